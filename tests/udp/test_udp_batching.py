"""router.udp.batching: the bytes helpers, the kernel fallback, and GRO -> GSO through the router.

The tests through the router pin the pure-Python path (they watch its GSO sends and outboxes);
the same transfers through the C splice are in ``test_udp_splice.py``."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import uvloop
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from hypothesis import given
from hypothesis import strategies as st

from discovery.targets import Target, TargetSnapshot
from router import constants as c
from router.demo.pki import DemoPki
from router.demo.quic_pods import ALPN
from router.extensions import choose
from router.udp import batching as b
from router.udp import pod_link as udp_pod_link
from router.udp import pod_to_client as udp_replies
from router.udp.edge import UdpRouter
from router.udp.settings import UdpRouterSettings
from tests.support.quic_exchange import quic_exchange
from tests.support.udp_router import running_udp_router, udp_socket

ROUTER_HOST, POD_HOST = "127.0.0.1", "127.0.0.2"
SNI = "stargate-0.stargate.external"
T = 5.0


@pytest.fixture(autouse=True)
def fresh_capabilities(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test probes the kernel anew; a refusal in one test does not leak into the next."""
    monkeypatch.setattr(b, "_gro_usable", True)
    monkeypatch.setattr(b, "_gso_usable", True)


# -- bytes --------------------------------------------------------------------------------
def test_split_cuts_equal_segments_and_a_shorter_last_one() -> None:
    data = memoryview(bytes(range(250)))
    assert [bytes(s) for s in b.split_segments(data, 100)] == [bytes(range(100)), bytes(range(100, 200)),
                                                              bytes(range(200, 250))]
    assert [len(s) for s in b.split_segments(data[:200], 100)] == [100, 100]
    assert list(b.split_segments(data[:0], 100)) == []


@pytest.mark.parametrize("size", [0, -1, 0x10000])
def test_impossible_segment_sizes_are_refused(size: int) -> None:
    with pytest.raises(b.BatchingError):
        list(b.split_segments(memoryview(b"x"), size))
    with pytest.raises(b.BatchingError):
        b.segment_cmsg(size)


def test_segment_cmsg_is_a_native_u16_at_sol_udp() -> None:
    assert b.segment_cmsg(1200) == (17, 103, struct.pack("H", 1200))


def test_gro_cmsg_gives_the_segment_size_else_the_whole_buffer_is_one_datagram() -> None:
    gro = (17, 104, struct.pack("i", 1200))
    assert b.gro_segment_size([gro], 3000) == 1200
    assert b.gro_segment_size([], 3000) == 3000
    assert b.gro_segment_size([(17, 104, b"\x01")], 3000) == 3000  # truncated cmsg
    assert b.gro_segment_size([(17, 104, struct.pack("i", 0))], 3000) == 3000
    assert b.gro_segment_size([(0, 104, struct.pack("i", 1200))], 3000) == 3000  # another level
    assert b.gro_segment_size([(17, 104, struct.pack("i", 1200))], 1200) == 1200  # one segment


@given(st.lists(st.integers(0, 2000), max_size=200), st.integers(0, 1500),
       st.integers(1, 70), st.integers(1, 70_000))
def test_gso_runs_carry_every_datagram_unchanged_and_in_order(
    sizes: list[int], max_segment: int, max_segments: int, max_bytes: int
) -> None:
    runs = b.gso_runs(sizes, max_segment, max_segments, max_bytes)
    assert [i for start, stop, _ in runs for i in range(start, stop)] == list(range(len(sizes)))
    for start, stop, size in runs:
        run = sizes[start:stop]
        assert size == run[0]
        if len(run) == 1:
            continue
        # what the kernel does with one UDP_SEGMENT send: cut the payload every ``size`` bytes
        assert 0 < size <= max_segment and len(run) <= max_segments and sum(run) <= max_bytes
        assert all(n == size for n in run[:-1]) and 0 < run[-1] <= size
        payload = memoryview(bytes(sum(run)))
        assert [len(s) for s in b.split_segments(payload, size)] == run


def test_gso_runs_batch_a_burst_and_keep_odd_sizes_apart() -> None:
    assert b.gso_runs([1200] * 5 + [300, 1200], 1472) == [(0, 6, 1200), (6, 7, 1200)]
    assert b.gso_runs([300, 1200, 1200], 1472) == [(0, 1, 300), (1, 3, 1200)]
    assert b.gso_runs([1500, 1500], 1472) == [(0, 1, 1500), (1, 2, 1500)]  # over the path MTU
    assert b.gso_runs([1200] * 130, 1472, 64) == [(0, 54, 1200), (54, 108, 1200), (108, 130, 1200)]
    assert b.gso_runs([0, 0, 5], 1472) == [(0, 1, 0), (1, 2, 0), (2, 3, 5)]


@st.composite
def _pieces(draw: st.DrawFn) -> list[tuple[int, int]]:
    """What successive reads return: (length, segment size), a GRO batch or a single datagram."""
    pieces = []
    for _ in range(draw(st.integers(0, 30))):
        size = draw(st.integers(1, 1500))
        segments = draw(st.integers(1, 5))
        last = draw(st.integers(1, size))
        pieces.append(((segments - 1) * size + last, size))
    return pieces


@given(_pieces(), st.integers(1, 70), st.integers(1, 70_000))
def test_a_segment_run_only_merges_what_one_gso_send_cuts_back_into_the_same_datagrams(
    pieces: list[tuple[int, int]], max_segments: int, max_bytes: int
) -> None:
    run, runs, joined = b.SegmentRun(max_segments, max_bytes), [], 0
    for length, size in pieces:
        if not run.joins(length, size):
            runs.append((run.stop - run.start, run.size, run.count, joined))
            run.restart(run.stop)
            joined = 0
        run.add(length, size)
        joined += 1
    if run.count:
        runs.append((run.stop - run.start, run.size, run.count, joined))

    def cut(length: int, size: int) -> list[int]:
        return [len(s) for s in b.split_segments(memoryview(bytes(length)), size)]

    assert [n for length, size, _, _ in runs for n in cut(length, size)] == [
        n for length, size in pieces for n in cut(length, size)]
    for length, size, count, joined in runs:
        assert count == len(cut(length, size))
        if joined > 1:  # a merge never makes a send the kernel would refuse
            assert count <= max_segments and length <= max_bytes


def test_a_segment_run_merges_single_datagrams_until_a_short_one() -> None:
    run = b.SegmentRun()
    for length in (1200, 1200, 1200, 300):
        assert run.joins(length, length)
        run.add(length, length)
    assert (run.start, run.stop, run.size, run.count, run.closed) == (0, 3900, 1200, 4, True)
    assert not run.joins(1200, 1200)
    run.restart(run.stop)
    assert (run.start, run.stop, run.count) == (3900, 3900, 0)


# -- the fallback -------------------------------------------------------------------------
class _RefusingSocket:
    """Refuses UDP_SEGMENT / UDP_GRO like a kernel or device without them; records what it sends."""

    def __init__(self, full_after: int | None = None) -> None:
        self.sent: list[bytes] = []
        self.sendmsg_calls = 0
        self.full_after = full_after

    def sendmsg(self, *_: Any) -> int:
        self.sendmsg_calls += 1
        raise OSError(errno.EIO, "no checksum offload")

    def sendto(self, data: memoryview, _addr: Any) -> int:
        if self.full_after is not None and len(self.sent) >= self.full_after:
            raise BlockingIOError(errno.EAGAIN, "full")
        self.sent.append(bytes(data))
        return len(data)

    def send(self, data: bytes) -> int:
        return self.sendto(memoryview(data), None)

    def setsockopt(self, *_: Any) -> None:
        raise OSError(errno.ENOPROTOOPT, "no UDP_GRO")


def test_a_refused_gso_send_falls_back_to_one_datagram_per_call_for_good() -> None:
    sock: Any = _RefusingSocket()
    data = memoryview(os.urandom(2500))
    assert b.send_segments(sock, data, 1000, ("127.0.0.1", 1)) == 2500
    assert sock.sent == [bytes(data[:1000]), bytes(data[1000:2000]), bytes(data[2000:])]
    assert b.batching_usable() == (True, False)
    assert b.send_segments(sock, data, 1000, ("127.0.0.1", 1)) == 2500
    assert sock.sendmsg_calls == 1


class _MtuShrunkSocket(_RefusingSocket):
    """Refuses one GSO send as a kernel does when a segment no longer fits the path MTU."""

    def sendmsg(self, *_: Any) -> int:
        self.sendmsg_calls += 1
        raise OSError(errno.EINVAL, "segment over the path MTU")


def test_a_gso_send_refused_for_its_size_goes_one_by_one_and_gso_stays_on() -> None:
    sock: Any = _MtuShrunkSocket()
    datagrams = [os.urandom(1400) for _ in range(3)]
    assert b.send_datagrams(sock, datagrams, 1472) == 4200
    assert b.send_segments(sock, memoryview(b"".join(datagrams)), 1400, ("127.0.0.1", 1)) == 4200
    assert sock.sent == datagrams * 2
    assert b.batching_usable() == (True, True)
    assert sock.sendmsg_calls == 2


def test_gso_is_used_only_on_a_kernel_that_knows_udp_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(b, "_gso_usable", None)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.getsockopt(b.SOL_UDP, b.UDP_SEGMENT)
            known = True
        except OSError:
            known = False
    assert b.gso_usable() is known

    class OldKernelSocket(socket.socket):  # before Linux 4.18: no such option
        def getsockopt(self, *_: Any) -> Any:
            raise OSError(errno.ENOPROTOOPT, "Protocol not available")

    monkeypatch.setattr(b, "_gso_usable", None)
    monkeypatch.setattr(b.socket, "socket", OldKernelSocket)
    assert not b.gso_usable()
    sock: Any = _MtuShrunkSocket()
    assert b.send_datagrams(sock, [bytes(1200)] * 3, 1472) == 3600
    assert sock.sendmsg_calls == 0


def test_a_full_socket_buffer_reports_how_far_the_batch_got() -> None:
    sock: Any = _RefusingSocket(full_after=1)
    assert b.send_segments(sock, memoryview(bytes(2500)), 1000, ("127.0.0.1", 1)) == 1000
    sock = _RefusingSocket(full_after=2)
    assert b.send_datagrams(sock, [bytes(1000)] * 3 + [bytes(10)], 1472) == 2000


def test_refused_gso_on_a_connected_socket_sends_the_same_datagrams_one_by_one_for_good() -> None:
    sock: Any = _RefusingSocket()
    datagrams = [os.urandom(1200) for _ in range(4)] + [os.urandom(40), os.urandom(1200)]
    assert b.send_datagrams(sock, datagrams, 1472) == sum(map(len, datagrams))
    assert sock.sent == datagrams
    assert b.batching_usable() == (True, False)
    assert b.send_datagrams(sock, datagrams, 1472) == sum(map(len, datagrams))
    assert sock.sendmsg_calls == 1


def test_a_refused_gro_option_is_not_asked_again() -> None:
    sock: Any = _RefusingSocket()
    assert not b.enable_gro(sock)
    assert b.batching_usable() == (False, True)
    assert not b.enable_gro(sock)


# -- the kernel ---------------------------------------------------------------------------
def test_a_gso_send_reaches_a_gro_receiver_as_one_buffer_and_a_plain_one_as_datagrams() -> None:
    data = memoryview(os.urandom(5 * 1200 + 300))
    with udp_socket(ROUTER_HOST) as sender, udp_socket(ROUTER_HOST) as gro, udp_socket(ROUTER_HOST) as plain:
        if not b.enable_gro(gro):
            pytest.skip("kernel without UDP_GRO")
        assert b.send_segments(sender, data, 1200, gro.getsockname()) == len(data)
        if not b.batching_usable()[1]:
            pytest.skip("kernel without UDP_SEGMENT")
        received, ancdata, _, _ = gro.recvmsg(65536, b.GRO_CMSG_SPACE)
        assert received == bytes(data)
        assert b.gro_segment_size(ancdata, len(received)) == 1200

        assert b.send_segments(sender, data, 1200, plain.getsockname()) == len(data)
        assert [plain.recv(65536) for _ in range(6)] == [bytes(s) for s in b.split_segments(data, 1200)]


def test_a_connected_gso_send_arrives_as_the_same_datagrams_in_order() -> None:
    datagrams = [os.urandom(1200) for _ in range(70)] + [os.urandom(700), os.urandom(30), os.urandom(1200)]
    with udp_socket(ROUTER_HOST) as sender, udp_socket(POD_HOST) as pod:
        pod.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sender.connect(pod.getsockname())
        limit = b.path_segment_limit(sender)
        assert limit >= 1500 - 28  # loopback's MTU (capped at 65,535) less the IPv4 and UDP headers
        assert b.send_datagrams(sender, datagrams, limit) == sum(map(len, datagrams))
        assert [pod.recv(65536) for _ in datagrams] == datagrams


def test_an_unconnected_socket_has_no_path_segment_limit() -> None:
    with udp_socket(ROUTER_HOST) as sock:
        assert b.path_segment_limit(sock) == 0


# -- through the router -------------------------------------------------------------------
@dataclass
class Relay:
    router: UdpRouter
    port: int
    batches: list[tuple[int, int]]
    """(buffer bytes, segment size) of every pod read the router forwarded."""
    outboxes: list[int]
    """Datagrams in every client outbox the router sent to a pod."""


@asynccontextmanager
async def relay_to(pod_port: int, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Relay]:
    batches: list[tuple[int, int]] = []
    send = udp_replies.send_segments

    def recording(sock: socket.socket, buffer: memoryview, size: int, addr: Any) -> int:
        batches.append((len(buffer), size))
        return send(sock, buffer, size, addr)

    monkeypatch.setattr(udp_replies, "send_segments", recording)
    outboxes: list[int] = []
    send_outbox = udp_pod_link.send_datagrams

    def recording_outbox(sock: socket.socket, datagrams: list[bytes], max_segment: int) -> int:
        outboxes.append(len(datagrams))
        return send_outbox(sock, datagrams, max_segment)

    monkeypatch.setattr(udp_pod_link, "send_datagrams", recording_outbox)
    snapshot = TargetSnapshot.of([Target("stargate-0", POD_HOST, 1, pod_port)])
    python_path = UdpRouterSettings(extensions=choose().with_splice(False))
    async with running_udp_router(lambda: snapshot, python_path, host=ROUTER_HOST) as (router, port):
        yield Relay(router, port, batches, outboxes)


def _client_initial() -> bytes:
    config = QuicConfiguration(is_client=True, alpn_protocols=[ALPN], server_name=SNI)
    conn = QuicConnection(configuration=config)
    conn.connect(("127.0.0.1", 443), now=time.monotonic())
    return conn.datagrams_to_send(now=time.monotonic())[0][0]


@asynccontextmanager
async def routed_flow(
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Relay, socket.socket, socket.socket, Any]]:
    """A UDP pod and client with one flow routed between them: (relay, pod, client, the address
    the pod sees the flow's socket at)."""
    loop = asyncio.get_running_loop()
    with udp_socket(POD_HOST) as pod, udp_socket(ROUTER_HOST) as client:
        pod.setblocking(False)
        client.setblocking(False)
        async with relay_to(pod.getsockname()[1], monkeypatch) as relay:
            initial = _client_initial()
            await loop.sock_sendto(client, initial, (ROUTER_HOST, relay.port))
            got, flow_socket = await asyncio.wait_for(loop.sock_recvfrom(pod, 65536), T)
            assert got == initial
            yield relay, pod, client, flow_socket


async def test_a_pod_gso_burst_is_read_as_one_batch_and_reaches_the_client_datagram_by_datagram(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    async with routed_flow(monkeypatch) as (relay, pod, client, flow_socket):
        burst = bytearray(os.urandom(5 * 1200 + 300))
        for start in range(0, len(burst), 1200):  # short headers, as after the handshake
            burst[start] = 0x40 | (burst[start] & 0x3F)
        assert b.send_segments(pod, memoryview(burst), 1200, flow_socket) == len(burst)
        answers = [await asyncio.wait_for(loop.sock_recv(client, 65536), T) for _ in range(6)]
        assert answers == [bytes(s) for s in b.split_segments(memoryview(burst), 1200)]
        relay.router.flush_metrics()
        if all(b.batching_usable()):
            assert (len(burst), 1200) in relay.batches


async def test_single_pod_datagrams_read_in_one_callback_reach_the_client_as_one_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    async with routed_flow(monkeypatch) as (relay, pod, client, flow_socket):
        burst = [bytes([0x40]) + os.urandom(1199) for _ in range(8)] + [bytes([0x41]) + os.urandom(99)]
        for datagram in burst:  # one send each, all queued before the router reads
            pod.sendto(datagram, flow_socket)
        assert [await asyncio.wait_for(loop.sock_recv(client, 65536), T) for _ in burst] == burst
        assert (8 * 1200 + 100, 1200) in relay.batches


async def _exchange(pki: DemoPki, monkeypatch: pytest.MonkeyPatch, request: bytes, answer: bytes
                    ) -> tuple[bytes, bytes, Relay]:
    """One QUIC stream through the router to a real aioquic pod: the client sends ``request``,
    the pod answers ``answer``; returns (what the pod read, what the client read, the relay)."""
    relays: list[Relay] = []

    @asynccontextmanager
    async def router_to(pod_port: int) -> AsyncIterator[int]:
        async with relay_to(pod_port, monkeypatch) as relay:
            relays.append(relay)
            yield relay.port

    received, got = await quic_exchange(pki, request, answer, router_to)
    return received, got, relays[0]


async def test_a_quic_download_through_the_router_is_byte_exact(pki: DemoPki, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = os.urandom(300_000)
    _, got, relay = await _exchange(pki, monkeypatch, b"download", payload)
    assert got == payload
    assert sum(size for size, _ in relay.batches) >= len(payload)


def on_uvloop(test: Callable[[], Awaitable[None]]) -> None:
    """Run ``test`` on the router's own loop: uvloop reads several datagrams per readiness event
    (the stdlib loop reads one), which is what lets a flow's outbox collect a burst."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(test())


def test_a_client_burst_reaches_the_pod_in_one_outbox_datagram_by_datagram(monkeypatch: pytest.MonkeyPatch) -> None:
    async def burst_through_the_router() -> None:
        with udp_socket(POD_HOST) as pod, udp_socket(ROUTER_HOST) as client:
            async with relay_to(pod.getsockname()[1], monkeypatch) as relay:
                initial = _client_initial()
                client.sendto(initial, (ROUTER_HOST, relay.port))
                assert await asyncio.to_thread(pod.recv, 65536) == initial
                burst = [bytes([0x40]) + os.urandom(1199) for _ in range(10)] + [bytes([0x41]) + os.urandom(99)]
                for datagram in burst:  # all queued before the router reads: one readiness event
                    client.sendto(datagram, (ROUTER_HOST, relay.port))
                assert [await asyncio.to_thread(pod.recv, 65536) for _ in burst] == burst
                assert max(relay.outboxes) > 1

    on_uvloop(burst_through_the_router)


def test_a_quic_upload_through_the_router_is_byte_exact(pki: DemoPki, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = os.urandom(1_000_000)

    async def upload() -> None:
        received, got, relay = await _exchange(pki, monkeypatch, payload, b"ok")
        assert (received, got) == (payload, b"ok")
        assert max(relay.outboxes) > 1  # aioquic sends its congestion window in bursts

    on_uvloop(upload)


async def test_a_flood_within_one_loop_iteration_holds_at_most_one_gso_run_per_flow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    async with routed_flow(monkeypatch) as (relay, pod, client, _flow_socket):
        pod.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        flood = [bytes([0x40]) + os.urandom(1199) for _ in range(150)]
        for datagram in flood:  # as if one readiness event delivered them all, with no await between
            relay.router.demux.deliver(datagram, client.getsockname())
        assert relay.outboxes[:2] == [c.QUIC_OUTBOX_DATAGRAMS] * 2  # sent early, once full
        assert [await asyncio.wait_for(loop.sock_recv(pod, 65536), T) for _ in flood] == flood
        assert sum(relay.outboxes) == len(flood)
