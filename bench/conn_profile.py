"""Where the router's CPU per new TCP connection goes: ``python -m bench.conn_profile``.

Runs the ``conn_rate`` load (2 client processes x 8 connections at a time, each a real TLS
ClientHello + 1 KiB, echoed by the pod, then closed) against the router, and HAProxy in the
same rounds, interleaved, and prints each one's CPU per connection, user and system.
``--baseline TREE`` adds a router run from another source tree (a ``git archive`` of the
commit to compare with): the per-round CPU ratio of the two routers is the figure that
survives a shared machine's noise. ``--strace`` counts the system calls per connection of
the router (and HAProxy), which is deterministic; ``--py-spy FILE`` records a py-spy profile
(raw collapsed stacks) of the router meanwhile; ``--callbacks`` runs the router alone and splits
its main thread's CPU by the callback that spent it (``bench.callback_hooks``: thread CPU clock
around each, so unlike py-spy's wall-clock samples it is not skewed by waits for a core).
``--router-args`` adds flags to both routers (``--router-args=--access-log=off``: the path
without its access line); ``--haproxy-log`` has HAProxy log each connection too (``option tcplog``
on stdout), so that both write a line per connection. ``--perf DIR`` records each box with
``perf record -g`` in turn and writes ``perf report`` by symbol: the kernel's side of the
comparison (whose wake-ups of the pod and the clients each box pays for, on loopback).
``--peers`` adds the pod's and the clients' CPU per connection under each box: a box that
batches its sends to them differently changes what they spend, and so the rate.

    python -m bench.conn_profile --rounds 6
    python -m bench.conn_profile --rounds 6 --baseline /tmp/main-tree
    python -m bench.conn_profile --strace
    python -m bench.conn_profile --py-spy /tmp/conn.txt
    python -m bench.conn_profile --callbacks --rounds 4
    python -m bench.conn_profile --perf /tmp/conn-perf --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import callback_hooks
from bench.context import POD, POD_HOST, SNI
from bench.procs import Agent, Haproxy, call_all, cpu_split, router_from, syscall_counts
from bench.tcp_load import connection_rate, start_echo_pod, tls_client_hello
from bench.tcp_scenarios import ECHO_BYTES, RATE_CLIENTS, RATE_CONCURRENCY

CALLBACK_HOOKS = '''
    from router import access_log, logging_setup
    from router.tcp import acceptor, connection, edge, fast_path, poller, relay_policy

    hook(acceptor.Acceptor, "_on_acceptable", "accept batches (accept4, socket objects, the fast path)")
    hook(fast_path.FastPath, "serve", "  of which: the fast path's read and decision")
    hook(fast_path.FastPath, "launch", "  of which: the fast path's batch of dials and relay starts")
    hook(edge.TcpRouter, "_serve", "connection task steps")
    hook(edge, "read_now", "  of which: first read and peek (recv, ClientHello)")
    hook(fast_path, "read_now", "  of which: first read and peek (recv, ClientHello)")
    hook(connection.Connections, "decide", "  of which: routing decision")
    hook(edge, "dial", "  of which: dial (socket, connect)")
    hook(fast_path, "start_dial", "  of which: dial (socket, connect)")
    hook(edge, "relay", "  of which: relay set-up and end (first send, result)")
    hook(relay_policy.Relay, "start", "  of which: relay set-up and end (first send, result)")
    hook(access_log.AccessLog, "end", "  of which: access line and end metrics")
    hook(poller.FdPoller, "_dispatch", "relay pumps (epoll dispatch: recv, send, shutdown)")  # C pump: untimed
    hook(relay_policy.Relay, "finish", "  of which: relay finish (close both sockets, the end's accounting)")
    hook(relay_policy, "_arm_young", "relay timers armed (deferred, shared)")
    hook(logging_setup._RouterLogHandler, "_flush_batch", "log batch flush (write)")
'''
"""The TCP edge's callbacks timed by ``--callbacks`` (``bench.callback_hooks``)."""

Box = tuple[tuple[str, int], int]
"""(address the clients dial, pid of the middle box)."""


_CONCURRENCY = [RATE_CONCURRENCY]
"""Connections at a time across the clients (``--concurrency``)."""


_PEERS: list[Agent] = []
"""The pod and the clients, whose CPU per connection ``--peers`` reports under each box."""
_PEER_CPU: dict[tuple[str, int], list[float]] = {}
"""Per box address: the peers' CPU seconds per connection of each round."""


def _run(clients: list[Agent], box: Box, seconds: float, message: bytes) -> tuple[int, float, float]:
    """Connections done, and the box's user and system CPU seconds meanwhile."""
    (addr, pid), per_client = box, max(1, _CONCURRENCY[0] // len(clients))
    user0, sys0 = cpu_split(pid)
    peers0 = [sum(cpu_split(peer.pid)) for peer in _PEERS]
    answers = call_all(clients, connection_rate, [(addr, seconds, per_client, message)] * len(clients))
    user1, sys1 = cpu_split(pid)
    done = sum(a[0] for a in answers)
    if _PEERS:
        peers = sum(sum(cpu_split(peer.pid)) for peer in _PEERS) - sum(peers0)
        _PEER_CPU.setdefault(addr, []).append(peers / max(done, 1))
    return done, user1 - user0, sys1 - sys0


def _strace(clients: list[Agent], box: Box, message: bytes) -> dict[str, float]:
    counts, done = syscall_counts(box[1], lambda: _run(clients, box, 2.0, message)[0])
    return {name: count / max(done, 1) for name, count in counts.items()}


def _callbacks(clients: list[Agent], box: Box, seconds: float, message: bytes, counts: Path) -> int:
    """The router's main-thread CPU per connection, split by callback (``--callbacks``)."""
    _run(clients, box, 0.5, message)  # warm up
    callback_hooks.start(box[1])
    done, user, system = _run(clients, box, seconds, message)
    callback_hooks.stop(box[1])
    print(f"router: {done} connections, CPU per connection {(user + system) / done * 1e6:.1f} us "
          f"(user {user / done * 1e6:.1f}); the hooks add their own cost to each line")
    callback_hooks.print_split(json.loads(counts.read_text()), done)
    return 0


def _perf(clients: list[Agent], boxes: dict[str, Box], seconds: float, message: bytes, out: Path) -> int:
    """``--perf``: each box's samples (``perf record``, all symbols) under the same load, and
    ``perf report`` of each by symbol: where the kernel's share differs between the boxes."""
    out.mkdir(parents=True, exist_ok=True)
    for name, box in boxes.items():
        data = out / f"{name}.data"
        perf = subprocess.Popen(["perf", "record", "-g", "-F", "2999", "-p", str(box[1]), "-o", str(data)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        done, user, system = _run(clients, box, seconds, message)
        perf.send_signal(signal.SIGINT)
        perf.wait()
        report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym",
                                 "--stdio", "--percent-limit", "0.4"], capture_output=True, text=True).stdout
        (out / f"{name}.txt").write_text(report)
        print(f"{name:9s} {done / seconds:7.0f} conn/s  {(user + system) / done * 1e6:6.1f} us CPU per connection "
              f"(user {user / done * 1e6:5.1f}): {out / name}.txt")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.conn_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--seconds", type=float, default=2.0, help="load per box and round (default 2)")
    p.add_argument("--baseline", type=Path, help="also run the router of this source tree")
    p.add_argument("--strace", action="store_true", help="system calls per connection instead of CPU")
    p.add_argument("--py-spy", type=Path, help="record a py-spy raw profile of the router here")
    p.add_argument("--peers", action="store_true",
                   help="also the pod's and the clients' CPU per connection under each box (how it batches for them)")
    p.add_argument("--perf", type=Path, help="perf-record each box (kernel and user symbols) into this directory")
    p.add_argument("--router-args", default="", help="extra router flags, space-separated")
    p.add_argument("--callbacks", action="store_true", help="the router alone: its CPU split by callback")
    p.add_argument("--haproxy-log", action="store_true",
                   help="HAProxy writes a tcplog line per connection too, as the router's access log does")
    p.add_argument("--concurrency", type=int, default=RATE_CONCURRENCY,
                   help=f"connections at a time (default {RATE_CONCURRENCY}, the bench's; 2: a router that "
                   "is mostly idle, so it accepts before the ClientHello arrives and waits for it)")
    args = p.parse_args(argv)
    _CONCURRENCY[0] = args.concurrency
    workdir = Path(tempfile.mkdtemp(prefix="conn-profile-"))
    counts = callback_hooks.install(workdir, CALLBACK_HOOKS) if args.callbacks else None
    message = tls_client_hello(SNI) + bytes(ECHO_BYTES)
    pod = Agent("echo-pod")
    clients = [Agent(f"rate-client-{i}") for i in range(RATE_CLIENTS)]
    try:
        port = pod.call(start_echo_pod, POD_HOST)
        if args.peers:
            _PEERS[:] = [pod, *clients]
        with contextlib.ExitStack() as stack:
            extra = args.router_args.split()
            rows = [(POD, POD_HOST, port, 1)]
            router = stack.enter_context(router_from(None, workdir, rows, extra))
            boxes: dict[str, Box] = {"router": (("127.0.0.1", router.tcp_port), router.pid)}
            if args.baseline is not None:
                base = stack.enter_context(router_from(args.baseline.resolve(), workdir, rows, extra))
                boxes["baseline"] = (("127.0.0.1", base.tcp_port), base.pid)
            haproxy = Haproxy(workdir, sni_routes=[(SNI, POD_HOST, port)], log_connections=args.haproxy_log)
            stack.callback(haproxy.close)
            boxes["haproxy"] = (("127.0.0.1", haproxy.ports[0]), haproxy.pid)
            if counts is not None:
                return _callbacks(clients, boxes["router"], args.rounds * args.seconds, message, counts)
            for box in boxes.values():
                _run(clients, box, 0.5, message)  # warm up
            if args.perf is not None:
                return _perf(clients, boxes, args.rounds * args.seconds, message, args.perf)
            if args.strace:
                for name, box in boxes.items():
                    counts = _strace(clients, box, message)
                    detail = ", ".join(f"{k} {v:.2f}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
                                       if v >= 0.05)
                    print(f"{name:9s} {sum(counts.values()):5.1f} system calls per connection: {detail}")
                return 0
            spy = None
            if args.py_spy is not None:
                seconds = int(args.rounds * args.seconds * len(boxes) + 2)
                spy = subprocess.Popen(["py-spy", "record", "-r", "500", "--native", "-f", "raw", "-d",
                                        str(seconds), "-o", str(args.py_spy), "--pid", str(router.pid)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            results: dict[str, list[tuple[float, float, float]]] = {n: [] for n in boxes}
            boxes_addr = {name: box[0] for name, box in boxes.items()}
            _PEER_CPU.clear()  # the warm-up's rounds are not measured
            names = list(boxes)
            for r in range(args.rounds):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    done, user, system = _run(clients, boxes[name], args.seconds, message)
                    results[name].append((done / args.seconds, user / done * 1e6, system / done * 1e6))
            if spy is not None:
                spy.wait()
    finally:
        pod.close()
        for client in clients:
            client.close()
    print(f"{args.rounds} rounds x {args.seconds}s per box, load average {os.getloadavg()[0]:.1f}")
    for name, rows in results.items():
        rate = statistics.median(row[0] for row in rows)
        cpu = statistics.median(row[1] + row[2] for row in rows)
        user = statistics.median(row[1] for row in rows)
        peers = _PEER_CPU.get(boxes_addr[name], [])
        beside = f"; the pod and clients: {statistics.median(peers) * 1e6:6.1f} us" if peers else ""
        print(f"{name:9s} {rate:7.0f} conn/s  {cpu:6.1f} us CPU per connection (user {user:5.1f}){beside}")
    if "baseline" in results:
        ratios = [(a[1] + a[2]) / (b[1] + b[2]) for a, b in zip(results["router"], results["baseline"], strict=True)]
        print(f"router/baseline CPU per connection, median of the rounds: {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
