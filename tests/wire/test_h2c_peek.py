"""h2c peek against real client bytes from the ``h2`` library."""

from __future__ import annotations

import hpack
import pytest
from hyperframe.frame import HeadersFrame
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.h2 import AUTHORITY, PATH, REQUEST, client, frame_runs
from tests.support.h2 import frame as _frame
from wire.h2_frames import H2_PREFACE, H2PeekError
from wire.h2c import MAX_PEEK_BYTES, H2Request, H2RequestReader, looks_like_h2c

EXPECTED = H2Request(stream_id=1, authority=AUTHORITY, path=PATH)


def client_bytes(headers: list[tuple[str, str]] = REQUEST, **priority: int) -> bytes:
    conn = client()
    conn.send_headers(1, headers, **priority)  # type: ignore[arg-type]
    return conn.data_to_send()


def feed_bytewise(data: bytes) -> list[H2Request | None]:
    reader = H2RequestReader()
    return [reader.feed(data[i : i + 1]) for i in range(len(data))]


def preface_and_settings() -> bytes:
    return client().data_to_send()


# --- H2RequestReader -----------------------------------------------------------


def test_h2_client_whole_and_bytewise() -> None:
    data = client_bytes()
    assert H2RequestReader().feed(data) == EXPECTED
    results = feed_bytewise(data)
    assert results[-1] == EXPECTED and results.count(None) == len(data) - 1


def test_priority_flag() -> None:
    data = client_bytes(priority_weight=200, priority_depends_on=0)
    assert H2RequestReader().feed(data) == EXPECTED
    assert feed_bytewise(data)[-1] == EXPECTED


def test_padded_and_priority_headers() -> None:
    block = hpack.Encoder().encode(REQUEST)
    frame = HeadersFrame(1, data=block, pad_length=17, flags=["PADDED", "PRIORITY", "END_HEADERS"])
    frame.stream_weight = 15
    data = preface_and_settings() + frame.serialize()
    assert H2RequestReader().feed(data) == EXPECTED
    assert feed_bytewise(data)[-1] == EXPECTED


def test_large_headers_with_continuation_and_huffman() -> None:
    conn = client(max_frame_size=1024)
    headers = [*REQUEST, *((f"x-meta-{i}", "v" * 300) for i in range(20))]
    conn.send_headers(3, headers)
    data = conn.data_to_send()
    assert data.count(b"\x09\x00\x00\x00\x00\x03") >= 3  # CONTINUATION frames on stream 3
    expected = H2Request(stream_id=3, authority=AUTHORITY, path=PATH)
    assert H2RequestReader().feed(data) == expected
    assert feed_bytewise(data)[-1] == expected


def test_host_header_when_no_authority() -> None:
    headers = [(n, v) for n, v in REQUEST if n != ":authority"] + [("host", "stargate-1.stargate.external")]
    block = hpack.Encoder().encode(headers)
    data = preface_and_settings() + HeadersFrame(1, data=block, flags=["END_HEADERS"]).serialize()
    assert H2RequestReader().feed(data) == H2Request(1, "stargate-1.stargate.external", PATH)


def test_no_authority_at_all() -> None:
    headers = [(n, v) for n, v in REQUEST if n != ":authority"]
    block = hpack.Encoder().encode(headers)
    data = preface_and_settings() + HeadersFrame(1, data=block, flags=["END_HEADERS"]).serialize()
    assert H2RequestReader().feed(data) == H2Request(1, None, PATH)


def test_non_ascii_authority_is_replaced_not_raised() -> None:
    block = hpack.Encoder().encode([(b":authority", b"st\xc3\xa4r.x"), (b":path", b"/")])
    data = preface_and_settings() + HeadersFrame(1, data=block, flags=["END_HEADERS"]).serialize()
    assert H2RequestReader().feed(data) == H2Request(1, "st\ufffd\ufffdr.x", "/")


def test_saw_preface_and_bytes_after_are_ignored() -> None:
    reader = H2RequestReader()
    assert reader.feed(H2_PREFACE[:-1]) is None and not reader.saw_preface
    assert reader.feed(H2_PREFACE[-1:]) is None and reader.saw_preface
    data = client_bytes()[len(H2_PREFACE) :]
    assert reader.feed(data + b"\x00\x00\x04\x00\x00\x00\x00\x00\x01abcd") == EXPECTED
    assert reader.feed(b"junk") == EXPECTED


def test_client_waiting_for_settings_sends_nothing_routable() -> None:
    reader = H2RequestReader()
    assert reader.feed(preface_and_settings()) is None
    assert reader.saw_preface


def test_max_bytes_is_chunking_independent() -> None:
    data = client_bytes()
    with pytest.raises(H2PeekError, match="within"):
        H2RequestReader(max_bytes=len(data) - 1).feed(data)
    assert H2RequestReader(max_bytes=len(data)).feed(data) == EXPECTED
    reader = H2RequestReader(max_bytes=len(data))
    assert [reader.feed(data[i : i + 7]) for i in range(0, len(data), 7)][-1] == EXPECTED


def test_endless_pings_hit_the_budget() -> None:
    ping = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + bytes(8)
    reader = H2RequestReader()
    with pytest.raises(H2PeekError, match=str(MAX_PEEK_BYTES)):
        for _ in range(MAX_PEEK_BYTES // len(ping) + 2):
            reader.feed(ping if reader.saw_preface else H2_PREFACE + ping)


BLOCK = hpack.Encoder().encode(REQUEST)


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        (_frame(0, 0, 1, b"x"), "type 0"),
        (_frame(3, 0, 1, bytes(4)), "type 3"),
        (_frame(7, 0, 0, bytes(8)), "type 7"),
        (_frame(0xEE, 0, 0), "type 238"),
        (_frame(9, 4, 1, BLOCK), "type 9"),
        (_frame(1, 4, 0, BLOCK), "stream 0"),
        (_frame(1, 4, 2, BLOCK), "stream 2"),
        (_frame(1, 0, 1, BLOCK) + _frame(9, 4, 3, b""), "interrupted"),
        (_frame(1, 0, 1, BLOCK) + _frame(4, 0, 0), "interrupted"),
        (_frame(1, 0x8 | 4, 1, b""), "pad length"),
        (_frame(1, 0x8 | 4, 1, b"\x05abc"), "padding"),
        (_frame(1, 0x20 | 4, 1, b"abc"), "priority"),
        (_frame(1, 4, 1, b"", length=16_385), "exceeds"),
        (_frame(1, 4, 1, b"\xff\xff\xff\xff"), "header block"),
        (_frame(1, 4, 1, b"\x3f\xe1\xff\x03"), "header block"),
        (_frame(4, 0, 1), "SETTINGS"),
        (_frame(4, 0, 0, bytes(5)), "SETTINGS"),
        (_frame(4, 1, 0, bytes(6)), "ACK with a payload"),
        (_frame(8, 0, 0, bytes(3)), "length 3"),
        (_frame(6, 0, 1, bytes(8)), "PING on a stream"),
        (_frame(2, 0, 0, bytes(5)), "PRIORITY on stream 0"),
        (_frame(1, 4, 1, hpack.Encoder().encode([(":authority", "a"), (":authority", "b")])), "duplicate"),
        (_frame(1, 4, 1, hpack.Encoder().encode([("host", "a"), ("host", "b")])), "duplicate"),
    ],
)
def test_refusals(frames: bytes, reason: str) -> None:
    with pytest.raises(H2PeekError, match=reason):
        H2RequestReader().feed(H2_PREFACE + frames)


def test_header_list_size_cap() -> None:
    block = hpack.Encoder().encode([*REQUEST, ("x-big", "v" * 9000), ("x-big2", "v" * 9000)])
    frames = _frame(1, 0, 1, block[:8000]) + _frame(9, 4, 1, block[8000:])
    with pytest.raises(H2PeekError, match="header block"):
        H2RequestReader(max_bytes=64 * 1024).feed(H2_PREFACE + frames)


def test_bad_preface() -> None:
    with pytest.raises(H2PeekError, match="preface"):
        H2RequestReader().feed(b"PRI * HTTP/1.1")
    with pytest.raises(H2PeekError, match="preface"):
        H2RequestReader().feed(b"GET / HTTP/1.1\r\n")


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"", False), (b"P", True), (H2_PREFACE[:10], True), (H2_PREFACE + b"xyz", True), (b"GET /", False),
     (b"\x16\x03\x01", False)],
)
def test_looks_like_h2c(data: bytes, expected: bool) -> None:
    assert looks_like_h2c(data) is expected


# --- fuzz ----------------------------------------------------------------------------

REAL = client_bytes(priority_weight=10, priority_depends_on=0)


def _read_all(chunks: list[bytes]) -> None:
    reader = H2RequestReader()
    try:
        for chunk in chunks:
            reader.feed(chunk)
    except H2PeekError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=6))
def test_fuzz_reader_after_preface(chunks: list[bytes]) -> None:
    _read_all([H2_PREFACE, *chunks])
    _read_all(chunks)


@settings(max_examples=300, deadline=None)
@given(frame_runs)
def test_fuzz_reader_structured_frames(frames: bytes) -> None:
    _read_all([H2_PREFACE + frames])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 0xFF))
def test_fuzz_header_blocks(block: bytes, flags: int) -> None:
    _read_all([H2_PREFACE + _frame(1, flags, 1, block)])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(REAL) - 1), st.integers(0, 255)), min_size=1, max_size=4))
def test_fuzz_mutated_real_client_bytes(mutations: list[tuple[int, int]]) -> None:
    data = bytearray(REAL)
    for pos, value in mutations:
        data[pos] = value
    _read_all([bytes(data)])
