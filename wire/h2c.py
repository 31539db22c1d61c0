"""h2c peek: the ``:authority`` and ``:path`` of the first request of a prior-knowledge stream.

Sans-IO. grpcio waits for the server's SETTINGS before its HEADERS, hence ``saw_preface`` (the router then
sends ``EMPTY_SETTINGS_FRAME``). Every byte read goes to the pod unchanged, so HPACK is decoded with a fresh
decoder, as the pod will decode the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import hpack

from wire.h2_frames import (
    DEFAULT_MAX_FRAME_SIZE,
    FRAME_HEADER_BYTES,
    H2_PREFACE,
    Flag,
    FrameHeader,
    FrameType,
    H2PeekError,
    parse_frame_header,
)

MAX_PEEK_BYTES = 16 * 1024
"""Stream bytes the reader looks at for the first request's header block; real ones are < 4 KiB."""

MAX_HEADER_LIST_BYTES = 16 * 1024
"""Decoded header list cap for the first HEADERS block (hpack bomb guard)."""

_SKIPPED_LENGTHS: dict[int, int | None] = {
    FrameType.SETTINGS: None,  # multiple of 6, checked below
    FrameType.WINDOW_UPDATE: 4,
    FrameType.PING: 8,
    FrameType.PRIORITY: 5,
}
"""Frames a client may send before its first HEADERS, with their fixed payload length."""


def looks_like_h2c(first_bytes: bytes) -> bool:
    """True if the stream starts (so far) with the HTTP/2 preface (False when empty)."""
    if not first_bytes:
        return False
    n = min(len(first_bytes), len(H2_PREFACE))
    return first_bytes[:n] == H2_PREFACE[:n]


@dataclass(frozen=True, slots=True)
class H2Request:
    """The routing facts of the first request of an h2c connection."""

    stream_id: int
    authority: str | None
    """``:authority``, else the ``host`` header, else None (ASCII, bad bytes replaced)."""
    path: str | None


class H2RequestReader:
    """Feed client bytes; get the first request's H2Request once its header block is complete."""

    def __init__(self, max_bytes: int = MAX_PEEK_BYTES) -> None:
        self._max_bytes = max_bytes
        self._buf = bytearray()
        self._pos = 0
        """Offset in ``_buf`` of the next unparsed frame (the preface comes first)."""
        self._fed = 0
        self._saw_preface = False
        self._block = bytearray()
        self._block_stream = 0
        """Stream of the HEADERS whose CONTINUATIONs are awaited; 0 before HEADERS."""
        self._request: H2Request | None = None

    @property
    def saw_preface(self) -> bool:
        """True once all 24 preface bytes arrived (time to send EMPTY_SETTINGS_FRAME)."""
        return self._saw_preface

    def feed(self, data: bytes) -> H2Request | None:
        """Consume ``data``; None means more bytes are needed. Idempotent once complete."""
        if self._request is not None:
            return self._request
        # Only the first max_bytes of the stream are looked at: the outcome does not depend
        # on chunking, and the buffer never exceeds max_bytes.
        self._buf += data[: max(0, self._max_bytes - self._fed)]
        self._fed += len(data)
        if not self._saw_preface:
            n = min(len(self._buf), len(H2_PREFACE))
            if self._buf[:n] != H2_PREFACE[:n]:
                raise H2PeekError("not the HTTP/2 client preface")
            if n < len(H2_PREFACE):
                self._check_budget()
                return None
            self._saw_preface = True
            self._pos = len(H2_PREFACE)
        while self._request is None:
            if len(self._buf) - self._pos < FRAME_HEADER_BYTES:
                break
            header = parse_frame_header(self._buf, self._pos)
            if header.length > DEFAULT_MAX_FRAME_SIZE:
                raise H2PeekError(f"frame of {header.length} bytes exceeds {DEFAULT_MAX_FRAME_SIZE}")
            end = self._pos + FRAME_HEADER_BYTES + header.length
            if len(self._buf) < end:
                break
            payload = bytes(self._buf[self._pos + FRAME_HEADER_BYTES : end])
            self._pos = end
            self._request = self._on_frame(header, payload)
        if self._request is not None:
            self._buf.clear()
            return self._request
        self._check_budget()
        return None

    def _check_budget(self) -> None:
        if self._fed > self._max_bytes:
            raise H2PeekError(f"no complete HEADERS within {self._max_bytes} bytes")

    def _on_frame(self, header: FrameHeader, payload: bytes) -> H2Request | None:
        if self._block_stream:
            if header.type != FrameType.CONTINUATION or header.stream_id != self._block_stream:
                raise H2PeekError("header block interrupted by another frame")
            self._block += payload
            return self._finish_block(header.flags)
        if header.type == FrameType.HEADERS:
            if header.stream_id == 0 or header.stream_id % 2 == 0:
                raise H2PeekError(f"HEADERS on stream {header.stream_id} is not a client stream")
            self._block_stream = header.stream_id
            self._block += _header_block_fragment(header.flags, payload)
            return self._finish_block(header.flags)
        if header.type in _SKIPPED_LENGTHS:
            _check_skipped(header)
            return None
        raise H2PeekError(f"frame type {header.type} before the first HEADERS")

    def _finish_block(self, flags: int) -> H2Request | None:
        if not flags & Flag.END_HEADERS:
            return None
        return _decode_request(self._block_stream, bytes(self._block))


def _header_block_fragment(flags: int, payload: bytes) -> bytes:
    """Strip HEADERS padding and priority fields (RFC 9113 section 6.2), bounds-checked."""
    start, pad = 0, 0
    if flags & Flag.PADDED:
        if not payload:
            raise H2PeekError("PADDED HEADERS without a pad length")
        pad, start = payload[0], 1
    if flags & Flag.PRIORITY:
        start += 5
    if start + pad > len(payload):
        raise H2PeekError("HEADERS padding or priority exceeds the frame")
    return payload[start : len(payload) - pad]


def _check_skipped(header: FrameHeader) -> None:
    want = _SKIPPED_LENGTHS[header.type]
    if header.type == FrameType.SETTINGS:
        if header.stream_id != 0 or header.length % 6:
            raise H2PeekError("malformed SETTINGS frame")
        if header.flags & Flag.ACK and header.length:
            raise H2PeekError("SETTINGS ACK with a payload")
    elif header.length != want:
        raise H2PeekError(f"frame type {header.type} of length {header.length}, expected {want}")
    if header.type == FrameType.PING and header.stream_id != 0:
        raise H2PeekError("PING on a stream")
    if header.type == FrameType.PRIORITY and header.stream_id == 0:
        raise H2PeekError("PRIORITY on stream 0")


def _decode_request(stream_id: int, block: bytes) -> H2Request:
    decoder = hpack.Decoder()
    decoder.max_header_list_size = MAX_HEADER_LIST_BYTES
    try:
        headers = decoder.decode(block, raw=True)
    except (hpack.HPACKError, ValueError, IndexError) as exc:
        raise H2PeekError(f"bad header block: {exc}") from exc
    found: dict[bytes, str] = {}
    for name, value in headers:
        if name in (b":authority", b":path", b"host"):
            if name in found:
                # Router and pod could pick different copies: refuse the ambiguity.
                raise H2PeekError(f"duplicate {name.decode()} header")
            found[name] = bytes(value).decode("ascii", errors="replace")
    authority = found.get(b":authority", found.get(b"host"))
    return H2Request(stream_id=stream_id, authority=authority, path=found.get(b":path"))


