"""Connection IDs over 20 octets from a hostile client, against the router process (issue 41, item 2).

With ``--quic-lb-server-id-bytes`` and no ``--quic-cid-length``, a short header's first octet says
how long its connection ID is (its low five bits, plus one): up to 32 octets, more than any v1/v2
connection ID holds (20, RFC 9000 section 17.2). No pod writes that, so such a datagram carries no
server ID: it is a miss as it would be without QUIC-LB (counted ``not_initial``), it opens no
flow, nothing learns its connection ID, and nothing raises, on the C splice and in pure Python.

And one client's bad datagrams never cost another client its own: a burst that mixes them with a
real aioquic connection's first flight (queued while the router is stopped, so that the router
reads them all in one batch, the bad ones first) leaves that connection to hand its pod every
datagram it sent, and to finish a transfer byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aioquic.asyncio import QuicConnectionProtocol
from aioquic.quic.connection import QuicConnection

from router import constants as c
from router.demo.pki import DemoPki
from router.demo.quic_pods import bound_port, client_configuration, request
from router.udp.quic_lb import SELF_ENCODED_LENGTH_MASK, pod_server_id
from tests.support.access_peers import access_lines
from tests.support.names import host as sni
from tests.support.quic_lb_pods import PodCids, fetch, payload, start_quic_lb_pod
from tests.support.router_process import RouterProcess, router_args, write_endpoints

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("both_udp_paths")]
"""Every test here runs on the pure-Python path and on the C splice."""

PODS = {"stargate-0": "127.0.0.2", "stargate-1": "127.0.0.3"}
SERVER_ID_BYTES = 4
"""A pod's whole IPv4 address is its server ID."""
QUIC_LB = f"--quic-lb-server-id-bytes={SERVER_ID_BYTES}"
HOSTILE_IP = "127.0.0.9"
"""The hostile client's own IP: what it costs is not a per-client count the legit client shares."""
HOSTILE_ADDRESSES = 48
"""Client addresses (ports) the hostile datagrams come from, one each: each was a join of its own."""
TRANSFER_BYTES = 1024 * 1024
SETTLE_S = 10.0
"""How long the router may take to count what it was sent (with ``--workers N``, an unclaimed
ask is counted after ``QUIC_HANDOFF_ASK_DEADLINE_S``)."""
DROPPED = f"{c.QUIC_DROPPED_DATAGRAMS_TOTAL}_total"
FLOWS = f"{c.QUIC_CONNECTIONS_TOTAL}_total"


def over_long_short_header(server_id: bytes) -> bytes:
    """A short header whose DCID's first octet self-encodes 32 octets (rotation 0, low bits 31),
    its next octets a ready pod's server ID: what a pod's connection ID would be, were it 32 long."""
    first = SELF_ENCODED_LENGTH_MASK  # (31 + 1) octets
    cid = bytes([first]) + server_id + os.urandom(32 - 1 - len(server_id))
    return b"\x40" + cid + os.urandom(40)


def names(pod: str) -> bytes:
    sid = pod_server_id(PODS[pod], SERVER_ID_BYTES)
    assert sid is not None
    return sid


@contextlib.contextmanager
def hostile_sockets(n: int) -> Iterator[list[socket.socket]]:
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) for _ in range(n)]
        for sock in socks:
            sock.bind((HOSTILE_IP, 0))
        yield socks


def send_hostile(socks: list[socket.socket], router: RouterProcess) -> None:
    for sock in socks:
        sock.sendto(over_long_short_header(names("stargate-0")), ("127.0.0.1", router.quic_port))


@asynccontextmanager
async def quic_lb_router(pki: DemoPki, tmp: Path, one_process: str = "") -> AsyncIterator[RouterProcess]:
    """Two QUIC-LB aioquic pods and a router process with ``--quic-lb-server-id-bytes`` and no
    ``--quic-cid-length`` (the length self-encoded): the setting the attack needs."""
    pods = {name: await start_quic_lb_pod(name, ip, pki.cert_path, pki.key_path, PodCids(ip, SERVER_ID_BYTES))
            for name, ip in PODS.items()}
    endpoints = tmp / "endpoints.json"
    write_endpoints(endpoints, [(name, PODS[name], 1, bound_port(pod)) for name, pod in pods.items()])
    router = RouterProcess(router_args(endpoints, "--log-format", "json", QUIC_LB), one_process=one_process)
    try:
        await asyncio.to_thread(router.wait_ready)
        yield router
    finally:
        router.__exit__()
        for pod in pods.values():
            pod.close()


async def settled(router: RouterProcess, done: Callable[[dict[str, float]], bool]) -> dict[str, float]:
    """The router's flow and drop counts once ``done`` holds of them, or as they are after ``SETTLE_S``."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        counts = await asyncio.to_thread(_counts, router)
        if done(counts) or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.05)


def _counts(router: RouterProcess) -> dict[str, float]:
    return {
        "joined": router.metric(FLOWS, outcome="joined"),
        "accepted": router.metric(FLOWS, outcome="accepted"),
        "not_initial": router.metric(DROPPED, reason="not_initial"),
    }


def tracebacks(router: RouterProcess) -> list[str]:
    return [line for line in router.lines if "Traceback" in line]


async def test_connection_ids_over_20_octets_open_no_flow_and_raise_nothing(pki: DemoPki, tmp_path: Path) -> None:
    async with quic_lb_router(pki, tmp_path) as router:
        with hostile_sockets(HOSTILE_ADDRESSES) as socks:
            send_hostile(socks, router)
            counts = await settled(router, lambda n: n["not_initial"] + n["joined"] >= HOSTILE_ADDRESSES)
        assert (counts, tracebacks(router)) == ({"joined": 0, "accepted": 0, "not_initial": HOSTILE_ADDRESSES}, [])
        async with connected(router, pki, "stargate-1") as client:  # the router serves as before
            assert await request(client.protocol, b"after") == b"stargate-1:after"
        assert router.stop() == 0
    assert [line["client"] for line in access_lines(router)
            if line["protocol"] == "quic" and line["client"].startswith(HOSTILE_IP)] == []


class _CountedTransport:
    """The client's datagram transport, counting the bytes of every datagram it sends."""

    def __init__(self, transport: Any, sent: list[int]) -> None:
        self._transport, self._sent = transport, sent

    def sendto(self, data: bytes, addr: Any = None) -> None:
        self._sent.append(len(data))
        self._transport.sendto(data, addr)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _CountingClient(QuicConnectionProtocol):
    """An aioquic client connection that counts what it sent: what its flow must have handed its pod."""

    def __init__(self, quic: QuicConnection, **kwargs: Any) -> None:
        super().__init__(quic, **kwargs)
        self.sent: list[int] = []

    def connection_made(self, transport: Any) -> None:
        super().connection_made(_CountedTransport(transport, self.sent))


class _Client:
    def __init__(self, protocol: _CountingClient, transport: asyncio.DatagramTransport) -> None:
        self.protocol, self.transport = protocol, transport

    @property
    def address(self) -> str:
        host, port = self.transport.get_extra_info("sockname")[:2]
        return f"{host}:{port}"


async def start_client(router: RouterProcess, pki: DemoPki, pod: str) -> _Client:
    """A real aioquic client whose first flight has left (the router may be stopped: it waits)."""
    loop = asyncio.get_running_loop()
    protocol = _CountingClient(QuicConnection(configuration=client_configuration(sni(pod), pki.ca_path)))
    transport, _ = await loop.create_datagram_endpoint(lambda: protocol, local_addr=("127.0.0.1", 0))
    protocol._quic.connect(("127.0.0.1", router.quic_port), now=loop.time())
    protocol.transmit()
    assert protocol.sent, "the client's first flight"
    return _Client(protocol, transport)


@asynccontextmanager
async def connected(router: RouterProcess, pki: DemoPki, pod: str) -> AsyncIterator[_Client]:
    client = await start_client(router, pki, pod)
    try:
        await asyncio.wait_for(client.protocol.wait_connected(), 10)
        yield client
    finally:
        client.protocol.close()
        client.transport.close()


async def quiet(client: _Client, for_s: float = 0.5) -> None:
    """Until the client has sent nothing for ``for_s`` (its last ACKs left)."""
    while True:
        before = len(client.protocol.sent)
        await asyncio.sleep(for_s)
        if len(client.protocol.sent) == before:
            return


async def test_a_batch_mixing_bad_connection_ids_with_a_real_connection_costs_that_connection_nothing(
    pki: DemoPki, tmp_path: Path
) -> None:
    one_process = "SIGSTOP holds every datagram of the burst in the one socket a single process reads"
    async with quic_lb_router(pki, tmp_path, one_process=one_process) as router:
        with hostile_sockets(HOSTILE_ADDRESSES) as socks:
            half = HOSTILE_ADDRESSES // 2
            router.proc.send_signal(signal.SIGSTOP)
            try:  # one burst, read in one batch: bad datagrams, a real first flight, bad datagrams
                send_hostile(socks[:half], router)
                client = await start_client(router, pki, "stargate-1")
                send_hostile(socks[half:], router)
            finally:
                router.proc.send_signal(signal.SIGCONT)
            try:
                await asyncio.wait_for(client.protocol.wait_connected(), 10)
                assert await fetch(client.protocol, TRANSFER_BYTES) == payload(TRANSFER_BYTES)
                await quiet(client)
                counts = await settled(router, lambda n: n["not_initial"] + n["joined"] >= HOSTILE_ADDRESSES)
                assert router.stop() == 0  # the drain ends the flow: its access line counts its bytes
                sent = sum(client.protocol.sent)
            finally:
                client.protocol.close()
                client.transport.close()
    flows = [(line["client"], line["pod"], line["bytes_client_to_pod"])
             for line in access_lines(router) if line["protocol"] == "quic"]
    assert (counts, len(tracebacks(router)), flows) == (
        {"joined": 0, "accepted": 1, "not_initial": HOSTILE_ADDRESSES},
        0,
        [(client.address, "stargate-1", sent)],  # every datagram it sent reached its pod, its first flight too
    )
