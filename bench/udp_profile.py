"""Where a middle box's CPU per relayed datagram goes: ``python -m bench.udp_profile``.

Runs the ``udp_echo`` load (each flow opened by a real Initial, ``ECHO_WINDOW`` datagrams of
1,200 bytes in flight, echoed by the pod) through the router and nginx in interleaved rounds and
prints each one's CPU per relayed datagram split into user and system time: the part a faster
router could still cut is its user time, the rest is the kernel's UDP work, which both boxes
pay (on loopback a send also pays the receiving socket's delivery). Beside it: the pod's and the
clients' CPU per echo under each box, the windows they refilled after losses, and the datagrams
the kernel dropped at the box's and the pod's sockets (full receive buffers). ``--strace`` counts the
router's system calls per datagram instead (how well the batching works).

    python -m bench.udp_profile --flows 1 --rounds 4
    python -m bench.udp_profile --flows 100 --strace
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.context import POD, POD_HOST, SNI
from bench.procs import Agent, Nginx, Router, cpu_split, syscall_counts, udp_drops
from bench.quic_load import client_initials, retire_udp_flows, start_udp_sink, udp_echo_window, udp_sink_forget_sources
from bench.quic_scenarios import DATAGRAM_BYTES, ECHO_WINDOW, establish_flows

Box = tuple[tuple[str, int], int]
"""(address the clients send to, pid of the middle box)."""


def _echo(pod: Agent, clients: Agent, box: Box, flows: int, flights: list[list[bytes]],
          seconds: float) -> tuple[float, float, float, int, float, int, int, int]:
    """Echoes per second, the box's user and system CPU microseconds per relayed datagram, the
    datagrams relayed (each echo crosses the box twice), the pod's and the clients' CPU
    microseconds per echo, the windows refilled after losses, and the datagrams dropped at the
    box's sockets and at the pod's (full receive buffers)."""
    addr, pid = box
    pod.call(udp_sink_forget_sources)
    establish_flows(clients, pod, addr, flows, flights)
    time.sleep(0.1)
    user0, sys0 = cpu_split(pid)
    peers0 = sum(sum(cpu_split(peer.pid)) for peer in (pod, clients))
    drops0 = udp_drops(pid), udp_drops(pod.pid)
    echoes, refills, elapsed = clients.call(udp_echo_window, seconds, DATAGRAM_BYTES, ECHO_WINDOW)
    user1, sys1 = cpu_split(pid)
    peers = sum(sum(cpu_split(peer.pid)) for peer in (pod, clients)) - peers0
    box_drops, pod_drops = udp_drops(pid) - drops0[0], udp_drops(pod.pid) - drops0[1]
    clients.call(retire_udp_flows)
    time.sleep(0.2)  # the last window drains
    relayed = max(2 * echoes, 1)
    return (echoes / elapsed, (user1 - user0) / relayed * 1e6, (sys1 - sys0) / relayed * 1e6, relayed,
            peers / max(echoes, 1) * 1e6, refills, box_drops, pod_drops)


def _strace(pod: Agent, clients: Agent, box: Box, flows: int, flights: list[list[bytes]], seconds: float) -> None:
    calls, relayed = syscall_counts(box[1], lambda: _echo(pod, clients, box, flows, flights, seconds)[3])
    busy = {k: v for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v >= relayed / 1000}
    detail = ", ".join(f"{k} {v / relayed:.3f}" for k, v in busy.items())
    print(f"router: {relayed} datagrams relayed, {sum(calls.values()) / relayed:.3f} system calls per "
          f"datagram: {detail}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.udp_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flows", type=int, default=1, help="echoing flows (default 1)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--seconds", type=float, default=3.0, help="load per box and round (default 3)")
    p.add_argument("--strace", action="store_true", help="the router's system calls per datagram")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="udp-profile-"))
    results: dict[str, list[tuple[float, float, float, int, float, int, int, int]]] = {}
    with contextlib.ExitStack() as stack:
        pod, clients = Agent("udp-pod"), Agent("udp-clients")
        stack.callback(pod.close)
        stack.callback(clients.close)
        port = pod.call(start_udp_sink, POD_HOST, True)
        router = Router(workdir, [(POD, POD_HOST, 1, port)])
        stack.callback(router.close)
        flights = client_initials(SNI, args.flows)
        boxes: dict[str, Box] = {"router": (("127.0.0.1", router.udp_port), router.pid)}
        if args.strace:
            _echo(pod, clients, boxes["router"], args.flows, flights, 1.0)  # warm up
            _strace(pod, clients, boxes["router"], args.flows, flights, args.seconds)
            return 0
        nginx = Nginx(workdir, POD_HOST, port)
        stack.callback(nginx.close)
        boxes["nginx"] = (("127.0.0.1", nginx.port), nginx.pid)
        names = list(boxes)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                results.setdefault(name, []).append(_echo(pod, clients, boxes[name], args.flows, flights,
                                                          args.seconds))
    print(f"{args.rounds} rounds x {args.seconds:g} s per box, {args.flows} flow(s) x {ECHO_WINDOW} in flight")
    for name, rows in results.items():
        rate, user, system = (statistics.median(row[i] for row in rows) for i in range(3))
        peers, refills = statistics.median(row[4] for row in rows), sum(row[5] for row in rows)
        box_drops, pod_drops = sum(row[6] for row in rows), sum(row[7] for row in rows)
        print(f"{name:7s} {rate:9,.0f} echoes/s  {user + system:5.2f} us CPU per datagram "
              f"(user {user:4.2f}, system {system:4.2f}); the pod and clients {peers:5.2f} us per echo, "
              f"{refills} windows refilled after losses; dropped at the box's sockets {box_drops:,}, "
              f"at the pod's {pod_drops:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
