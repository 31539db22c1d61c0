"""Initial frame walking and CRYPTO reassembly: allowed frames, bounds, order, overlap, fuzz."""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quic.frames import CryptoReassembler, walk_initial_frames
from quic.packet import QuicPacketError, encode_varint
from tests.support.quic_frames import ack, close, crypto_frame
from tests.support.quic_vectors import RFC_CLIENT_HELLO, RFC_CLIENT_PAYLOAD, RFC_SERVER_PAYLOAD


def test_rfc_client_payload_is_one_crypto_frame_then_padding() -> None:
    assert list(walk_initial_frames(RFC_CLIENT_PAYLOAD)) == [(0, RFC_CLIENT_HELLO)]


def test_rfc_server_payload_skips_the_ack() -> None:
    [(offset, data)] = walk_initial_frames(RFC_SERVER_PAYLOAD)
    assert offset == 0 and data[0] == 2 and len(data) == 0x5A  # ServerHello


def test_allowed_frames_are_skipped_and_crypto_kept_in_order() -> None:
    payload = b"".join((
        b"\x00\x00\x01", crypto_frame(5, b"world"), ack(10, [(1, 2), (0, 1)]), b"\x01",
        ack(7, ecn=True), crypto_frame(0, b"hello"), close(b"bye"), bytes(100), crypto_frame(10, b""),
    ))
    assert list(walk_initial_frames(payload)) == [(5, b"world"), (0, b"hello"), (10, b"")]
    assert list(walk_initial_frames(b"")) == []
    assert list(walk_initial_frames(bytes(1000))) == []


@pytest.mark.parametrize(
    "frame",
    [
        b"\x08\x00\x01a",  # STREAM
        b"\x07\x01t",  # NEW_TOKEN
        b"\x1e",  # HANDSHAKE_DONE
        b"\x1d\x00\x00",  # application CONNECTION_CLOSE
        b"\x18\x00\x00\x08" + bytes(24),  # NEW_CONNECTION_ID
        b"\x40\x08",  # STREAM, two-byte type
        b"\xff",  # truncated varint type
    ],
)
def test_frames_not_allowed_in_initial_are_refused(frame: bytes) -> None:
    with pytest.raises(QuicPacketError):
        list(walk_initial_frames(crypto_frame(0, b"ok") + frame))


def test_every_truncation_raises_or_walks() -> None:
    payload = crypto_frame(3, b"abcdef") + ack(1000, [(5, 6)], ecn=True) + close(b"reason") + crypto_frame(0, b"abc")
    for cut in range(len(payload)):
        with contextlib.suppress(QuicPacketError):
            list(walk_initial_frames(payload[:cut]))
    with pytest.raises(QuicPacketError, match="truncated CRYPTO"):
        list(walk_initial_frames(crypto_frame(0, b"abcdef")[:-1]))


def test_crypto_beyond_varint_range_and_absurd_ack_range_counts() -> None:
    with pytest.raises(QuicPacketError, match="2\\^62"):
        list(walk_initial_frames(b"\x06" + encode_varint((1 << 62) - 2) + encode_varint(5) + b"abcde"))
    huge = b"\x02" + encode_varint(5) + encode_varint(0) + encode_varint((1 << 62) - 1) + encode_varint(0)
    with pytest.raises(QuicPacketError, match="ACK ranges"):
        list(walk_initial_frames(huge + bytes(10)))


def test_reassembler_in_order_out_of_order_and_gaps() -> None:
    r = CryptoReassembler(100)
    assert r.contiguous() == b"" and r.contiguous_length == 0
    r.add(5, b"fghij")
    assert r.contiguous() == b""
    r.add(0, b"abc")
    assert r.contiguous() == b"abc"
    r.add(3, b"de")
    assert r.contiguous() == b"abcdefghij"
    assert r.contiguous(4) == b"abcd"
    r.add(20, b"xyz")
    assert r.contiguous_length == 10


def test_reassembler_overlaps_and_duplicates() -> None:
    data = bytes(range(50))
    r = CryptoReassembler(64)
    r.add(10, data[10:30])
    r.add(10, data[10:30])  # duplicate
    r.add(5, data[5:15])  # overlaps the front
    r.add(25, data[25:40])  # overlaps the back
    r.add(0, data[0:45])  # covers everything
    r.add(12, data[12:13])
    assert r.contiguous() == data[:45]
    r.add(45, b"")
    assert r.contiguous() == data[:45]


def test_reassembler_refuses_conflicts_overflow_and_negative_offsets() -> None:
    r = CryptoReassembler(16)
    r.add(0, b"abcd")
    with pytest.raises(QuicPacketError, match="conflicting"):
        r.add(2, b"XY")
    with pytest.raises(QuicPacketError, match="exceeds"):
        r.add(10, b"1234567")
    with pytest.raises(QuicPacketError, match="exceeds"):
        r.add(17, b"")
    with pytest.raises(QuicPacketError):
        r.add(-1, b"a")
    r.add(4, b"efghijklmnop")  # exactly up to the limit
    assert r.contiguous() == b"abcdefghijklmnop"


def test_reassembler_many_tiny_pieces_shuffled() -> None:
    data = random.Random(3).randbytes(4000)
    pieces = [(i, data[i : i + 3 + i % 5]) for i in range(0, len(data), 3)]  # overlapping 3-7 byte pieces
    random.Random(4).shuffle(pieces)
    r = CryptoReassembler(4096)
    for offset, piece in pieces:
        r.add(offset, piece)
    assert r.contiguous() == data


@st.composite
def pieces_of(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, bytes]]]:
    data = draw(st.binary(min_size=1, max_size=300))
    spans = draw(st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(0, 40)), max_size=60))
    pieces = [(start, data[start : start + length]) for start, length in spans]
    return data, pieces


@settings(max_examples=300, deadline=None)
@given(case=pieces_of())
def test_reassembler_matches_a_byte_map_model(case: tuple[bytes, list[tuple[int, bytes]]]) -> None:
    data, pieces = case
    r = CryptoReassembler(len(data))
    have: set[int] = set()
    for offset, piece in pieces:
        r.add(offset, piece)
        have.update(range(offset, offset + len(piece)))
        prefix = 0
        while prefix in have:
            prefix += 1
        assert r.contiguous() == data[:prefix]


@settings(max_examples=400, deadline=None)
@given(payload=st.one_of(
    st.binary(max_size=200),
    st.lists(st.sampled_from([b"\x00", b"\x01", crypto_frame(0, b"ab"), ack(3, [(0, 0)]), close(b"x"),
                              ack(9, ecn=True), b"\x06", b"\x02\x05", b"\x1c\x00", b"\x06\x44"]),
             max_size=12).map(b"".join),
))
def test_fuzz_walk_and_reassemble_raise_only_quic_packet_error(payload: bytes) -> None:
    r = CryptoReassembler(64)
    try:
        for offset, data in walk_initial_frames(payload):
            r.add(offset, data)
    except QuicPacketError:
        pass
