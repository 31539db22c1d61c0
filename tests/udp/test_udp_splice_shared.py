"""The C splice with several flows on one client address: each datagram to the flow its
Destination Connection ID names, on real loopback sockets (``router/udp/_splice.c``).

An address with one flow costs nothing more (``test_udp_splice``: every short header is that
flow's). Once two flows meet at an address (attached there, or one moved there), the splice
compares each datagram's DCID with the pod CID each of them learned last; what names none goes
back to Python (``router.udp.demux``), with the rest of that address's datagrams of the call, so
no flow's datagrams overtake each other.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.extensions import SPLICE_MODULE, Extensions, is_built
from router.udp import native
from router.udp.flows import Flow
from tests.support.udp_router import has_datagram, udp_socket

pytestmark = pytest.mark.skipif(not is_built(SPLICE_MODULE), reason="the C splice is not built (no C compiler)")

ROUTER_HOST = "127.0.0.1"
POD_HOSTS = ("127.0.0.2", "127.0.0.3")
CIDS = (b"\x10" * 8, b"\x11" * 8)
UNKNOWN = b"\x99" * 8


def short(dcid: bytes, n: int) -> bytes:
    """A short header to ``dcid``, numbered ``n``."""
    return bytes([0x40]) + dcid + n.to_bytes(4, "big") + bytes(100)


def client_header(dcid: bytes) -> bytes:
    """A client's Handshake-like long header to this DCID."""
    return bytes([0xE0, 0, 0, 0, 1, len(dcid)]) + dcid + bytes([8]) + bytes(8) + bytes(50)


def pod_header(scid: bytes) -> bytes:
    """A pod's v1 long header with this SCID: the splice remembers it as the flow's pod CID."""
    return bytes([0xE0, 0, 0, 0, 1, 8]) + bytes(8) + bytes([len(scid)]) + scid + bytes(60)


@dataclass
class Shared:
    """Two flows on ``client``'s address, to ``pods[i]`` through ``links[i]``, pod CIDs ``CIDS[i]``."""

    splicer: native.Splicer
    public: socket.socket
    client: socket.socket
    pods: list[socket.socket]
    links: list[socket.socket]
    flows: list[Flow[None]]

    def send(self, *datagrams: bytes, sock: socket.socket | None = None) -> None:
        for datagram in datagrams:
            (sock or self.client).sendto(datagram, self.public.getsockname())

    def received(self, i: int) -> list[bytes]:
        got = []
        while has_datagram(self.pods[i]):
            got.append(self.pods[i].recv(65536))
        return got


@contextmanager
def shared(learn: bool = True) -> Iterator[Shared]:
    splicer_type = native.splicer_type(Extensions(splice=True))
    assert splicer_type is not None
    with ExitStack() as stack:
        public, client = stack.enter_context(udp_socket(ROUTER_HOST)), stack.enter_context(udp_socket(ROUTER_HOST))
        public.setblocking(False)
        pods = [stack.enter_context(udp_socket(host)) for host in POD_HOSTS]
        for pod in pods:
            pod.setblocking(False)  # what a call spliced is queued before it returns: drained without waiting
        links = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK))
                 for _ in pods]
        splicer = splicer_type(public.fileno(), 4, 64)
        flows = [Flow(client.getsockname(), f"stargate-{i}", None, last_active=0.0) for i in range(2)]
        for link, pod, flow in zip(links, pods, flows, strict=True):
            link.connect(pod.getsockname())
            splicer.attach(link.fileno(), client.getsockname(), flow)
        x = Shared(splicer, public, client, pods, links, flows)
        if learn:
            for pod, link, cid in zip(pods, links, CIDS, strict=True):
                pod.sendto(pod_header(cid), link.getsockname())
            assert {flow_ for flow_, _ in splicer.from_pods(1.0)} == set(flows)
            assert len([client.recv(65536) for _ in pods]) == 2  # the pods' long headers reached the client
        try:
            yield x
        finally:
            splicer.close()


def test_two_flows_on_one_address_each_get_the_short_headers_that_name_their_pod_cid() -> None:
    with shared() as x:
        x.send(short(CIDS[0], 1), short(CIDS[1], 2), short(CIDS[1], 3), short(CIDS[0], 4))
        assert x.splicer.from_clients(2.0) == []
        assert x.received(0) == [short(CIDS[0], 1), short(CIDS[0], 4)]
        assert x.received(1) == [short(CIDS[1], 2), short(CIDS[1], 3)]
        assert (x.flows[0].client_bytes, x.flows[1].client_bytes) == (2 * len(short(CIDS[0], 1)),) * 2


def test_long_headers_to_a_flows_learned_cid_are_spliced_to_it() -> None:
    with shared() as x:
        x.send(client_header(CIDS[1]), client_header(CIDS[0]))
        assert x.splicer.from_clients(2.0) == []
        assert x.received(1) == [client_header(CIDS[1])] and x.received(0) == [client_header(CIDS[0])]


def test_a_datagram_naming_no_flow_goes_back_with_the_rest_of_its_address_in_that_call() -> None:
    """Python decides where it goes (the address's first flow, or a moved one); whatever that
    address sent after it in the same call follows it there, in order."""
    with shared() as x:
        sent = [short(CIDS[0], 1), short(UNKNOWN, 2), short(CIDS[1], 3), short(CIDS[0], 4)]
        x.send(*sent)
        back = x.splicer.from_clients(2.0)
        assert back == [(d, x.client.getsockname()) for d in sent[1:]]
        assert x.received(0) == [sent[0]] and x.received(1) == []
        x.send(short(CIDS[1], 5))  # the next call splices again
        assert x.splicer.from_clients(3.0) == [] and x.received(1) == [short(CIDS[1], 5)]


def test_before_the_pods_answer_nothing_of_a_shared_address_is_spliced() -> None:
    with shared(learn=False) as x:
        x.send(short(CIDS[0], 1), client_header(CIDS[0]))
        assert [d for d, _ in x.splicer.from_clients(1.0)] == [short(CIDS[0], 1), client_header(CIDS[0])]


def test_the_second_flow_keeps_the_address_when_the_first_is_detached_and_stays_told_apart() -> None:
    with shared() as x:
        x.splicer.detach(x.links[0].fileno())
        x.send(short(CIDS[1], 1), short(CIDS[0], 2))
        assert x.splicer.from_clients(1.0) == [(short(CIDS[0], 2), x.client.getsockname())]
        assert x.received(1) == [short(CIDS[1], 1)] and x.splicer.flows == 1
        x.pods[1].sendto(b"\x40reply", x.links[1].getsockname())
        x.splicer.from_pods(2.0)
        assert x.client.recv(65536) == b"\x40reply"


def test_a_flow_moved_onto_another_flows_address_joins_it() -> None:
    """An endpoint's connections follow it one by one when it rebinds: the first one moved to the
    new address takes it alone, the second joins it, and each keeps its datagrams."""
    with shared() as x, udp_socket(ROUTER_HOST) as moved:
        x.splicer.rekey(x.links[0].fileno(), moved.getsockname())
        x.send(short(CIDS[0], 1), sock=moved)
        x.send(short(CIDS[1], 2))
        assert x.splicer.from_clients(1.0) == []
        assert x.received(0) == [short(CIDS[0], 1)] and x.received(1) == [short(CIDS[1], 2)]
        x.splicer.rekey(x.links[1].fileno(), moved.getsockname())
        x.send(short(CIDS[1], 3), short(CIDS[0], 4), sock=moved)
        assert x.splicer.from_clients(2.0) == []
        assert x.received(0) == [short(CIDS[0], 4)] and x.received(1) == [short(CIDS[1], 3)]
        x.send(short(CIDS[0], 5))  # nothing is at the old address any more
        assert x.splicer.from_clients(3.0) == [(short(CIDS[0], 5), x.client.getsockname())]
        for i in range(2):
            x.pods[i].sendto(bytes([0x40, i]), x.links[i].getsockname())
        x.splicer.from_pods(4.0)
        assert sorted(moved.recv(65536) for _ in range(2)) == [b"\x40\x00", b"\x40\x01"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([0, 1, 2]), max_size=60))
def test_every_datagram_of_a_shared_address_reaches_its_pod_or_python_exactly_once_in_order(
    choices: list[int],
) -> None:
    with shared() as x:
        sent = [short((*CIDS, UNKNOWN)[c], n) for n, c in enumerate(choices)]
        x.send(*sent)
        back = [d for d, _ in x.splicer.from_clients(1.0)]
        got = [x.received(0), x.received(1)]
        first_back = next((i for i, c in enumerate(choices) if c == 2), len(choices))
        assert back == sent[first_back:]  # the unknown one and everything after it, in order
        for i in range(2):
            assert got[i] == [d for d, c in zip(sent[:first_back], choices, strict=False) if c == i]
