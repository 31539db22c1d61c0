"""``python -m bench``: run the scenarios, print the table, write JSON / Markdown / PNG.

    python -m bench [--quick] [--json FILE] [--plot DIR] [--markdown FILE] [--only NAME[,NAME]]
                    [--workers N] [--rounds N] [--python-peers]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.context import BenchContext, Scenario
from bench.procs import python_version, raise_fd_limit, tool_version
from bench.results import OutputPathError, Outputs, Row, text_table


def _scenarios() -> dict[str, Scenario]:
    from bench import (
        discovery_scenarios,
        grpc_scenarios,
        memory_scenarios,
        quic_lb_scenarios,
        quic_scenarios,
        tcp_scenarios,
        worker_follow_scenarios,
    )

    return {
        "discovery": discovery_scenarios.discovery,
        "tcp_bulk": tcp_scenarios.tcp_bulk,
        "conn_rate": tcp_scenarios.conn_rate,
        "grpc": grpc_scenarios.grpc_unary_and_streaming,
        "quic_sniff": quic_scenarios.quic_sniff,
        "quic_handshake": quic_scenarios.quic_handshake,
        "udp_relay": quic_scenarios.udp_relay,
        "udp_download": quic_scenarios.udp_download,
        "udp_echo": quic_scenarios.udp_echo,
        "udp_demux": quic_scenarios.udp_demux,
        "quic_lb_join": quic_lb_scenarios.quic_lb_join,
        "worker_follow": worker_follow_scenarios.worker_follow,
        "memory_tcp": memory_scenarios.memory_tcp,
        "memory_udp": memory_scenarios.memory_udp,
        "workers": tcp_scenarios.workers_speedup,
    }


def machine_info(workers: int) -> dict[str, Any]:
    load = os.getloadavg()
    return {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "python": python_version(),
        "haproxy": tool_version(["haproxy", "-v"]),
        "nginx": tool_version(["nginx", "-v"]),
        "loadavg_at_start": [round(x, 2) for x in load],
        "router_workers": workers,
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, 3 rounds: under 2 minutes")
    p.add_argument("--json", type=Path, help="write the figures as JSON")
    p.add_argument("--plot", type=Path, help="write PNG bar charts into this directory (matplotlib)")
    p.add_argument("--markdown", type=Path, help="write the table as Markdown (for bench/README.md)")
    p.add_argument("--only", default="", help="comma-separated scenario names (see --list)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--workers", type=int, default=1,
                   help="router worker processes in the throughput scenarios (default 1); "
                        "the 'workers' scenario always compares 1 and 2")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds per scenario "
                   "(default 5, --quick 3)")
    p.add_argument("--python-peers", action="store_true",
                   help="the UDP loads' clients and pod in Python, not bench/udp_peers.c (as without a C compiler)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    scenarios = _scenarios()
    if args.list:
        print("\n".join(scenarios))
        return 0
    wanted = [n.strip() for n in args.only.split(",") if n.strip()] or list(scenarios)
    unknown = [n for n in wanted if n not in scenarios]
    if unknown:
        print(f"python -m bench: unknown scenario(s) {', '.join(unknown)}; "
              f"known: {', '.join(scenarios)}", file=sys.stderr)
        return 2
    if args.workers < 1 or (args.rounds is not None and args.rounds < 1):
        print("python -m bench: --workers and --rounds must be >= 1", file=sys.stderr)
        return 2
    outputs = Outputs(json=args.json, markdown=args.markdown, plot=args.plot)
    try:
        outputs.prepare()  # before the first scenario: a bad path must not cost a whole run
    except OutputPathError as exc:
        print(f"python -m bench: {exc}", file=sys.stderr)
        return 2
    raise_fd_limit()
    machine = machine_info(args.workers)
    print(f"bench: {'quick' if args.quick else 'full'} run, {machine['nproc']} CPUs, kernel "
          f"{machine['kernel']}, Python {machine['python']}, load {machine['loadavg_at_start']}",
          file=sys.stderr)
    rows: list[Row] = []
    failures: list[str] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="stargate-bench-") as tmp:
        for name in wanted:
            ctx = BenchContext(quick=args.quick, workdir=Path(tmp), workers=args.workers,
                               rounds_override=args.rounds, python_peers=args.python_peers)
            print(f"bench: {name}", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            try:
                with ctx.stack:
                    rows += scenarios[name](ctx)
            except Exception as exc:
                failures.append(f"{name}: {exc}")
                print(f"bench: {name} FAILED: {exc}", file=sys.stderr, flush=True)
            print(f"bench: {name} took {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
    machine["duration_s"] = round(time.monotonic() - started, 1)
    machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(text_table(rows))
    print(f"\n{len(rows)} figures in {machine['duration_s']}s; load average at end "
          f"{machine['loadavg_at_end']}")
    written, unwritten = outputs.write(rows, machine)
    for line in written + unwritten:
        print(f"bench: {line}", file=sys.stderr)
    for failure in failures:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if failures or unwritten else 0
