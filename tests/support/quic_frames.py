"""QUIC frames built by hand for Initial payloads (CRYPTO, ACK, CONNECTION_CLOSE), with aioquic's
varint encoder so the builders share no code with the ``quic/`` parsers they feed."""

from __future__ import annotations

from collections.abc import Sequence

from aioquic.buffer import encode_uint_var


def crypto_frame(offset: int, data: bytes) -> bytes:
    """CRYPTO (0x06) carrying ``data`` at ``offset`` of the handshake stream."""
    return b"\x06" + encode_uint_var(offset) + encode_uint_var(len(data)) + data


def ack(largest: int, ranges: Sequence[tuple[int, int]] = (), ecn: bool = False) -> bytes:
    """ACK (0x02, or 0x03 with ECN counts): ``largest``, a first range of 0, then (gap, length) ``ranges``."""
    body = encode_uint_var(largest) + encode_uint_var(0) + encode_uint_var(len(ranges)) + encode_uint_var(0)
    body += b"".join(encode_uint_var(g) + encode_uint_var(n) for g, n in ranges)
    if ecn:
        body += encode_uint_var(1) + encode_uint_var(2) + encode_uint_var(3)
    return (b"\x03" if ecn else b"\x02") + body


def close(reason: bytes) -> bytes:
    """CONNECTION_CLOSE (0x1c), PROTOCOL_VIOLATION about a CRYPTO frame, with ``reason``."""
    return b"\x1c" + encode_uint_var(0x0A) + encode_uint_var(0x06) + encode_uint_var(len(reason)) + reason
