"""Several QUIC connections on one client address, told apart by connection ID: the flow table and
``classify_on_flow`` on plain values (no sockets). The end-to-end proofs with real clients are in
``test_udp_connections_per_address``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.outcomes import QuicDropReason
from router.udp.flow_limits import FlowLimits
from router.udp.flow_table import UdpFlowTable
from router.udp.flows import Flow, PendingFlow
from router.udp.verdicts import Unrouted, Verdict, classify_on_flow
from tests.support.initial_packets import long_header_packet as long_header

A = ("192.0.2.1", 1000)
B = ("192.0.2.2", 2000)
OLD_DCID, NEW_DCID = b"O" * 8, b"N" * 8
POD_0, POD_1 = b"\x10" * 8, b"\x11" * 8
SCID_0, SCID_1 = b"s" * 8, b"t" * 8
INITIAL, ZERO_RTT, HANDSHAKE = 0, 1, 2

Table = UdpFlowTable[str, str]


def _connection(table: Table, address: tuple[str, int], dcid: bytes, scid: bytes, pod: str, pod_cid: bytes,
                now: float = 0.0) -> Flow[str]:
    """A flow as the edge makes one: a pending flow keyed by its first DCID, established, its pod CID learned."""
    opened = table.open_pending(address, "sniffer", now, dcid=dcid, scid=scid)
    assert isinstance(opened, PendingFlow)
    flow = table.establish(opened, pod, "link", now)
    table.learn_cid(flow, pod_cid)
    return flow


def _two_at_a(table: Table) -> tuple[Flow[str], Flow[str]]:
    first = _connection(table, A, OLD_DCID, SCID_0, "stargate-0", POD_0)
    second = _connection(table, A, NEW_DCID, SCID_1, "stargate-1", POD_1)
    return first, second


def _short(dcid: bytes) -> bytes:
    return b"\x41" + dcid + bytes(40)


def _judge(table: Table, datagram: bytes, address: tuple[str, int] = A) -> Unrouted[str, str]:
    first = table.flow(address)
    assert first is not None
    return classify_on_flow(table, first, datagram, 0.0, None)


def test_only_a_full_initial_naming_no_connection_is_a_new_one() -> None:
    table = Table()
    flow = _connection(table, A, OLD_DCID, SCID_0, "stargate-0", POD_0)
    for datagram in (
        long_header(INITIAL, 1200, dcid=OLD_DCID),  # the connection's retransmitted Initial
        long_header(INITIAL, 1200, dcid=POD_0),  # its Initial after the pod's Initial (or Retry)
        long_header(HANDSHAKE, 1300, dcid=b"X" * 8),  # not an Initial: the address's flow
        long_header(INITIAL, 1199, dcid=NEW_DCID),  # too small to start a connection
        long_header(INITIAL, 1300, version=0x1A2A3A4A, dcid=NEW_DCID),  # unknown version
        b"\xc0\x00",  # unparseable
        b"",
    ):
        assert _judge(table, datagram) == (Verdict.FORWARD, None, flow, None, None, None)
    got = _judge(table, long_header(INITIAL, 1200, dcid=NEW_DCID))
    assert got.verdict is Verdict.OPEN and got.header is not None and got.header.dcid == NEW_DCID


def test_new_connections_from_a_flows_address_are_pending_flows_beside_it() -> None:
    table = Table(FlowLimits(max_pending_flows=2, max_pending_flows_per_address=2))
    flow = _connection(table, A, OLD_DCID, SCID_0, "stargate-0", POD_0)
    second = table.open_pending(A, "s", 0.0, dcid=NEW_DCID, scid=SCID_1)
    third = table.open_pending(A, "s", 0.0, dcid=b"T" * 8)
    assert isinstance(second, PendingFlow) and isinstance(third, PendingFlow)
    assert table.pending(A, NEW_DCID) is second and table.flow(A) is flow and not flow.shared
    assert table.open_pending(B, "s", 0.0) == QuicDropReason.PENDING_FULL  # bounded like any pending flow
    got = _judge(table, long_header(ZERO_RTT, 1300, dcid=NEW_DCID))
    assert (got.verdict, got.pending) == (Verdict.FEED, second)
    assert _judge(table, _short(POD_0)).verdict is Verdict.FORWARD  # unshared: a short header is the flow's
    assert table.expire(10.0).pending == (second, third)


def test_two_connections_on_one_address_are_told_apart_by_their_connection_ids() -> None:
    table = Table()
    first, second = _two_at_a(table)
    assert first.shared and second.shared and list(table.flows_at(A)) == [first, second]
    cases = {
        _short(POD_0): first,
        _short(POD_1): second,
        long_header(INITIAL, 1200, dcid=NEW_DCID): second,  # its Initial's retransmit
        long_header(ZERO_RTT, 1300, dcid=NEW_DCID): second,
        long_header(HANDSHAKE, 400, dcid=POD_1): second,
        long_header(HANDSHAKE, 400, dcid=POD_0): first,
        long_header(HANDSHAKE, 400, dcid=b"?" * 8, scid=SCID_1): second,  # by the client's own CID
        long_header(HANDSHAKE, 400, dcid=b"?" * 8, scid=b"?" * 8): first,
        b"": first,
    }
    for datagram, flow in cases.items():
        assert (_judge(table, datagram).verdict, _judge(table, datagram).flow) == (Verdict.FORWARD, flow)
    # A short header naming no CID: the address's first flow's, as when it was alone, unless QUIC-LB
    # names another pod (UNNAMED says so to the edge).
    unnamed = _judge(table, _short(b"\x99" * 8))
    assert (unnamed.verdict, unnamed.flow) == (Verdict.UNNAMED, first)


def test_an_address_keeps_its_other_flows_when_its_first_one_ends() -> None:
    table = Table()
    first, second = _two_at_a(table)
    assert table.remove(first)
    assert table.flow(A) is second and list(table.flows_at(A)) == [second]
    assert second.shared  # still told apart by CID: its endpoint may open another connection any time
    assert _judge(table, _short(POD_1)).flow is second


def test_connections_of_one_endpoint_follow_it_to_a_new_address_one_by_one() -> None:
    """A rebinding endpoint: each connection's first datagram from the new address moves its flow,
    also where another of its flows already is."""
    table = Table()
    first, second = _two_at_a(table)
    assert table.migrate(first, B)  # the edge's JOIN from an address with no flow
    assert table.flow(B) is first and first.shared
    got = _judge(table, _short(POD_1), B)  # the second connection from B: found by its pod CID
    assert (got.verdict, got.flow) == (Verdict.JOIN, second)
    assert table.migrate(second, B) and list(table.flows_at(B)) == [first, second]
    assert table.flow(A) is None
    handshake = _judge(table, long_header(HANDSHAKE, 400, dcid=POD_0), B)
    assert (handshake.verdict, handshake.flow) == (Verdict.FORWARD, first)


def test_a_spoofed_initial_from_a_live_address_gets_its_own_flow_and_the_live_one_keeps_its_datagrams() -> None:
    table = Table()
    live = _connection(table, A, OLD_DCID, SCID_0, "stargate-0", POD_0)
    spoofed = _judge(table, long_header(INITIAL, 1200, dcid=b"F" * 8, scid=b"F" * 8))
    assert spoofed.verdict is Verdict.OPEN
    pending = table.open_pending(A, "s", 0.0, dcid=b"F" * 8, scid=b"F" * 8)
    assert isinstance(pending, PendingFlow)
    impostor = table.establish(pending, "stargate-1", "link", 0.0)
    table.learn_cid(impostor, b"\x77" * 8)
    assert table.flow(A) is live  # first it stays: what no CID names is still the live one's
    for datagram in (_short(POD_0), _short(b"\x42" * 8), long_header(HANDSHAKE, 400, dcid=POD_0, scid=SCID_0)):
        assert _judge(table, datagram).flow is live


def test_a_refused_new_connection_is_reanswered_not_sniffed_again() -> None:
    table = Table()
    _connection(table, A, OLD_DCID, SCID_0, "stargate-0", POD_0)
    table.rejections.remember((A, NEW_DCID), b"close", now=0.0)
    got = classify_on_flow(table, table.flow(A), long_header(INITIAL, 1200, dcid=NEW_DCID), 1.0, None)  # type: ignore[arg-type]
    assert got.verdict is Verdict.REANSWER and got.rejection is not None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1400), st.sampled_from([None, 4, 8]))
def test_any_bytes_from_a_shared_address_get_a_verdict_never_an_exception(
    datagram: bytes, cid_length: int | None
) -> None:
    table = Table()
    _, second = _two_at_a(table)
    table.migrate(second, B)
    for address in (A, B):
        flow = table.flow(address)
        assert flow is not None
        got = classify_on_flow(table, flow, datagram, 0.0, cid_length)
        assert got.verdict is not Verdict.DROP or got.drop_reason in tuple(QuicDropReason)
        assert got.verdict is not Verdict.FORWARD or (got.flow is not None and got.flow.address == address)
