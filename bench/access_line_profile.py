"""What the access line costs per connection, in process: ``python -m bench.access_line_profile``.

Configures logging as the router does (``configure_logging``, a 64 KiB block-buffered stream, here
to /dev/null, on the router's event loop so lines are batched as in production), builds an
``AccessLog`` with real ``RouterMetrics`` and times ``open`` + ``end`` of an accepted connection
(every field known) per line, with the line (``text`` and ``json``) and without it
(``--access-log off``); the difference is what the line itself costs. Each measurement runs in
its own process; ``--baseline TREE`` (a ``git archive`` of the commit to compare with) runs the
same measurements on that tree's ``router/``, rounds interleaved, so a shared machine's noise
hits both alike. Single-threaded and short: a few seconds of one core.

    python -m bench.access_line_profile
    git archive HEAD router | tar -x -C /tmp/before
    python -m bench.access_line_profile --baseline /tmp/before --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import io
import json
import os
import statistics
import subprocess
import sys
import time

FORMATS = ("text", "json")
UNLIMITED_LINES_PER_S = 1e15
"""The access log's budget here (a tree that has one): far above any rate measured, so no line is dropped."""
MODES = ("off", "on")


def _measure(lines: int, repeats: int) -> dict[str, float]:
    """Best us per line over ``repeats`` of ``lines`` records, for every format and mode."""
    import logging

    from router.access_log import AccessLog
    from router.logging_setup import LOG_BUFFER_BYTES, configure_logging
    from router.metrics import RouterMetrics
    from router.outcomes import GrpcOutcome, ProtocolLabel, Termination

    def stream() -> io.TextIOWrapper:
        raw = io.FileIO(os.devnull, "w")
        return io.TextIOWrapper(io.BufferedWriter(raw, LOG_BUFFER_BYTES), encoding="utf-8",
                                errors="backslashreplace")

    def once(access: AccessLog) -> float:
        started = time.perf_counter_ns()
        for i in range(lines):
            now = 1000.0 + i * 0.001
            record = access.open(ProtocolLabel.TLS, "10.0.0.7:53114", now)
            record.hostname, record.pod = "stargate-0.stargate.external", "stargate-0"
            record.pod_address, record.decided_at = "10.1.2.3:50051", now + 0.00014
            record.bytes_client_to_pod, record.bytes_pod_to_client = 812 + i, 1405
            access.end(record, GrpcOutcome.COMPLETED, Termination.CLIENT_CLOSE, now + 0.0512)
        return (time.perf_counter_ns() - started) / lines / 1000.0

    async def run() -> dict[str, float]:
        out: dict[str, float] = {}
        for fmt in FORMATS:
            configure_logging(fmt, "info", stream=stream())  # type: ignore[arg-type]
            for mode in MODES:
                options = {"enabled": mode == "on", "logger": logging.getLogger("router.access")}
                if "lines_per_s" in inspect.signature(AccessLog).parameters:
                    # Every line written (and its budget's token taken): the line's cost, not a drop's.
                    options["lines_per_s"] = UNLIMITED_LINES_PER_S
                access = AccessLog(RouterMetrics(), **options)  # type: ignore[arg-type]
                best = float("inf")
                for _ in range(repeats):
                    best = min(best, once(access))
                    await asyncio.sleep(0)  # the batch flush runs between repeats, as between loop turns
                out[f"{fmt}/{mode}"] = best
        return out

    try:
        import uvloop  # the router's loop when installed
        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


def _worker(tree: str | None, lines: int, repeats: int) -> dict[str, float]:
    """One measurement in a fresh process (``tree``'s router when given)."""
    cmd = [sys.executable, "-m", "bench.access_line_profile", "--worker",
           "--lines", str(lines), "--repeats", str(repeats)]
    env = dict(os.environ)
    if tree is not None:
        env["ACCESS_LINE_PROFILE_TREE"] = tree
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--lines", type=int, default=10_000, help="records per timed repeat")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per measurement (best kept)")
    parser.add_argument("--rounds", type=int, default=3, help="processes per tree (median kept)")
    parser.add_argument("--baseline", metavar="TREE", help="also measure TREE's router/ (a git archive)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        tree = os.environ.get("ACCESS_LINE_PROFILE_TREE")
        if tree:
            sys.path.insert(0, tree)
        print(json.dumps(_measure(args.lines, args.repeats)))
        return
    trees: dict[str, str | None] = {"this tree": None}
    if args.baseline:
        trees = {"baseline": os.path.abspath(args.baseline), **trees}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            runs[name].append(_worker(tree, args.lines, args.repeats))
    print(f"us per accepted connection, open+end ({args.lines} lines x best of {args.repeats}, "
          f"median of {args.rounds} processes)")
    print(f"{'':10}" + "".join(f"{f'{fmt} off':>10}{f'{fmt} on':>10}{f'{fmt} line':>11}" for fmt in FORMATS))
    for name, results in runs.items():
        med = {key: statistics.median(r[key] for r in results) for key in results[0]}
        cells = "".join(
            f"{med[f'{fmt}/off']:10.2f}{med[f'{fmt}/on']:10.2f}{med[f'{fmt}/on'] - med[f'{fmt}/off']:11.2f}"
            for fmt in FORMATS
        )
        print(f"{name:10}{cells}")


if __name__ == "__main__":
    main()
