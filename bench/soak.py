"""A soak of the router process under new connections: ``python -m bench.soak --minutes 5``.

Two pods (grpcio and aioquic, each answering with its name) behind the router process (one
worker, default flags); real grpcio clients open a new connection per call, real aioquic
clients a new connection per round trip, some from local ports reused at once, some two at once
on one socket (``bench.soak_clients``). Every ``--sample-s`` seconds the router's open fds,
RSS and live QUIC flows are read (``/proc``, ``/metrics``). At the end: the calls and connections
that worked and any that failed (a legitimate connection refused is a failure), the router's own
refusal counters, and the fds and RSS over time: after the first minute, when the first
connections' flows have reached their idle timeout, they should stay flat.

    python -m bench.soak --minutes 5
    python -m bench.soak --minutes 1 --sample-s 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from pathlib import Path

from bench.context import POD_HOST
from bench.grpc_load import start_grpc_pod
from bench.procs import Agent, Router, process_tree, raise_fd_limit, rss_bytes
from bench.quic_load import start_quic_pod_thread
from bench.soak_clients import grpc_calls, quic_connections
from router import constants as c
from router.demo.pki import make_pki

PODS = (("stargate-0", POD_HOST), ("stargate-1", "127.0.0.3"))
REUSED_PORTS = list(range(24_000, 24_016))
"""Local ports the QUIC clients reuse the moment they are free (below the ephemeral range)."""
SETTLE_S = 60.0
"""The first minute: flows of the first connections have not reached their idle timeout yet."""


def open_fds(pid: int) -> int:
    """Open file descriptors of ``pid``'s process tree."""
    total = 0
    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{p}/fd"))
    return total


def _metric(router: Router, name: str, **labels: str) -> float:
    with contextlib.suppress(KeyError, OSError):
        return router.process.metric(name, **labels)
    return float("nan")


def soak(minutes: float, sample_s: float, grpc_threads: int, quic_concurrency: int) -> int:
    raise_fd_limit()
    seconds = minutes * 60
    with tempfile.TemporaryDirectory(prefix="stargate-soak-") as tmp:
        workdir = Path(tmp)
        pki = make_pki(workdir / "pki")
        pods, agents = Agent("soak-pods"), [Agent("soak-grpc"), Agent("soak-quic")]
        try:
            rows = [(name, host, pods.call(start_grpc_pod, name, host),
                     pods.call(start_quic_pod_thread, name, host, str(pki.cert_path), str(pki.key_path)))
                    for name, host in PODS]
            router = Router(workdir, rows)
            try:
                names = [f"{name}.stargate.external" for name, _ in PODS]
                pod_names = [name for name, _ in PODS]
                agents[0].submit(grpc_calls, f"127.0.0.1:{router.tcp_port}", pod_names, names, seconds, grpc_threads)
                agents[1].submit(quic_connections, "127.0.0.1", router.udp_port, pod_names, names,
                                 str(pki.ca_path), seconds, quic_concurrency, REUSED_PORTS)
                samples = _sample(router, seconds, sample_s)
                grpc_counts = agents[0].result(seconds + 120)
                quic_counts = agents[1].result(seconds + 120)
                refusals = {f"quic {o}": _metric(router, f"{c.QUIC_CONNECTIONS_TOTAL}_total", outcome=o)
                            for o in ("missing_sni", "unknown_sni", "target_unavailable", "client_limit")}
                refusals.update({f"grpc {o}": _metric(router, f"{c.GRPC_CONNECTIONS_TOTAL}_total", protocol="h2c",
                                                      outcome=o)
                                 for o in ("target_unavailable", "connect_error", "protocol_error")})
                ended = {t: _metric(router, f"{c.TERMINATIONS_TOTAL}_total", protocol="quic", termination=t)
                         for t in ("quic_idle_timeout", "idle_timeout")}
            finally:
                router.close()
        finally:
            for agent in (pods, *agents):
                agent.close()
    return _report(minutes, samples, grpc_counts, quic_counts, refusals, ended)


def _sample(router: Router, seconds: float, sample_s: float) -> list[tuple[float, int, float, float]]:
    """(seconds since start, open fds, RSS MiB, live QUIC flows) every ``sample_s`` for ``seconds``."""
    samples = []
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        flows = _metric(router, c.ACTIVE_CONNECTIONS, protocol="quic")
        samples.append((elapsed, open_fds(router.pid), rss_bytes(router.pid) / 2**20, flows))
        print(f"  {elapsed:6.0f} s  fds {samples[-1][1]:5d}  RSS {samples[-1][2]:6.1f} MiB  quic flows {flows:5.0f}",
              flush=True)
        time.sleep(max(0.0, sample_s - (time.monotonic() - started - elapsed)))
    return samples


def _report(minutes: float, samples: list[tuple[float, int, float, float]], grpc_counts: dict[str, int],
            quic_counts: dict[str, int], refusals: dict[str, float], ended: dict[str, float]) -> int:
    settled = [s for s in samples if s[0] >= SETTLE_S] or samples
    grpc_failed = sum(v for k, v in grpc_counts.items() if k != "ok")
    quic_failed = sum(v for k, v in quic_counts.items() if k not in ("ok", "local_port_busy"))
    print(f"\nsoak {minutes:g} min, router process (1 worker, default flags)")
    print(f"  gRPC calls, each on a new connection: {grpc_counts.get('ok', 0):,} ok, {grpc_failed} failed "
          f"{ {k: v for k, v in grpc_counts.items() if k != 'ok'} }")
    print(f"  QUIC connections (aioquic): {quic_counts.get('ok', 0):,} ok, {quic_failed} failed "
          f"{ {k: v for k, v in quic_counts.items() if k != 'ok'} }")
    print(f"  router refusals: { {k: int(v) for k, v in refusals.items()} }; QUIC flows ended: "
          f"{ {k: int(v) for k, v in ended.items()} }")
    fds, rss = [s[1] for s in settled], [s[2] for s in settled]
    print(f"  after the first minute: fds {min(fds)}..{max(fds)}, RSS {min(rss):.1f}..{max(rss):.1f} MiB "
          f"(at start: {samples[0][1]} fds, {samples[0][2]:.1f} MiB; at end: {samples[-1][1]} fds, "
          f"{samples[-1][2]:.1f} MiB)")
    refused = grpc_failed + quic_failed + int(sum(v for v in refusals.values() if v == v))
    print(f"  refused legitimate connections: {refused}")
    return 0 if refused == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the clients open connections")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples of the router")
    parser.add_argument("--grpc-threads", type=int, default=4, help="gRPC calls in flight at once")
    parser.add_argument("--quic-concurrency", type=int, default=6, help="QUIC connections in flight at once")
    args = parser.parse_args()
    for name in ("minutes", "sample_s", "grpc_threads", "quic_concurrency"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    return soak(args.minutes, args.sample_s, args.grpc_threads, args.quic_concurrency)


if __name__ == "__main__":
    raise SystemExit(main())
