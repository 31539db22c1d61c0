"""The gRPC rejection encoder, read back by a real ``h2`` client."""

from __future__ import annotations

import urllib.parse

import h2.events
import pytest
from hyperframe.frame import HeadersFrame

from tests.support.h2 import REQUEST, SETTINGS_ACK, client
from wire.grpc import GrpcStatus, grpc_rejection, percent_encode_grpc_message
from wire.h2_frames import EMPTY_SETTINGS_FRAME


@pytest.mark.parametrize("message", ["unknown target authority", "ü 100% \n bad", "~" * 20_000])
def test_h2_client_reads_the_rejection(message: str) -> None:
    conn = client()
    conn.send_headers(1, REQUEST)
    conn.data_to_send()
    rejection = grpc_rejection(1, GrpcStatus.INVALID_ARGUMENT, message)
    events = conn.receive_data(EMPTY_SETTINGS_FRAME + rejection)
    kinds = [type(e) for e in events]
    assert h2.events.SettingsAcknowledged in kinds
    response = next(e for e in events if isinstance(e, h2.events.ResponseReceived))
    headers = dict(response.headers)
    assert headers[":status"] == "200"
    assert headers["content-type"] == "application/grpc"
    assert headers["grpc-status"] == str(GrpcStatus.INVALID_ARGUMENT)
    assert urllib.parse.unquote(headers["grpc-message"]) == message
    assert any(isinstance(e, h2.events.StreamEnded) and e.stream_id == 1 for e in events)
    goaway = next(e for e in events if isinstance(e, h2.events.ConnectionTerminated))
    assert (goaway.error_code, goaway.last_stream_id) == (0, 1)


def test_rejection_uses_continuation_for_huge_messages() -> None:
    data = grpc_rejection(5, 14, "~" * 20_000)
    headers_at = len(SETTINGS_ACK)
    headers = HeadersFrame(5)
    headers.parse_flags(data[headers_at + 4])
    assert data[headers_at + 3] == 1 and "END_HEADERS" not in headers.flags
    length = int.from_bytes(data[headers_at : headers_at + 3], "big")
    continuation_at = headers_at + 9 + length
    assert data[continuation_at + 3 : continuation_at + 9] == b"\x09\x04\x00\x00\x00\x05"


def test_percent_encoding() -> None:
    assert percent_encode_grpc_message("a b%c\u00fc\n") == "a b%25c%C3%BC%0A"


@pytest.mark.parametrize(("stream_id", "status"), [(0, 3), (2**31, 3), (1, -1), (1, 17)])
def test_rejection_argument_checks(stream_id: int, status: int) -> None:
    with pytest.raises(ValueError):
        grpc_rejection(stream_id, status, "x")
