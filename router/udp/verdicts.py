"""What the QUIC edge does with a datagram that no routed flow simply takes.

Pure verdicts over the flow table (``flow_table``) and the datagram's bytes:
``classify_unrouted`` for an address with no flow (open a pending flow, join a migrated flow,
answer Version Negotiation, re-answer a refusal, or drop, with the reason counted), and
``classify_on_flow`` for a long header from an established flow's address (forward it, or
sniff a contender: a new connection reusing the address). The cheap checks come first, so
only a well-formed Initial of at least 1200 bytes may cost a pending flow.
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
    parse_long_header,
)
from router.outcomes import QuicDropReason
from router.udp.flow_table import Address, Flow, Rejection, UdpFlowTable

S = TypeVar("S")
H = TypeVar("H")


class Verdict(Enum):
    """What the edge does with a datagram from an address that has no flow."""

    DROP = "drop"
    """Count it under ``Unrouted.drop_reason`` and forget it."""
    JOIN = "join"
    """It carries a learned pod CID: re-key ``Unrouted.flow`` to this address (migration)."""
    NEGOTIATE = "negotiate"
    """Unknown version, big enough to start a connection: answer Version Negotiation."""
    REANSWER = "reanswer"
    """A retransmit of a refused attempt: resend ``Unrouted.rejection.answer`` if allowed."""
    OPEN = "open"
    """A client Initial of a new attempt: start a pending flow and sniff it."""
    FORWARD = "forward"
    """(Established flow) one of its connections' datagrams: send it to the pod."""
    CONTEND = "contend"
    """(Established flow) a datagram of the contender already sniffed at this address: feed it."""


class Unrouted(NamedTuple, Generic[H]):
    """The verdict on one unrouted datagram, with what the edge needs to carry it out. A named
    tuple, not a frozen dataclass: one is built per new address's datagram, in one call."""

    verdict: Verdict
    drop_reason: QuicDropReason | None = None
    flow: Flow[H] | None = None
    header: LongHeader | None = None
    rejection: Rejection | None = None


def classify_unrouted(
    table: UdpFlowTable[S, H], datagram: bytes, address: Address, now: float, cid_length: int | None,
    native: InitialProtection | None = None,
) -> Unrouted[H]:
    """Judge a datagram from an address with neither a flow nor a pending flow.

    Cheap checks first: only a well-formed v1/v2 Initial of at least 1200 bytes may cost
    a pending flow (RFC 9000 14.1), so short or non-Initial datagrams are never buffered.
    """
    if not datagram:
        return Unrouted(Verdict.DROP, QuicDropReason.MALFORMED)
    if not datagram[0] & 0x80:
        flow = table.flow_for_short_header(datagram, cid_length)
        return Unrouted(Verdict.JOIN, flow=flow) if flow else Unrouted(Verdict.DROP, QuicDropReason.NOT_INITIAL)
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
            return Unrouted(Verdict.DROP, QuicDropReason.NOT_INITIAL)
        return Unrouted(Verdict.NEGOTIATE, header=header)
    if header.packet_type is not PacketType.INITIAL:
        return Unrouted(Verdict.DROP, QuicDropReason.NOT_INITIAL)
    rejection = table.rejection(address, header.dcid, now)
    if rejection is not None:
        return Unrouted(Verdict.REANSWER, header=header, rejection=rejection)
    if not big_enough:
        return Unrouted(Verdict.DROP, QuicDropReason.SHORT_INITIAL)
    return Unrouted(Verdict.OPEN, header=header)


def classify_on_flow(
    table: UdpFlowTable[S, H], flow: Flow[H], datagram: bytes, now: float, native: InitialProtection | None = None
) -> Unrouted[H]:
    """Judge a long-header datagram from the address of an established flow.

    FORWARD unless it belongs to the contender sniffed at this address (CONTEND) or is a
    client Initial (v1/v2, >= 1200 bytes) whose DCID is neither a client DCID of the flow nor
    a learned pod CID: a new connection, which OPENs a contender (REANSWER if it was refused,
    DROP ``pending_full`` while another contender holds the address).
    """
    contender = table.pending(flow.address)
    if contender is None and (
        len(datagram) < QUIC_MIN_INITIAL_DATAGRAM_BYTES or _known_dcid(table, flow, datagram)
    ):  # cannot open a connection: forwarded without a parse (most handshake datagrams)
        return _FORWARD
    try:
        header = parse_long_header(datagram, 0, native)
    except QuicPacketError:
        return _FORWARD
    if contender is not None and contender.dcid == header.dcid:
        return Unrouted(Verdict.CONTEND, header=header)
    if (
        header.packet_type is not PacketType.INITIAL
        or len(datagram) < QUIC_MIN_INITIAL_DATAGRAM_BYTES
        or header.dcid in flow.client_dcids
        or table.flow_for_cid(header.dcid) is flow
    ):
        return _FORWARD
    rejection = table.rejection(flow.address, header.dcid, now)
    if rejection is not None:
        return Unrouted(Verdict.REANSWER, header=header, rejection=rejection)
    if contender is not None:
        return Unrouted(Verdict.DROP, QuicDropReason.PENDING_FULL)
    return Unrouted(Verdict.OPEN, header=header)


_FORWARD: Unrouted[Any] = Unrouted(Verdict.FORWARD)
"""The usual verdict on an established flow's long header, allocated once."""


def _known_dcid(table: UdpFlowTable[S, H], flow: Flow[H], datagram: bytes) -> bool:
    """Whether the long header's DCID (RFC 8999 invariants: its length at byte 5) is a client
    DCID of the flow or a pod CID learned for it: then it is one of this flow's connections."""
    if len(datagram) < 6:
        return False
    dcid = datagram[6 : 6 + datagram[5]]
    return dcid in flow.client_dcids or table.flow_for_cid(dcid) is flow
