"""Where a middle box's CPU per relayed datagram goes: ``python -m bench.udp_profile``.

Runs the ``udp_echo`` load (each flow opened by a real Initial, ``ECHO_WINDOW`` datagrams of
1,200 bytes in flight, echoed by the pod), or with ``--shape download|relay`` the
``udp_download`` / ``udp_relay`` load (the pod, or the clients, send round-robin on every flow as
fast as they can, one ``sendto`` each; ``download-gso`` / ``relay-gso``: GSO batches of
``GSO_SEGMENTS``), through the router and nginx (and ``--floor``:
bench/udp_floor, the router's batching in C and nothing else) in interleaved rounds,
and prints each one's CPU per relayed datagram split into user and system time: the part a
faster router could still cut is its user time, the rest is the kernel's UDP work, which every
box pays (on loopback a send also pays the receiving socket's delivery). Beside it: the pod's and
the clients' CPU per echo (per delivered datagram for the others) under each box, the windows
they refilled after losses, and the datagrams the kernel dropped at the box's and the pod's
sockets (full receive buffers). ``--strace`` counts the router's system calls per datagram
instead (how well the batching works). The clients and pod are bench/udp_peers.c where a C
compiler is found (the bench's own choice), the Python ones with ``--python-peers``.

    python -m bench.udp_profile --flows 1 --rounds 4
    python -m bench.udp_profile --flows 1 --rounds 4 --python-peers
    python -m bench.udp_profile --flows 100 --strace
    python -m bench.udp_profile --shape download --flows 100 --rounds 4
    python -m bench.udp_profile --floor /tmp/udp_floor   # bench/udp_floor: the floor too
    python -m bench.udp_profile --shape relay --flows 100 --floor /tmp/udp_floor --floor-io-uring
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import udp_peers
from bench.context import POD, POD_HOST, SNI
from bench.procs import Agent, Nginx, PeerProcess, Router, call_all, cpu_split, free_port, syscall_counts, udp_drops
from bench.quic_load import (
    client_initials,
    count_flow_datagrams,
    retire_udp_flows,
    start_udp_sink,
    udp_blast,
    udp_echo_window,
    udp_sink_blast,
    udp_sink_forget_sources,
    udp_sink_stats,
    use_c_peers,
)
from bench.quic_scenarios import DATAGRAM_BYTES, ECHO_WINDOW, GSO_SEGMENTS, establish_flows

Box = tuple[tuple[str, int], int]
"""(address the clients send to, pid of the middle box)."""
Figures = tuple[float, float, float, int, float, int, int, int]
"""Rate, the box's user and system us per datagram, datagrams relayed, the peers' us per unit,
refills, drops at the box's sockets and at the pod's."""


Load = Callable[[Agent, Agent, float], tuple[int, int, float, int]]
"""Runs one shape's load for some seconds: (units, datagrams relayed, elapsed, refills)."""


def _measured(load: Load, pod: Agent, clients: Agent, box: Box, flows: int, seconds: float) -> Figures:
    """Open ``flows`` through ``box`` (each with an Initial of its own, confirmed as the bench's
    loads are: ``quic_scenarios.establish_flows``), run ``load`` and read around it: units per second, the box's
    user and system CPU microseconds per relayed datagram, the datagrams relayed, the pod's and
    the clients' CPU microseconds per unit, the windows refilled after losses, and the datagrams
    dropped at the box's sockets and at the pod's (full receive buffers)."""
    addr, pid = box
    pod.call(udp_sink_forget_sources)  # the pod sends only to this case's flows
    establish_flows(clients, addr, client_initials(SNI, flows))
    time.sleep(0.1)
    user0, sys0 = cpu_split(pid)
    peers0 = sum(sum(cpu_split(peer.pid)) for peer in (pod, clients))
    drops0 = udp_drops(pid), udp_drops(pod.pid)
    units, relayed, elapsed, refills = load(pod, clients, seconds)
    user1, sys1 = cpu_split(pid)
    peers = sum(sum(cpu_split(peer.pid)) for peer in (pod, clients)) - peers0
    box_drops, pod_drops = udp_drops(pid) - drops0[0], udp_drops(pod.pid) - drops0[1]
    clients.call(retire_udp_flows)
    time.sleep(0.2)  # what is still queued drains
    relayed = max(relayed, 1)
    return (units / elapsed, (user1 - user0) / relayed * 1e6, (sys1 - sys0) / relayed * 1e6, relayed,
            peers / max(units, 1) * 1e6, refills, box_drops, pod_drops)


def _echo(pod: Agent, clients: Agent, seconds: float) -> tuple[int, int, float, int]:
    """``udp_echo``: each echo crosses the box twice."""
    echoes, refills, elapsed = clients.call(udp_echo_window, seconds, DATAGRAM_BYTES, ECHO_WINDOW)
    return echoes, 2 * echoes, elapsed, refills


def _download(pod: Agent, clients: Agent, seconds: float, segments: int = 1) -> tuple[int, int, float, int]:
    """``udp_download``: pod -> clients, per datagram delivered to the clients; ``segments`` per
    GSO send of the pod (1: one datagram per call)."""
    clients.submit(count_flow_datagrams, seconds + 0.3)
    _sent, elapsed = pod.call(udp_sink_blast, seconds, DATAGRAM_BYTES, segments)
    delivered = clients.result()
    return delivered, delivered, elapsed, 0


def _relay(pod: Agent, clients: Agent, seconds: float, segments: int = 1) -> tuple[int, int, float, int]:
    """``udp_relay``: clients -> pod, per datagram delivered to the pod; ``segments`` per GSO send
    of the clients (1: one datagram per call)."""
    before = pod.call(udp_sink_stats)[0]
    _sent, elapsed = clients.call(udp_blast, seconds, DATAGRAM_BYTES, segments)
    time.sleep(0.2)  # let queued datagrams drain through the middle box
    delivered = pod.call(udp_sink_stats)[0] - before
    return delivered, delivered, elapsed, 0


class UdpFloor(PeerProcess):
    """``bench/udp_floor``: the router's batching in C with nothing else, as a third box."""

    kind = "floor"

    def __init__(self, binary: Path, pod_host: str, pod_port: int, io_uring: bool = False) -> None:
        self.port = free_port(socket.SOCK_DGRAM)
        ring = ["io_uring"] if io_uring else []
        self._start([str(binary), str(self.port), pod_host, str(pod_port), *ring], [self.port], True, "udp_floor")


SHAPES: dict[str, Load] = {
    "echo": _echo,
    "download": _download,
    "download-gso": functools.partial(_download, segments=GSO_SEGMENTS),
    "relay": _relay,
    "relay-gso": functools.partial(_relay, segments=GSO_SEGMENTS),
}
"""``--shape``: the load each round runs (the pod echoes only for ``echo``; the ``-gso`` loads'
senders send GSO batches of ``GSO_SEGMENTS``, as GSO-sending QUIC stacks do)."""


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
                   help="echo (udp_echo, the default), download (udp_download), relay (udp_relay), or "
                        "download-gso / relay-gso (the same from a pod / clients sending GSO batches of 10)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--seconds", type=float, default=3.0, help="load per box and round (default 3)")
    p.add_argument("--strace", action="store_true", help="the router's system calls per datagram")
    p.add_argument("--floor", type=Path, help="also measure this build of bench/udp_floor")
    p.add_argument("--floor-io-uring", action="store_true",
                   help="the floor sends a batch to many pods in one io_uring_enter, as the splice does where it can")
    p.add_argument("--python-peers", action="store_true",
                   help="the clients and pod in Python instead of bench/udp_peers.c (as without a C compiler)")
    args = p.parse_args(argv)
    peers = None if args.python_peers else udp_peers.build()
    workdir = Path(tempfile.mkdtemp(prefix="udp-profile-"))
    results: dict[str, list[Figures]] = {}
    with contextlib.ExitStack() as stack:
        pod, clients = Agent("udp-pod"), Agent("udp-clients")
        stack.callback(pod.close)
        stack.callback(clients.close)
        call_all([pod, clients], use_c_peers, [(peers,), (peers,)])
        port = pod.call(start_udp_sink, POD_HOST, args.shape == "echo")
        router = Router(workdir, [(POD, POD_HOST, 1, port)])
        stack.callback(router.close)
        boxes: dict[str, Box] = {"router": (("127.0.0.1", router.udp_port), router.pid)}
        shape = SHAPES[args.shape]

        def run(pod: Agent, clients: Agent, box: Box, flows: int, seconds: float) -> Figures:
            return _measured(shape, pod, clients, box, flows, seconds)

        if args.strace:
            run(pod, clients, boxes["router"], args.flows, 1.0)  # warm up
            _strace(router.pid, lambda: run(pod, clients, boxes["router"], args.flows, args.seconds))
            return 0
        nginx = Nginx(workdir, POD_HOST, port)
        stack.callback(nginx.close)
        boxes["nginx"] = (("127.0.0.1", nginx.port), nginx.pid)
        if args.floor is not None:
            floor = UdpFloor(args.floor, POD_HOST, port, args.floor_io_uring)
            stack.callback(floor.close)
            boxes["floor"] = (("127.0.0.1", floor.port), floor.pid)
        names = list(boxes)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                results.setdefault(name, []).append(run(pod, clients, boxes[name], args.flows, args.seconds))
    echo = args.shape == "echo"
    shape = f"x {ECHO_WINDOW} in flight" if echo else f"({args.shape})"
    unit = "echoes/s" if echo else "datagrams/s"
    per = "echo" if echo else "delivered datagram"
    print(f"{args.rounds} rounds x {args.seconds:g} s per box, {args.flows} flow(s) {shape}, "
          f"{udp_peers.describe(peers)}")
    nginx_rate = statistics.median(row[0] for row in results["nginx"]) if "nginx" in results else None
    for name, rows in results.items():
        rate, user, system = (statistics.median(row[i] for row in rows) for i in range(3))
        versus = f" ({rate / nginx_rate:.2f}x nginx)" if nginx_rate else ""
        peers, refills = statistics.median(row[4] for row in rows), sum(row[5] for row in rows)
        box_drops, pod_drops = sum(row[6] for row in rows), sum(row[7] for row in rows)
        print(f"{name:7s} {rate:9,.0f} {unit}{versus}  {user + system:5.2f} us CPU per datagram "
              f"(user {user:4.2f}, system {system:4.2f}); the pod and clients {peers:5.2f} us per {per}, "
              f"{refills} windows refilled after losses; dropped at the box's sockets {box_drops:,}, "
              f"at the pod's {pod_drops:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
