"""The gRPC rejection encoder: a polite HTTP/2 answer that fails the client's first call. Sans-IO."""

from __future__ import annotations

from enum import IntEnum

import hpack

from wire.h2_frames import (
    DEFAULT_MAX_FRAME_SIZE,
    MAX_STREAM_ID,
    SETTINGS_ACK_FRAME,
    ErrorCode,
    Flag,
    FrameType,
    encode_frame,
)


class GrpcStatus(IntEnum):
    """gRPC status codes (grpc/doc/statuscodes.md); the router sends two of them."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    """A missing or non-matching :authority: retrying the same call cannot help."""
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    """The named pod is not ready or the dial failed: a retry may succeed."""
    DATA_LOSS = 15
    UNAUTHENTICATED = 16

def grpc_rejection(stream_id: int, grpc_status: int, message: str) -> bytes:
    """SETTINGS ACK, a trailers-only gRPC response ending ``stream_id``, then GOAWAY: after EMPTY_SETTINGS_FRAME
    the client sees a polite HTTP/2 server, and its call fails with ``grpc_status``, not a reset connection."""
    if not 0 < stream_id <= MAX_STREAM_ID:
        raise ValueError(f"stream id {stream_id} out of range")
    if not 0 <= grpc_status <= max(GrpcStatus):
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
            frames.append(encode_frame(FrameType.HEADERS, Flag.END_STREAM | last, stream_id, chunk))
        else:
            frames.append(encode_frame(FrameType.CONTINUATION, last, stream_id, chunk))
    goaway = stream_id.to_bytes(4, "big") + ErrorCode.NO_ERROR.to_bytes(4, "big")
    frames.append(encode_frame(FrameType.GOAWAY, 0, 0, goaway))
    return b"".join(frames)


def percent_encode_grpc_message(message: str) -> str:
    """gRPC spec: UTF-8, then every byte outside printable ASCII (and ``%``) as ``%XX``."""
    return "".join(
        chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}"
        for b in message.encode("utf-8", errors="replace")
    )
