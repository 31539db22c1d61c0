"""A flood that fills the QUIC flow table, and the legitimate clients that must get through it.

The flood (issue 42): valid one-datagram client Initials (a real aioquic ClientHello naming a real
pod, ``max_idle_timeout`` 3600 s) or QUIC-LB short headers whose connection IDs name a real pod by
server ID, each from a source address of its own, at a steady rate. Nothing answers the pods'
replies and no flood connection ever sends a 1-RTT packet: each flood flow is a flow its client
never confirms. The legitimate clients: real aioquic connections (a stream naming the pod and a
transfer checked byte for byte) and real quinn endpoints (``tests/support/quinn_peer``: two
connections on one socket, a round trip on each before and after a rebind), run until told to stop.

Shared by ``tests/faults/test_flow_table_flood.py`` and ``bench.flow_table_flood``.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import random
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aioquic.asyncio import connect
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from router.demo.quic_pods import ALPN, WHOAMI, client_configuration, request
from router.udp.quic_lb import pod_server_id
from tests.support.initial_packets import protected_initial
from tests.support.names import host as sni
from tests.support.polling import deliberate_pause
from tests.support.quic_frames import crypto_frame
from tests.support.quic_initial_rewriter import open_flight
from tests.support.quic_lb_pods import fetch, payload, quic_lb_cid

ROUTER_HOST = "127.0.0.1"
PODS = {"stargate-0": "127.0.0.2", "stargate-1": "127.0.0.3"}
SERVER_ID_BYTES = 4
"""With ``--quic-lb-server-id-bytes 4`` a pod's whole IPv4 address is its server ID."""
FLOOD_HOSTS = tuple(f"127.0.0.{i}" for i in range(10, 60))
"""The flood's source IPs: apart from the legitimate clients' 127.0.0.1, so the access log tells them apart."""
FLOOD_TICK_S = 0.01
"""The flood sends its datagrams in bursts this far apart: steady at any rate, a few event-loop turns."""
CLAIMED_IDLE_TIMEOUT_S = 3600.0
"""The ``max_idle_timeout`` a forged ClientHello claims: before issue 42 its flow lived the router's
relay idle bound (300 s) whatever the handshake did."""
JOIN_CID_BYTES = 12
"""A join's connection ID: a first octet, the 4-byte server ID and a 7-byte nonce (as ``quic_lb_pods``')."""
JOIN_PAYLOAD_BYTES = 8
"""After the connection ID: a 21-byte short header in all, the issue's cheapest join."""
LEGIT_PORTS = itertools.cycle(range(12_000, 20_000))
"""The aioquic clients' local ports: below the ephemeral range, where the quinn peer rebinds, so quinn
never moves onto a port whose closed aioquic connection's flow the router still holds (it would take
quinn's datagrams as that flow's: the router gives an unshared flow its address's short headers
without a look at the DCID). Apart from ``quic_flood_harness``'s 20,000-32,000."""
LEGIT_IDLE_TIMEOUT_S = 3.0
"""The aioquic clients' ``max_idle_timeout``: their closed connections' flows leave the small table
~4 s later (three PTOs and the grace, ``FlowLimits.flow_idle_timeout_s``), not 30 s later."""
PORT_TRIES = 50
"""Local ports tried in a row before giving up: other test processes may hold a few of the range."""
LEGIT_TIMEOUT_S = 8.0
"""One aioquic connection (handshake, a name round trip, the transfer) longer than this failed."""
QUINN_RUN_TIMEOUT_S = 45.0
"""One quinn run: two handshakes and four round trips, each step bounded by the peer at 10 s."""
QUINN_PAUSE_S = 0.5
"""Between quinn runs: each connection's flow lives quinn's 10 s idle timeout after it closes, and the
test's table is small."""


def forged_hello(pod: str) -> tuple[bytes, bytes]:
    """(the ClientHello, the client's source connection ID) of a real aioquic client connecting to
    ``pod`` by name, claiming ``CLAIMED_IDLE_TIMEOUT_S``. The SCID is kept in every forged Initial
    (it is in the hello's transport parameters), so the pod answers each as a new connection."""
    config = QuicConfiguration(is_client=True, server_name=sni(pod), alpn_protocols=[ALPN],
                               idle_timeout=CLAIMED_IDLE_TIMEOUT_S)
    config.verify_mode = ssl.CERT_NONE
    connection = QuicConnection(configuration=config)
    connection.connect((PODS[pod], 443), now=0.0)
    flight = open_flight([data for data, _ in connection.datagrams_to_send(now=0.0)])
    return flight.crypto, flight.scid


class FloodForge:
    """Flood datagrams naming ``pods`` (all by default) in turn: ``initial()`` or ``join()``.
    ``fresh_scids``: each Initial with a source connection ID of its own, for a pod that echoes
    (the router learns the echoed one as the pod's) rather than one that reads the hello."""

    def __init__(self, rng: random.Random, pods: tuple[str, ...] = tuple(PODS), fresh_scids: bool = False) -> None:
        self.rng, self.fresh_scids = rng, fresh_scids
        self.hellos = [forged_hello(pod) for pod in pods]
        self.server_ids = [pod_server_id(PODS[pod], SERVER_ID_BYTES) for pod in pods]
        self.made = 0

    def initial(self) -> bytes:
        """One client Initial (1,200 bytes, a fresh DCID) carrying a whole ClientHello."""
        hello, scid = self.hellos[self.made % len(self.hellos)]
        self.made += 1
        if self.fresh_scids:
            scid = self.rng.randbytes(len(scid))
        return protected_initial(crypto_frame(0, hello), dcid=self.rng.randbytes(8), scid=scid)

    def join(self) -> bytes:
        """One short header whose self-encoded QUIC-LB connection ID names a pod (21 bytes)."""
        server_id = self.server_ids[self.made % len(self.server_ids)]
        assert server_id is not None
        self.made += 1
        nonce = self.rng.randbytes(JOIN_CID_BYTES - 1 - len(server_id))
        cid = quic_lb_cid(server_id, nonce, self.rng.randrange(7), self_encoded=True)
        return b"\x40" + cid + self.rng.randbytes(JOIN_PAYLOAD_BYTES)


class FloodSender:
    """Sends each datagram from a source address never used before (a host of ``FLOOD_HOSTS``, a
    port the kernel picks), at a steady rate; the socket is closed at once, as a spoofer has none."""

    def __init__(self) -> None:
        self.used: set[tuple[str, int]] = set()
        self.sent = 0

    def _send_one(self, datagram: bytes, target: tuple[str, int]) -> None:
        while True:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                sock.bind((FLOOD_HOSTS[len(self.used) % len(FLOOD_HOSTS)], 0))
                address = sock.getsockname()
                if address in self.used:  # the kernel gave a port back: take another
                    continue
                self.used.add(address)
                sock.sendto(datagram, target)
                self.sent += 1
                return
            finally:
                sock.close()

    async def run(self, make: Callable[[], bytes], target: tuple[str, int], rate_per_s: float, seconds: float,
                  tick_s: float = FLOOD_TICK_S) -> float:
        """``make()`` datagrams to ``target`` at ``rate_per_s`` for ``seconds``, ``tick_s`` worth at a
        time; returns the seconds it took (more when the machine could not keep up)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        due = 0
        while (elapsed := loop.time() - started) < seconds:
            target_count = int(min(elapsed + tick_s, seconds) * rate_per_s)
            while due < target_count:
                self._send_one(make(), target)
                due += 1
            await deliberate_pause(tick_s, "the flood's pace: this tick's datagrams are out")
        return loop.time() - started


@dataclass(repr=False)
class Legit:
    """What the legitimate clients got: a connection is ok only if every byte came back as sent."""

    ok: Counter[str] = field(default_factory=Counter)
    """Connections that worked, by client (``aioquic``, ``quinn``)."""
    failed: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.ok.values()) + len(self.failed)

    @property
    def success(self) -> float:
        return sum(self.ok.values()) / max(1, self.total)

    def __repr__(self) -> str:
        return f"Legit({self.summary()})"

    def summary(self) -> str:
        ordered = sorted(self.seconds) or [0.0]
        p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        reasons = Counter(reason[:90] for reason in self.failed)
        return (f"legit connections {sum(self.ok.values())}/{self.total} ({100 * self.success:.1f} %: "
                f"aioquic {self.ok['aioquic']}, quinn {self.ok['quinn']}), aioquic p50 {p50 * 1000:.0f} ms "
                f"p99 {p99 * 1000:.0f} ms" + (f"; failures {dict(reasons.most_common(4))}" if reasons else ""))


async def _exchange(port: int, config: QuicConfiguration, local_port: int, transfer_bytes: int) -> tuple[bytes, bytes]:
    """(the pod's answer to WHOAMI, the ``transfer_bytes`` it sent) over one new connection."""
    async with asyncio.timeout(LEGIT_TIMEOUT_S):
        async with connect(ROUTER_HOST, port, configuration=config, local_port=local_port) as client:
            return await request(client, WHOAMI), await fetch(client, transfer_bytes)


async def aioquic_connection(port: int, pod: str, cafile: Path, legit: Legit, transfer_bytes: int) -> None:
    """Connect naming ``pod``, ask its name, fetch ``transfer_bytes`` and compare them byte for byte."""
    config = client_configuration(sni(pod), cafile, idle_timeout_s=LEGIT_IDLE_TIMEOUT_S)
    started = time.perf_counter()
    for _ in range(PORT_TRIES):
        try:
            named, got = await _exchange(port, config, next(LEGIT_PORTS), transfer_bytes)
            break
        except (ConnectionError, TimeoutError) as exc:
            legit.failed.append(f"aioquic: {exc!r}")
            return
        except OSError as exc:  # a port another process holds: the next one
            if exc.errno != errno.EADDRINUSE:
                raise
    else:
        raise RuntimeError(f"{PORT_TRIES} local ports in a row were taken")
    if named != f"{pod}:".encode() + WHOAMI:
        legit.failed.append(f"aioquic: {pod} answered {named[:40]!r}")
    elif got != payload(transfer_bytes):
        legit.failed.append(f"aioquic: {len(got)} bytes, not the {transfer_bytes} sent")
    else:
        legit.ok["aioquic"] += 1
        legit.seconds.append(time.perf_counter() - started)


async def aioquic_lanes(port: int, cafile: Path, legit: Legit, stop: asyncio.Event, lanes: int,
                        transfer_bytes: int, pause_s: float = 0.0, pods: tuple[str, ...] = tuple(PODS)) -> None:
    """``lanes`` aioquic clients one connection after another (``pods`` in turn) until ``stop``."""
    async def lane(first: int) -> None:
        i = first
        while not stop.is_set():
            await aioquic_connection(port, pods[i % len(pods)], cafile, legit, transfer_bytes)
            i += 1
            await deliberate_pause(pause_s, "a client lane's gap between connections")

    await asyncio.gather(*(lane(i) for i in range(lanes)))


async def quinn_run(binary: Path, port: int, ca_der: Path, legit: Legit) -> None:
    """One quinn endpoint: a connection to each pod on one socket, a round trip on each, a rebind,
    another round trip on each; a connection is ok if both its answers are exactly as asked."""
    names = [sni(pod) for pod in PODS]
    peer = await asyncio.create_subprocess_exec(
        str(binary), f"{ROUTER_HOST}:{port}", str(ca_der), *names,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(peer.communicate(), QUINN_RUN_TIMEOUT_S)
    except TimeoutError:
        peer.kill()
        await peer.wait()
        out, err = b"", b"no exit"
    lines = out.decode(errors="replace").splitlines()
    for pod, name in zip(PODS, names, strict=True):
        if all(f"{phase} {name} {pod}:{phase}-{name}" in lines for phase in ("before", "after")):
            legit.ok["quinn"] += 1
        else:
            legit.failed.append(f"quinn {pod}: {err.decode(errors='replace').strip()[-80:]}")


async def quinn_runs(binary: Path, port: int, ca_der: Path, legit: Legit, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await quinn_run(binary, port, ca_der, legit)
        await deliberate_pause(QUINN_PAUSE_S, "the quinn endpoint's gap between runs")
