"""QUIC long/short header parsing (RFC 8999 invariants, RFC 9000 section 17, RFC 9369).

The router never terminates QUIC, so it reads only what is in the clear: version, connection IDs,
token, and where each coalesced packet ends. Every read is bounds-checked; untrusted input can only
raise :class:`QuicPacketError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import IntEnum
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from quic.native import InitialProtection

QUIC_V1 = 0x00000001
"""RFC 9000."""
QUIC_V2 = 0x6B3343CF
"""RFC 9369: same protocol as v1, different wire image (types, salt, labels)."""
QUIC_VERSION_NEGOTIATION = 0x00000000
"""A long header with version 0 is a Version Negotiation packet (RFC 8999 section 6)."""
SUPPORTED_VERSIONS = (QUIC_V1, QUIC_V2)
"""Versions whose Initials the router can open, in server preference order."""

QUIC_MIN_INITIAL_DATAGRAM_BYTES = 1200
"""RFC 9000 section 14.1: a client Initial datagram is at least 1200 bytes."""

MAX_CID_LENGTH = 20
"""v1/v2 connection IDs are at most 20 bytes (RFC 9000 section 17.2); invariants allow 255."""
VARINT_MAX = (1 << 62) - 1
"""Largest value a QUIC variable-length integer can carry (RFC 9000 section 16)."""

LONG_FORM = 0x80
_LONG_HEADER_MIN = 7  # first byte + version(4) + dcid length(1) + scid length(1)


class QuicPacketError(ValueError):
    """Bytes that are not a usable QUIC packet; the one error type of all of ``quic/``."""


class UnsupportedVersion(QuicPacketError):
    """A long header of a version other than v1/v2: answer Version Negotiation (it carries the CIDs)."""

    def __init__(self, version: int, dcid: bytes = b"", scid: bytes = b"") -> None:
        super().__init__(f"unsupported QUIC version 0x{version:08x}")
        self.version = version
        self.dcid = dcid
        self.scid = scid


class PacketType(IntEnum):
    """Long header packet types, normalised across versions (v1 wire values)."""

    INITIAL = 0
    ZERO_RTT = 1
    HANDSHAKE = 2
    RETRY = 3


class QuicErrorCode(IntEnum):
    """Transport error codes of CONNECTION_CLOSE (RFC 9000 section 20.1) the router sends;
    names and values as aioquic's ``QuicErrorCode``."""

    INTERNAL_ERROR = 0x1
    """The endpoint hit an error it cannot name more precisely."""
    CONNECTION_REFUSED = 0x2
    """The server refuses the connection: the router's answer to an Initial it cannot route."""


_V2_TYPES = (PacketType.RETRY, PacketType.INITIAL, PacketType.ZERO_RTT, PacketType.HANDSHAKE)
"""RFC 9369 section 3.2: v2 wire type bits 0b00..0b11 -> normalised type."""
_V1_TYPES = tuple(PacketType)
"""v1 wire type bits -> type: a tuple index, not an enum call, on every long header."""


def packet_type_bits(version: int, packet_type: PacketType) -> int:
    """The two type bits (already shifted to bits 4-5) of ``packet_type`` in ``version``."""
    wire = _V2_TYPES.index(packet_type) if version == QUIC_V2 else int(packet_type)
    return wire << 4


class LongHeader(NamedTuple):
    """The cleartext part of one long-header packet, positioned inside its datagram. A NamedTuple, not a
    frozen dataclass: built per new flow's datagram in one C call, not one ``__setattr__`` per field."""

    version: int
    packet_type: PacketType | None
    """None for Version Negotiation (version 0) and versions other than v1/v2."""
    dcid: bytes
    scid: bytes
    token: bytes
    """Initial only, else b""."""
    header_length: int
    """Offset of the (protected) packet number; for VN/Retry/unknown versions, of the byte after the SCID."""
    packet_length: int
    """Bytes of this packet (header + Length's payload); for Retry, VN, unknown versions the datagram's rest."""
    offset: int = 0
    """Offset in the datagram of this packet's first byte (non-zero when coalesced)."""

    @property
    def end(self) -> int:
        """Offset just past this packet: where a coalesced next packet starts."""
        return self.offset + self.packet_length


def decode_varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the QUIC varint at ``pos``; bounds-checked."""
    if pos >= len(data):
        raise QuicPacketError("truncated varint")
    first = data[pos]
    size = 1 << (first >> 6)
    if pos + size > len(data):
        raise QuicPacketError("truncated varint")
    value = first & 0x3F
    for i in range(1, size):
        value = (value << 8) | data[pos + i]
    return value, pos + size


def encode_varint(value: int) -> bytes:
    """Shortest QUIC varint encoding of ``value``."""
    if value < 0 or value > VARINT_MAX:
        raise QuicPacketError(f"varint out of range: {value}")
    if value < 0x40:
        return bytes((value,))
    if value < 0x4000:
        return (value | 0x4000).to_bytes(2, "big")
    if value < 0x4000_0000:
        return (value | 0x8000_0000).to_bytes(4, "big")
    return (value | 0xC000_0000_0000_0000).to_bytes(8, "big")


def is_long_header(datagram: bytes) -> bool:
    """True when the first byte has the header form bit set (RFC 8999 section 5.1)."""
    return bool(datagram) and bool(datagram[0] & LONG_FORM)


def parse_long_header(datagram: bytes, offset: int = 0, native: InitialProtection | None = None) -> LongHeader:
    """The long header at ``offset``; QuicPacketError if malformed. With ``native`` a usual v1/v2 header is
    read in C (one call per new flow); what C declines, ``read_long_header`` reads and names the fault."""
    if native is not None and (fields := native.long_header(datagram, offset)) is not None:
        version, bits, dcid, scid, token, header_length, packet_length = fields
        packet_type = (_V2_TYPES if version == QUIC_V2 else _V1_TYPES)[bits]
        return LongHeader(version, packet_type, dcid, scid, token, header_length, packet_length, offset)
    return read_long_header(datagram, offset)


def read_long_header(datagram: bytes, offset: int = 0) -> LongHeader:
    """``parse_long_header`` in Python: the reference the C must agree with, and what names the fault."""
    n = len(datagram)
    if offset < 0 or offset + _LONG_HEADER_MIN > n:
        raise QuicPacketError("truncated long header")
    first = datagram[offset]
    if not first & LONG_FORM:
        raise QuicPacketError("not a long header")
    version = int.from_bytes(datagram[offset + 1 : offset + 5], "big")
    known = version in SUPPORTED_VERSIONS
    pos = offset + 5
    dcid, pos = _cid(datagram, pos, known, "DCID")
    scid, pos = _cid(datagram, pos, known, "SCID")
    if not known:
        return LongHeader(version, None, dcid, scid, b"", pos, n - offset, offset)
    packet_type = (_V2_TYPES if version == QUIC_V2 else _V1_TYPES)[(first >> 4) & 3]
    if packet_type is PacketType.RETRY:
        return LongHeader(version, packet_type, dcid, scid, b"", pos, n - offset, offset)
    token = b""
    if packet_type is PacketType.INITIAL:
        token_length, pos = decode_varint(datagram, pos)
        if token_length > n - pos:
            raise QuicPacketError("truncated token")
        token = datagram[pos : pos + token_length]
        pos += token_length
    length, pos = decode_varint(datagram, pos)
    if length > n - pos:
        raise QuicPacketError(f"Length {length} exceeds the {n - pos} bytes left in the datagram")
    return LongHeader(version, packet_type, dcid, scid, token, pos, pos + length - offset, offset)


def _cid(data: bytes, pos: int, known: bool, what: str) -> tuple[bytes, int]:
    if pos >= len(data):
        raise QuicPacketError(f"truncated {what} length")
    length = data[pos]
    pos += 1
    if known and length > MAX_CID_LENGTH:
        raise QuicPacketError(f"{what} of {length} bytes exceeds {MAX_CID_LENGTH}")
    if pos + length > len(data):
        raise QuicPacketError(f"truncated {what}")
    return data[pos : pos + length], pos + length


def iter_long_headers(
    datagram: bytes, first: LongHeader | None = None, native: InitialProtection | None = None
) -> Iterator[LongHeader]:
    """Every coalesced long-header packet of a datagram (RFC 9000 section 12.2); ``first``: the first, if parsed.

    A malformed first packet raises QuicPacketError. Iteration stops quietly (receivers discard such bytes)
    at a short header, at junk that does not parse, and after a packet running to the datagram's end
    (Retry, VN, unknown versions)."""
    header = parse_long_header(datagram, 0, native) if first is None else first
    while True:
        yield header
        if header.packet_type in (None, PacketType.RETRY) or header.end >= len(datagram):
            return
        if not datagram[header.end] & LONG_FORM:
            return
        try:
            header = parse_long_header(datagram, header.end, native)
        except QuicPacketError:
            return


def long_header_scid(datagram: bytes) -> bytes | None:
    """The SCID of a v1/v2 long header by the invariants alone (RFC 8999 section 5.1), None for anything
    else: a pod's connection ID without building a ``LongHeader``."""
    n = len(datagram)
    if n < _LONG_HEADER_MIN or not datagram[0] & LONG_FORM:
        return None
    if int.from_bytes(datagram[1:5], "big") not in SUPPORTED_VERSIONS:
        return None
    at = 6 + datagram[5]
    if datagram[5] > MAX_CID_LENGTH or at >= n:
        return None
    length = datagram[at]
    if length > MAX_CID_LENGTH or at + 1 + length > n:
        return None
    return datagram[at + 1 : at + 1 + length]


def long_header_cids(datagram: bytes) -> tuple[bytes, bytes]:
    """(DCID, SCID) of any version's long header by the invariants (RFC 8999 section 5.1), telling connections
    apart at a shared address; (b"", b"") if not one. Each may be up to 255 octets: look flows up by them,
    but keep only what ``parse_long_header`` or ``router.udp.quic_lb.routable_cid`` read (at most 20)."""
    n = len(datagram)
    if n < _LONG_HEADER_MIN or not datagram[0] & LONG_FORM:
        return b"", b""
    at = 6 + datagram[5]
    if at >= n:
        return b"", b""
    stop = at + 1 + datagram[at]
    if stop > n:
        return b"", b""
    return datagram[6:at], datagram[at + 1 : stop]


def short_header_dcid(datagram: bytes, cid_length: int) -> bytes:
    """The DCID of a short-header (1-RTT) packet, whose length only the receiver knows."""
    if not 0 <= cid_length <= MAX_CID_LENGTH:
        raise QuicPacketError(f"connection ID length {cid_length} out of range")
    if not datagram:
        raise QuicPacketError("empty datagram")
    if datagram[0] & LONG_FORM:
        raise QuicPacketError("not a short header")
    if len(datagram) < 1 + cid_length:
        raise QuicPacketError("truncated short header")
    return datagram[1 : 1 + cid_length]
