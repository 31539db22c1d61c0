"""How fast a flood must come to keep legitimate QUIC clients out: ``python -m bench.flow_table_flood``.

Issue 42's figure. The router process runs with a small QUIC flow table: a ``memory.max`` of
``--memory-mib`` (64: the floors, 256 flows per worker) read through ``CGROUP_MEMORY_MAX_PATH_ENV``,
as the router sizes its tables in a container. For each rate of ``--rates`` a fresh router meets a
flood (``bench.flood_clients``) of valid one-datagram Initials naming a real pod and claiming
``max_idle_timeout`` 3600 s (or, ``--kind joins`` with ``--quic-lb-server-id-bytes 4``, 21-byte
short headers naming a pod by server ID), each from a source address of its own. The flood opens
with one table's worth at once (an attacker fills the table first: the worst start for the
clients), then goes on at the rate while real aioquic clients (``--lanes`` of them, one connection
after another: a handshake, a name round trip and a 16 KiB transfer compared byte for byte) connect
to the other pod for ``--seconds``; ``--rounds`` such rounds per rate, interleaved with the other
tree's.

A rate *denies service* when fewer than 99 % of those connections work, pooled over the rounds (and,
the stronger figure, fewer than 50 %); the summary gives, per tree, the lowest rate stepped that
does. The table also says what the router did (medians of the rounds): datagrams refused
``flow_table_full``, flows ended ``evicted`` and ``handshake_timeout``, datagrams the kernel dropped
at its sockets (a router that cannot keep up loses Initials there), its CPU. ``--baseline TREE`` runs
the router of another source tree at every rate too (a worktree of main: the tree before the fix); a
tree denied below 50 % at two rates in a row is not stepped higher.

    python -m bench.flow_table_flood --baseline <worktree of the tree before>
    python -m bench.flow_table_flood --kind joins --rates 0,100,500 --workers 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import flood_clients
from bench.procs import Agent, BenchError, Router, cpu_exact, raise_fd_limit, router_from, udp_drops
from router import constants as c
from router.demo.pki import make_pki
from router.memory_bounds import MIB, bounds_for
from router.outcomes import QuicDropReason
from tests.support.flow_table_flood import PODS, SERVER_ID_BYTES

DENIED = 0.99
"""Below this share of the legitimate connections working, the rate denies service."""
DENIED_HARD = 0.50
"""The stronger figure: most legitimate clients are kept out."""
SETTLE_S = 0.3
"""After the opening burst, before the clients start: the router has read it."""
TRANSFER_BYTES = 16 * 1024
"""What each legitimate connection fetches and compares byte for byte."""
STEP_SPARE_S = 60.0
"""How long past its window a step's agents may take to answer (a denied client waits for its timeouts)."""
SIZED = re.compile(r"QUIC flows <= (\d+)")
"""The router's start line saying how many flows its table holds (``router.memory_bounds``)."""
STOP_AFTER = 2
"""Rates in a row a tree is denied below 50 % at before the higher ones are skipped for it."""


def _metric(router: Router, name: str, **labels: str) -> float | None:
    """A series from a live scrape; None where the tree has no such series (the tree before the fix)."""
    try:
        return router.process.metric(name, **labels)
    except KeyError:
        return None


def _flows_per_worker(router: Router) -> int:
    """The table the router sized, from its start line (``QUIC flows <= N``)."""
    for line in router.process.lines:
        if sized := SIZED.search(line):
            return int(sized[1])
    raise BenchError("the router did not say how it sized its QUIC tables")


def step(tree: Path | None, rate: float, args: argparse.Namespace, rows: list[tuple[str, str, int, int]],
         env: dict[str, str], cafile: str, workdir: Path, agents: dict[str, Agent], seed: int) -> dict[str, Any]:
    """One rate against one tree's fresh router: what the clients got and what the router did."""
    extra = ["--workers", str(args.workers)]
    if args.kind == "joins":
        extra += ["--quic-lb-server-id-bytes", str(SERVER_ID_BYTES)]
    with router_from(tree, workdir, rows, extra, env) as router:
        table = _flows_per_worker(router) * args.workers
        prime = table if args.prime else 0
        delay = prime / flood_clients.PRIME_RATE_PER_S + SETTLE_S
        address = ("127.0.0.1", router.udp_port)
        cpu0, drops0, started = cpu_exact(router.pid), udp_drops(router.pid), time.monotonic()
        agents["flood"].submit(flood_clients.flood, address, args.kind, prime, rate, SETTLE_S + args.seconds, seed)
        agents["legit"].submit(flood_clients.legit, router.udp_port, cafile, delay, args.seconds, args.lanes,
                               TRANSFER_BYTES)
        got = agents["legit"].result(delay + args.seconds + STEP_SPARE_S)
        sent, took = agents["flood"].result(delay + args.seconds + STEP_SPARE_S)
        elapsed = time.monotonic() - started
        cpu = (cpu_exact(router.pid) - cpu0) / elapsed
        kernel = udp_drops(router.pid) - drops0
        dropped = {r.value: _metric(router, f"{c.QUIC_DROPPED_DATAGRAMS_TOTAL}_total", reason=r) or 0.0
                   for r in QuicDropReason}
        ended = {t: _metric(router, f"{c.TERMINATIONS_TOTAL}_total", protocol="quic", termination=t)
                 for t in ("evicted", "handshake_timeout")}
    total = got["ok"] + sum(got["failed"].values())
    return {
        "rate": rate, "achieved": sent / took if took else 0.0,
        "table": table, "prime": prime, "legit_ok": got["ok"], "legit_total": total,
        "success": got["ok"] / total if total else 0.0, "p50_ms": got["p50_ms"], "p99_ms": got["p99_ms"],
        "failures": got["failed"], "flow_table_full": dropped["flow_table_full"],
        "dropped": {k: v for k, v in dropped.items() if v}, "evicted": ended["evicted"],
        "handshake_timeout": ended["handshake_timeout"], "kernel_drops": kernel, "router_cpu": cpu,
    }


def _count(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _row(tree: str, rate: float, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One tree at one rate over its rounds: the clients' connections pooled, the rest medians."""
    def mid(key: str) -> float | None:
        values = [r[key] for r in rounds if r[key] is not None]
        return statistics.median(values) if values else None

    ok, total = sum(r["legit_ok"] for r in rounds), sum(r["legit_total"] for r in rounds)
    return {"tree": tree, "rate": rate, "rounds": len(rounds), "legit_ok": ok, "legit_total": total,
            "success": ok / total if total else 0.0, **{k: mid(k) for k in (
                "achieved", "p50_ms", "p99_ms", "flow_table_full", "evicted", "handshake_timeout", "kernel_drops",
                "router_cpu")}}


def _line(r: dict[str, Any]) -> str:
    return (f"| {r['tree']} | {r['rate']:,.0f} | {_count(r['achieved'])} | {r['legit_ok']}/{r['legit_total']} "
            f"({100 * r['success']:.1f} %) | {_count(r['p50_ms'])} / {_count(r['p99_ms'])} "
            f"| {_count(r['flow_table_full'])} | {_count(r['evicted'])} | {_count(r['handshake_timeout'])} "
            f"| {_count(r['kernel_drops'])} | {100 * (r['router_cpu'] or 0):.0f} % |")


HEADER = ("| tree | flood /s | achieved /s | legitimate connections | p50 / p99 ms | flow_table_full | evicted "
          "| handshake_timeout | kernel drops | router CPU |\n|---|---|---|---|---|---|---|---|---|---|")


def _denial(rows: list[dict[str, Any]], tree: str, floor: float) -> str:
    stepped = [r for r in rows if r["tree"] == tree]
    denied = [r["rate"] for r in stepped if r["success"] < floor]
    if denied:
        return f"{min(denied):,.0f}/s"
    return f"none up to {max(r['rate'] for r in stepped):,.0f}/s" if stepped else "not run"


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every round of every rate on every tree, interleaved; returns (the rounds, the rows per tree and rate)."""
    raise_fd_limit()
    trees: dict[str, Path | None] = {"this": None}
    if args.baseline:
        trees["baseline"] = args.baseline.resolve()
    rounds: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stargate-flood-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        pki = make_pki(workdir / "pki")
        memory_max = workdir / "memory.max"
        memory_max.write_text(f"{args.memory_mib * MIB}\n")
        env = {c.CGROUP_MEMORY_MAX_PATH_ENV: str(memory_max)}
        agents = {name: Agent(f"flood-{name}") for name in ("legit-pod", "flood-pod", "legit", "flood")}
        for agent in agents.values():
            stack.callback(agent.close)
        pods = [
            (flood_clients.LEGIT_POD, PODS[flood_clients.LEGIT_POD], 1,
             agents["legit-pod"].call(flood_clients.start_legit_pod, str(pki.cert_path), str(pki.key_path))),
            (flood_clients.FLOOD_POD, PODS[flood_clients.FLOOD_POD], 1,
             agents["flood-pod"].call(flood_clients.start_flood_pod, args.kind, str(pki.cert_path),
                                      str(pki.key_path))),
        ]
        bounds = bounds_for(args.memory_mib * MIB, args.workers)
        print(f"{args.kind} flood; memory.max {args.memory_mib} MiB: {bounds.max_flows} flows per worker, "
              f"{args.workers} worker(s); {args.rounds} round(s) of {args.seconds:g} s of {args.lanes} aioquic "
              f"lanes per tree and rate; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}", flush=True)
        denied_in_a_row = dict.fromkeys(trees, 0)
        for i, rate in enumerate(args.rates):
            names = [name for name in trees if denied_in_a_row[name] < STOP_AFTER]
            per_tree: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            for k in range(args.rounds):
                for name in names[(i + k) % len(names):] + names[: (i + k) % len(names)] if names else []:
                    result = step(trees[name], rate, args, pods, env, str(pki.ca_path), workdir, agents, seed=i)
                    result["tree"] = name
                    per_tree[name].append(result)
                    rounds.append(result)
                    print(f"  {name} {rate:,.0f}/s: {result['legit_ok']}/{result['legit_total']} got through, "
                          f"evicted {_count(result['evicted'])}, flow_table_full {_count(result['flow_table_full'])}, "
                          f"kernel drops {result['kernel_drops']:,}", file=sys.stderr, flush=True)
            for name in names:
                rows.append(_row(name, rate, per_tree[name]))
                denied_in_a_row[name] = denied_in_a_row[name] + 1 if rows[-1]["success"] < DENIED_HARD else 0
    print(f"\n{HEADER}")
    for row in rows:
        print(_line(row))
    print(f"\nload average {os.getloadavg()[0]:.2f}")
    for name, tree in trees.items():
        print(f"{name} ({tree or os.getcwd()}): denied (< {100 * DENIED:.0f} % of the clients get through) from "
              f"{_denial(rows, name, DENIED)}; < {100 * DENIED_HARD:.0f} % from {_denial(rows, name, DENIED_HARD)}")
    return rounds, rows


def _rates(text: str) -> list[float]:
    rates = sorted({float(r) for r in text.split(",") if r.strip()})
    if not rates or rates[0] < 0:
        raise argparse.ArgumentTypeError("expected rates per second >= 0, comma-separated")
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.flow_table_flood", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=_rates, default=_rates("0,300,1000,2000,4000,8000"),
                        help="flood datagrams per second to step through, after the opening burst")
    parser.add_argument("--kind", choices=("initials", "joins"), default="initials")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the clients connect per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per tree and rate, interleaved")
    parser.add_argument("--lanes", type=int, default=2, help="aioquic clients connecting one after another")
    parser.add_argument("--memory-mib", type=int, default=64, help="the memory.max the router sizes its tables to")
    parser.add_argument("--workers", type=int, default=1, help="router worker processes")
    parser.add_argument("--no-prime", dest="prime", action="store_false",
                        help="no opening burst: the flood starts at its rate into an empty table")
    parser.add_argument("--baseline", type=Path, help="also step the router of this source tree")
    parser.add_argument("--json", type=Path, help="write the steps here")
    args = parser.parse_args()
    for name in ("seconds", "rounds", "lanes", "memory_mib", "workers"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    if args.baseline is not None and not (args.baseline / "router" / "__main__.py").is_file():
        parser.error(f"--baseline: {args.baseline} holds no router/ source tree")
    rounds, rows = run(args)
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                                         "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
