"""Where a middle box's CPU per relayed datagram goes: ``python -m bench.udp_profile``.

Runs the ``udp_echo`` load (each flow opened by a real Initial, ``ECHO_WINDOW`` datagrams of
1,200 bytes in flight, echoed by the pod), or with ``--shape download`` the ``udp_download``
load (the pod sends round-robin to every flow as fast as it can, one ``sendto`` each), through
the router and nginx in interleaved rounds and prints each one's CPU per relayed datagram split
into user and system time: the part a faster router could still cut is its user time, the rest
is the kernel's UDP work, which both boxes pay (on loopback a send also pays the receiving
socket's delivery). Beside it: the pod's and the clients' CPU per echo (per delivered datagram
for the download) under each box, the windows they refilled after losses, and the datagrams the
kernel dropped at the box's and the pod's sockets (full receive buffers). ``--strace`` counts
the router's system calls per datagram instead (how well the batching works).

    python -m bench.udp_profile --flows 1 --rounds 4
    python -m bench.udp_profile --flows 100 --strace
    python -m bench.udp_profile --shape download --flows 100 --rounds 4
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.context import POD, POD_HOST, SNI
from bench.procs import Agent, Nginx, Router, cpu_split, syscall_counts, udp_drops
from bench.quic_load import (
    client_initials,
    count_flow_datagrams,
    retire_udp_flows,
    start_udp_sink,
    udp_echo_window,
    udp_sink_blast,
    udp_sink_forget_sources,
)
from bench.quic_scenarios import DATAGRAM_BYTES, ECHO_WINDOW, establish_flows

Box = tuple[tuple[str, int], int]
"""(address the clients send to, pid of the middle box)."""
Figures = tuple[float, float, float, int, float, int, int, int]
"""Rate, the box's user and system us per datagram, datagrams relayed, the peers' us per unit,
refills, drops at the box's sockets and at the pod's."""


def _echo(pod: Agent, clients: Agent, box: Box, flows: int, flights: list[list[bytes]],
          seconds: float) -> Figures:
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


def _download(pod: Agent, clients: Agent, box: Box, flows: int, flights: list[list[bytes]],
              seconds: float) -> Figures:
    """The same figures for pod -> client datagrams (``udp_download``): per datagram delivered to
    the clients, no refills (nothing is echoed)."""
    addr, pid = box
    pod.call(udp_sink_forget_sources)  # the pod sends only to this case's flows
    establish_flows(clients, pod, addr, flows, flights)
    time.sleep(0.1)
    user0, sys0 = cpu_split(pid)
    peers0 = sum(sum(cpu_split(peer.pid)) for peer in (pod, clients))
    drops0 = udp_drops(pid), udp_drops(pod.pid)
    clients.submit(count_flow_datagrams, seconds + 0.3)
    _sent, elapsed = pod.call(udp_sink_blast, seconds, DATAGRAM_BYTES)
    delivered = clients.result()
    user1, sys1 = cpu_split(pid)
    peers = sum(sum(cpu_split(peer.pid)) for peer in (pod, clients)) - peers0
    box_drops, pod_drops = udp_drops(pid) - drops0[0], udp_drops(pod.pid) - drops0[1]
    clients.call(retire_udp_flows)
    relayed = max(delivered, 1)
    return (delivered / elapsed, (user1 - user0) / relayed * 1e6, (sys1 - sys0) / relayed * 1e6, relayed,
            peers / relayed * 1e6, 0, box_drops, pod_drops)


SHAPES = {"echo": _echo, "download": _download}
"""``--shape``: the load each round runs."""


def _strace(pid: int, load: Callable[[], Figures]) -> None:
    calls, relayed = syscall_counts(pid, lambda: load()[3])
    busy = {k: v for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v >= relayed / 1000}
    detail = ", ".join(f"{k} {v / relayed:.3f}" for k, v in busy.items())
    print(f"router: {relayed} datagrams relayed, {sum(calls.values()) / relayed:.3f} system calls per "
          f"datagram: {detail}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.udp_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flows", type=int, default=1, help="flows (default 1)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="echo",
                   help="echo (udp_echo, the default) or download (udp_download)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--seconds", type=float, default=3.0, help="load per box and round (default 3)")
    p.add_argument("--strace", action="store_true", help="the router's system calls per datagram")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="udp-profile-"))
    results: dict[str, list[Figures]] = {}
    with contextlib.ExitStack() as stack:
        pod, clients = Agent("udp-pod"), Agent("udp-clients")
        stack.callback(pod.close)
        stack.callback(clients.close)
        port = pod.call(start_udp_sink, POD_HOST, True)
        router = Router(workdir, [(POD, POD_HOST, 1, port)])
        stack.callback(router.close)
        flights = client_initials(SNI, args.flows)
        boxes: dict[str, Box] = {"router": (("127.0.0.1", router.udp_port), router.pid)}
        run = SHAPES[args.shape]
        if args.strace:
            run(pod, clients, boxes["router"], args.flows, flights, 1.0)  # warm up
            _strace(router.pid, lambda: run(pod, clients, boxes["router"], args.flows, flights, args.seconds))
            return 0
        nginx = Nginx(workdir, POD_HOST, port)
        stack.callback(nginx.close)
        boxes["nginx"] = (("127.0.0.1", nginx.port), nginx.pid)
        names = list(boxes)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                results.setdefault(name, []).append(run(pod, clients, boxes[name], args.flows, flights,
                                                        args.seconds))
    shape = f"x {ECHO_WINDOW} in flight" if args.shape == "echo" else "downloading"
    unit = "echoes/s" if args.shape == "echo" else "datagrams/s"
    per = "echo" if args.shape == "echo" else "delivered datagram"
    print(f"{args.rounds} rounds x {args.seconds:g} s per box, {args.flows} flow(s) {shape}")
    for name, rows in results.items():
        rate, user, system = (statistics.median(row[i] for row in rows) for i in range(3))
        peers, refills = statistics.median(row[4] for row in rows), sum(row[5] for row in rows)
        box_drops, pod_drops = sum(row[6] for row in rows), sum(row[7] for row in rows)
        print(f"{name:7s} {rate:9,.0f} {unit}  {user + system:5.2f} us CPU per datagram "
              f"(user {user:4.2f}, system {system:4.2f}); the pod and clients {peers:5.2f} us per {per}, "
              f"{refills} windows refilled after losses; dropped at the box's sockets {box_drops:,}, "
              f"at the pod's {pod_drops:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
