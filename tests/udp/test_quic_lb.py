"""QUIC-LB's plaintext connection IDs (``router/udp/quic_lb.py``): what a datagram's connection ID
names, on bytes alone. Every connection ID a QUIC-LB pod can issue names that pod; config rotation
0b111, a connection ID too short for its server ID, Initials and 0-RTT packets name nobody; two pods
whose addresses end alike name nobody; and no bytes whatever make the decoding raise."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from discovery.targets import Target, TargetSnapshot
from quic.packet import MAX_CID_LENGTH, QUIC_V1, QUIC_V2, PacketType, long_header_cids, packet_type_bits
from router.udp.quic_lb import (
    MAX_SERVER_ID_BYTES,
    ServerIds,
    check_server_id_bytes,
    pod_server_id,
    routable_cid,
    server_id,
)
from tests.support.initial_packets import long_header_packet
from tests.support.quic_lb_pods import quic_lb_cid

SERVER_ID_BYTES = st.integers(1, MAX_SERVER_ID_BYTES)


@st.composite
def issued(draw: st.DrawFn) -> tuple[bytes, bytes, int]:
    """(a connection ID a QUIC-LB pod may issue, its server ID, the server ID's length)."""
    n = draw(SERVER_ID_BYTES)
    sid = draw(st.binary(min_size=n, max_size=n))
    nonce = draw(st.binary(min_size=4, max_size=19 - n))
    rotation = draw(st.integers(0, 0b110))
    cid = quic_lb_cid(sid, nonce, rotation, self_encoded=draw(st.booleans()), random_bits=draw(st.integers(0, 31)))
    return cid, sid, n


@settings(max_examples=500, deadline=None)
@given(issued())
def test_every_connection_id_a_pod_issues_names_its_server_id(cid_sid_n: tuple[bytes, bytes, int]) -> None:
    cid, sid, n = cid_sid_n
    assert server_id(cid, n) == sid
    assert routable_cid(b"\x40" + cid + bytes(20), len(cid)) == cid  # the length configured


@settings(max_examples=300, deadline=None)
@given(st.integers(1, MAX_SERVER_ID_BYTES).flatmap(
    lambda n: st.tuples(st.just(n), st.binary(min_size=n, max_size=n), st.binary(min_size=4, max_size=19 - n))))
def test_a_self_encoded_length_cuts_the_short_header_where_the_connection_id_ends(
    n_sid_nonce: tuple[int, bytes, bytes],
) -> None:
    _n, sid, nonce = n_sid_nonce
    cid = quic_lb_cid(sid, nonce, 0, self_encoded=True)
    assert routable_cid(b"\x41" + cid + b"\xaa" * 30, None) == cid


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=20), SERVER_ID_BYTES)
def test_config_rotation_0b111_names_no_server(rest: bytes, n: int) -> None:
    assert server_id(bytes([0xE0 | rest[0] & 0x1F]) + rest[1:], n) is None


def test_a_connection_id_too_short_for_its_server_id_names_none() -> None:
    assert server_id(b"\x05\x7f\x00\x00", 4) is None
    assert server_id(b"\x05\x7f\x00\x00\x01", 4) == b"\x7f\x00\x00\x01"
    assert server_id(b"", 1) is None


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=80), st.one_of(st.none(), st.integers(0, 20)), SERVER_ID_BYTES)
def test_no_datagram_makes_the_decoding_raise(datagram: bytes, cid_length: int | None, n: int) -> None:
    cid = routable_cid(datagram, cid_length)
    assert cid is None or (0 < len(cid) <= MAX_CID_LENGTH and cid in datagram)
    if cid is not None:
        sid = server_id(cid, n)
        assert sid is None or len(sid) == n


@settings(max_examples=300, deadline=None)
@given(st.integers(MAX_CID_LENGTH, 31), st.integers(0, 0b110), st.binary(min_size=32, max_size=80))
def test_a_first_octet_that_self_encodes_over_20_octets_names_no_connection_id(
    low_bits: int, rotation: int, rest: bytes
) -> None:
    """21 to 32 octets (low five bits 20 to 31): longer than any v1/v2 connection ID, so no pod
    wrote it; the datagram carries no server ID, however well its next octets name a pod."""
    datagram = b"\x40" + bytes([rotation << 5 | low_bits]) + rest
    assert routable_cid(datagram, None) is None
    assert routable_cid(datagram, MAX_CID_LENGTH) == datagram[1 : 1 + MAX_CID_LENGTH]  # a configured length cuts


@pytest.mark.parametrize("length", [MAX_CID_LENGTH + 1, 32, 255])
def test_a_handshake_packets_dcid_over_20_octets_names_no_pod(length: int) -> None:
    cid = quic_lb_cid(b"\x7f\x00\x00\x02", bytes(length - 5), 1)
    handshake = long_header_packet(PacketType.HANDSHAKE, 300, dcid=cid)
    assert long_header_cids(handshake)[0] == cid and routable_cid(handshake, None) is None
    assert routable_cid(long_header_packet(PacketType.HANDSHAKE, 300, dcid=cid[:MAX_CID_LENGTH]), None) == cid[:20]


@pytest.mark.parametrize("version", [QUIC_V1, QUIC_V2], ids=["v1", "v2"])
def test_only_a_handshake_long_header_is_routed_by_its_dcid(version: int) -> None:
    def packet(packet_type: PacketType, size: int, version: int = version) -> bytes:
        bits = packet_type_bits(version, packet_type) >> 4 if version in (QUIC_V1, QUIC_V2) else int(packet_type)
        return long_header_packet(bits, size, version=version, dcid=cid)

    cid = quic_lb_cid(b"\x7f\x00\x00\x02", b"nonce", 1)
    assert routable_cid(packet(PacketType.HANDSHAKE, 300), None) == cid
    for client_chosen in (PacketType.INITIAL, PacketType.ZERO_RTT):  # the client picked those DCIDs
        assert routable_cid(packet(client_chosen, 1200), None) is None
    assert routable_cid(packet(PacketType.HANDSHAKE, 300, 0x1A2A3A4A), None) is None


def test_a_pods_server_id_is_the_end_of_its_address() -> None:
    assert pod_server_id("10.1.2.3", 4) == bytes([10, 1, 2, 3])
    assert pod_server_id("10.1.2.3", 2) == bytes([2, 3])
    assert pod_server_id("10.1.2.3", 6) == b"\xff\xff" + bytes([10, 1, 2, 3])  # IPv4 mapped into IPv6
    assert pod_server_id("fd00::1:2", 4) == ipaddress.IPv6Address("fd00::1:2").packed[-4:]
    assert pod_server_id("stargate-0", 4) is None


def test_server_ids_name_ready_pods_and_pods_whose_addresses_end_alike_name_none() -> None:
    pods = [Target("stargate-0", "10.0.0.5", 1, 2), Target("stargate-1", "10.0.1.5", 1, 2),
            Target("stargate-2", "10.0.1.6", 1, 2), Target("stargate-3", "10.0.1.7", 1, 0)]
    one = ServerIds.of(TargetSnapshot.of(pods), 1)
    assert one.ambiguous == ("stargate-0", "stargate-1")
    assert one.target(b"\x00\x05" + bytes(4)) is None  # 10.0.0.5 and 10.0.1.5 both end in 5
    assert one.target(b"\x00\x06" + bytes(4)) == pods[2]
    assert one.target(b"\x00\x07" + bytes(4)) is None  # no QUIC port: nothing to route to
    four = ServerIds.of(TargetSnapshot.of(pods), 4)
    assert four.ambiguous == () and four.target(quic_lb_cid(bytes([10, 0, 1, 5]), bytes(4), 2)) == pods[1]
    assert four.target(quic_lb_cid(bytes([10, 0, 9, 9]), bytes(4), 2)) is None


@pytest.mark.parametrize("bad", [0, 16, -1])
def test_a_server_id_is_1_to_15_bytes(bad: int) -> None:
    with pytest.raises(ValueError, match="1-15"):
        check_server_id_bytes(bad)
