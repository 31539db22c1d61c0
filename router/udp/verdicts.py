"""What the QUIC edge does with a datagram that no routed flow simply takes.

Pure verdicts over the flow table and the datagram's bytes, as QUIC's own demultiplexing: the
connection IDs a datagram carries name its flow, and what names nothing goes to the address's first
flow. Cheap checks come first: only a well-formed v1/v2 Initial of at least 1200 bytes may cost a
pending flow (RFC 9000 section 14.1).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Generic, NamedTuple, TypeVar

from quic.native import InitialProtection
from quic.packet import (
    QUIC_MIN_INITIAL_DATAGRAM_BYTES,
    QUIC_VERSION_NEGOTIATION,
    SUPPORTED_VERSIONS,
    LongHeader,
    PacketType,
    QuicPacketError,
    long_header_cids,
    parse_long_header,
)
from router.outcomes import QuicDropReason
from router.udp.flow_table import UdpFlowTable
from router.udp.flows import Address, Flow, PendingFlow
from router.udp.rejections import Rejection

S = TypeVar("S")
H = TypeVar("H")


class Verdict(Enum):
    """What the edge does with a datagram that no flow simply takes."""

    DROP = "drop"
    """Count it under ``Unrouted.drop_reason`` and forget it."""
    JOIN = "join"
    """A learned pod CID of ``Unrouted.flow``, from a new address (NAT rebinding): move the flow, forward."""
    NEGOTIATE = "negotiate"
    """Unknown version, big enough to start a connection: answer Version Negotiation."""
    REANSWER = "reanswer"
    """A retransmit of a refused attempt: resend ``Unrouted.rejection.answer`` if allowed."""
    OPEN = "open"
    """A client Initial of a new connection: start a pending flow and sniff it."""
    FORWARD = "forward"
    """One of ``Unrouted.flow``'s datagrams, from its address: send it to the pod."""
    FEED = "feed"
    """A datagram of ``Unrouted.pending``, a connection from this address still being sniffed."""
    UNNAMED = "unnamed"
    """A shared address's short header naming no learned CID: the first flow's, unless a join names a pod."""
    MISS = "miss"
    """Not an Initial, naming no flow, from an address with none: joined if it names a pod, else ``not_initial``."""


class Unrouted(NamedTuple, Generic[S, H]):
    """The verdict on one datagram, with what the edge needs to carry it out. A named tuple,
    not a frozen dataclass: one is built per judged datagram, in one call."""

    verdict: Verdict
    drop_reason: QuicDropReason | None = None
    flow: Flow[H] | None = None
    header: LongHeader | None = None
    rejection: Rejection | None = None
    pending: PendingFlow[S] | None = None


_MISS: Unrouted[Any, Any] = Unrouted(Verdict.MISS, QuicDropReason.NOT_INITIAL)
"""The verdict on a miss: built once (``drop_reason``: what it counts as when no join takes it)."""


def classify_unrouted(
    table: UdpFlowTable[S, H], datagram: bytes, address: Address, now: float, cid_length: int | None,
    native: InitialProtection | None = None,
) -> Unrouted[S, H]:
    """Judge a datagram from an address with no flow: a connection being sniffed there, a migrated
    flow's, a new attempt, or junk; short or non-Initial datagrams are never buffered (RFC 9000 14.1)."""
    if not datagram:
        return Unrouted(Verdict.DROP, QuicDropReason.MALFORMED)
    if not datagram[0] & 0x80:
        flow = table.flow_for_short_header(datagram, cid_length)
        return Unrouted(Verdict.JOIN, flow=flow) if flow else _MISS
    pending = table.pending(address, long_header_cids(datagram)[0])
    if pending is not None:  # a datagram of a connection being sniffed: its first DCID
        return Unrouted(Verdict.FEED, pending=pending)
    try:
        header = parse_long_header(datagram, 0, native)
    except QuicPacketError:
        return Unrouted(Verdict.DROP, QuicDropReason.MALFORMED)
    flow = table.flow_for_cid(header.dcid) if header.dcid else None
    if flow is not None:
        return Unrouted(Verdict.JOIN, flow=flow)
    big_enough = len(datagram) >= QUIC_MIN_INITIAL_DATAGRAM_BYTES
    if header.version not in SUPPORTED_VERSIONS:
        # RFC 9000 6.1: never answer a VN, nor a datagram too small to start a connection.
        if header.version == QUIC_VERSION_NEGOTIATION or not big_enough:
            return _MISS
        return Unrouted(Verdict.NEGOTIATE, header=header)
    if header.packet_type is not PacketType.INITIAL:
        return _MISS
    rejection = table.rejections.get((address, header.dcid), now)
    if rejection is not None:
        return Unrouted(Verdict.REANSWER, header=header, rejection=rejection)
    if not big_enough:
        return Unrouted(Verdict.DROP, QuicDropReason.SHORT_INITIAL)
    return Unrouted(Verdict.OPEN, header=header)


def classify_on_flow(
    table: UdpFlowTable[S, H], first: Flow[H], datagram: bytes, now: float, cid_length: int | None,
    native: InitialProtection | None = None,
) -> Unrouted[S, H]:
    """Judge a long header from the address of its first flow ``first``, or any datagram of a shared
    address: a DCID naming a flow or pending connection, then a full v1/v2 Initial (a new connection),
    then the client's SCID; what names nothing is ``first``'s."""
    address = first.address
    if not datagram:
        return _forward(first)
    if not datagram[0] & 0x80:  # a short header of a shared address: the pod CID it carries
        named = table.flow_for_short_header(datagram, cid_length)
        if named is None:
            return Unrouted(Verdict.UNNAMED, flow=first)
        return _forward(named) if named.address == address else Unrouted(Verdict.JOIN, flow=named)
    dcid, scid = long_header_cids(datagram)
    flow = table.flow_for_long_header(address, dcid)
    if flow is not None:
        return _forward(flow) if flow.address == address else Unrouted(Verdict.JOIN, flow=flow)
    pending = table.pending(address, dcid)
    if pending is not None:
        return Unrouted(Verdict.FEED, pending=pending)
    if len(datagram) >= QUIC_MIN_INITIAL_DATAGRAM_BYTES:
        try:
            header = parse_long_header(datagram, 0, native)
        except QuicPacketError:
            header = None
        if header is not None and header.packet_type is PacketType.INITIAL and header.version in SUPPORTED_VERSIONS:
            rejection = table.rejections.get((address, header.dcid), now)
            if rejection is not None:
                return Unrouted(Verdict.REANSWER, header=header, rejection=rejection)
            return Unrouted(Verdict.OPEN, header=header)
    return _forward(table.flow_for_client_scid(address, scid) or first)


def _forward(flow: Flow[H]) -> Unrouted[Any, H]:
    return Unrouted(Verdict.FORWARD, flow=flow)


def judge(
    table: UdpFlowTable[S, H], first: Flow[H] | None, datagram: bytes, address: Address, now: float,
    cid_length: int | None, native: InitialProtection | None = None,
) -> Unrouted[S, H]:
    """The verdict on a datagram from ``address``, whose first flow is ``first`` (None: it has none)."""
    if first is None:
        return classify_unrouted(table, datagram, address, now, cid_length, native)
    return classify_on_flow(table, first, datagram, now, cid_length, native)
