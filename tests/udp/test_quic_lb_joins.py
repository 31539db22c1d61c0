"""QUIC-LB joins on the edge in this process, with raw datagrams: what a miss may cost.

A datagram that names no flow opens one only if its connection ID's server ID names exactly one
ready pod, within the join bucket, the flow table and the client's limit; everything else is
dropped and counted under its own reason (a random short header costs a slice and a lookup). With
QUIC-LB off the same datagrams are dropped as ever (``not_initial``).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import pytest

from discovery.targets import Target
from router.demo.pki import DemoPki
from router.extensions import Extensions
from router.udp.quic_lb import pod_server_id
from tests.support.initial_packets import long_header_packet
from tests.support.polling import eventually
from tests.support.quic_lb_pods import quic_lb_cid
from tests.support.quic_pods_harness import POD_HOSTS, ROUTER_HOST, Harness, running

pytestmark = pytest.mark.timeout(60)
"""Every test here runs on the pure-Python path and on the C splice."""

QUIC_LB = {"quic_lb_server_id_bytes": 4}


def short_header(server_id: bytes, rotation: int = 1) -> bytes:
    """A short header whose 12-byte DCID (its length self-encoded) carries ``server_id``."""
    cid = quic_lb_cid(server_id, os.urandom(11 - len(server_id)), rotation, self_encoded=True)
    return b"\x40" + cid + os.urandom(40)


def names(pod: str) -> bytes:
    sid = pod_server_id(POD_HOSTS[pod], 4)
    assert sid is not None
    return sid


@contextmanager
def clients(n: int) -> Iterator[list[socket.socket]]:
    """``n`` UDP sockets on ``ROUTER_HOST``: ``n`` client addresses of one client IP."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) for _ in range(n)]
        for sock in socks:
            sock.bind((ROUTER_HOST, 0))
        yield socks


def send_each(h: Harness, socks: list[socket.socket], make: bytes | Callable[[], bytes]) -> None:
    for sock in socks:
        sock.sendto(make() if callable(make) else make, (ROUTER_HOST, h.port))


async def test_a_short_header_naming_a_ready_pod_opens_one_flow_to_it(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions, **QUIC_LB) as h:
        with clients(1) as (sock,):
            for _ in range(3):
                sock.sendto(short_header(names("stargate-1")), (ROUTER_HOST, h.port))
            await eventually(lambda: h.outcome("joined") == 1 and h.router.active_flows == 1)
            flow = h.router.table.flow(sock.getsockname())
            assert flow is not None and flow.pod_name == "stargate-1" and flow.shared
            await eventually(lambda: flow.client_bytes == 3 * 53, what="all three datagrams on the flow")
        assert h.outcome("accepted") == 0


async def test_a_handshake_packet_naming_a_pod_joins_it_and_a_zero_rtt_packet_never_does(
    pki: DemoPki, extensions: Extensions
) -> None:
    """A v1 Handshake packet's DCID is always one the server issued; a 0-RTT packet's is the
    client's choice, which names no pod (and an Initial is read for its SNI instead)."""
    def cid() -> bytes:
        return quic_lb_cid(names("stargate-0"), os.urandom(7), 0, self_encoded=True)

    async with running(pki, extensions, **QUIC_LB) as h:
        with clients(2) as (handshake, zero_rtt):
            handshake.sendto(long_header_packet(2, 300, dcid=cid()), (ROUTER_HOST, h.port))
            zero_rtt.sendto(long_header_packet(1, 300, dcid=cid()), (ROUTER_HOST, h.port))
            await eventually(lambda: h.outcome("joined") == 1 and h.dropped("not_initial") == 1)
            flow = h.router.table.flow(handshake.getsockname())
            assert flow is not None and flow.pod_name == "stargate-0"


async def test_a_flood_naming_a_pod_opens_no_more_flows_than_the_join_bucket_holds(
    pki: DemoPki, extensions: Extensions
) -> None:
    async with running(pki, extensions, **QUIC_LB, quic_lb_join_burst=5, quic_lb_joins_per_s=0.001) as h:
        with clients(40) as socks:
            send_each(h, socks, lambda: short_header(names("stargate-0")))
            await eventually(lambda: h.dropped("quic_lb_rate_limited") == 35, what="35 joins refused")
            assert h.outcome("joined") == 5 and h.router.active_flows == 5


async def test_datagrams_naming_no_ready_pod_open_nothing(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions, **QUIC_LB) as h:
        with clients(30) as socks:
            send_each(h, socks[:10], lambda: short_header(bytes([10, 9, 9, 9])))  # nobody's address
            send_each(h, socks[10:20], lambda: short_header(names("stargate-0"), rotation=0b111))  # not encoded
            send_each(h, socks[20:], b"\x40\x0b\x7f")  # too short for the length it self-encodes
            await eventually(lambda: h.dropped("quic_lb_unknown_server") == 10 and h.dropped("not_initial") == 20)
            assert h.router.active_flows == 0 and h.outcome("joined") == 0 and h.router.pending_flows == 0


async def test_joins_hold_the_client_limit_and_the_flow_table_bound(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions, **QUIC_LB, max_flows_per_client=2) as h:
        with clients(5) as socks:
            send_each(h, socks, lambda: short_header(names("stargate-0")))
            await eventually(lambda: h.dropped("quic_lb_refused") == 3)
            assert h.outcome("joined") == 2 and h.router.active_flows == 2
    async with running(pki, extensions, **QUIC_LB, max_flows=3) as h:
        with clients(5) as socks:  # joins the pod never answers: each newer one takes the oldest's place
            send_each(h, socks, lambda: short_header(names("stargate-1")))
            await eventually(lambda: h.outcome("joined") == 5)
            assert h.terminations("evicted") == 2 and h.router.active_flows == 3
            assert h.dropped("flow_table_full") == 0


async def test_a_draining_router_joins_nothing(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions, **QUIC_LB) as h:
        h.router.stop_accepting()
        with clients(3) as socks:
            send_each(h, socks, lambda: short_header(names("stargate-0")))
            await eventually(lambda: h.dropped("quic_lb_refused") == 3)
            assert h.router.active_flows == 0


async def test_pods_whose_addresses_end_alike_name_nobody_and_are_logged_once_per_snapshot(
    pki: DemoPki, extensions: Extensions, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(pki, extensions, quic_lb_server_id_bytes=1) as h:
        twin = Target("stargate-9", "10.0.0.2", 1, h.targets["stargate-1"].quic_port)  # ends in 2, as 127.0.0.2
        h.publish("stargate-0", "stargate-1", twin=twin)
        with caplog.at_level(logging.WARNING, logger="router.udp_router"), clients(4) as socks:
            send_each(h, socks[:3], lambda: short_header(b"\x02"))
            socks[3].sendto(short_header(b"\x03"), (ROUTER_HOST, h.port))  # stargate-1: no twin
            await eventually(lambda: h.dropped("quic_lb_unknown_server") == 3 and h.outcome("joined") == 1)
        warnings = [r.getMessage() for r in caplog.records if "quic-lb" in r.getMessage()]
        assert warnings == ["quic-lb: pods whose addresses end in the same 1 bytes have no server ID: "
                            "stargate-0, stargate-9"]


async def test_without_quic_lb_such_datagrams_are_dropped_as_ever(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions) as h:
        with clients(3) as socks:
            send_each(h, socks, lambda: short_header(names("stargate-0")))
            await eventually(lambda: h.dropped("not_initial") == 3)
            assert h.router.active_flows == 0 and h.outcome("joined") == 0
