"""Initial flood: garbage, truncated and valid-looking Initials from 200 source ports, with real
aioquic handshakes in parallel.

What must hold while the flood runs (issue "Hardening"):

* legitimate handshakes (aioquic client -> router -> aioquic pod, one stream round trip)
  still succeed, >= 99 %;
* pending (not yet routed) flows never exceed ``max_pending_flows``, and each holds at most
  its datagram budget plus one ClientHello's worth of CRYPTO reassembly;
* no reply is larger than the datagram that provoked it (checked exactly in process, where
  every send is paired with the datagram being handled, and from the outside by matching
  each reply's DCID to the attempt it answers);
* the drop counters account for the datagrams: every flood datagram the router read is
  either counted under a ``quic_dropped_datagrams_total`` reason or answered with a
  CONNECTION_CLOSE (a Version Negotiation answer is counted as a ``not_initial`` drop too).

Default run: 10,000 datagrams in process, 5,000 against the real router process;
``-m slow``: 100,000 each. Every figure is printed (``pytest -s``) for the README.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import os
import random
import socket
import time
import tracemalloc
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aioquic.asyncio import connect

from discovery.targets import Target, TargetSnapshot
from quic.clienthello import MAX_TLS_CLIENT_HELLO_BYTES
from quic.frames import QUIC_MAX_CRYPTO_BYTES
from quic.initial_keys import client_initial_keys, encrypt_initial
from quic.initial_sniffer import InitialSniffer
from quic.packet import QUIC_V1, QUIC_V2, QUIC_VERSION_NEGOTIATION, QuicPacketError, parse_long_header
from router import constants as c
from router.demo.pki import DemoPki, make_pki
from router.demo.quic_pods import WHOAMI, bound_port, client_configuration, request, start_quic_pod
from router.hostname import HostnameTemplate
from router.metrics import RouterMetrics
from router.udp.edge import UdpRouter
from router.udp.settings import UdpRouterSettings
from tests.faults import rss_kib
from tests.quic_initial_rewriter import client_first_flight, crypto_frame, open_flight
from tests.router_process import RouterProcess, router_args, write_endpoints

ROUTER_HOST = "127.0.0.1"
POD_HOSTS = {"stargate-0": "127.0.0.2", "stargate-1": "127.0.0.3"}
FLOOD_HOSTS = tuple(f"127.0.0.{i}" for i in range(10, 60))
SOCKETS_PER_HOST = 4
"""50 addresses x 4 ports = 200 flood sockets."""
WINDOW = 24
"""In process, datagrams in flight to the router at most: well under its socket buffer."""
LEGIT_CONCURRENCY = 4
HANDSHAKE_TIMEOUT_S = 10.0
SNI_UNKNOWN = b"aaaaaaaaaaaaaaaa.nowhere.example"
SNI_NO_SUCH_POD = b"stargate-zzzzzzzz.stargate.external"
REFUSED_KINDS = {  # kind -> weight, for the half of the sockets whose attempts get refused
    "garbage": 15, "probe": 5, "short_initial": 12, "cut_initial": 12, "unknown_sni": 30, "retransmit": 14,
    "small_retransmit": 12,
}
PENDING_KINDS = {  # and for the half that keeps flows pending (their other datagrams queue behind)
    "partial_hello": 40, "garbage": 20, "unknown_sni": 20, "cut_initial": 20,
}


LEGIT_PORTS = itertools.cycle(range(20_000, 32_000))
"""Local ports of the legitimate clients, below the ephemeral range and never reused in a test:
a new connection to another pod from the address of a flow whose client spoke in the last
QUIC_FLOW_TAKEOVER_QUIET_MS is refused (see ``test_a_new_connection_from_a_reused_address_reaches_its_named_pod``)."""


def sni(pod: str) -> str:
    return f"{pod}.stargate.external"


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


# ---------------------------------------------------------------------------
# The flood's datagrams
# ---------------------------------------------------------------------------
@dataclass
class Attempt:
    """A refused-to-be attempt (unknown SNI) and every datagram that may earn its answer."""

    dcid: bytes
    sizes: list[int] = field(default_factory=list)


class FloodForge:
    """Builds flood datagrams from a real aioquic ClientHello, protected with real Initial keys."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.hellos = [_hello(SNI_UNKNOWN), _hello(SNI_NO_SUCH_POD)]
        self.last_refusable: dict[socket.socket, bytes] = {}
        self.attempts: dict[bytes, Attempt] = {}
        """Client SCID -> attempt: a CONNECTION_CLOSE answer is addressed to that SCID."""
        self.probes: dict[bytes, list[int]] = defaultdict(list)
        """SCID of a datagram that may earn Version Negotiation -> its sizes (the VN echoes it as DCID)."""

    def datagram(self, sock: socket.socket, kinds: dict[str, int]) -> tuple[str, bytes]:
        kind = self.rng.choices(list(kinds), list(kinds.values()))[0]
        last = self.last_refusable.get(sock)
        if kind in ("retransmit", "small_retransmit") and last is None:
            kind = "unknown_sni"
        if kind == "garbage":
            garbage = self._garbage()
            with contextlib.suppress(QuicPacketError):  # a random long header of an unknown version
                self.probes[parse_long_header(garbage).scid].append(len(garbage))
            return kind, garbage
        if kind == "probe":
            return kind, self._probe()
        if kind == "retransmit":
            assert last is not None
            self.attempts[_scid_of(last)].sizes.append(len(last))
            return kind, last
        if kind == "small_retransmit":  # header-only "Initial" for the refused DCID: 20-200 bytes
            assert last is not None
            header = parse_long_header(last)
            small = self._small_initial(header.version, header.dcid, header.scid, self.rng.randint(0, 150))
            self.attempts[header.scid].sizes.append(len(small))
            return kind, small
        version = self.rng.choice((QUIC_V1, QUIC_V2))
        dcid, scid = self.rng.randbytes(self.rng.choice((8, 8, 12, 20))), self.rng.randbytes(8)
        hello = self._random_sni(self.rng.choice(self.hellos))
        if kind == "unknown_sni":
            datagram = _initial(version, dcid, scid, crypto_frame(0, hello), self.rng.randint(1200, 1350))
            self.last_refusable[sock] = datagram
            self.attempts[scid] = Attempt(dcid, [len(datagram)])
            return kind, datagram
        if kind == "short_initial":
            return kind, _initial(version, dcid, scid, crypto_frame(0, hello), self.rng.randint(600, 1199))
        if kind == "cut_initial":
            whole = _initial(version, dcid, scid, crypto_frame(0, hello), 1250)
            return kind, whole[: self.rng.randint(7, len(whole) - 1)]
        # partial_hello: the ClientHello's start, or a lone piece far into the CRYPTO stream
        if self.rng.random() < 0.5:
            frames = crypto_frame(0, hello[: self.rng.randint(1, len(hello) - 1)])
        else:
            frames = crypto_frame(self.rng.randint(1000, QUIC_MAX_CRYPTO_BYTES - 1000), hello[:900])
        return kind, _initial(version, dcid, scid, frames, self.rng.randint(1200, 1350))

    def _garbage(self) -> bytes:
        data = bytearray(self.rng.randbytes(self.rng.randint(1, 1400)))
        if len(data) >= 5 and data[0] & 0x80 and int.from_bytes(data[1:5], "big") in (QUIC_V1, QUIC_V2):
            data[1] ^= 0x55  # never a real version: garbage stays garbage
        return bytes(data)

    def _probe(self) -> bytes:
        scid = self.rng.randbytes(8)
        probe = b"\xc0" + (0x1A2A3A4A).to_bytes(4, "big") + b"\x08" + self.rng.randbytes(8) + b"\x08" + scid
        probe = probe.ljust(self.rng.randint(1200, 1300), b"\x00")
        self.probes[scid].append(len(probe))
        return probe

    def _small_initial(self, version: int, dcid: bytes, scid: bytes, tail: int) -> bytes:
        first = 0xC0 | ((1 if version == QUIC_V2 else 0) << 4)
        head = bytes((first,)) + version.to_bytes(4, "big") + bytes((len(dcid),)) + dcid
        head += bytes((len(scid),)) + scid + b"\x00"  # no token
        return head + bytes((0x40 | tail >> 8, tail & 0xFF)) + self.rng.randbytes(tail)

    def _random_sni(self, hello: bytes) -> bytes:
        for name, run in ((SNI_UNKNOWN, 16), (SNI_NO_SUCH_POD[9:], 8)):
            at = hello.find(name)
            if at >= 0:
                letters = bytes(self.rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(run))
                return hello[:at] + letters + hello[at + run :]
        return hello


def _hello(server_name: bytes) -> bytes:
    _, flight = client_first_flight(server_name=server_name.decode())
    return open_flight(flight).crypto


def _initial(version: int, dcid: bytes, scid: bytes, frames: bytes, size: int) -> bytes:
    """A protected client Initial of about ``size`` bytes (PADDING after the frames)."""
    overhead = 1 + 4 + 1 + len(dcid) + 1 + len(scid) + 1 + 2 + 1 + 16
    payload = frames + bytes(max(0, size - overhead - len(frames)))
    return encrypt_initial(version, dcid, scid, 0, payload, client_initial_keys(version, dcid))


def _scid_of(datagram: bytes) -> bytes:
    return parse_long_header(datagram).scid


# ---------------------------------------------------------------------------
# Sockets, replies, kernel counters
# ---------------------------------------------------------------------------
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


def kernel_drops(ports: set[tuple[str, int]]) -> int:
    """Datagrams the kernel dropped at these local (host, port) sockets (``/proc/net/udp``)."""
    wanted = {f"{int.from_bytes(socket.inet_aton(h), 'little'):08X}:{p:04X}" for h, p in ports}
    total = 0
    with open("/proc/net/udp") as table:
        next(table)
        for line in table:
            fields = line.split()
            if fields[1] in wanted:
                total += int(fields[-1])
    return total


@dataclass
class ReplyCheck:
    """Replies seen from outside, matched to what may have provoked them."""

    vn: int = 0
    closes: int = 0
    most_answers: int = 0
    """Most CONNECTION_CLOSEs one attempt got: QUIC_ANSWERS_PER_REJECTION unless its address
    interleaved another attempt (one remembered attempt per address, by design)."""
    violations: list[str] = field(default_factory=list)


def check_replies(replies: list[bytes], forge: FloodForge) -> ReplyCheck:
    """Each VN echoes one datagram no smaller than it; each CONNECTION_CLOSE answers one attempt, at
    most as often as that attempt sent datagrams at least as large as the answer."""
    result = ReplyCheck()
    per_attempt: Counter[bytes] = Counter()
    sizes: dict[bytes, int] = {}
    for reply in replies:
        try:
            header = parse_long_header(reply)
        except QuicPacketError:
            result.violations.append(f"unparseable {len(reply)}-byte reply")
            continue
        if header.version == QUIC_VERSION_NEGOTIATION:
            result.vn += 1
            sizes_sent = forge.probes.get(header.dcid, [])
            fitting = [s for s in sizes_sent if s >= len(reply)]
            if not fitting:
                result.violations.append(f"VN of {len(reply)} bytes answers no datagram of that size or more")
            else:
                sizes_sent.remove(min(fitting))  # one answer per datagram
            continue
        attempt = forge.attempts.get(header.dcid)
        if header.version not in (QUIC_V1, QUIC_V2) or attempt is None:
            result.violations.append(f"{len(reply)}-byte reply to no attempt of ours")
            continue
        result.closes += 1
        per_attempt[header.dcid] += 1
        sizes[header.dcid] = len(reply)
    for scid, count in per_attempt.items():
        eligible = sum(1 for s in forge.attempts[scid].sizes if s >= sizes[scid])
        if count > eligible:
            result.violations.append(f"{count} answers of {sizes[scid]} bytes, {eligible} datagrams that large")
        result.most_answers = max(result.most_answers, count)
    return result


# ---------------------------------------------------------------------------
# The in-process router, instrumented
# ---------------------------------------------------------------------------
class _SendProxy:
    def __init__(self, transport: Any, on_send: Callable[[bytes, Any], None]) -> None:
        self._transport, self._on_send = transport, on_send

    def sendto(self, data: bytes, addr: Any = None) -> None:
        self._on_send(data, addr)
        self._transport.sendto(data, addr)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class RouterAudit:
    """Pairs every router send with the datagram being handled; tracks pending flows and memory."""

    def __init__(self, router: UdpRouter, flood: set[tuple[str, int]]) -> None:
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
        handle, evict = router._from_client, router._evict

        def on_evict(pending: Any) -> None:  # an eviction counts for the evicted flow's address
            before = sum(_dropped(router._metrics).values())
            evict(pending)
            evicted = sum(_dropped(router._metrics).values()) - before
            legit_current = self.current is not None and self.current[0] not in self.flood
            if pending.address in self.flood and legit_current:
                self.legit_drops -= evicted
            elif pending.address not in self.flood and not legit_current:
                self.legit_drops += evicted

        def from_client(data: bytes, addr: Any) -> None:
            self.current = (addr, len(data))
            before = None if addr in self.flood else sum(_dropped(router._metrics).values())
            try:
                handle(data, addr)
            finally:
                self.current = None
            if before is not None:
                self.legit_drops += sum(_dropped(router._metrics).values()) - before
            if addr in self.flood:
                self.processed += 1
                self.max_pending = max(self.max_pending, router.pending_flows)
                if self.processed % 16 == 0:
                    self.sample_memory()

        router._from_client = from_client  # type: ignore[method-assign]
        router._evict = on_evict  # type: ignore[method-assign]
        router._transport = _SendProxy(router._transport, self._sent)  # type: ignore[assignment]

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
        for pending in self.router._table.pending_flows():
            held = pending.buffered_bytes + len(pending.sniffer._crypto._buf)
            self.max_flow_bytes = max(self.max_flow_bytes, held)
            total += held
        self.max_pending_bytes = max(self.max_pending_bytes, total)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DemoPki:
    return make_pki(tmp_path_factory.mktemp("pki"))


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


async def _eventually(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _dropped(metrics: RouterMetrics) -> dict[str, float]:
    name = f"{c.QUIC_DROPPED_DATAGRAMS_TOTAL}_total"
    return {r: metrics.registry.get_sample_value(name, {"reason": r}) or 0.0 for r in c.QUIC_DROP_REASONS}


# ---------------------------------------------------------------------------
# In process
# ---------------------------------------------------------------------------
async def _send_flood(
    flood: FloodSockets, forge: FloodForge, rng: random.Random, port: int, datagrams: int, legit: Legit,
    min_handshakes: int, rate_per_s: int, burst: int, backlog: Callable[[int], int] | None = None,
) -> tuple[int, float]:
    """Send forged datagrams to the router at ``rate_per_s``, ``burst`` at a time, for at least
    ``datagrams`` and until ``min_handshakes`` real ones ran beside them (at most 3x longer);
    with ``backlog`` (sent -> not yet read) also never more than WINDOW ahead of the router.
    Returns (datagrams sent, seconds)."""
    started, sent, i = time.perf_counter(), 0, -1
    while i + 1 < datagrams or (legit.total < min_handshakes and i + 1 < 3 * datagrams):
        i += 1
        sock, kinds = flood.pick(rng)
        try:
            sock.sendto(forge.datagram(sock, kinds)[1], (ROUTER_HOST, port))
            sent += 1
        except BlockingIOError:
            pass
        if i % burst == burst - 1:
            await asyncio.sleep(max(0.0, started + (i + 1) / rate_per_s - time.perf_counter()))
            if backlog is not None:
                wait_until = time.monotonic() + 0.05
                while backlog(sent) > WINDOW and time.monotonic() < wait_until:
                    await asyncio.sleep(0)
    return sent, time.perf_counter() - started


async def _flood_in_process(
    pki: DemoPki, datagrams: int, min_handshakes: int, legit_floor: float | None = 0.99,
    rate_per_s: int = 2_500, **overrides: Any
) -> tuple[RouterAudit, dict[str, float], Legit]:
    """Flood an in-process router (default settings but a 1 s pending timeout, so the table
    drains quickly; ``overrides`` change more) while real handshakes run; check and print."""
    loop = asyncio.get_running_loop()
    rng = random.Random(datagrams)
    settings = UdpRouterSettings(**{"pending_flow_timeout_s": 1.0, **overrides})
    metrics = RouterMetrics()
    async with quic_pods(pki) as targets:
        snapshot = TargetSnapshot.of(list(targets.values()))
        template = HostnameTemplate.parse(c.DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE, "default")
        router = UdpRouter(settings, template, lambda: snapshot, metrics)
        _, port = await router.start(ROUTER_HOST, 0)
        flood = FloodSockets(loop)
        audit = RouterAudit(router, flood.addresses)
        forge = FloodForge(rng)
        legit, stop, idle = Legit(), asyncio.Event(), Legit()
        try:
            for i in range(8):  # the same handshakes without a flood, for comparison
                started = time.perf_counter()
                await whoami(port, f"stargate-{i % 2}", pki.ca_path)
                idle.seconds.append(time.perf_counter() - started)
                idle.ok += 1
            legit_task = loop.create_task(legit.run(port, pki.ca_path, stop))
            # at rate_per_s, and never more than WINDOW ahead of the router
            sent, flood_seconds = await _send_flood(flood, forge, rng, port, datagrams, legit, min_handshakes,
                                                    rate_per_s, 8, lambda sent: sent - audit.processed)
            stop.set()
            await asyncio.wait_for(legit_task, 60)
            listener = {(ROUTER_HOST, port)}
            await _eventually(lambda: audit.processed + kernel_drops(listener) >= sent, "the router to read", 10)
            await _eventually(lambda: router.pending_flows == 0, "pending flows to expire", 5)
            await asyncio.sleep(0.1)  # late replies
            assert await whoami(port, "stargate-1", pki.ca_path) == "stargate-1"
        finally:
            flood.close()
            await router.close()

    drops = _dropped(metrics)
    replies = check_replies(flood.all_replies(), forge)
    answers_sent = len(audit.answers)
    vn_sent = sum(1 for _, _, vn in audit.answers if vn)
    largest_ratio = max((a / p for a, p, _ in audit.answers), default=0.0)
    flow_bound = settings.max_pending_bytes_per_flow + MAX_TLS_CLIENT_HELLO_BYTES
    print(
        f"\nin-process flood: {sent} datagrams sent from {len(flood.sockets)} ports in {flood_seconds:.1f} s "
        f"({sent / flood_seconds:.0f}/s); read by the router {audit.processed}, kernel drops "
        f"{kernel_drops({(ROUTER_HOST, port)})}\n  {legit.summary()} (without a flood: {idle.summary()})\n"
        f"  drops {({k: int(v) for k, v in drops.items() if v})} (of legit clients {audit.legit_drops:.0f}), "
        f"answers {answers_sent} "
        f"(VN {replies.vn}, CONNECTION_CLOSE {replies.closes}, at most {replies.most_answers} per attempt), "
        f"largest answer/provoking {largest_ratio:.3f}\n"
        f"  pending flows max {audit.max_pending} (bound {settings.max_pending_flows}), "
        f"per flow max {audit.max_flow_bytes} B (bound {flow_bound}), all pending max {audit.max_pending_bytes} B"
    )
    assert legit.total >= min_handshakes
    if legit_floor is not None:
        assert legit.ok >= legit_floor * legit.total, legit.failed[:5]
    assert audit.max_pending <= settings.max_pending_flows
    assert audit.max_flow_bytes <= flow_bound
    assert audit.max_pending_bytes <= settings.max_pending_flows * flow_bound
    assert audit.orphans == 0 and all(a <= p for a, p, _ in audit.answers)
    assert replies.violations == []
    assert replies.vn + replies.closes == len(flood.all_replies())
    assert sum(drops.values()) - audit.legit_drops + answers_sent - vn_sent == audit.processed
    assert len(flood.all_replies()) + kernel_drops(flood.addresses) >= answers_sent
    return audit, drops, legit


async def test_initial_flood_in_process(pki: DemoPki) -> None:
    await _flood_in_process(pki, datagrams=10_000, min_handshakes=100)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_initial_flood_in_process_100k(pki: DemoPki) -> None:
    await _flood_in_process(pki, datagrams=100_000, min_handshakes=1_000)


async def test_a_full_pending_table_stays_bounded_and_recovers(pki: DemoPki) -> None:
    """200 ports against a 64-flow pending table: the bound holds, the excess is counted, and once
    the flood stops the table drains and handshakes succeed again. While the table is full a new
    client's Initial evicts the oldest pending flow (a spoofed one: legitimate flows are decided in one
    round trip), so legitimate clients still get through (>= 95 %; before eviction some timed out)."""
    audit, drops, _ = await _flood_in_process(
        pki, datagrams=5_000, min_handshakes=12, legit_floor=0.95, rate_per_s=2_000, max_pending_flows=64
    )
    assert audit.max_pending == 64 and drops["pending_full"] > 0


async def test_an_oversized_initial_holds_no_pending_slot() -> None:
    """A valid Initial bigger than a pending flow may buffer (UDP allows 65,527 bytes) is dropped
    once, and leaves no empty pending flow behind to hold a slot until the timeout."""
    metrics = RouterMetrics()
    template = HostnameTemplate.parse(c.DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE, "default")
    router = UdpRouter(UdpRouterSettings(), template, TargetSnapshot, metrics)
    _, port = await router.start(ROUTER_HOST, 0)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        hello = _hello(SNI_UNKNOWN)
        oversized = _initial(QUIC_V1, os.urandom(8), os.urandom(8), crypto_frame(0, hello[:100]),
                             c.QUIC_MAX_PENDING_BYTES_PER_FLOW + 1000)
        sock.sendto(oversized, (ROUTER_HOST, port))
        await _eventually(lambda: _dropped(metrics)["pending_full"] == 1, "the oversized Initial's drop", 5)
        assert router.pending_flows == 0
        router.sweep(asyncio.get_running_loop().time() + 60)
        assert sum(_dropped(metrics).values()) == 1
    finally:
        sock.close()
        await router.close()


def test_a_lone_crypto_piece_far_into_the_stream_costs_no_big_buffer() -> None:
    """CRYPTO past the largest ClientHello can never complete one: refused, not reassembled."""
    dcid = os.urandom(8)
    for offset, fits in ((MAX_TLS_CLIENT_HELLO_BYTES - 100, True), (MAX_TLS_CLIENT_HELLO_BYTES + 100, False)):
        sniffer = InitialSniffer()
        datagram = _initial(QUIC_V1, dcid, os.urandom(8), crypto_frame(offset, b"x" * 100), 1200)
        if fits:
            assert sniffer.feed(datagram) is None
            assert len(sniffer._crypto._buf) <= MAX_TLS_CLIENT_HELLO_BYTES
        else:
            with pytest.raises(QuicPacketError):
                sniffer.feed(datagram)


async def test_pending_memory_per_address_is_bounded() -> None:
    """Worst case per source address, measured with tracemalloc: 16 datagrams of 2 KiB (the
    per-flow budget) whose CRYPTO pieces spread over the whole ClientHello range, never complete."""
    metrics = RouterMetrics()
    template = HostnameTemplate.parse(c.DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE, "default")
    router = UdpRouter(UdpRouterSettings(pending_flow_timeout_s=60.0), template, TargetSnapshot, metrics)
    _, port = await router.start(ROUTER_HOST, 0)
    loop = asyncio.get_running_loop()
    flood = FloodSockets(loop)
    per_flow = c.QUIC_MAX_PENDING_DATAGRAMS_PER_FLOW
    size = c.QUIC_MAX_PENDING_BYTES_PER_FLOW // per_flow
    flights = []
    for sock in flood.sockets:
        dcid, scid = os.urandom(8), os.urandom(8)
        keys = client_initial_keys(QUIC_V1, dcid)
        pieces = [crypto_frame(400 + 1000 * i, os.urandom(900)) for i in range(per_flow)]  # never from 0
        flights.append((sock, [encrypt_initial(QUIC_V1, dcid, scid, pn, piece + bytes(size - 43 - len(piece)), keys)
                               for pn, piece in enumerate(pieces)]))
    audit = RouterAudit(router, flood.addresses)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for pn in range(per_flow):
            for i, (sock, flight) in enumerate(flights):
                sock.sendto(flight[pn], (ROUTER_HOST, port))
                if i % WINDOW == WINDOW - 1 or i == len(flights) - 1:
                    sent = pn * len(flights) + i + 1
                    await _eventually(lambda n=sent: audit.processed == n, "the router to read", 10)
        grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
        flood.close()
        held = [p.buffered_bytes for p in router._table.pending_flows()]
        await router.close()
    per_address = grown / len(flights)
    bound = c.QUIC_MAX_PENDING_BYTES_PER_FLOW + MAX_TLS_CLIENT_HELLO_BYTES
    print(f"\npending memory: {len(flights)} addresses, {per_address / 1024:.1f} KiB each (datagram budget "
          f"{c.QUIC_MAX_PENDING_BYTES_PER_FLOW // 1024} KiB + CRYPTO {MAX_TLS_CLIENT_HELLO_BYTES // 1024} KiB); "
          f"at {c.QUIC_MAX_PENDING_FLOWS} pending flows: {per_address * c.QUIC_MAX_PENDING_FLOWS / 2**20:.0f} MiB")
    assert len(held) == len(flights) and max(held) <= c.QUIC_MAX_PENDING_BYTES_PER_FLOW
    assert per_address <= bound + 8 * 1024  # + the flow's objects, keys and reassembler bookkeeping


async def test_a_new_connection_from_a_reused_address_reaches_its_named_pod(pki: DemoPki) -> None:
    """The first client's socket closes and its port is reused while its flow is still established
    (300 s idle timeout): the new connection names another pod, and takes the address over once the
    old client has been quiet for the takeover grace (sooner it would be refused, never misrouted)."""
    async with quic_pods(pki) as targets:
        snapshot = TargetSnapshot.of(list(targets.values()))
        template = HostnameTemplate.parse(c.DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE, "default")
        metrics = RouterMetrics()
        router = UdpRouter(UdpRouterSettings(), template, lambda: snapshot, metrics)
        _, port = await router.start(ROUTER_HOST, 0)
        try:
            local_port = next(LEGIT_PORTS)
            for i, pod in enumerate(("stargate-0", "stargate-1")):
                if i:
                    await asyncio.sleep(c.QUIC_FLOW_TAKEOVER_QUIET_MS / 1000 + 0.2)
                config = client_configuration(sni(pod), pki.ca_path)
                async with connect(ROUTER_HOST, port, configuration=config, local_port=local_port) as client:
                    answer = await asyncio.wait_for(request(client, WHOAMI), HANDSHAKE_TIMEOUT_S)
                assert answer.partition(b":")[0].decode() == pod
            outcomes = {o: metrics.registry.get_sample_value(f"{c.QUIC_CONNECTIONS_TOTAL}_total", {"outcome": o})
                        for o in ("accepted", "completed", "target_unavailable")}
            assert outcomes == {"accepted": 2, "completed": 1, "target_unavailable": 0}
            assert router.active_flows == 1
        finally:
            await router.close()


# ---------------------------------------------------------------------------
# The real router process
# ---------------------------------------------------------------------------
@dataclass
class ProcessSamples:
    max_pending: float = 0.0
    max_rss_kib: int = 0


async def _sample(proc: RouterProcess, samples: ProcessSamples, stop: asyncio.Event) -> None:
    while not stop.is_set():
        pending = await asyncio.to_thread(proc.metric, c.PENDING_FLOWS)
        samples.max_pending = max(samples.max_pending, pending)
        samples.max_rss_kib = max(samples.max_rss_kib, rss_kib(proc.proc.pid))
        await asyncio.sleep(0.1)


async def _flood_router_process(
    pki: DemoPki, workdir: Path, datagrams: int, rate_per_s: int, min_handshakes: int
) -> None:
    loop = asyncio.get_running_loop()
    rng = random.Random(datagrams + 1)
    async with quic_pods(pki) as targets:
        endpoints = workdir / "endpoints.json"
        write_endpoints(endpoints, [(t.pod_name, t.address, 1, t.quic_port) for t in targets.values()])
        with RouterProcess(router_args(endpoints)) as proc:
            await asyncio.to_thread(proc.wait_ready)
            port = proc.quic_port
            rss_before = rss_kib(proc.proc.pid)
            flood = FloodSockets(loop)
            forge = FloodForge(rng)
            legit, stop, sampling = Legit(), asyncio.Event(), asyncio.Event()
            samples = ProcessSamples()
            try:
                legit_task = loop.create_task(legit.run(port, pki.ca_path, stop))
                sampler = loop.create_task(_sample(proc, samples, sampling))
                # open loop at rate_per_s, in 10 ms bursts
                sent, flood_seconds = await _send_flood(flood, forge, rng, port, datagrams, legit, min_handshakes,
                                                        rate_per_s, max(1, rate_per_s // 100))
                stop.set()
                await asyncio.wait_for(legit_task, 60)
                await asyncio.sleep(c.QUIC_PENDING_FLOW_TIMEOUT_MS / 1000 + 1.0)  # every pending flow expires
                sampling.set()
                await sampler
                assert await asyncio.to_thread(proc.metric, c.PENDING_FLOWS) == 0
                drops = {r: await asyncio.to_thread(
                    proc.metric, f"{c.QUIC_DROPPED_DATAGRAMS_TOTAL}_total", reason=r) for r in c.QUIC_DROP_REASONS}
                listener_drops = kernel_drops({(ROUTER_HOST, port)})
                flood_drops = kernel_drops(flood.addresses)
                replies = check_replies(flood.all_replies(), forge)
                assert await whoami(port, "stargate-0", pki.ca_path) == "stargate-0"
            finally:
                flood.close()
            assert proc.stop() == 0
            log_lines = len(proc.lines)
    counted = sum(drops.values()) + replies.closes
    print(
        f"\nrouter-process flood: {sent} datagrams from {len(flood.sockets)} ports in {flood_seconds:.1f} s "
        f"({sent / flood_seconds:.0f}/s); kernel drops at the router {listener_drops}, at the flood sockets "
        f"{flood_drops}\n  {legit.summary()}\n  drops {({k: int(v) for k, v in drops.items() if v})}, "
        f"replies VN {replies.vn} CONNECTION_CLOSE {replies.closes}; counted {int(counted)} of {sent}\n"
        f"  pending gauge max {samples.max_pending:.0f} (bound {c.QUIC_MAX_PENDING_FLOWS}), "
        f"RSS {rss_before} KiB -> max {samples.max_rss_kib} KiB; {log_lines} router log lines"
    )
    assert legit.total >= min_handshakes and legit.ok >= 0.99 * legit.total, legit.failed[:5]
    assert samples.max_pending <= min(c.QUIC_MAX_PENDING_FLOWS, len(flood.sockets))
    assert replies.violations == []
    assert sent - listener_drops - flood_drops <= counted <= sent
    flow_bound_kib = (c.QUIC_MAX_PENDING_BYTES_PER_FLOW + MAX_TLS_CLIENT_HELLO_BYTES) // 1024
    assert samples.max_rss_kib - rss_before <= len(flood.sockets) * flow_bound_kib + 32 * 1024


async def test_initial_flood_against_the_router_process(pki: DemoPki, tmp_path: Path) -> None:
    await _flood_router_process(pki, tmp_path, datagrams=5_000, rate_per_s=2_500, min_handshakes=40)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_initial_flood_against_the_router_process_100k(pki: DemoPki, tmp_path: Path) -> None:
    await _flood_router_process(pki, tmp_path, datagrams=100_000, rate_per_s=4_000, min_handshakes=400)
