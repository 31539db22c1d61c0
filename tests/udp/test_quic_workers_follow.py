"""``--workers N``: a client whose port changes keeps its connection whichever worker the kernel
gives its new 4-tuple to: that worker finds the pod in the workers' shared connection-ID index and
joins the connection there (``router.udp.cid_index``, ``router.udp.joins``). Real ``python -m router``
processes, real aioquic pods, aioquic and quinn clients that rebind 20 times in one connection; and
a flood of random short headers from many addresses, each counted dropped once and joined nowhere."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aioquic.asyncio import connect
from aioquic.quic.configuration import QuicConfiguration
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from router import constants as c
from router.demo.pki import DemoPki
from router.demo.quic_pods import bound_port, client_configuration, request, start_quic_pod
from router.extensions import Extensions
from tests.support.access_peers import access_lines
from tests.support.names import host as sni
from tests.support.polling import deliberate_pause, eventually_blocking
from tests.support.rebinding import rebind
from tests.support.router_process import RouterProcess, extensions_env, router_args, write_endpoints
from tests.support.shared_socket import open_shared_socket

pytestmark = pytest.mark.timeout(120)

REBINDS = 20
PODS = {"stargate-0": "127.0.0.2", "stargate-1": "127.0.0.3"}
CONNECTIONS = f"{c.QUIC_CONNECTIONS_TOTAL}_total"
DROPPED = f"{c.QUIC_DROPPED_DATAGRAMS_TOTAL}_total"
PAIRS_AIOQUIC = [("c", 2), ("python", 4)]
PAIRS_QUINN = [("c", 4), ("python", 2)]
"""Each client through 2 and 4 workers, each count on both datapaths across the two clients: every
pair the datapath and the worker count meet in is run once, not once per client (the suite's time)."""


@pytest.fixture
async def endpoints(tmp_path: Path, pki: DemoPki) -> AsyncIterator[Path]:
    """Two aioquic demo pods (they answer ``<pod>:<request>``) in an endpoints file."""
    pods = {name: await start_quic_pod(name, ip, 0, pki.cert_path, pki.key_path) for name, ip in PODS.items()}
    path = tmp_path / "endpoints.json"
    write_endpoints(path, [(name, PODS[name], 1, bound_port(pod)) for name, pod in pods.items()])
    try:
        yield path
    finally:
        for pod in pods.values():
            pod.close()


async def _router(endpoints: Path, workers: int, extensions: Extensions | None = None) -> RouterProcess:
    """``--workers N`` on the path ``extensions`` chose (the C splice and C Initial reading, or pure
    Python); None: the router's own choice."""
    args = router_args(endpoints, "--workers", str(workers), "--log-format", "json", "--debug-endpoints")
    router = RouterProcess(args, env=None if extensions is None else extensions_env(extensions))
    await asyncio.to_thread(router.wait_ready, 30.0)
    return router


def _config(pod: str, pki: DemoPki) -> QuicConfiguration:
    return client_configuration(sni(pod), pki.ca_path)


async def _metric(router: RouterProcess, name: str, **labels: str) -> float:
    return await asyncio.to_thread(router.metric, name, **labels)


@pytest.mark.parametrize(("extensions", "workers"), PAIRS_AIOQUIC, indirect=["extensions"])
async def test_an_aioquic_client_that_rebinds_twenty_times_keeps_its_connection(
    endpoints: Path, pki: DemoPki, workers: int, extensions: Extensions
) -> None:
    router = await _router(endpoints, workers, extensions)
    with router:
        config = client_configuration(sni("stargate-1"), pki.ca_path)
        async with connect("127.0.0.1", router.quic_port, configuration=config) as client:
            assert await request(client, b"before") == b"stargate-1:before"
            first_port = client._transport.get_extra_info("sockname")[1]
            sent = 0
            for n in range(REBINDS):
                moved = await rebind(client)
                counting = _CountingTransport(moved)
                client._transport = counting  # type: ignore[assignment]
                payload = f"after-{n}-".encode() * (n + 1)
                assert await request(client, payload) == b"stargate-1:" + payload
                sent += counting.sent
        assert await _metric(router, CONNECTIONS, outcome="accepted") == 1
        joined = await _metric(router, CONNECTIONS, outcome="joined")
        assert 0 < joined <= REBINDS  # none of 20 new ports on another worker: p = 2**-20 with 2 workers
        assert await _metric(router, DROPPED, reason="not_initial") == 0
        assert await asyncio.to_thread(router.stop, signal.SIGTERM, 30.0) == 0
    quic = [line for line in access_lines(router) if line.get("protocol") == "quic"]
    assert {line["pod"] for line in quic} == {"stargate-1"}  # every flow of the connection: its one pod
    opened = [line for line in quic if line.get("hostname")]  # a joined flow read no ClientHello
    assert len(opened) == 1 and opened[0]["client"].endswith(f":{first_port}")  # routed once, by its SNI
    assert len(quic) == 1 + joined  # one line per flow: the routed one, and each join on another worker
    assert sum(line["bytes_client_to_pod"] for line in quic) > sent  # every rebound datagram counted once


class _CountingTransport:
    """A client transport that counts the bytes sent through it (the rest passes through)."""

    def __init__(self, transport: asyncio.DatagramTransport) -> None:
        self._transport = transport
        self.sent = 0

    def sendto(self, data: bytes, addr: object = None) -> None:
        self.sent += len(data)
        self._transport.sendto(data, addr)

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


async def test_a_connection_opened_beside_a_moved_one_leaves_it_its_pod(
    endpoints: Path, pki: DemoPki, extensions: Extensions
) -> None:
    """One aioquic endpoint (one socket): its connection to stargate-0 moves to a port the kernel
    gives the other worker (joined there), then it opens a connection to stargate-1 from that port.
    Each connection still reaches its own pod: the flows of that address are told apart by
    connection ID from the start."""
    router = await _router(endpoints, 2, extensions)
    with router:
        shared = await open_shared_socket("127.0.0.1")
        try:
            target = ("127.0.0.1", router.quic_port)
            first = await asyncio.wait_for(shared.connect(target, _config("stargate-0", pki)), 10)
            assert await request(first, b"a") == b"stargate-0:a"
            for n in range(REBINDS):  # until a new port lands on the worker without the flow (p = 1/2 each)
                await shared.rebind("127.0.0.1")
                assert await request(first, b"moved-%d" % n) == b"stargate-0:moved-%d" % n
                if await _metric(router, CONNECTIONS, outcome="joined"):
                    break
            else:
                pytest.fail(f"{REBINDS} new ports all on the flow's own worker")
            second = await asyncio.wait_for(shared.connect(target, _config("stargate-1", pki)), 10)
            for round_ in (b"b", b"c", b"d"):
                assert await request(second, round_) == b"stargate-1:" + round_
                assert await request(first, round_) == b"stargate-0:" + round_
            assert shared.unmatched == 0
        finally:
            shared.close()
        assert await _metric(router, CONNECTIONS, outcome="accepted") == 2
        assert await _metric(router, DROPPED, reason="not_initial") == 0
        assert await asyncio.to_thread(router.stop, signal.SIGTERM, 30.0) == 0


@pytest.mark.parametrize(("extensions", "workers"), PAIRS_QUINN, indirect=["extensions"])
async def test_a_quinn_endpoint_that_rebinds_twenty_times_keeps_its_connections_to_two_pods(
    endpoints: Path, pki: DemoPki, tmp_path: Path, quinn_peer: Path, workers: int, extensions: Extensions
) -> None:
    ca = tmp_path / "ca.der"
    ca.write_bytes(x509.load_pem_x509_certificate(pki.ca_pem).public_bytes(Encoding.DER))
    names = [sni(pod) for pod in PODS]
    router = await _router(endpoints, workers, extensions)
    with router:
        peer = await asyncio.create_subprocess_exec(
            str(quinn_peer), f"127.0.0.1:{router.quic_port}", str(ca), "--rebinds", str(REBINDS), *names,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(peer.communicate(), 90)
        assert peer.returncode == 0, err.decode()
        lines = out.decode().split("\n")
        phases = ["before", "after", *(f"after-{n}" for n in range(2, REBINDS + 1))]
        for phase in phases:
            for pod, name in zip(PODS, names, strict=True):
                assert f"{phase} {name} {pod}:{phase}-{name}" in lines
        ports = [line.split()[2] for line in lines if line.startswith("port ")]
        assert len(ports) == REBINDS + 1  # a new port every time (the kernel may hand back an earlier one later)
        assert all(before != after for before, after in itertools.pairwise(ports))
        assert await _metric(router, CONNECTIONS, outcome="accepted") == 2
        assert await _metric(router, DROPPED, reason="not_initial") == 0
        assert await _metric(router, CONNECTIONS, outcome="joined") > 0
        assert await asyncio.to_thread(router.stop, signal.SIGTERM, 30.0) == 0
    quic = [line for line in access_lines(router) if line.get("protocol") == "quic"]
    assert sorted(line["pod"] for line in quic if line.get("hostname")) == sorted(PODS)  # one routed flow each
    assert {line["pod"] for line in quic} == set(PODS)


async def test_a_flood_of_random_short_headers_is_dropped_once_each_and_joins_nothing(
    endpoints: Path, pki: DemoPki
) -> None:
    router = await _router(endpoints, 2)
    with router:
        config = client_configuration(sni("stargate-0"), pki.ca_path)
        async with connect("127.0.0.1", router.quic_port, configuration=config) as client:  # a CID to share
            assert await request(client, b"before the flood") == b"stargate-0:before the flood"
        sockets = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(256)]
        try:
            for sock in sockets:
                sock.bind(("127.0.0.1", 0))
            for _ in range(40):  # 10,240 datagrams from 256 addresses, in paced bursts
                for sock in sockets:  # a short header (0b01 first bits), a random connection ID and payload
                    junk = bytes([0x40 | os.urandom(1)[0] & 0x3F]) + os.urandom(40)
                    sock.sendto(junk, ("127.0.0.1", router.quic_port))
                await deliberate_pause(0.01, "the flood's pace: a burst from every address, then the next")
        finally:
            for sock in sockets:
                sock.close()
        read = 40 * len(sockets)
        await asyncio.to_thread(
            eventually_blocking, lambda: router.metric(DROPPED, reason="not_initial") == read, 30.0,
            what="every datagram counted dropped once",
        )
        assert await _metric(router, CONNECTIONS, outcome="joined") == 0
        # The workers still serve: a real client through the router after the flood.
        async with connect("127.0.0.1", router.quic_port, configuration=config) as client:
            assert await request(client, b"after the flood") == b"stargate-0:after the flood"
        assert await asyncio.to_thread(router.stop, signal.SIGTERM, 30.0) == 0
