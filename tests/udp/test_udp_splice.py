"""router.udp._splice (the optional C splice) on real loopback sockets, alone and in the router.

The splice moves established flows' short-header datagrams both ways and hands everything else
back in arrival order; these tests hold it to that with real UDP sockets and, through the
router, real aioquic clients and pods. The pure-Python path's own batching is tested in
``test_udp_batching.py``; the router-level suites run both paths (``tests/support/udp_paths.py``).
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from discovery.targets import Target, TargetSnapshot
from quic.packet import QUIC_V1
from router import constants as c
from router.demo.pki import DemoPki
from router.extensions import PYTHON, SPLICE_MODULE, Extensions, choose, is_built
from router.udp import batching, native
from router.udp.flow_limits import FlowLimits
from router.udp.flows import Flow
from router.udp.settings import UdpRouterSettings
from tests.support.quic_exchange import quic_exchange
from tests.support.udp_router import has_datagram, running_udp_router, udp_socket

pytestmark = pytest.mark.skipif(not is_built(SPLICE_MODULE), reason="the C splice is not built (no C compiler)")

ROUTER_HOST, POD_HOST = "127.0.0.1", "127.0.0.2"
SNI = "stargate-0.stargate.external"
T = 5.0


def _flow(address: tuple[str, int]) -> Flow[None]:
    return Flow(address, "stargate-0", None, last_active=0.0)


def short(n: int, size: int = 1200) -> bytes:
    """A short-header-looking datagram numbered ``n``."""
    return bytes([0x40]) + n.to_bytes(4, "big") + bytes(size - 5)


def long_header(n: int) -> bytes:
    return bytes([0xC0]) + n.to_bytes(4, "big") + bytes(95)


def pod_header(scid: bytes, version: int = 1) -> bytes:
    """A pod's long header (a Handshake packet's first bytes) with this SCID and an 8-byte DCID."""
    return bytes([0xE0]) + version.to_bytes(4, "big") + bytes([8]) + bytes(8) + bytes([len(scid)]) + scid + bytes(60)


@dataclass
class Spliced:
    """A splicer on a public socket with one flow attached: ``client`` <-> ``pod`` through ``link``."""

    splicer: native.Splicer
    public: socket.socket
    client: socket.socket
    pod: socket.socket
    flow: Flow[None]
    link: socket.socket


@contextmanager
def spliced() -> Iterator[Spliced]:
    splicer_type = native.splicer_type(Extensions(splice=True))
    assert splicer_type is not None
    with udp_socket(ROUTER_HOST) as public, udp_socket(ROUTER_HOST) as client, udp_socket(POD_HOST) as pod, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK) as link:
        public.setblocking(False)
        link.connect(pod.getsockname())
        splicer = splicer_type(public.fileno(), 4, 64)
        flow = _flow(client.getsockname())
        splicer.attach(link.fileno(), client.getsockname(), flow)
        try:
            yield Spliced(splicer, public, client, pod, flow, link)
        finally:
            splicer.close()


def test_short_headers_from_an_attached_client_reach_its_pod_in_order_and_are_counted() -> None:
    with spliced() as x:
        burst = [short(n) for n in range(100)] + [short(100, 300)]
        for datagram in burst:
            x.client.sendto(datagram, x.public.getsockname())
        assert x.splicer.from_clients(12.5) == []
        assert [x.pod.recv(65536) for _ in burst] == burst
        assert (x.flow.client_bytes, x.flow.last_active) == (100 * 1200 + 300, 12.5)
        assert x.splicer.take_counts() == (100 * 1200 + 300, 0)


def test_an_unconfirmed_flow_is_watched_through_python_both_ways_until_confirmed() -> None:
    with spliced() as x:
        x.splicer.detach(x.link.fileno())
        x.splicer.attach(x.link.fileno(), x.client.getsockname(), x.flow, False)
        to = x.public.getsockname()
        x.client.sendto(short(1), to)  # a 1-RTT packet: Python judges whether it confirms the flow
        assert x.splicer.from_clients(1.0) == [(short(1), x.client.getsockname())]
        answer = pod_header(b"P" * 8)
        x.pod.sendto(answer, x.link.getsockname())
        x.pod.sendto(short(2, 300), x.link.getsockname())
        assert x.splicer.from_pods(2.0) == [(x.flow, b"P" * 8)]  # its SCID is learned as ever
        assert x.splicer.take_handed() == [(x.flow, answer), (x.flow, short(2, 300))]  # not sent: Python sends
        assert x.flow.pod_bytes == 0
        x.splicer.confirm(x.link.fileno())
        x.client.sendto(short(3), to)
        assert x.splicer.from_clients(3.0) == [] and x.pod.recv(65536) == short(3)
        x.pod.sendto(short(4, 300), x.link.getsockname())
        assert x.splicer.from_pods(4.0) == [] and x.splicer.take_handed() == []
        assert x.client.recv(65536) == short(4, 300)  # the first the client got: the handed ones were not sent
        with pytest.raises(KeyError):
            x.splicer.confirm(x.link.fileno() + 1000)


SO_NO_CHECK = 11
"""``<asm-generic/socket.h>``: no UDP checksum on send, which makes the kernel refuse GSO (EINVAL)."""


def test_a_burst_the_kernel_refuses_to_segment_goes_datagram_by_datagram() -> None:
    with spliced() as x:
        x.link.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
        burst = [short(n) for n in range(40)] + [short(40, 700)]
        for datagram in burst:
            x.client.sendto(datagram, x.public.getsockname())
        assert x.splicer.from_clients(1.0) == []
        assert [x.pod.recv(65536) for _ in burst] == burst
        assert x.flow.client_bytes == 40 * 1200 + 700
        for datagram in burst:  # the flow's next burst: datagram by datagram at once, all of it again
            x.client.sendto(datagram, x.public.getsockname())
        assert x.splicer.from_clients(2.0) == []
        assert [x.pod.recv(65536) for _ in burst] == burst
        assert x.flow.client_bytes == 2 * (40 * 1200 + 700)


def test_what_the_splice_cannot_send_comes_back_in_order_and_a_flow_after_its_long_header_too() -> None:
    with spliced() as x, udp_socket(ROUTER_HOST) as stranger:
        to = x.public.getsockname()
        x.client.sendto(short(0), to)
        stranger.sendto(short(1), to)
        x.client.sendto(long_header(2), to)
        x.client.sendto(short(3), to)  # after its flow's long header: stays behind it
        x.client.sendto(b"", to)
        client = x.client.getsockname()
        assert x.splicer.from_clients(1.0) == [
            (short(1), stranger.getsockname()), (long_header(2), client), (short(3), client), (b"", client)
        ]
        assert x.pod.recv(65536) == short(0)
        assert x.flow.client_bytes == 1200


def test_pod_datagrams_reach_the_client_and_new_pod_scids_come_back_to_learn_from() -> None:
    with spliced() as x:
        answers = [pod_header(b"P" * 8), long_header(0)] + [short(n) for n in range(1, 80)] + [short(80, 9000)]
        for datagram in answers:
            x.pod.sendto(datagram, x.link.getsockname())
        learned = x.splicer.from_pods(2.0)
        learned += x.splicer.from_pods(2.0)  # 64 per pod socket per call: the rest on the next
        assert learned == [(x.flow, b"P" * 8)]  # a version-0 header teaches nothing
        got = [x.client.recvfrom(65536) for _ in answers]
        assert [data for data, _ in got] == answers
        assert {address for _, address in got} == {x.public.getsockname()}
        assert (x.flow.pod_bytes, x.flow.last_active) == (sum(map(len, answers)), 2.0)
        assert x.splicer.take_counts() == (0, sum(map(len, answers)))


def _gso_send(sock: socket.socket, datagrams: list[bytes], to: tuple[str, int]) -> None:
    """One ``sendmsg`` carrying ``datagrams`` (all of the first one's size, the last maybe
    shorter) as a GSO batch, as quinn sends; skips the test where the kernel has no UDP GSO."""
    try:
        sock.sendmsg([b"".join(datagrams)], [batching.segment_cmsg(len(datagrams[0]))], 0, to)
    except OSError as exc:
        if exc.errno in batching.REFUSALS:
            pytest.skip(f"kernel without UDP GSO: {exc}")
        raise


def test_a_pods_gso_batch_is_one_read_and_reaches_the_client_as_the_same_datagrams() -> None:
    with spliced() as x:
        if not batching.enable_gro(x.link):
            pytest.skip("kernel without UDP_GRO")
        handshake = [bytes([0xC0]) + QUIC_V1.to_bytes(4, "big") + b"\x00\x04scid" + bytes(1190) for _ in range(3)]
        data = [short(n) for n in range(20)] + [short(20, 500)]
        _gso_send(x.pod, handshake, x.link.getsockname())
        _gso_send(x.pod, data, x.link.getsockname())
        learned = x.splicer.from_pods(3.0)
        assert learned == [(x.flow, b"scid")]  # one SCID: learned from the first of the three
        got = [x.client.recvfrom(65536) for _ in handshake + data]
        assert [datagram for datagram, _ in got] == handshake + data
        assert {address for _, address in got} == {x.public.getsockname()}
        assert x.flow.pod_bytes == sum(map(len, handshake + data))
        assert x.splicer.take_counts() == (0, sum(map(len, handshake + data)))


def _receive_buffer(sock: socket.socket, wanted: int) -> None:
    """At least ``wanted`` bytes of receive buffer (``SO_RCVBUFFORCE`` as root, past
    ``net.core.rmem_max``), or skip: a test of lost-nothing must not lose to its own socket."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, wanted)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, wanted)
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) < wanted:
        pytest.skip(f"a receive buffer of {wanted} bytes is not allowed here")


SO_RCVBUFFORCE = 33
"""``<asm-generic/socket.h>``: SO_RCVBUF past ``net.core.rmem_max``, for a privileged process."""


def test_gso_batches_of_more_datagrams_than_one_call_queues_all_arrive_in_order() -> None:
    with spliced() as x:
        if not batching.enable_gro(x.link):
            pytest.skip("kernel without UDP_GRO")
        _receive_buffer(x.link, 1 << 23)
        _receive_buffer(x.client, 1 << 25)
        segments = 128  # Linux 6.x takes 128 per GSO send: reads of 128 overflow one call's queue
        try:
            x.pod.sendmsg([b"".join(short(n, 40) for n in range(segments))],
                          [batching.segment_cmsg(40)], 0, x.link.getsockname())
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            segments = 64  # older kernels: 64, and the queue never overflows; all must arrive still
            _gso_send(x.pod, [short(n, 40) for n in range(segments)], x.link.getsockname())
        sent = [short(n, 40) for n in range(segments)]
        for batch in range(1, 40):
            datagrams = [short(batch * segments + n, 40) for n in range(segments)]
            _gso_send(x.pod, datagrams, x.link.getsockname())
            sent += datagrams
        x.splicer.from_pods(1.0)
        x.splicer.from_pods(1.0)
        assert [x.client.recv(65536) for _ in sent] == sent
        assert x.flow.pod_bytes == 40 * len(sent)


def test_a_flood_of_gso_batches_from_a_stranger_comes_back_a_bounded_call_at_a_time_all_in_order() -> None:
    with spliced() as x, udp_socket(ROUTER_HOST) as stranger:
        if not batching.enable_gro(x.public):
            pytest.skip("kernel without UDP_GRO")
        _receive_buffer(x.public, 1 << 23)
        sent = []
        for batch in range(100):  # 100 reads of 64 tiny datagrams: 6,400 for Python to judge
            datagrams = [bytes([0x40]) + (batch * 64 + n).to_bytes(4, "big") + bytes(3) for n in range(64)]
            _gso_send(stranger, datagrams, x.public.getsockname())
            sent += datagrams
        first = x.splicer.from_clients(1.0)
        # One recvmmsg of 64 reads holds 4,096 datagrams, past a call's worth (4 x 64): no second read.
        assert len(first) == 64 * 64
        back = first
        while batch_back := x.splicer.from_clients(1.0):
            assert len(batch_back) <= 64 * 64
            back += batch_back
        assert [data for data, _ in back] == sent
        assert {address for _, address in back} == {stranger.getsockname()}


def test_a_moved_client_gets_the_pod_datagrams_at_its_new_address() -> None:
    with spliced() as x, udp_socket(ROUTER_HOST) as moved:
        x.splicer.rekey(x.link.fileno(), moved.getsockname())
        moved.sendto(short(1), x.public.getsockname())
        x.client.sendto(short(2), x.public.getsockname())
        assert x.splicer.from_clients(1.0) == [(short(2), x.client.getsockname())]
        assert x.pod.recv(65536) == short(1)
        x.pod.sendto(short(3), x.link.getsockname())
        x.splicer.from_pods(1.0)
        assert moved.recv(65536) == short(3)


def test_a_pod_that_is_gone_fails_its_flow_once() -> None:
    with spliced() as x:
        x.pod.close()  # the port answers ICMP port unreachable: ECONNREFUSED on the next send or read
        for n in range(3):
            x.client.sendto(short(n), x.public.getsockname())
            x.splicer.from_clients(1.0)
            x.splicer.from_pods(1.0)
        assert x.splicer.has_failures
        assert x.splicer.take_failures() == [(x.flow, errno.ECONNREFUSED)]
        assert not x.splicer.has_failures


def test_a_detached_flow_takes_the_python_path_again() -> None:
    with spliced() as x:
        x.splicer.detach(x.link.fileno())
        x.splicer.detach(x.link.fileno())  # idempotent
        x.client.sendto(short(0), x.public.getsockname())
        assert x.splicer.from_clients(1.0) == [(short(0), x.client.getsockname())]
        assert x.splicer.flows == 0


def test_wrong_calls_raise_clear_errors() -> None:
    with spliced() as x:
        fd = x.link.fileno()
        with pytest.raises(ValueError, match="attached already"):
            x.splicer.attach(fd, ("127.0.0.1", 1), x.flow)
        with pytest.raises(ValueError, match="not an IPv4 address"):
            x.splicer.attach(fd + 1000, ("stargate-0", 1), x.flow)
        with pytest.raises(ValueError, match="tuple"):
            x.splicer.attach(fd + 1000, "127.0.0.1:1", x.flow)  # type: ignore[arg-type]
        with pytest.raises(KeyError):
            x.splicer.rekey(fd + 1000, x.client.getsockname())
        x.splicer.close()
        with pytest.raises(RuntimeError, match="closed"):
            x.splicer.from_clients(1.0)


datagrams = st.lists(
    st.tuples(st.sampled_from(["client", "stranger"]), st.binary(min_size=0, max_size=1400)), max_size=150
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(datagrams)
def test_every_datagram_reaches_the_pod_or_python_exactly_once_in_order(sent: list[tuple[str, bytes]]) -> None:
    """Whatever arrives: the attached client's short headers before its first other datagram go
    to the pod, everything else comes back, each exactly once and in arrival order."""
    with spliced() as x, udp_socket(ROUTER_HOST) as stranger:
        senders = {"client": x.client, "stranger": stranger}
        for who, data in sent:
            senders[who].sendto(data, x.public.getsockname())
        _assert_judged_in_order(x, senders, sent)


def _assert_judged_in_order(x: Spliced, senders: dict[str, socket.socket], sent: list[tuple[str, bytes]]) -> None:
    """One call's rule: the attached client's short headers before its first other datagram go
    to the pod, everything else comes back to Python, each exactly once and in arrival order."""
    back: list[tuple[bytes, tuple[str, int]]] = []
    while len(batch := x.splicer.from_clients(1.0)) or has_datagram(x.public):
        back += batch
    to_pod, to_python, slow = [], [], False
    for who, data in sent:
        if who == "client" and not slow and data and not data[0] & 0x80:
            to_pod.append(data)
        else:
            slow = slow or who == "client"
            to_python.append((data, senders[who].getsockname()))
    assert back == to_python
    assert [x.pod.recv(65536) for _ in to_pod] == to_pod


gso_sends = st.lists(
    st.tuples(
        st.sampled_from(["client", "stranger"]),
        st.lists(st.sampled_from([0x40, 0x5F, 0xC0]), min_size=1, max_size=24),  # short, short, long
        st.integers(8, 1300),
        st.integers(0, 5),
    ),
    max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gso_sends)
def test_a_clients_gso_batches_are_judged_datagram_by_datagram_in_order(
    sends: list[tuple[str, list[int], int, int]],
) -> None:
    """With GRO on the public socket a client's GSO batch is one read: the splice cuts it and
    holds each datagram to the same rule as if it had come alone."""
    with spliced() as x, udp_socket(ROUTER_HOST) as stranger:
        if not batching.enable_gro(x.public):
            pytest.skip("kernel without UDP_GRO")
        senders = {"client": x.client, "stranger": stranger}
        sent: list[tuple[str, bytes]] = []
        for who, firsts, size, shorter in sends:
            batch = [bytes([first]) + len(sent + [None] * k).to_bytes(2, "big") + bytes(size - 3)
                     for k, first in enumerate(firsts)]
            batch[-1] = batch[-1][: max(3, size - shorter)] if len(batch) > 1 else batch[-1]
            if len(batch) > 1:
                _gso_send(senders[who], batch, x.public.getsockname())
            else:
                senders[who].sendto(batch[0], x.public.getsockname())
            sent += [(who, datagram) for datagram in batch]
        _assert_judged_in_order(x, senders, sent)


def test_the_process_choice_takes_the_splice_unless_the_switch_is_set() -> None:
    assert choose({}).splice and native.splicer_type(choose({})) is not None
    assert choose({c.NO_EXTENSIONS_ENV: "1"}) == PYTHON and native.splicer_type(PYTHON) is None
    assert choose({c.NO_IO_URING_ENV: "1"}).splice and not choose({c.NO_IO_URING_ENV: "1"}).io_uring
    assert native.splicer_type(PYTHON.with_splice(True)) is not None


# -- through the router, with aioquic on both ends ------------------------------------------
async def _exchange(pki: DemoPki, request: bytes, answer: bytes) -> tuple[bytes, bytes, int]:
    """One QUIC stream through a router on the C splice to a real aioquic pod: (what the pod
    read, what the client read, bytes the splice moved)."""
    moved: list[int] = []

    @asynccontextmanager
    async def router_to(pod_port: int) -> AsyncIterator[int]:
        snapshot = TargetSnapshot.of([Target("stargate-0", POD_HOST, 1, pod_port)])
        # The sweeper drains the splice's counts into the metrics every sweep: none may run during
        # the exchange (a slow one, under ASan, took longer than QUIC_FLOW_SWEEP_INTERVAL_MS), or
        # take_counts below would see only what moved since the last sweep. The sweep runs four times
        # within the shortest idle timeout a flow may have (three PTOs and the grace): long here.
        quiet = UdpRouterSettings(extensions=choose().with_splice(True), sweep_interval_s=60.0,
                                  limits=FlowLimits(pending_flow_timeout_s=240.0, idle_timeout_s=600.0,
                                                    probe_timeout_s=80.0))
        async with running_udp_router(lambda: snapshot, quiet) as (router, port):
            assert router.path.splicer is not None
            yield port
            moved.append(sum(router.path.splicer.take_counts()))

    received, got = await quic_exchange(pki, request, answer, router_to)
    return received, got, moved[0]


async def test_a_quic_download_through_the_splice_is_byte_exact(pki: DemoPki) -> None:
    payload = os.urandom(300_000)
    _, got, moved = await _exchange(pki, b"download", payload)
    assert got == payload
    assert moved >= len(payload)


async def test_a_quic_upload_through_the_splice_is_byte_exact(pki: DemoPki) -> None:
    payload = os.urandom(1_000_000)
    received, got, moved = await _exchange(pki, payload, b"ok")
    assert (received, got) == (payload, b"ok")
    assert moved >= len(payload)


def test_an_ipv6_flow_is_spliced_both_ways_with_the_addresses_python_uses() -> None:
    splicer_type = native.splicer_type(Extensions(splice=True))
    assert splicer_type is not None
    sockets = [socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) for _ in range(4)]
    public, client, pod, link = sockets
    try:
        for sock in (public, client, pod):
            sock.bind(("::1", 0))
            sock.settimeout(T)
        public.setblocking(False)
        link.setblocking(False)
        link.connect(pod.getsockname())
        splicer = splicer_type(public.fileno(), 4, 64)
        flow = _flow(client.getsockname())
        splicer.attach(link.fileno(), client.getsockname(), flow)
        with pytest.raises(ValueError, match="not an IPv6 address"):
            splicer.attach(link.fileno() + 1000, ("127.0.0.1", 1), flow)
        client.sendto(short(0), public.getsockname())
        client.sendto(long_header(1), public.getsockname())
        assert splicer.from_clients(1.0) == [(long_header(1), client.getsockname())]
        assert pod.recv(65536) == short(0)
        pod.sendto(short(2), link.getsockname())
        splicer.from_pods(1.0)
        assert client.recvfrom(65536) == (short(2), public.getsockname())
        if batching.enable_gro(public) and batching.enable_gro(link):  # GSO batches both ways, as over IPv4
            up, down = [short(n, 700) for n in range(3, 9)], [short(n, 900) for n in range(9, 14)] + [short(14, 90)]
            _gso_send(client, up, public.getsockname())
            _gso_send(pod, down, link.getsockname())
            assert splicer.from_clients(2.0) == []
            splicer.from_pods(2.0)
            assert [pod.recv(65536) for _ in up] == up
            assert [client.recvfrom(65536) for _ in down] == [(d, public.getsockname()) for d in down]
        splicer.close()
    finally:
        for sock in sockets:
            sock.close()


def test_the_loop_callbacks_hand_back_datagrams_learned_headers_and_failures_in_order() -> None:
    with spliced() as x, udp_socket(ROUTER_HOST) as stranger:
        got: list[tuple[object, object]] = []
        failed: list[tuple[object, int]] = []
        to = x.public.getsockname()
        stranger.sendto(short(0), to)
        x.client.sendto(long_header(1), to)
        x.client.sendto(short(2), to)

        def on_datagram(data: bytes, address: tuple[str, int]) -> None:
            got.append((data, address))
            if data == long_header(1):  # Python may end the flow from here: the splice is not busy
                x.splicer.detach(x.link.fileno())

        assert x.splicer.pump_clients(lambda: 3.0, on_datagram, lambda *a: failed.append(a)) is None
        assert got == [(short(0), stranger.getsockname()), (long_header(1), x.client.getsockname()),
                       (short(2), x.client.getsockname())]
        x.splicer.attach(x.link.fileno(), x.client.getsockname(), x.flow)
        x.pod.sendto(pod_header(b"Q" * 8), x.link.getsockname())
        x.splicer.pump_pods(lambda: 4.0, lambda *a: got.append(a), lambda *a: failed.append(a), print)
        assert got[-1] == (x.flow, b"Q" * 8)
        x.pod.close()
        x.client.sendto(short(4), to)
        x.splicer.pump_clients(lambda: 4.0, on_datagram, lambda *a: failed.append(a))
        x.splicer.pump_pods(lambda: 4.0, lambda *a: got.append(a), lambda *a: failed.append(a), print)
        assert failed == [(x.flow, errno.ECONNREFUSED)]
        with pytest.raises(ZeroDivisionError):
            x.client.sendto(long_header(5), to)
            x.splicer.pump_clients(lambda: 5.0, lambda *a: 1 / 0, lambda *a: None)


def test_a_pod_scid_is_handed_back_when_it_changes_and_unusable_headers_never() -> None:
    with spliced() as x:
        sent = [pod_header(b"A" * 8), pod_header(b"A" * 8), pod_header(b"B" * 8), pod_header(b"A" * 8),
                pod_header(b"C" * 8, version=0x0A0A0A0A), pod_header(b""),
                bytes([0xC0, 0, 0, 0, 1, 30]) + bytes(10)]  # a DCID longer than the datagram
        for datagram in sent:
            x.pod.sendto(datagram, x.link.getsockname())
        learned = x.splicer.from_pods(1.0)
        assert [scid for _, scid in learned] == [b"A" * 8, b"B" * 8, b"A" * 8]
        assert [x.client.recv(65536) for _ in sent] == sent


def client_header(dcid: bytes) -> bytes:
    """A client's Handshake-like long header to this DCID."""
    return bytes([0xE0, 0, 0, 0, 1, len(dcid)]) + dcid + bytes([8]) + bytes(8) + bytes(50)


def test_client_long_headers_to_the_learned_pod_cid_are_spliced_others_come_back() -> None:
    with spliced() as x:
        to = x.public.getsockname()
        x.client.sendto(client_header(b"A" * 8), to)  # nothing learned yet: Python judges it
        assert x.splicer.from_clients(1.0) == [(client_header(b"A" * 8), x.client.getsockname())]
        x.pod.sendto(pod_header(b"A" * 8), x.link.getsockname())
        assert len(x.splicer.from_pods(1.0)) == 1
        sent = [client_header(b"A" * 8), client_header(b"A" * 7), client_header(b"B" * 8), short(1)]
        for datagram in sent:
            x.client.sendto(datagram, to)
        assert x.splicer.from_clients(2.0) == [(datagram, x.client.getsockname()) for datagram in sent[1:]]
        assert x.pod.recv(65536) == sent[0]


QUIC_VERSIONS = (1, 0x6B3343CF)
"""v1 and v2: the versions whose pod SCIDs the splice remembers."""


@st.composite
def quic_like(draw: st.DrawFn) -> bytes:
    """Long headers whose lengths may lie, to pod CIDs from a small set, or any bytes at all."""
    if draw(st.booleans()):
        return draw(st.binary(min_size=1, max_size=120))
    version = draw(st.sampled_from([*QUIC_VERSIONS, 0, 0x0A0A0A0A]))
    dcid = draw(st.sampled_from([b"", b"A" * 8, b"B" * 8, b"A" * 20]))
    scid = draw(st.sampled_from([b"", b"A" * 8, b"B" * 8, b"C" * 4]))
    cut = draw(st.integers(min_value=1, max_value=60))
    first = draw(st.sampled_from([0x40, 0xC0, 0xE0]))
    lying = draw(st.sampled_from([None, 0, 21, 255]))
    raw = bytes([first]) + version.to_bytes(4, "big") + bytes([len(dcid) if lying is None else lying]) + dcid
    return (raw + bytes([len(scid)]) + scid + bytes(20))[: max(1, len(raw) + cut)]


def learned_by_model(datagrams: list[bytes]) -> tuple[list[bytes], bytes | None]:
    """The SCIDs the splice hands back of a pod's datagrams, and the one it remembers (its rules, in
    Python): a non-empty v1/v2 SCID that is not the remembered one."""
    remembered: bytes | None = None
    handed: list[bytes] = []
    for d in datagrams:
        if not d[0] & 0x80:
            continue
        at = 6 + d[5] if len(d) >= 7 else 0
        usable = (len(d) >= 7 and int.from_bytes(d[1:5], "big") in QUIC_VERSIONS and d[5] <= 20 and at < len(d)
                  and 0 < d[at] <= 20 and at + 1 + d[at] <= len(d))
        if usable and d[at + 1 : at + 1 + d[at]] != remembered:
            remembered = d[at + 1 : at + 1 + d[at]]
            handed.append(remembered)
    return handed, remembered


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(quic_like(), min_size=1, max_size=30), st.lists(quic_like(), max_size=30))
def test_whatever_the_pod_and_client_send_the_splice_follows_its_rules(
    from_pod: list[bytes], from_client: list[bytes]
) -> None:
    """Hostile bytes both ways: every pod datagram reaches the client unchanged and in order, and
    only the new v1/v2 SCIDs of its long headers come back; the client's reach
    the pod while they are short headers or long headers to the remembered pod CID, the rest
    (from the first other one on) come back, each exactly once and in order."""
    with spliced() as x:
        for datagram in from_pod:
            x.pod.sendto(datagram, x.link.getsockname())
        learned: list[tuple[object, bytes]] = []
        while len(batch := x.splicer.from_pods(1.0)) or has_datagram(x.link):
            learned += batch
        assert [x.client.recv(65536) for _ in from_pod] == from_pod
        handed, remembered = learned_by_model(from_pod)
        assert learned == [(x.flow, scid) for scid in handed]
        for datagram in from_client:
            x.client.sendto(datagram, x.public.getsockname())
        to_pod: list[bytes] = []
        to_python: list[bytes] = []
        for d in from_client:
            to_learned = bool(remembered) and remembered is not None and d[5:6] == bytes([len(remembered)]) \
                and d[6 : 6 + len(remembered)] == remembered
            if not to_python and (not d[0] & 0x80 or to_learned):
                to_pod.append(d)
            else:
                to_python.append(d)
        assert [data for data, _ in x.splicer.from_clients(2.0)] == to_python
        assert [x.pod.recv(65536) for _ in to_pod] == to_pod
