"""The C splice with many flows in one batch: their sends to the pods in one ``io_uring_enter``.

Where the kernel allows io_uring (``router/udp/_send_ring.h``), a client batch's datagrams for
several flows leave in one system call, each flow's linked in order; otherwise, or switched off,
one ``sendmmsg`` per flow. Both must deliver the same datagrams to the same pods in the same
order, count the same bytes, and treat a refusing pod (GSO, ECONNREFUSED) the same way. Real
loopback sockets; each pod is its own socket on 127.0.0.2.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import platform
import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from aioquic.asyncio import connect
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from discovery.targets import Target, TargetSnapshot
from router.demo.pki import DemoPki
from router.demo.quic_pods import client_configuration
from router.extensions import SPLICE_MODULE, Extensions, choose, is_built
from router.udp import native
from router.udp.flows import Flow
from router.udp.settings import UdpRouterSettings
from tests.support.quic_exchange import answering_pod
from tests.support.udp_router import has_datagram, running_udp_router, udp_socket

pytestmark = pytest.mark.skipif(not is_built(SPLICE_MODULE), reason="the C splice is not built (no C compiler)")

ROUTER_HOST, POD_HOST = "127.0.0.1", "127.0.0.2"
SNI = "stargate-0.stargate.external"
T = 5.0
SO_NO_CHECK = 11
"""``<asm-generic/socket.h>``: no UDP checksum on send, which makes the kernel refuse GSO (EINVAL)."""


def _splicer(public: socket.socket, io_uring: bool) -> native.Splicer:
    splicer_type = native.splicer_type(Extensions(splice=True))
    assert splicer_type is not None
    return splicer_type(public.fileno(), 4, 64, io_uring=io_uring)


def short(flow: int, n: int, size: int = 1200) -> bytes:
    """A short-header-looking datagram of ``flow``, numbered ``n``."""
    return bytes([0x40, flow]) + n.to_bytes(4, "big") + bytes(size - 6)


@dataclass
class Many:
    """A splicer on ``public`` with flow i: ``clients[i]`` <-> ``pods[i]`` through ``links[i]``."""

    splicer: native.Splicer
    public: socket.socket
    clients: list[socket.socket]
    pods: list[socket.socket]
    links: list[socket.socket]
    flows: list[Flow[None]]

    def send(self, i: int, data: bytes) -> None:
        self.clients[i].sendto(data, self.public.getsockname())

    def drain(self) -> list[tuple[bytes, tuple[str, int]]]:
        """Run ``from_clients`` until the public socket is empty; what came back to Python."""
        back: list[tuple[bytes, tuple[str, int]]] = []
        while len(batch := self.splicer.from_clients(1.0)) or has_datagram(self.public):
            back += batch
        return back


@contextmanager
def spliced_flows(count: int, io_uring: bool) -> Iterator[Many]:
    with ExitStack() as stack:
        public = stack.enter_context(udp_socket(ROUTER_HOST))
        public.setblocking(False)
        clients = [stack.enter_context(udp_socket(ROUTER_HOST)) for _ in range(count)]
        pods = [stack.enter_context(udp_socket(POD_HOST)) for _ in range(count)]
        links = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK))
                 for _ in range(count)]
        splicer = _splicer(public, io_uring)
        stack.callback(splicer.close)
        flows = []
        for client, pod, link in zip(clients, pods, links, strict=True):
            link.connect(pod.getsockname())
            flows.append(Flow(client.getsockname(), "stargate-0", None, last_active=0.0))
            splicer.attach(link.fileno(), client.getsockname(), flows[-1])
        yield Many(splicer, public, clients, pods, links, flows)


both = pytest.mark.parametrize("io_uring", [True, False], ids=["io_uring", "sendmmsg"])


def test_the_ring_opens_where_the_kernel_allows_it_and_only_when_asked() -> None:
    with udp_socket(ROUTER_HOST) as sock:
        off = _splicer(sock, False)
        assert (off.io_uring, off.io_uring_errno) == (False, 0)
        on = _splicer(sock, True)
        if not on.io_uring:
            assert on.io_uring_errno in (errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOMEM)
            pytest.skip(f"io_uring refused here ({errno.errorcode[on.io_uring_errno]})")
        assert on.io_uring_errno == 0
        on.close()
        assert not on.io_uring  # closed with the splice


# Each datagram: (flow, first byte, size). 0x40/0x5F short headers, 0xC0 a long header, size 0 empty.
traffic = st.lists(
    st.tuples(st.integers(0, 4), st.sampled_from([0x40, 0x40, 0x5F, 0xC0]), st.sampled_from([0, 40, 700, 1200, 1200])),
    max_size=160,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traffic)
def test_every_flows_datagrams_reach_its_pod_or_python_exactly_once_in_order(sent: list[tuple[int, int, int]]) -> None:
    """The same traffic through the ring and through sendmmsg: each flow's short headers before
    its first other datagram reach its own pod in order; everything else comes back in order."""
    for io_uring in (True, False):
        with spliced_flows(5, io_uring) as x:
            to_pod: list[list[bytes]] = [[] for _ in x.flows]
            to_python, slow = [], set()
            for n, (i, first, size) in enumerate(sent):
                data = b"" if size == 0 else bytes([first, i]) + n.to_bytes(4, "big") + bytes(max(0, size - 6))
                x.send(i, data)
                if data and not data[0] & 0x80 and i not in slow:
                    to_pod[i].append(data)
                else:
                    slow.add(i)
                    to_python.append((data, x.clients[i].getsockname()))
            assert x.drain() == to_python
            for i, pod in enumerate(x.pods):
                assert [pod.recv(65536) for _ in to_pod[i]] == to_pod[i]
                assert x.flows[i].client_bytes == sum(map(len, to_pod[i]))
            assert x.splicer.take_counts()[0] == sum(len(d) for flow in to_pod for d in flow)


@both
def test_interleaved_bursts_of_many_flows_arrive_whole_and_in_order(io_uring: bool) -> None:
    with spliced_flows(8, io_uring) as x:
        if io_uring and not x.splicer.io_uring:
            pytest.skip("io_uring refused here")
        for n in range(30):  # round robin: a batch of 64 holds 8 datagrams of each flow
            for i in range(8):
                x.send(i, short(i, n, 1200 if n % 7 else 300))
        assert x.drain() == []
        for i, pod in enumerate(x.pods):
            assert [pod.recv(65536) for _ in range(30)] == [short(i, n, 1200 if n % 7 else 300) for n in range(30)]
        assert x.splicer.io_uring is io_uring


@both
def test_a_pod_socket_that_refuses_gso_gets_its_runs_datagram_by_datagram_beside_the_others(io_uring: bool) -> None:
    with spliced_flows(3, io_uring) as x:
        x.links[1].setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
        for _ in range(2):  # the second time the flow is known to refuse: datagram by datagram at once
            for n in range(20):
                for i in range(3):
                    x.send(i, short(i, n, 1200 if n < 19 else 500))
            assert x.drain() == []
            for i, pod in enumerate(x.pods):
                assert [pod.recv(65536) for _ in range(20)] == [short(i, n, 1200 if n < 19 else 500) for n in range(20)]
        assert [flow.client_bytes for flow in x.flows] == [2 * (19 * 1200 + 500)] * 3


@both
def test_a_gone_pod_fails_its_flow_once_and_the_other_flows_go_on(io_uring: bool) -> None:
    with spliced_flows(3, io_uring) as x:
        x.pods[0].close()  # ICMP port unreachable: ECONNREFUSED on the flow's next send
        for n in range(4):
            for i in range(3):
                x.send(i, short(i, n))
            x.drain()
        assert x.splicer.take_failures() == [(x.flows[0], errno.ECONNREFUSED)]
        for i in (1, 2):
            assert [x.pods[i].recv(65536) for _ in range(4)] == [short(i, n) for n in range(4)]


def test_another_thread_cannot_submit_to_the_ring_and_the_batch_still_arrives() -> None:
    """The ring is opened single-issuer (Linux 6.1+): a call from another thread makes the kernel
    refuse the submission, and the splice sends that batch, and all later ones, with sendmmsg."""
    with spliced_flows(3, True) as x:
        if not x.splicer.io_uring:
            pytest.skip("io_uring refused here")
        for i in range(3):
            x.send(i, short(i, 0))
        done: list[list[tuple[bytes, tuple[str, int]]]] = []
        worker = threading.Thread(target=lambda: done.append(x.drain()))
        worker.start()
        worker.join(T)
        assert done == [[]]
        assert [pod.recv(65536) for pod in x.pods] == [short(i, 0) for i in range(3)]
        if tuple(map(int, platform.release().split(".")[:2])) >= (6, 1):
            assert not x.splicer.io_uring


def test_a_forked_child_sends_with_sendmmsg_and_leaves_the_parents_ring_alone() -> None:
    with spliced_flows(2, True) as x:
        if not x.splicer.io_uring:
            pytest.skip("io_uring refused here")
        pid = os.fork()
        if pid == 0:  # the child: the inherited ring is not its own
            code = 1
            try:
                for i in range(2):
                    x.send(i, short(i, 1))
                code = 0 if not x.splicer.io_uring and x.drain() == [] else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert [pod.recv(65536) for pod in x.pods] == [short(i, 1) for i in range(2)]
        assert x.splicer.io_uring  # the parent's ring still works
        for i in range(2):
            x.send(i, short(i, 2))
        assert x.drain() == []
        assert [pod.recv(65536) for pod in x.pods] == [short(i, 2) for i in range(2)]


@pytest.mark.parametrize("io_uring", [True, False], ids=["io_uring", "sendmmsg"])
async def test_concurrent_quic_uploads_through_the_router_are_byte_exact(pki: DemoPki, io_uring: bool) -> None:
    """Eight real aioquic clients upload at once through a router on the C splice to one real
    aioquic pod: their datagrams share client batches, which go to the pod through the ring."""
    payloads = [os.urandom(150_000) for _ in range(8)]
    async with answering_pod(pki, lambda data: hashlib.sha256(data).digest()) as pod_port:
        snapshot = TargetSnapshot.of([Target("stargate-0", POD_HOST, 1, pod_port)])
        settings_ = UdpRouterSettings(extensions=choose().with_splice(True, io_uring))
        async with running_udp_router(lambda: snapshot, settings_) as (router, port):

            async def upload(payload: bytes) -> bytes:
                client_config = client_configuration(SNI, Path(pki.ca_path))
                async with connect(ROUTER_HOST, port, configuration=client_config) as client:
                    reader, writer = await client.create_stream()
                    writer.write(payload)
                    writer.write_eof()
                    return await asyncio.wait_for(reader.read(), T)

            answers = await asyncio.wait_for(asyncio.gather(*(upload(p) for p in payloads)), 4 * T)
            assert answers == [hashlib.sha256(p).digest() for p in payloads]
            splicer = router.path.splicer
            assert splicer is not None
            if io_uring and splicer.io_uring:
                assert splicer.ring_batches > 0
            else:
                assert splicer.ring_batches == 0
