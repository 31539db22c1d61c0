"""Initial keys and packet protection against RFC 9001 / RFC 9369 Appendix A."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quic.initial_keys import (
    InitialKeys,
    client_initial_keys,
    decode_packet_number,
    decrypt_initial,
    encrypt_initial,
    packet_number_length,
    server_initial_keys,
)
from quic.packet import QUIC_V1, QUIC_V2, PacketType, QuicPacketError, parse_long_header
from tests.support.quic_vectors import (
    RFC_CLIENT_PAYLOAD,
    RFC_DCID,
    RFC_SERVER_PAYLOAD,
    RFC_SERVER_SCID,
    V1_CLIENT_INITIAL,
    V1_SERVER_INITIAL,
    V2_CLIENT_INITIAL,
    V2_SERVER_INITIAL,
)

KEY_VECTORS = [  # (version, side, key, iv, hp)
    (QUIC_V1, "client", "1f369613dd76d5467730efcbe3b1a22d", "fa044b2f42a3fd3b46fb255c",
     "9f50449e04a0e810283a1e9933adedd2"),
    (QUIC_V1, "server", "cf3a5331653c364c88f0f379b6067e37", "0ac1493ca1905853b0bba03e",
     "c206b8d9b9f0f37644430b490eeaa314"),
    (QUIC_V2, "client", "8b1a0bc121284290a29e0971b5cd045d", "91f73e2351d8fa91660e909f",
     "45b95e15235d6f45a6b19cbcb0294ba9"),
    (QUIC_V2, "server", "82db637861d55e1d011f19ea71d5d2a7", "dd13c276499c0249d3310652",
     "edf6d05c83121201b436e16877593c3a"),
]

PACKETS = [  # (version, protected client Initial, protected server Initial)
    (QUIC_V1, V1_CLIENT_INITIAL, V1_SERVER_INITIAL),
    (QUIC_V2, V2_CLIENT_INITIAL, V2_SERVER_INITIAL),
]


@pytest.mark.parametrize(("version", "side", "key", "iv", "hp"), KEY_VECTORS)
def test_initial_keys_match_rfc_vectors(version: int, side: str, key: str, iv: str, hp: str) -> None:
    derive = client_initial_keys if side == "client" else server_initial_keys
    assert derive(version, RFC_DCID) == InitialKeys(bytes.fromhex(key), bytes.fromhex(iv), bytes.fromhex(hp))


def test_keys_differ_by_version_direction_and_dcid() -> None:
    all_keys = {
        client_initial_keys(QUIC_V1, RFC_DCID), server_initial_keys(QUIC_V1, RFC_DCID),
        client_initial_keys(QUIC_V2, RFC_DCID), client_initial_keys(QUIC_V1, RFC_DCID[:-1]),
        client_initial_keys(QUIC_V1, b""),
    }
    assert len(all_keys) == 5


def test_unknown_version_has_no_initial_keys() -> None:
    with pytest.raises(QuicPacketError):
        client_initial_keys(0x1A2A3A4A, RFC_DCID)
    with pytest.raises(QuicPacketError):
        encrypt_initial(0xFF00001D, RFC_DCID, b"", 0, b"\x01", client_initial_keys(QUIC_V1, RFC_DCID))


@pytest.mark.parametrize(("version", "client_packet", "server_packet"), PACKETS)
def test_decrypt_rfc_client_initial(version: int, client_packet: bytes, server_packet: bytes) -> None:
    header = parse_long_header(client_packet)
    assert header.packet_type is PacketType.INITIAL and header.packet_length == len(client_packet) == 1200
    number, payload = decrypt_initial(client_packet, header, client_initial_keys(version, RFC_DCID))
    assert (number, payload) == (2, RFC_CLIENT_PAYLOAD)


@pytest.mark.parametrize(("version", "client_packet", "server_packet"), PACKETS)
def test_decrypt_rfc_server_initial(version: int, client_packet: bytes, server_packet: bytes) -> None:
    header = parse_long_header(server_packet)
    assert header.scid == RFC_SERVER_SCID and header.dcid == b""
    number, payload = decrypt_initial(server_packet, header, server_initial_keys(version, RFC_DCID))
    assert (number, payload) == (1, RFC_SERVER_PAYLOAD)


@pytest.mark.parametrize(("version", "client_packet", "server_packet"), PACKETS)
def test_encrypt_reproduces_rfc_packets(version: int, client_packet: bytes, server_packet: bytes) -> None:
    client = encrypt_initial(
        version, RFC_DCID, b"", 2, RFC_CLIENT_PAYLOAD, client_initial_keys(version, RFC_DCID), pn_length=4
    )
    assert client == client_packet
    server_keys = server_initial_keys(version, RFC_DCID)
    server = encrypt_initial(version, b"", RFC_SERVER_SCID, 1, RFC_SERVER_PAYLOAD, server_keys, pn_length=2)
    assert server == server_packet


@pytest.mark.parametrize(("version", "client_packet", "server_packet"), PACKETS)
def test_tampered_or_misaddressed_initial_fails_authentication(
    version: int, client_packet: bytes, server_packet: bytes
) -> None:
    header = parse_long_header(client_packet)
    keys = client_initial_keys(version, RFC_DCID)
    for index in (0, 5, 17, 18, 40, 700, len(client_packet) - 1):
        tampered = bytearray(client_packet)
        tampered[index] ^= 0x01
        with pytest.raises(QuicPacketError):
            decrypt_initial(bytes(tampered), parse_long_header(bytes(tampered)), keys)
    with pytest.raises(QuicPacketError):
        decrypt_initial(client_packet, header, server_initial_keys(version, RFC_DCID))
    with pytest.raises(QuicPacketError):
        decrypt_initial(client_packet, header, client_initial_keys(version, b"\x00" * 8))


def test_decrypt_refuses_non_initial_and_unsampleable_packets() -> None:
    keys = client_initial_keys(QUIC_V1, RFC_DCID)
    handshake = bytes((0xE0,)) + QUIC_V1.to_bytes(4, "big") + b"\x00\x00" + b"\x14" + bytes(20)
    with pytest.raises(QuicPacketError, match="not an Initial"):
        decrypt_initial(handshake, parse_long_header(handshake), keys)
    tiny = bytes((0xC0,)) + QUIC_V1.to_bytes(4, "big") + b"\x00\x00\x00" + b"\x13" + bytes(19)
    with pytest.raises(QuicPacketError, match="too short"):
        decrypt_initial(tiny, parse_long_header(tiny), keys)


@pytest.mark.parametrize("version", [QUIC_V1, QUIC_V2])
@pytest.mark.parametrize("packet_number", [0, 1, 127, 128, 40_000, 1 << 23, (1 << 31) - 1])
def test_encrypt_decrypt_round_trip(version: int, packet_number: int) -> None:
    keys = client_initial_keys(version, RFC_DCID)
    packet = encrypt_initial(version, RFC_DCID, b"scid", packet_number, b"\x01", keys, token=b"tok")
    header = parse_long_header(packet)
    assert (header.version, header.packet_type, header.token) == (version, PacketType.INITIAL, b"tok")
    number, payload = decrypt_initial(packet, header, keys, largest_pn=packet_number - 1)
    assert number == packet_number
    assert payload[:1] == b"\x01" and not payload[1:].strip(b"\x00")  # padded only for the sample


def test_packet_number_length_and_limits() -> None:
    assert [packet_number_length(n) for n in (0, 127, 128, 32767, 32768, (1 << 23), (1 << 31) - 1)] == [
        1, 1, 2, 2, 3, 4, 4,
    ]
    with pytest.raises(QuicPacketError):
        packet_number_length(1 << 31)
    keys = client_initial_keys(QUIC_V1, RFC_DCID)
    with pytest.raises(QuicPacketError):
        encrypt_initial(QUIC_V1, RFC_DCID, b"", 256, b"\x01", keys, pn_length=1)
    with pytest.raises(QuicPacketError):
        encrypt_initial(QUIC_V1, RFC_DCID, b"", -1, b"\x01", keys)
    with pytest.raises(QuicPacketError):
        encrypt_initial(QUIC_V1, bytes(21), b"", 0, b"\x01", keys)


def test_decode_packet_number_rfc9000_example() -> None:
    # RFC 9000 A.3: largest 0xa82f30ea, 16-bit truncated 0x9b32 -> 0xa82f9b32.
    assert decode_packet_number(0x9B32, 16, 0xA82F30EA) == 0xA82F9B32
    assert decode_packet_number(0x05, 8, -1) == 5
    assert decode_packet_number(0x00, 8, 0xFF) == 0x100


@settings(max_examples=300, deadline=None)
@given(datagram=st.binary(min_size=0, max_size=1300), version=st.sampled_from([QUIC_V1, QUIC_V2]))
def test_fuzz_decrypt_initial_raises_only_quic_packet_error(datagram: bytes, version: int) -> None:
    keys = client_initial_keys(version, RFC_DCID)
    try:
        header = parse_long_header(datagram)
        if header.packet_type is PacketType.INITIAL:
            decrypt_initial(datagram, header, keys)
    except QuicPacketError:
        pass
