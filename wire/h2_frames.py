"""HTTP/2 frame layout shared by the h2c peek, the SETTINGS-ACK stripper and the gRPC rejection.

Sans-IO: the 9-byte frame header (RFC 9113 section 4.1), the frame types and flags the
router reads or writes, and the one error type for a malformed start of an h2c stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, IntFlag

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""The 24-byte HTTP/2 client connection preface (RFC 9113 section 3.4)."""

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


class H2PeekError(ValueError):
    """Not a well-formed start of an h2c connection; hpack errors are re-raised as this."""


def encode_frame(frame_type: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes([frame_type, flags])
        + stream_id.to_bytes(4, "big")
        + payload
    )


EMPTY_SETTINGS_FRAME: bytes = encode_frame(FrameType.SETTINGS, 0, 0)
"""The router's own SETTINGS (all defaults), sent as soon as the preface arrived."""

SETTINGS_ACK_FRAME: bytes = encode_frame(FrameType.SETTINGS, Flag.ACK, 0)
"""The client's acknowledgement of the router's SETTINGS (stripped) and the router's own (sent)."""


@dataclass(frozen=True, slots=True)
class FrameHeader:
    length: int
    type: int
    flags: int
    stream_id: int


def parse_frame_header(data: bytes | bytearray, offset: int = 0) -> FrameHeader:
    raw = data[offset : offset + FRAME_HEADER_BYTES]
    return FrameHeader(
        length=int.from_bytes(raw[0:3], "big"),
        type=raw[3],
        flags=raw[4],
        stream_id=int.from_bytes(raw[5:9], "big") & MAX_STREAM_ID,
    )
