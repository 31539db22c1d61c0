"""UdpRouter end to end: real aioquic clients -> router (127.0.0.1) -> real aioquic pods (127.0.0.2/3)."""

from __future__ import annotations

import asyncio
import logging
import random
import socket

import pytest
from aioquic.asyncio import QuicConnectionProtocol, connect
from aioquic.quic.connection import QuicConnection

from discovery.targets import Target
from quic.packet import QuicErrorCode
from router import constants as c
from router.demo.pki import DemoPki
from router.demo.quic_pods import QUIC_V1, QUIC_V2, WHOAMI, client_configuration, request
from router.extensions import Extensions
from tests.support.names import host as sni
from tests.support.polling import eventually, holds, steady
from tests.support.quic_initial_rewriter import BIG_HELLO_ALPN, SERVER_COMPLETABLE, rewrite_flight
from tests.support.quic_pods_harness import (
    POD_HOSTS,
    ROUTER_HOST,
    T,
    first_flight,
    raw_socket,
    received,
    refusal,
    running,
)

pytestmark = pytest.mark.timeout(30)
"""Every test here runs on the pure-Python path and on the C splice, each within 30 s."""

# -- routing ------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [QUIC_V1, QUIC_V2], ids=["v1", "v2"])
async def test_handshake_and_stream_reach_the_named_pod(pki: DemoPki, extensions: Extensions, version: int) -> None:
    async with running(pki, extensions) as h:
        assert await h.whoami(sni("stargate-0"), version) == "stargate-0"
        assert await h.whoami(sni("stargate-1"), version) == "stargate-1"
        assert h.outcome("accepted") == 2
        assert h.count(f"{c.RELAYED_BYTES_TOTAL}_total", protocol="quic", direction="client_to_pod") > 2400
        assert h.count(f"{c.RELAYED_BYTES_TOTAL}_total", protocol="quic", direction="pod_to_client") > 1000
        assert h.count(c.ACTIVE_CONNECTIONS, protocol="quic") == h.router.active_flows == 2
        assert h.count(c.PENDING_FLOWS) == h.router.pending_flows == 0


async def test_twenty_concurrent_connections_split_over_two_pods(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions) as h:
        wanted = [f"stargate-{i % 2}" for i in range(20)]
        got = await asyncio.wait_for(asyncio.gather(*(h.whoami(sni(p)) for p in wanted)), 3 * T)
        assert got == wanted
        assert h.outcome("accepted") == 20


async def test_a_pod_answering_with_retry_is_passed_through(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions, retry=True) as h:
        assert await h.whoami(sni("stargate-1")) == "stargate-1"
        assert h.outcome("accepted") == 1 and h.router.active_flows == 1


async def test_version_negotiation_from_the_pod_is_passed_through(pki: DemoPki, extensions: Extensions) -> None:
    """A v2 client meets a v1-only pod: the pod's VN reaches it and its v1 retry stays on the flow."""
    async with running(pki, extensions, pod_versions=(QUIC_V1,)) as h:
        assert await h.whoami(sni("stargate-0"), QUIC_V2) == "stargate-0"
        assert h.outcome("accepted") == 1 and h.router.active_flows == 1


@pytest.mark.parametrize("case", sorted(SERVER_COMPLETABLE))
async def test_rewritten_first_flights_complete_through_the_router(
    pki: DemoPki, extensions: Extensions, case: str
) -> None:
    """Chrome-like chaos, reordering, duplicates, junk: the router buffers and forwards as is."""
    async with running(pki, extensions) as h:
        loop = asyncio.get_running_loop()
        config = client_configuration(sni("stargate-0"), h.cafile, extra_alpn=BIG_HELLO_ALPN)
        conn = QuicConnection(configuration=config)
        client = QuicConnectionProtocol(conn)
        transport, _ = await loop.create_datagram_endpoint(lambda: client, local_addr=(ROUTER_HOST, 0))
        try:
            router_addr = (ROUTER_HOST, h.port)
            conn.connect(router_addr, now=loop.time())
            flight = [d for d, _ in conn.datagrams_to_send(now=loop.time())]
            assert len(flight) >= 2  # the big ClientHello spans several datagrams
            for datagram in rewrite_flight(flight, case, random.Random(case)):
                transport.sendto(datagram, router_addr)
            client.transmit()  # arm aioquic's timers; later datagrams flow unchanged
            await asyncio.wait_for(client.wait_connected(), T)
            answer = await request(client, WHOAMI)
            assert answer == b"stargate-0:" + WHOAMI
            client.close()
        finally:
            transport.close()


# -- refusals -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("server_name", "outcome", "reason"),
    [
        (None, "missing_sni", c.REASON_MISSING_SNI),
        ("stargate-0.example.com", "unknown_sni", c.REASON_UNKNOWN_SNI),
        (sni("stargate-9"), "target_unavailable", c.REASON_TARGET_NOT_READY),
    ],
    ids=["missing", "unknown", "not_in_snapshot"],
)
async def test_refusals_fail_fast_with_the_reason(
    pki: DemoPki, extensions: Extensions, caplog: pytest.LogCaptureFixture, server_name: str | None, outcome: str,
    reason: str,
) -> None:
    async with running(pki, extensions) as h:
        with caplog.at_level(logging.INFO, logger="router.udp_router"):
            terminated = await asyncio.wait_for(refusal(h, server_name), T)
        assert (terminated.error_code, terminated.reason_phrase) == (QuicErrorCode.CONNECTION_REFUSED, reason)
        assert h.outcome(outcome) == 1 and h.outcome("accepted") == 0
        assert h.router.active_flows == h.router.pending_flows == 0
        logged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert any(outcome in m and repr(server_name) in m and "127.0.0.1:" in m for m in logged)


async def test_a_flood_of_refusals_is_counted_but_logged_at_a_bounded_rate(
    pki: DemoPki, extensions: Extensions, caplog: pytest.LogCaptureFixture
) -> None:
    attempts = 3 * int(c.REJECTION_LOG_LINES_PER_S)
    async with running(pki, extensions) as h, raw_socket() as sock:
        flights = [first_flight(h, "nobody.example.com")[0] for _ in range(attempts)]  # a new DCID each
        with caplog.at_level(logging.INFO, logger="router.udp_router"):
            for initial in flights:
                sock.sendto(initial, (ROUTER_HOST, h.port))
            await eventually(lambda: h.outcome("unknown_sni") == attempts, what="every attempt refused")
        refused = [r for r in caplog.records if "quic flow refused" in r.getMessage()]
        assert 1 <= len(refused) <= c.REJECTION_LOG_LINES_PER_S + 1


async def test_snapshot_changes_apply_to_new_flows_only(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions) as h:
        h.publish("stargate-0")
        await asyncio.wait_for(refusal(h, sni("stargate-1")), T)
        config = client_configuration(sni("stargate-0"), h.cafile)
        async with connect(ROUTER_HOST, h.port, configuration=config) as kept:
            h.publish("stargate-1")  # stargate-0 leaves: its open flow keeps going
            assert await request(kept, b"still") == b"stargate-0:still"
            assert await h.whoami(sni("stargate-1")) == "stargate-1"
            moved = Target("stargate-0", POD_HOSTS["stargate-1"], 1, h.targets["stargate-1"].quic_port)
            h.publish(**{"stargate-0": moved})
            assert await h.whoami(sni("stargate-0")) == "stargate-1"  # routed by the new snapshot
        assert h.outcome("target_unavailable") == 1


async def test_retransmits_of_a_refused_attempt_get_a_bounded_number_of_answers(
    pki: DemoPki, extensions: Extensions
) -> None:
    async with running(pki, extensions) as h, raw_socket() as sock:
        (initial,) = first_flight(h, "nobody.example.com")
        for _ in range(5):
            sock.sendto(initial, (ROUTER_HOST, h.port))
        await eventually(lambda: h.dropped("rate_limited") == 2, what="two silenced retransmits")
        answers = received(sock)
        assert len(answers) == c.QUIC_ANSWERS_PER_REJECTION
        assert all(len(a) <= len(initial) for a in answers)
        assert h.outcome("unknown_sni") == 1  # parsed and counted once


async def test_refusals_beyond_the_byte_budget_are_silent(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions, reject_budget_bytes_per_s=1.0) as h, raw_socket() as sock:
        (initial,) = first_flight(h, "nobody.example.com")
        sock.sendto(initial, (ROUTER_HOST, h.port))
        await eventually(lambda: h.dropped("rate_limited") == 1, what="a refusal over budget")
        assert received(sock) == [] and h.outcome("unknown_sni") == 1


async def test_unusable_datagrams_from_new_addresses_are_dropped_and_counted(
    pki: DemoPki, extensions: Extensions
) -> None:
    async with running(pki, extensions) as h, raw_socket() as sock:
        (initial,) = first_flight(h, sni("stargate-0"))
        router = (ROUTER_HOST, h.port)
        sock.sendto(b"\x40" + bytes(40), router)  # short header, unknown CID
        sock.sendto(initial[:1100], router)  # an Initial cut under 1200 bytes
        sock.sendto(b"\xff\x00", router)  # a long header that is not one
        reasons = ("not_initial", "short_initial", "malformed")
        await eventually(lambda: [h.dropped(r) for r in reasons] == [1, 1, 1], what="three drops")
        assert received(sock) == [] and h.router.pending_flows == h.router.active_flows == 0


async def test_unknown_versions_get_version_negotiation_never_larger_thanreceived(
    pki: DemoPki, extensions: Extensions
) -> None:
    async with running(pki, extensions) as h, raw_socket() as sock:
        dcid, scid = bytes(range(8)), bytes(range(10, 18))
        probe = b"\xc0" + (0x1A2A3A4A).to_bytes(4, "big") + b"\x08" + dcid + b"\x08" + scid
        sock.sendto(probe.ljust(1200, b"\x00"), (ROUTER_HOST, h.port))
        sock.sendto(probe.ljust(1199, b"\x00"), (ROUTER_HOST, h.port))  # too small to answer
        await eventually(lambda: h.dropped("not_initial") == 2, what="both probes handled")
        (vn,) = received(sock)
        assert vn[0] & 0x80 and vn[1:5] == bytes(4) and len(vn) <= 1200
        assert vn[5:6 + 8 + 1 + 8] == b"\x08" + scid + b"\x08" + dcid  # CIDs echoed swapped
        versions = {int.from_bytes(vn[i : i + 4], "big") for i in range(23, len(vn), 4)}
        assert versions == {QUIC_V1, QUIC_V2}


async def test_incomplete_client_hellos_wait_bounded_then_expire(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions, max_pending_flows=1, pending_flow_timeout_s=0.3) as h, \
            raw_socket() as first, raw_socket() as second:
        conn = QuicConnection(
            configuration=client_configuration(sni("stargate-0"), h.cafile, extra_alpn=BIG_HELLO_ALPN)
        )
        conn.connect((ROUTER_HOST, h.port), now=0.0)
        part = next(iter(conn.datagrams_to_send(now=0.0)))[0]  # 1 of 3 datagrams of the hello
        first.sendto(part, (ROUTER_HOST, h.port))
        await eventually(lambda: h.router.pending_flows == 1, what="one pending flow")
        assert h.count(c.PENDING_FLOWS) == 1  # the gauge reads the table at scrape time
        second.sendto(part, (ROUTER_HOST, h.port))
        await eventually(lambda: h.dropped("pending_full") == 1, what="pending table full")
        await eventually(lambda: h.dropped("pending_timeout") == 1, what="the pending flow to expire")
        assert h.router.pending_flows == 0 and h.count(c.PENDING_FLOWS) == 0


async def test_an_idle_router_does_not_sweep_until_something_can_expire(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions, pending_flow_timeout_s=0.2) as h, raw_socket() as client:  # sweeps every 50 ms
        sweeps: list[float] = []
        sweep = h.router.sweep
        h.router.sweep = lambda now: (sweeps.append(now), sweep(now))[1]  # type: ignore[method-assign]
        # nothing to expire: the sweeper sleeps, no timer wakes the loop (six sweep periods)
        await holds(lambda: sweeps == [], 0.3, what="no sweep")
        conn = QuicConnection(
            configuration=client_configuration(sni("stargate-0"), h.cafile, extra_alpn=BIG_HELLO_ALPN)
        )
        conn.connect((ROUTER_HOST, h.port), now=0.0)
        client.sendto(next(iter(conn.datagrams_to_send(now=0.0)))[0], (ROUTER_HOST, h.port))
        await eventually(lambda: h.dropped("pending_timeout") == 1, what="the pending flow to expire")
        settled = await steady(lambda: len(sweeps), 0.1, what="the last sweep (two periods without one)")
        await holds(lambda: len(sweeps) == settled, 0.3, what="no sweep")  # empty again: asleep again


async def test_a_pod_port_that_refuses_is_a_relay_error(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions) as h, raw_socket() as sock:
        closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        closed.bind((POD_HOSTS["stargate-0"], 0))
        dead = Target("stargate-0", POD_HOSTS["stargate-0"], 1, closed.getsockname()[1])
        closed.close()  # nothing listens there now: the kernel answers ICMP port unreachable
        h.publish(**{"stargate-0": dead})
        for datagram in first_flight(h, sni("stargate-0")):
            sock.sendto(datagram, (ROUTER_HOST, h.port))
        await eventually(lambda: h.outcome("relay_error") == 1, what="the flow to fail")
        assert h.outcome("accepted") == 1 and h.router.active_flows == 0
        assert h.count(c.ACTIVE_CONNECTIONS, protocol="quic") == 0


# -- flow lifetime ------------------------------------------------------------------------
async def _rebind(client: QuicConnectionProtocol) -> asyncio.DatagramTransport:
    """Move the client to a new UDP port, as a NAT rebinding does (the QUIC state stays)."""
    old = client._transport
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", 0, 0, 0))
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(lambda: client, sock=sock)
    assert old is not None
    old.close()
    return transport


@pytest.mark.parametrize("cid_length", [None, 8], ids=["learned_cid_length", "configured_cid_length"])
async def test_a_client_that_rebinds_its_port_keeps_its_connection(
    pki: DemoPki, extensions: Extensions, cid_length: int | None
) -> None:
    async with running(pki, extensions, cid_length=cid_length) as h:
        config = client_configuration(sni("stargate-1"), h.cafile)
        async with connect(ROUTER_HOST, h.port, configuration=config) as client:
            assert await request(client, b"before") == b"stargate-1:before"
            moved = await _rebind(client)
            try:
                assert await request(client, b"after") == b"stargate-1:after"
                assert await request(client, b"again") == b"stargate-1:again"
            finally:
                moved.close()
        assert h.outcome("accepted") == 1 and h.dropped("not_initial") == 0


async def test_idle_flows_expire_as_completed(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions, idle_timeout_s=0.4) as h:
        config = client_configuration(sni("stargate-0"), h.cafile)
        async with connect(ROUTER_HOST, h.port, configuration=config) as client:
            assert await request(client, b"hi") == b"stargate-0:hi"
            assert h.count(c.ACTIVE_CONNECTIONS, protocol="quic") == 1
            await eventually(lambda: h.router.active_flows == 0, what="the idle flow to expire")
            assert h.outcome("completed") == 1
            assert h.count(c.ACTIVE_CONNECTIONS, protocol="quic") == 0


async def test_drain_refuses_new_flows_and_keeps_established_ones(pki: DemoPki, extensions: Extensions) -> None:
    async with running(pki, extensions) as h:
        config = client_configuration(sni("stargate-0"), h.cafile)
        async with connect(ROUTER_HOST, h.port, configuration=config) as client:
            h.router.stop_accepting()
            terminated = await asyncio.wait_for(refusal(h, sni("stargate-1")), T)
            assert terminated.reason_phrase == c.REASON_TARGET_NOT_READY
            assert await request(client, b"draining") == b"stargate-0:draining"
            await asyncio.wait_for(h.router.drain(0.2), T)  # the flow outlives the drain: cut
            assert h.router.active_flows == 0 and h.outcome("completed") == 1
