"""Long/short header parsing: RFC vectors, both versions' type encodings, coalescing, fuzz."""

from __future__ import annotations

import contextlib

import pytest
from aioquic.quic.packet import QuicErrorCode as AioquicErrorCode
from hypothesis import given, settings
from hypothesis import strategies as st

from quic.packet import (
    QUIC_V1,
    QUIC_V2,
    LongHeader,
    PacketType,
    QuicErrorCode,
    QuicPacketError,
    UnsupportedVersion,
    decode_varint,
    encode_varint,
    is_long_header,
    iter_long_headers,
    long_header_scid,
    packet_type_bits,
    parse_long_header,
    short_header_dcid,
)
from tests.support.quic_vectors import (
    RFC_DCID,
    RFC_SERVER_SCID,
    V1_CLIENT_INITIAL,
    V1_SERVER_INITIAL,
    V2_CLIENT_INITIAL,
    V2_SERVER_INITIAL,
)

V2_RETRY = bytes.fromhex("cf6b3343cf0008f067a5502a4262b5746f6b656ec8646ce8bfe33952d955543665dcc7b6")
"""RFC 9369 A.4."""


def long_packet(version: int, packet_type: PacketType, body: bytes = bytes(30), dcid: bytes = b"d" * 8,
                scid: bytes = b"s" * 8, token: bytes = b"") -> bytes:
    """A long-header packet with a correct Length (contents unprotected: parsing only)."""
    parts = [bytes((0xC0 | packet_type_bits(version, packet_type),)), version.to_bytes(4, "big"),
             bytes((len(dcid),)), dcid, bytes((len(scid),)), scid]
    if packet_type is PacketType.INITIAL:
        parts += [encode_varint(len(token)), token]
    parts += [encode_varint(len(body)), body]
    return b"".join(parts)


@pytest.mark.parametrize(
    ("packet", "version", "dcid", "scid", "header_length"),
    [
        (V1_CLIENT_INITIAL, QUIC_V1, RFC_DCID, b"", 18),
        (V2_CLIENT_INITIAL, QUIC_V2, RFC_DCID, b"", 18),
        (V1_SERVER_INITIAL, QUIC_V1, b"", RFC_SERVER_SCID, 18),
        (V2_SERVER_INITIAL, QUIC_V2, b"", RFC_SERVER_SCID, 18),
    ],
)
def test_parse_rfc_initials(
    packet: bytes, version: int, dcid: bytes, scid: bytes, header_length: int
) -> None:
    header = parse_long_header(packet)
    assert header == LongHeader(version, PacketType.INITIAL, dcid, scid, b"", header_length, len(packet), 0)
    assert header.end == len(packet)


def test_parse_rfc9369_retry() -> None:
    header = parse_long_header(V2_RETRY)
    assert (header.version, header.packet_type, header.dcid, header.scid) == (
        QUIC_V2, PacketType.RETRY, b"", RFC_SERVER_SCID,
    )
    assert header.packet_length == len(V2_RETRY)


@pytest.mark.parametrize("version", [QUIC_V1, QUIC_V2])
@pytest.mark.parametrize("packet_type", list(PacketType))
def test_packet_types_are_normalised_per_version(version: int, packet_type: PacketType) -> None:
    packet = long_packet(version, packet_type)
    assert parse_long_header(packet).packet_type is packet_type


def test_v2_type_bits_differ_from_v1() -> None:
    # RFC 9369 3.2: Initial 0b01, 0-RTT 0b10, Handshake 0b11, Retry 0b00.
    assert [packet_type_bits(QUIC_V2, t) >> 4 for t in PacketType] == [1, 2, 3, 0]
    assert [packet_type_bits(QUIC_V1, t) >> 4 for t in PacketType] == [0, 1, 2, 3]


def test_initial_token_and_length() -> None:
    packet = long_packet(QUIC_V1, PacketType.INITIAL, body=bytes(100), token=b"retry-token")
    header = parse_long_header(packet)
    assert header.token == b"retry-token"
    assert header.header_length == len(packet) - 100
    assert header.packet_length == len(packet)


def test_version_negotiation_and_unknown_versions_take_the_rest() -> None:
    vn = b"\xc5" + bytes(4) + b"\x04abcd\x02xy" + QUIC_V1.to_bytes(4, "big") + QUIC_V2.to_bytes(4, "big")
    header = parse_long_header(vn)
    assert (header.version, header.packet_type, header.dcid, header.scid) == (0, None, b"abcd", b"xy")
    assert (header.header_length, header.packet_length) == (13, len(vn))
    # Invariants (RFC 8999) allow 255-byte CIDs in versions we do not know.
    unknown = b"\xc0" + (0x1A2A3A4A).to_bytes(4, "big") + b"\xc8" + bytes(200) + b"\x00" + bytes(900)
    header = parse_long_header(unknown)
    assert header.packet_type is None and len(header.dcid) == 200 and header.packet_length == len(unknown)


def test_v1_cid_longer_than_20_bytes_is_malformed() -> None:
    with pytest.raises(QuicPacketError, match="exceeds 20"):
        parse_long_header(long_packet(QUIC_V1, PacketType.INITIAL, dcid=bytes(21)))
    with pytest.raises(QuicPacketError, match="exceeds 20"):
        parse_long_header(long_packet(QUIC_V2, PacketType.HANDSHAKE, scid=bytes(21)))


def test_every_truncation_of_an_initial_is_refused() -> None:
    for cut in range(len(V1_CLIENT_INITIAL)):
        with pytest.raises(QuicPacketError):
            parse_long_header(V1_CLIENT_INITIAL[:cut])


def test_short_header_is_not_a_long_header() -> None:
    assert not is_long_header(b"")
    assert not is_long_header(b"\x40abc")
    assert is_long_header(V1_CLIENT_INITIAL)
    with pytest.raises(QuicPacketError, match="not a long header"):
        parse_long_header(b"\x40" + bytes(30))


def test_coalesced_packets_and_trailing_padding() -> None:
    initial = long_packet(QUIC_V1, PacketType.INITIAL, body=bytes(50))
    zero_rtt = long_packet(QUIC_V1, PacketType.ZERO_RTT, body=bytes(20))
    handshake = long_packet(QUIC_V1, PacketType.HANDSHAKE, body=bytes(10))
    datagram = initial + zero_rtt + handshake + bytes(40)  # zeros: padding after the packets
    headers = list(iter_long_headers(datagram))
    assert [h.packet_type for h in headers] == [PacketType.INITIAL, PacketType.ZERO_RTT, PacketType.HANDSHAKE]
    assert [h.offset for h in headers] == [0, len(initial), len(initial) + len(zero_rtt)]
    assert headers[1].header_length == len(initial) + len(zero_rtt) - 20
    assert headers[-1].end == len(datagram) - 40


def test_iteration_stops_quietly_at_junk_after_the_first_packet() -> None:
    initial = long_packet(QUIC_V2, PacketType.INITIAL, body=bytes(50))
    junk_long = b"\xd0" + QUIC_V2.to_bytes(4, "big") + b"\x30"  # claims a 48-byte DCID
    assert len(list(iter_long_headers(initial + junk_long))) == 1
    other_version = b"\xc0" + (0x0A0A0A0A).to_bytes(4, "big") + b"\x00\x00" + bytes(20)
    headers = list(iter_long_headers(initial + other_version + initial))
    assert [h.packet_type for h in headers] == [PacketType.INITIAL, None]  # unknown version: rest is its
    with pytest.raises(QuicPacketError):
        list(iter_long_headers(junk_long + initial))
    with pytest.raises(QuicPacketError):
        list(iter_long_headers(b""))


def test_short_header_dcid() -> None:
    datagram = b"\x41" + b"12345678" + bytes(20)
    assert short_header_dcid(datagram, 8) == b"12345678"
    assert short_header_dcid(datagram, 0) == b""
    with pytest.raises(QuicPacketError):
        short_header_dcid(b"\x41123", 8)
    with pytest.raises(QuicPacketError):
        short_header_dcid(V1_CLIENT_INITIAL, 8)
    with pytest.raises(QuicPacketError):
        short_header_dcid(b"", 0)
    with pytest.raises(QuicPacketError):
        short_header_dcid(datagram, 21)


def test_varints_rfc9000_examples() -> None:
    examples = {"c2197c5eff14e88c": 151_288_809_941_952_652, "9d7f3e7d": 494_878_333, "7bbd": 15_293,
                "25": 37, "4025": 37}
    for encoded, value in examples.items():
        assert decode_varint(bytes.fromhex(encoded), 0) == (value, len(encoded) // 2)
    for value in (0, 63, 64, 16383, 16384, (1 << 30) - 1, 1 << 30, (1 << 62) - 1):
        data = encode_varint(value)
        assert decode_varint(data, 0) == (value, len(data))
    for bad in (-1, 1 << 62):
        with pytest.raises(QuicPacketError):
            encode_varint(bad)
    with pytest.raises(QuicPacketError):
        decode_varint(b"\x80\x00", 0)
    with pytest.raises(QuicPacketError):
        decode_varint(b"", 0)


def test_unsupported_version_carries_the_client_cids() -> None:
    exc = UnsupportedVersion(0x1A2A3A4A, b"d", b"s")
    assert isinstance(exc, QuicPacketError) and (exc.version, exc.dcid, exc.scid) == (0x1A2A3A4A, b"d", b"s")


def mutated(seed_packets: list[bytes]) -> st.SearchStrategy[bytes]:
    """Real packets with random byte flips, truncations and appended junk."""
    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        data = bytearray(draw(st.sampled_from(seed_packets)))
        for _ in range(draw(st.integers(0, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        data = data[: draw(st.integers(0, len(data)))]
        return bytes(data) + draw(st.binary(max_size=40))
    return build()


FUZZ_DATAGRAMS = st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=60).map(lambda b: b"\xc0" + QUIC_V1.to_bytes(4, "big") + b),
    mutated([
        V1_CLIENT_INITIAL[:80], V2_SERVER_INITIAL, V2_RETRY,
        long_packet(QUIC_V1, PacketType.INITIAL, token=b"t") + long_packet(QUIC_V1, PacketType.ZERO_RTT),
    ]),
)


@settings(max_examples=400, deadline=None)
@given(datagram=FUZZ_DATAGRAMS, offset=st.integers(-2, 10))
def test_fuzz_header_parsing_raises_only_quic_packet_error(datagram: bytes, offset: int) -> None:
    try:
        header = parse_long_header(datagram, offset)
        assert header.offset == offset and header.header_length <= header.end <= len(datagram)
    except QuicPacketError:
        pass
    try:
        for header in iter_long_headers(datagram):
            assert header.end <= len(datagram)
    except QuicPacketError:
        pass
    with contextlib.suppress(QuicPacketError):
        short_header_dcid(datagram, 8)


@pytest.mark.parametrize("code", list(QuicErrorCode))
def test_error_codes_are_the_rfc_values_aioquic_uses(code: QuicErrorCode) -> None:
    assert code == AioquicErrorCode[code.name]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=80))
def test_long_header_scid_is_the_parsed_scid_of_every_v1_v2_header(tail: bytes) -> None:
    """The invariants-only SCID read agrees with the full parse wherever that succeeds."""
    for datagram in (tail, b"\xc0" + QUIC_V1.to_bytes(4, "big") + tail, b"\xd0" + QUIC_V2.to_bytes(4, "big") + tail):
        scid = long_header_scid(datagram)
        try:
            header = parse_long_header(datagram)
        except QuicPacketError:
            continue
        assert scid == (header.scid if header.packet_type is not None else None)
