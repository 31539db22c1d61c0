"""Refusals a real aioquic client understands: Initial CONNECTION_CLOSE and Version Negotiation."""

from __future__ import annotations

import pytest
from aioquic.quic import events
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicErrorCode as AioquicErrorCode

from quic.initial_keys import decrypt_initial, server_initial_keys
from quic.initial_sniffer import InitialSniffer
from quic.packet import (
    QUIC_V1,
    QUIC_V2,
    PacketType,
    QuicErrorCode,
    QuicPacketError,
    UnsupportedVersion,
    parse_long_header,
)
from quic.server_packets import (
    QUIC_MAX_CLOSE_REASON_BYTES,
    QUIC_ROUTER_SCID_BYTES,
    build_initial_close,
    build_version_negotiation,
    connection_close_frame,
)
from router.constants import (
    REASON_MISSING_SNI,
    REASON_TARGET_NOT_READY,
    REASON_UNKNOWN_SNI,
)
from tests.support.quic_initial_rewriter import SERVER_NAME, client_first_flight

ROUTER_ADDR = ("127.0.0.1", 50072)
VERSIONS = [QUIC_V1, QUIC_V2]


def _sniffed(version: int, **kwargs: object) -> tuple[QuicConnection, InitialSniffer, list[bytes]]:
    client, datagrams = client_first_flight(version, addr=ROUTER_ADDR, **kwargs)  # type: ignore[arg-type]
    sniffer = InitialSniffer()
    infos = [sniffer.feed(d) for d in datagrams]
    assert infos[-1] is not None and infos[-1].server_name == SERVER_NAME
    return client, sniffer, datagrams


def _terminated(client: QuicConnection, now: float) -> events.ConnectionTerminated:
    """The client's ConnectionTerminated, after its draining period (virtual time)."""
    for _ in range(4):
        for event in iter(client.next_event, None):
            if isinstance(event, events.ConnectionTerminated):
                return event
        timer = client.get_timer()
        assert timer is not None
        now = max(now, timer)
        client.handle_timer(now)
    raise AssertionError("the client never terminated")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("reason", "code"),
    [(REASON_UNKNOWN_SNI, QuicErrorCode.CONNECTION_REFUSED), (REASON_MISSING_SNI, QuicErrorCode.CONNECTION_REFUSED),
     (REASON_TARGET_NOT_READY, QuicErrorCode.INTERNAL_ERROR)],
)
def test_real_client_terminates_with_our_reason_and_code(version: int, reason: str, code: int) -> None:
    client, sniffer, datagrams = _sniffed(version)
    version_, dcid, scid = sniffer.version, sniffer.original_dcid, sniffer.client_scid
    assert version_ == version and dcid is not None and scid is not None
    close = build_initial_close(version, dcid, scid, reason, error_code=code)
    assert len(close) < len(datagrams[0])  # never more than received: no amplification
    client.receive_datagram(close, ROUTER_ADDR, now=0.05)
    event = _terminated(client, 0.05)
    assert (event.error_code, event.frame_type, event.reason_phrase) == (code, 0, reason)


@pytest.mark.parametrize("version", VERSIONS)
def test_close_is_a_server_initial_addressed_to_the_client(version: int) -> None:
    close = build_initial_close(version, b"origdcid", b"clientscid", "no", scid=b"routerid")
    header = parse_long_header(close)
    assert (header.version, header.packet_type, header.dcid, header.scid, header.token) == (
        version, PacketType.INITIAL, b"clientscid", b"routerid", b"",
    )
    number, payload = decrypt_initial(close, header, server_initial_keys(version, b"origdcid"))
    assert number == 0 and payload.startswith(connection_close_frame(QuicErrorCode.CONNECTION_REFUSED, "no"))
    random_scid = parse_long_header(build_initial_close(version, b"origdcid", b"c", "no")).scid
    assert len(random_scid) == QUIC_ROUTER_SCID_BYTES


def test_long_reasons_are_cut_on_a_character_boundary() -> None:
    frame = connection_close_frame(2, "é" * 1000)
    phrase = frame[5:]  # type 1, code 1, frame type 1, length 2 bytes
    assert len(phrase) <= QUIC_MAX_CLOSE_REASON_BYTES
    assert phrase.decode("utf-8") == "é" * (QUIC_MAX_CLOSE_REASON_BYTES // 2)


def test_version_negotiation_layout() -> None:
    vn = build_version_negotiation(b"client-dcid", b"client-scid", (QUIC_V2, QUIC_V1))
    assert vn[0] & 0xC0 == 0xC0
    header = parse_long_header(vn)
    assert (header.version, header.packet_type) == (0, None)
    assert (header.dcid, header.scid) == (b"client-scid", b"client-dcid")
    assert vn[header.header_length :] == QUIC_V2.to_bytes(4, "big") + QUIC_V1.to_bytes(4, "big")
    long_cids = build_version_negotiation(bytes(255), bytes(100))  # invariants allow > 20 bytes
    assert parse_long_header(long_cids).scid == bytes(255)
    for bad in ((), (0,), (1 << 32,)):
        with pytest.raises(QuicPacketError):
            build_version_negotiation(b"d", b"s", bad)


def test_version_negotiation_moves_a_real_client_to_a_version_we_route() -> None:
    client, datagrams = client_first_flight(0x1A2A3A4A, other_versions=[QUIC_V1], addr=ROUTER_ADDR)
    with pytest.raises(UnsupportedVersion) as caught:
        InitialSniffer().feed(datagrams[0])
    refused = caught.value
    client.receive_datagram(build_version_negotiation(refused.dcid, refused.scid), ROUTER_ADDR, now=0.05)
    retry = [d for d, _ in client.datagrams_to_send(now=0.05)]
    sniffer = InitialSniffer()
    assert sniffer.feed(retry[0]) is not None and sniffer.version == QUIC_V1


def test_version_negotiation_without_a_common_version_terminates_a_real_client() -> None:
    client, datagrams = client_first_flight(QUIC_V1, addr=ROUTER_ADDR)
    header = parse_long_header(datagrams[0])
    vn = build_version_negotiation(header.dcid, header.scid, (QUIC_V2,))
    client.receive_datagram(vn, ROUTER_ADDR, now=0.05)
    event = _terminated(client, 0.05)
    assert event.error_code == AioquicErrorCode.INTERNAL_ERROR
    assert "common protocol version" in event.reason_phrase
