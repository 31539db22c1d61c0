"""h2c peek: the first request's ``:authority``, the SETTINGS ACK to hide, gRPC rejections.

Sans-IO. grpcio clients send the preface, SETTINGS and WINDOW_UPDATE, then wait for the
server's SETTINGS before sending HEADERS; so the router answers ``EMPTY_SETTINGS_FRAME``
at once, reads frames up to the first complete header block, and forwards everything it
read to the pod unchanged. The client's ACK of the router's SETTINGS must not reach the
pod (which never sent those settings): ``SettingsAckStripper`` removes exactly that frame.
HPACK is decoded with ``hpack``, with a fresh decoder as the pod will use on the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, IntFlag

import hpack

from router.constants import H2_MAX_HEADER_LIST_SIZE, H2_PREFACE, MAX_PEEK_BYTES

FRAME_HEADER_BYTES = 9
"""length(3) + type(1) + flags(1) + reserved bit and stream id(4) (RFC 9113 section 4.1)."""

DEFAULT_MAX_FRAME_SIZE = 16_384
"""SETTINGS_MAX_FRAME_SIZE initial value; the router advertises no other."""

MAX_STREAM_ID = 2**31 - 1


class FrameType(IntEnum):
    DATA = 0
    HEADERS = 1
    PRIORITY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PUSH_PROMISE = 5
    PING = 6
    GOAWAY = 7
    WINDOW_UPDATE = 8
    CONTINUATION = 9


class Flag(IntFlag):
    ACK = 0x1
    END_STREAM = 0x1
    END_HEADERS = 0x4
    PADDED = 0x8
    PRIORITY = 0x20


class ErrorCode(IntEnum):
    NO_ERROR = 0


_SKIPPED_LENGTHS: dict[int, int | None] = {
    FrameType.SETTINGS: None,  # multiple of 6, checked below
    FrameType.WINDOW_UPDATE: 4,
    FrameType.PING: 8,
    FrameType.PRIORITY: 5,
}
"""Frames a client may send before its first HEADERS, with their fixed payload length."""


class H2PeekError(ValueError):
    """Not a well-formed start of an h2c connection; hpack errors are re-raised as this."""


def _frame(frame_type: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes([frame_type, flags])
        + stream_id.to_bytes(4, "big")
        + payload
    )


EMPTY_SETTINGS_FRAME: bytes = _frame(FrameType.SETTINGS, 0, 0)
"""The router's own SETTINGS (all defaults), sent as soon as the preface arrived."""

SETTINGS_ACK_FRAME: bytes = _frame(FrameType.SETTINGS, Flag.ACK, 0)


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


@dataclass(frozen=True, slots=True)
class _FrameHeader:
    length: int
    type: int
    flags: int
    stream_id: int


def _parse_frame_header(data: bytes | bytearray, offset: int = 0) -> _FrameHeader:
    raw = data[offset : offset + FRAME_HEADER_BYTES]
    return _FrameHeader(
        length=int.from_bytes(raw[0:3], "big"),
        type=raw[3],
        flags=raw[4],
        stream_id=int.from_bytes(raw[5:9], "big") & MAX_STREAM_ID,
    )


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
            header = _parse_frame_header(self._buf, self._pos)
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

    def _on_frame(self, header: _FrameHeader, payload: bytes) -> H2Request | None:
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


def _check_skipped(header: _FrameHeader) -> None:
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
    decoder.max_header_list_size = H2_MAX_HEADER_LIST_SIZE
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


class SettingsAckStripper:
    """Removes exactly one SETTINGS ACK frame (the client's ack of the router's empty SETTINGS)
    from the client->pod byte stream, wherever it appears, then passes everything through."""

    __slots__ = ("_done", "_header", "_payload_left", "_preface_left")

    def __init__(self) -> None:
        self._preface_left = len(H2_PREFACE)
        self._header = bytearray()
        """A partial frame header (< 9 bytes): the only bytes ever held back."""
        self._payload_left = 0
        self._done = False

    @property
    def done(self) -> bool:
        """True once the ACK was removed; ``feed`` is then the identity."""
        return self._done

    def feed(self, data: bytes) -> bytes:
        """Bytes to forward for ``data``; raises H2PeekError on a malformed stream."""
        if self._done:
            return data
        out: list[bytes] = []
        view = memoryview(data)
        pos = 0
        while pos < len(view) and not self._done:
            if self._preface_left:
                offset = len(H2_PREFACE) - self._preface_left
                n = min(self._preface_left, len(view) - pos)
                if view[pos : pos + n] != H2_PREFACE[offset : offset + n]:
                    raise H2PeekError("not the HTTP/2 client preface")
                out.append(bytes(view[pos : pos + n]))
                self._preface_left -= n
                pos += n
            elif self._payload_left:
                n = min(self._payload_left, len(view) - pos)
                out.append(bytes(view[pos : pos + n]))
                self._payload_left -= n
                pos += n
            else:
                n = min(FRAME_HEADER_BYTES - len(self._header), len(view) - pos)
                self._header += view[pos : pos + n]
                pos += n
                if len(self._header) == FRAME_HEADER_BYTES:
                    self._on_header(out)
        if pos < len(view):
            out.append(bytes(view[pos:]))
        return b"".join(out)

    def _on_header(self, out: list[bytes]) -> None:
        header = _parse_frame_header(self._header)
        if header.type == FrameType.SETTINGS and header.flags & Flag.ACK:
            if header.length or header.stream_id:
                raise H2PeekError("malformed SETTINGS ACK")
            self._done = True
        else:
            out.append(bytes(self._header))
            self._payload_left = header.length
        self._header.clear()


def grpc_rejection(stream_id: int, grpc_status: int, message: str) -> bytes:
    """SETTINGS ACK, a trailers-only gRPC response ending ``stream_id``, then GOAWAY.

    Sent after EMPTY_SETTINGS_FRAME, so the client sees a complete, polite HTTP/2 server:
    its call fails with ``grpc_status`` / ``message`` instead of a reset connection.
    """
    if not 0 < stream_id <= MAX_STREAM_ID:
        raise ValueError(f"stream id {stream_id} out of range")
    if not 0 <= grpc_status <= 16:
        raise ValueError(f"grpc-status {grpc_status} out of range")
    block = hpack.Encoder().encode(
        [
            (":status", "200"),
            ("content-type", "application/grpc"),
            ("grpc-status", str(grpc_status)),
            ("grpc-message", percent_encode_grpc_message(message)),
        ]
    )
    frames = [SETTINGS_ACK_FRAME]
    chunks = [block[i : i + DEFAULT_MAX_FRAME_SIZE] for i in range(0, len(block), DEFAULT_MAX_FRAME_SIZE)]
    for i, chunk in enumerate(chunks):
        last = Flag.END_HEADERS if i == len(chunks) - 1 else 0
        if i == 0:
            frames.append(_frame(FrameType.HEADERS, Flag.END_STREAM | last, stream_id, chunk))
        else:
            frames.append(_frame(FrameType.CONTINUATION, last, stream_id, chunk))
    goaway = stream_id.to_bytes(4, "big") + ErrorCode.NO_ERROR.to_bytes(4, "big")
    frames.append(_frame(FrameType.GOAWAY, 0, 0, goaway))
    return b"".join(frames)


def percent_encode_grpc_message(message: str) -> str:
    """gRPC spec: UTF-8, then every byte outside printable ASCII (and ``%``) as ``%XX``."""
    return "".join(
        chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}"
        for b in message.encode("utf-8", errors="replace")
    )
