"""The Initial flood's harness: 200 flood sockets, the kernel's drop counters, an in-process
router instrumented to pair every send with the datagram it answers, real aioquic pods and
legitimate handshakes that run beside the flood, and samples of the router process."""

from __future__ import annotations

import asyncio
import errno
import itertools
import random
import socket
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aioquic.asyncio import connect

from discovery.targets import Target
from router import constants as c
from router.demo.pki import DemoPki
from router.demo.quic_pods import WHOAMI, bound_port, client_configuration, request, start_quic_pod
from router.metrics import RouterMetrics
from router.outcomes import QuicDropReason
from router.udp.edge import UdpRouter
from tests.support.names import host as sni
from tests.support.polling import becomes_true, deliberate_pause
from tests.support.quic_flood_forge import PENDING_KINDS, REFUSED_KINDS, FloodForge
from tests.support.router_probes import rss_kib
from tests.support.router_process import RouterProcess

ROUTER_HOST = "127.0.0.1"
POD_HOSTS = {"stargate-0": "127.0.0.2", "stargate-1": "127.0.0.3"}
FLOOD_HOSTS = tuple(f"127.0.0.{i}" for i in range(10, 60))
SOCKETS_PER_HOST = 4
"""50 addresses x 4 ports = 200 flood sockets."""
WINDOW = 24
"""In process, datagrams in flight to the router at most: well under its socket buffer."""
LEGIT_CONCURRENCY = 4
HANDSHAKE_TIMEOUT_S = 10.0
LEGIT_PORTS = itertools.cycle(range(20_000, 32_000))
"""Local ports of the legitimate clients: below the ephemeral range the flood's sockets take theirs
from, each used once per test."""


async def whoami(port: int, pod: str, cafile: Path) -> str:
    """One handshake + stream round trip from a fresh local port; the pod name that answered."""
    config = client_configuration(sni(pod), cafile)
    for _ in range(50):
        try:
            async with connect(ROUTER_HOST, port, configuration=config, local_port=next(LEGIT_PORTS)) as client:
                answer = await request(client, WHOAMI)
                return answer.partition(b":")[0].decode()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise ConnectionError("no free local port")


class FloodSockets:
    """200 non-blocking UDP sockets on 127.0.0.10-59; every reply is captured as it arrives."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.sockets: list[socket.socket] = []
        self.replies: dict[socket.socket, list[bytes]] = defaultdict(list)
        for host in FLOOD_HOSTS:
            for _ in range(SOCKETS_PER_HOST):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.bind((host, 0))
                sock.setblocking(False)
                self.sockets.append(sock)
                loop.add_reader(sock.fileno(), self._drain, sock)
        self.addresses = {s.getsockname() for s in self.sockets}
        self.kinds = {s: REFUSED_KINDS if i % 2 else PENDING_KINDS for i, s in enumerate(self.sockets)}

    def pick(self, rng: random.Random) -> tuple[socket.socket, dict[str, int]]:
        sock = self.sockets[rng.randrange(len(self.sockets))]
        return sock, self.kinds[sock]

    def _drain(self, sock: socket.socket) -> None:
        while True:
            try:
                self.replies[sock].append(sock.recv(65536))
            except BlockingIOError:
                return

    def all_replies(self) -> list[bytes]:
        return [r for replies in self.replies.values() for r in replies]

    def close(self) -> None:
        for sock in self.sockets:
            self.loop.remove_reader(sock.fileno())
            sock.close()


def _udp_rows(ports: set[tuple[str, int]]) -> list[list[str]]:
    """The ``/proc/net/udp`` rows of these local (host, port) sockets, split into fields."""
    wanted = {f"{int.from_bytes(socket.inet_aton(h), 'little'):08X}:{p:04X}" for h, p in ports}
    with open("/proc/net/udp") as table:
        next(table)
        return [fields for line in table if (fields := line.split())[1] in wanted]


def kernel_drops(ports: set[tuple[str, int]]) -> int:
    """Datagrams the kernel dropped at these local (host, port) sockets (``/proc/net/udp``)."""
    return sum(int(fields[-1]) for fields in _udp_rows(ports))


def kernel_queued(ports: set[tuple[str, int]]) -> int:
    """Bytes waiting unread in these local (host, port) sockets' receive queues (``/proc/net/udp``)."""
    return sum(int(fields[4].partition(":")[2], 16) for fields in _udp_rows(ports))


class RouterAudit:
    """Pairs every router send with the datagram being handled; tracks pending flows and memory."""

    def __init__(self, router: UdpRouter, metrics: RouterMetrics, flood: set[tuple[str, int]]) -> None:
        self.router, self.flood = router, flood
        self.current: tuple[Any, int] | None = None
        self.processed = 0
        self.answers: list[tuple[int, int, bool]] = []
        """(answer size, provoking datagram size, is Version Negotiation) of every send to a flood address."""
        self.orphans = 0
        """Sends to a flood address outside the handling of that address's datagram."""
        self.max_pending = 0
        self.max_flow_bytes = 0
        self.max_pending_bytes = 0
        self.legit_drops = 0.0
        """Drops of legitimate clients' datagrams (a full pending table refuses them too)."""
        handle, make_room, send = router.demux._judged, router.table.make_room, router.refusals.send

        def evicting(address: Any) -> Any:  # an eviction counts for the evicted flow's address
            pending = make_room(address)
            if pending is not None:
                evicted = max(1, len(pending.datagrams))
                legit_current = self.current is not None and self.current[0] not in self.flood
                if pending.address in self.flood and legit_current:
                    self.legit_drops -= evicted
                elif pending.address not in self.flood and not legit_current:
                    self.legit_drops += evicted
            return pending

        def judged(first: Any, data: bytes, addr: Any, now: float) -> None:
            self.current = (addr, len(data))
            before = None if addr in self.flood else sum(dropped_counts(metrics).values())
            try:
                handle(first, data, addr, now)
            finally:
                self.current = None
            if before is not None:
                self.legit_drops += sum(dropped_counts(metrics).values()) - before
            if addr in self.flood:
                self.processed += 1
                self.max_pending = max(self.max_pending, router.pending_flows)
                if self.processed % 16 == 0:
                    self.sample_memory()

        def sending(data: bytes, addr: Any) -> bool:
            self._sent(data, addr)
            return send(data, addr)

        # Every flood datagram comes from an address with no flow, so is judged (``verdicts.judge``).
        router.demux._judged = judged  # type: ignore[method-assign]
        router.table.make_room = evicting  # type: ignore[method-assign]
        router.refusals.send = sending

    def _sent(self, data: bytes, addr: Any) -> None:
        if addr not in self.flood:
            return
        if self.current is None or self.current[0] != addr:
            self.orphans += 1
        else:
            self.answers.append((len(data), self.current[1], data[1:5] == bytes(4)))

    def sample_memory(self) -> None:
        """Bytes the pending flows hold: their queued datagrams plus their CRYPTO reassembly buffers."""
        total = 0
        for pending in self.router.table.pending_flows():
            held = pending.buffered_bytes + len(pending.sniffer._crypto._buf)
            self.max_flow_bytes = max(self.max_flow_bytes, held)
            total += held
        self.max_pending_bytes = max(self.max_pending_bytes, total)


@asynccontextmanager
async def quic_pods(pki: DemoPki) -> AsyncIterator[dict[str, Target]]:
    pods = {name: await start_quic_pod(name, host, 0, pki.cert_path, pki.key_path)
            for name, host in POD_HOSTS.items()}
    try:
        yield {name: Target(name, POD_HOSTS[name], 1, bound_port(pod)) for name, pod in pods.items()}
    finally:
        for pod in pods.values():
            pod.close()


@dataclass
class Legit:
    """Real aioquic handshakes + one stream round trip each, run until told to stop."""

    ok: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.ok + len(self.failed)

    async def run(self, port: int, cafile: Path, stop: asyncio.Event) -> None:
        """Handshakes on LEGIT_CONCURRENCY lanes until ``stop``; those under way then still count."""
        async def one(i: int) -> None:
            pod = f"stargate-{i % 2}"
            started = time.perf_counter()
            try:
                got = await asyncio.wait_for(whoami(port, pod, cafile), HANDSHAKE_TIMEOUT_S)
            except (ConnectionError, TimeoutError) as exc:
                self.failed.append(f"{pod}: {exc!r}")
                return
            self.seconds.append(time.perf_counter() - started)
            if got == pod:
                self.ok += 1
            else:
                self.failed.append(f"{pod} answered by {got}")

        async def lane(first: int) -> None:
            i = first
            while not stop.is_set():
                await one(i)
                i += LEGIT_CONCURRENCY

        await asyncio.gather(*(lane(i) for i in range(LEGIT_CONCURRENCY)))

    def summary(self) -> str:
        ordered = sorted(self.seconds) or [0.0]
        p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        failures = Counter(reason.split(":", 1)[-1].strip()[:60] for reason in self.failed)
        return (f"legit handshakes {self.ok}/{self.total} ({100 * self.ok / max(1, self.total):.2f} %), "
                f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms"
                + (f", failures {dict(failures)}" if failures else ""))


def dropped_counts(metrics: RouterMetrics) -> dict[str, float]:
    """``quic_dropped_datagrams_total`` by reason, 0 for a reason never counted."""
    name = f"{c.QUIC_DROPPED_DATAGRAMS_TOTAL}_total"
    return {r: metrics.registry.get_sample_value(name, {"reason": r}) or 0.0 for r in QuicDropReason}


FLOOD_STRETCH = 8
"""How much longer than its datagrams a flood may last while too few real handshakes ran beside it."""


async def send_flood(
    flood: FloodSockets, forge: FloodForge, rng: random.Random, port: int, datagrams: int, legit: Legit,
    min_handshakes: int, rate_per_s: int, burst: int, backlog: Callable[[int], int] | None = None,
) -> tuple[int, float]:
    """Send forged datagrams to the router at ``rate_per_s``, ``burst`` at a time, for at least
    ``datagrams`` and until ``min_handshakes`` real ones ran beside them (at most ``FLOOD_STRETCH``
    times longer: a loaded machine completes fewer handshakes per second);
    with ``backlog`` (sent -> not yet read) also never more than WINDOW ahead of the router.
    Returns (datagrams sent, seconds)."""
    started, sent, i = time.perf_counter(), 0, -1
    while i + 1 < datagrams or (legit.total < min_handshakes and i + 1 < FLOOD_STRETCH * datagrams):
        i += 1
        sock, kinds = flood.pick(rng)
        try:
            sock.sendto(forge.datagram(sock, kinds)[1], (ROUTER_HOST, port))
            sent += 1
        except BlockingIOError:
            pass
        if i % burst == burst - 1:
            await deliberate_pause(max(0.0, started + (i + 1) / rate_per_s - time.perf_counter()),
                                   "the flood's pacing: rate_per_s, burst by burst")
            if backlog is not None:  # up to 50 ms for the router to catch up, yielding the loop to it
                await becomes_true(lambda behind=backlog, n=sent: behind(n) <= WINDOW, 0.05, interval_s=0)
    return sent, time.perf_counter() - started


@dataclass
class ProcessSamples:
    """The highest pending-flow gauge and RSS seen while sampling the router process."""

    max_pending: float = 0.0
    max_rss_kib: int = 0


async def sample_process(proc: RouterProcess, samples: ProcessSamples, stop: asyncio.Event) -> None:
    """Scrape and measure the router process every 0.1 s until ``stop``."""
    while not stop.is_set():
        pending = await asyncio.to_thread(proc.metric, c.PENDING_FLOWS)
        samples.max_pending = max(samples.max_pending, pending)
        samples.max_rss_kib = max(samples.max_rss_kib, rss_kib(proc.all_pids()))
        await deliberate_pause(0.1, "the sampling period")
