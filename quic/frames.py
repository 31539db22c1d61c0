"""Initial-packet frames (RFC 9000 sections 12.4 and 19) and CRYPTO stream reassembly.

Every frame is walked, not only CRYPTO, so a malformed payload is refused rather than half-read.
Clients split, reorder and interleave CRYPTO data (Chrome's "chaos protection"), so the reassembler
accepts any order, overlap and duplication, within a byte bound.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from enum import IntEnum

from quic.packet import VARINT_MAX, QuicPacketError, decode_varint
from wire.client_hello import MAX_TLS_CLIENT_HELLO_BYTES

QUIC_MAX_CRYPTO_BYTES = MAX_TLS_CLIENT_HELLO_BYTES
"""CRYPTO bytes buffered per pending flow: past the largest ClientHello accepted none can complete."""


class FrameType(IntEnum):
    """Frame types allowed in an Initial packet."""

    PADDING = 0x00
    PING = 0x01
    ACK = 0x02
    ACK_ECN = 0x03
    CRYPTO = 0x06
    CONNECTION_CLOSE = 0x1C


def walk_initial_frames(payload: bytes) -> Iterator[tuple[int, bytes]]:
    """(offset, data) of every CRYPTO frame of a decrypted Initial payload, in order; a frame type not
    allowed in an Initial (RFC 9000 section 12.4) raises QuicPacketError."""
    n = len(payload)
    pos = 0
    while pos < n:
        if payload[pos] == FrameType.PADDING:  # runs of PADDING are common: skip fast
            pos = n - len(payload[pos:].lstrip(b"\x00"))
            continue
        frame_type, pos = decode_varint(payload, pos)
        if frame_type == FrameType.PING:
            continue
        if frame_type == FrameType.CRYPTO:
            offset, pos = decode_varint(payload, pos)
            length, pos = decode_varint(payload, pos)
            if offset + length > VARINT_MAX:
                raise QuicPacketError("CRYPTO offset + length exceeds 2^62 - 1")
            if length > n - pos:
                raise QuicPacketError("truncated CRYPTO frame")
            yield offset, payload[pos : pos + length]
            pos += length
        elif frame_type in (FrameType.ACK, FrameType.ACK_ECN):
            pos = _skip_ack(payload, pos, frame_type == FrameType.ACK_ECN)
        elif frame_type == FrameType.CONNECTION_CLOSE:
            _error_code, pos = decode_varint(payload, pos)
            _frame_type, pos = decode_varint(payload, pos)
            reason_length, pos = decode_varint(payload, pos)
            if reason_length > n - pos:
                raise QuicPacketError("truncated CONNECTION_CLOSE reason")
            pos += reason_length
        else:
            raise QuicPacketError(f"frame type 0x{frame_type:x} is not allowed in an Initial packet")


def _skip_ack(payload: bytes, pos: int, ecn: bool) -> int:
    """Position after an ACK frame body (RFC 9000 section 19.3)."""
    _largest, pos = decode_varint(payload, pos)
    _delay, pos = decode_varint(payload, pos)
    range_count, pos = decode_varint(payload, pos)
    _first_range, pos = decode_varint(payload, pos)
    if range_count > (len(payload) - pos) // 2:  # every range is at least two varints
        raise QuicPacketError("truncated ACK ranges")
    for _ in range(range_count):
        _gap, pos = decode_varint(payload, pos)
        _length, pos = decode_varint(payload, pos)
    if ecn:
        for _ in range(3):
            _count, pos = decode_varint(payload, pos)
    return pos


class CryptoReassembler:
    """The Initial CRYPTO stream, rebuilt from pieces in any order, up to ``max_bytes``.

    Bytes received twice must be equal (RFC 9000 section 2.2): a conflict raises, so the router never
    routes on a ClientHello that the pod, keeping the other copy, would read differently."""

    __slots__ = ("_buf", "_max", "_ranges")

    def __init__(self, max_bytes: int = QUIC_MAX_CRYPTO_BYTES) -> None:
        self._max = max_bytes
        self._buf = bytearray()
        self._ranges: list[tuple[int, int]] = []
        """Sorted, disjoint, non-adjacent [start, end) ranges of received bytes."""

    def add(self, offset: int, data: bytes) -> None:
        """Store ``data`` at ``offset``; QuicPacketError past max_bytes or on a conflict."""
        end = offset + len(data)
        if offset < 0 or end > self._max:
            raise QuicPacketError(f"CRYPTO data up to offset {end} exceeds {self._max} bytes")
        if not data:
            return
        if end > len(self._buf):
            self._buf.extend(bytes(end - len(self._buf)))
        ranges = self._ranges
        # Ranges that overlap or touch [offset, end) merge into one.
        lo = bisect.bisect_left(ranges, (offset, -1))
        if lo and ranges[lo - 1][1] >= offset:
            lo -= 1
        hi = lo
        while hi < len(ranges) and ranges[hi][0] <= end:
            start, stop = ranges[hi]
            a, b = max(start, offset), min(stop, end)
            if a < b and self._buf[a:b] != data[a - offset : b - offset]:
                raise QuicPacketError(f"conflicting CRYPTO data at offset {a}")
            hi += 1
        self._buf[offset:end] = data
        merged_start = min(offset, ranges[lo][0]) if hi > lo else offset
        merged_end = max(end, ranges[hi - 1][1]) if hi > lo else end
        ranges[lo:hi] = [(merged_start, merged_end)]

    @property
    def max_bytes(self) -> int:
        """The stream's bound: CRYPTO data past it is refused."""
        return self._max

    @property
    def contiguous_length(self) -> int:
        """Bytes available from offset 0 without a gap."""
        if self._ranges and self._ranges[0][0] == 0:
            return self._ranges[0][1]
        return 0

    def contiguous(self, limit: int | None = None) -> bytes:
        """The stream's bytes from offset 0 up to the first gap (at most ``limit``)."""
        available = self.contiguous_length
        return bytes(self._buf[: available if limit is None else min(limit, available)])
