"""The SETTINGS-ACK stripper against real client bytes from the ``h2`` library."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.h2 import AUTHORITY, REQUEST, SETTINGS_ACK, client, frame_runs
from tests.support.h2 import frame as _frame
from wire.h2_frames import EMPTY_SETTINGS_FRAME, H2_PREFACE, H2PeekError
from wire.settings_ack import SettingsAckStripper


def _strip(stripper: SettingsAckStripper, data: bytes, chunk: int) -> bytes:
    return b"".join(stripper.feed(data[i : i + chunk]) for i in range(0, len(data), chunk))


def _acking_client_stream() -> tuple[h2.connection.H2Connection, bytes, bytes]:
    """A grpcio-like exchange: the client acks the router's SETTINGS, then sends a request.

    Returns the client, the whole client stream, and that stream without the ACK.
    """
    conn = client()
    before = conn.data_to_send()
    conn.receive_data(EMPTY_SETTINGS_FRAME)
    ack = conn.data_to_send()
    assert ack == SETTINGS_ACK
    conn.send_headers(1, REQUEST)
    conn.send_data(1, b"\x00\x00\x00\x00\x05hello", end_stream=True)
    after = conn.data_to_send()
    return conn, before + ack + after, before + after


@pytest.mark.parametrize("chunk", [1, 2, 7, 9, 10, 100, 10_000])
def test_stripper_removes_the_client_ack_at_any_chunking(chunk: int) -> None:
    _, stream, expected = _acking_client_stream()
    stripper = SettingsAckStripper()
    assert _strip(stripper, stream, chunk) == expected
    assert stripper.done


def test_pod_never_sees_the_routers_ack_but_sees_its_own() -> None:
    conn, stream, _ = _acking_client_stream()
    stripper = SettingsAckStripper()
    pod = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
    pod.initiate_connection()
    pod_settings = pod.data_to_send()
    events = pod.receive_data(_strip(stripper, stream, 5))
    assert not any(isinstance(e, h2.events.SettingsAcknowledged) for e in events)
    request = next(e for e in events if isinstance(e, h2.events.RequestReceived))
    assert dict(request.headers)[":authority"] == AUTHORITY
    conn.receive_data(pod_settings)
    later = conn.data_to_send()
    assert stripper.feed(later) is later  # identity once done
    events = pod.receive_data(later)
    assert any(isinstance(e, h2.events.SettingsAcknowledged) for e in events)


def test_stripper_only_removes_one_ack() -> None:
    stream = H2_PREFACE + SETTINGS_ACK + SETTINGS_ACK + SETTINGS_ACK
    assert _strip(SettingsAckStripper(), stream, 3) == H2_PREFACE + SETTINGS_ACK * 2


def test_stripper_passes_ack_bytes_inside_payloads() -> None:
    data_frame = _frame(0, 0, 1, SETTINGS_ACK * 3)
    stream = H2_PREFACE + data_frame + SETTINGS_ACK
    assert _strip(SettingsAckStripper(), stream, 4) == H2_PREFACE + data_frame


@pytest.mark.parametrize(
    "stream",
    [b"GET / HTTP/1.1\r\n", H2_PREFACE + _frame(4, 1, 0, bytes(6)), H2_PREFACE + _frame(4, 1, 1)],
)
def test_stripper_refuses_malformed_streams(stream: bytes) -> None:
    with pytest.raises(H2PeekError):
        _strip(SettingsAckStripper(), stream, 1)




@settings(max_examples=300, deadline=None)
@given(frame_runs, st.lists(st.integers(1, 40), min_size=1, max_size=30))
def test_fuzz_stripper_buffers_at_most_a_partial_header(frames: bytes, cuts: list[int]) -> None:
    stream = H2_PREFACE + frames
    stripper = SettingsAckStripper()
    fed = out = pos = 0
    try:
        for size in cuts * (len(stream) // sum(cuts) + 1):
            chunk = stream[pos : pos + size]
            pos += len(chunk)
            fed += len(chunk)
            out += len(stripper.feed(chunk))
            held = fed - out - (9 if stripper.done else 0)
            assert 0 <= held < 9
    except H2PeekError:
        pass
