"""Fuzz targets of the h2c peek (``wire.h2c``): the request reader and the SETTINGS
ACK stripper, seeded with real ``h2`` client streams and hand-built frame sequences."""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from typing import Any

import hpack

from tests.fuzz.target import FuzzTarget, check, feed_all, pieces, route_name, tweak
from tests.support.h2 import frame, split_frames
from wire.h2_frames import H2_PREFACE, H2PeekError
from wire.h2c import H2RequestReader
from wire.settings_ack import SettingsAckStripper


def run_h2_request(data: bytes) -> str:
    whole = feed_all(H2RequestReader(), [data], H2PeekError)
    chunked = feed_all(H2RequestReader(), pieces(data), H2PeekError)
    check(whole[0] == chunked[0], f"whole feed {whole[0]} but chunked feed {chunked[0]}")
    if whole[0] == "error":
        raise whole[1]  # type: ignore[misc]
    check(whole[1] == chunked[1], "chunked feed found another request")
    request = whole[1]
    if request is None:
        return "incomplete"
    authority = request.authority  # type: ignore[attr-defined]
    check(authority is None or isinstance(authority, str), "authority type")
    if authority:
        route_name(authority)
    return "request"


def _strip(pieces: Sequence[bytes]) -> tuple[bytes, bool, H2PeekError | None]:
    stripper = SettingsAckStripper()
    out = []
    try:
        for piece in pieces:
            out.append(stripper.feed(piece))
    except H2PeekError as exc:
        return b"".join(out), stripper.done, exc
    return b"".join(out), stripper.done, None


def run_settings_ack(data: bytes) -> str:
    """Forwarded bytes are the input minus exactly one empty SETTINGS ACK, however chunked."""
    out, done, error = _strip([data])
    chunked_out, chunked_done, chunked_error = _strip(pieces(data))
    check((error is None) == (chunked_error is None), "chunking changed whether the stream is malformed")
    if error is not None:
        raise error
    check((out, done) == (chunked_out, chunked_done), "chunking changed the forwarded bytes")
    if not done:
        check(data.startswith(out) and len(data) - len(out) < 9, "bytes lost before the ACK")
        return "passing"
    check(len(out) == len(data) - 9, "not exactly one 9-byte frame removed")
    first_diff = next((i for i, (a, b) in enumerate(zip(out, data, strict=False)) if a != b), len(out))
    check(
        any(_is_settings_ack(data[i : i + 9]) and data[:i] + data[i + 9 :] == out
            for i in range(max(0, first_diff - 9), first_diff + 1)),
        "the removed bytes are not a SETTINGS ACK",
    )
    return "stripped"


def _is_settings_ack(header: bytes) -> bool:
    """Empty SETTINGS with ACK on stream 0; other flags and the reserved bit are ignored (RFC 9113 4.1)."""
    return (len(header) == 9 and header[:4] == b"\x00\x00\x00\x04" and bool(header[4] & 1)
            and int.from_bytes(header[5:9], "big") & 0x7FFF_FFFF == 0)


GRPC_HEADERS = [
    (":method", "POST"), (":scheme", "http"), (":path", "/stargate.Stargate/Whoami"),
    (":authority", "stargate-0.stargate.external"), ("te", "trailers"),
    ("content-type", "application/grpc"), ("user-agent", "grpc-python/1.60"),
]


@functools.cache
def _h2_streams() -> tuple[bytes, ...]:
    import h2.config
    import h2.connection

    def client(headers: Sequence[tuple[str, str]], **kwargs: Any) -> bytes:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.increment_flow_control_window(1 << 20)
        conn.send_headers(1, headers, **kwargs)
        conn.send_data(1, b"\x00\x00\x00\x00\x02hi", end_stream=True)
        return conn.data_to_send()

    preface = H2_PREFACE
    settings = frame(4, 0, 0, b"\x00\x02\x00\x00\x00\x00\x00\x04\x00\x40\x00\x00")
    ack = frame(4, 1, 0)
    plain = hpack.Encoder().encode(GRPC_HEADERS, huffman=False)
    host_only = hpack.Encoder().encode([(":path", "/x"), ("host", "stargate-1.stargate.external:50071")])
    padded = bytes((5,)) + plain + bytes(5)
    prioritised = b"\x00\x00\x00\x03\x10" + plain
    third = len(plain) // 3
    continued = (
        frame(1, 0, 1, plain[:third]) + frame(9, 0, 1, plain[third : 2 * third])
        + frame(9, 4, 1, plain[2 * third :])
    )
    return (
        client(GRPC_HEADERS),
        client(GRPC_HEADERS, priority_weight=200, priority_depends_on=0),
        client([(":method", "GET"), (":scheme", "http"), (":path", "/"),
                (":authority", "Stargate-0.Stargate.External.:443")]),
        preface + settings + frame(8, 0, 0, b"\x00\x0f\x00\x01") + ack + frame(1, 4, 1, plain),
        preface + settings + frame(6, 0, 0, bytes(8)) + frame(2, 0, 3, bytes(5)) + frame(1, 0xC, 1, padded),
        preface + frame(1, 0x24, 1, prioritised) + ack,
        preface + settings + continued + ack,
        preface + frame(1, 5, 1, b"\x3f\xe1\x1f" + host_only),  # dynamic table size update first
        preface + ack + frame(1, 4, 1, plain) + frame(0, 1, 1, b"\x00\x00\x00\x00\x00"),
    )


def h2_seeds() -> list[bytes]:
    return list(_h2_streams())


H2_DICTIONARY = (
    H2_PREFACE, b"\x00\x00\x00\x04\x01\x00\x00\x00\x00", b"\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    b"\x00\x40\x00", b"\x7f\xff\xff\xff", b"\x80\x00\x00\x01", b"\x01\x04", b"\x09\x04", b"\x3f\xe1\x1f",
    b"\x41", b"\x01", b"\x00\x0a:authority", b"\x04host", b"\xff\xff\xff\xff\x0f",
)


_HEADER_POOL = (
    (":authority", "stargate-0.stargate.external"), (":authority", "STARGATE-1.stargate.external:50071"),
    (":authority", ""), (":authority", "x" * 300), ("host", "stargate-0.stargate.external"), (":path", "/"),
    (":path", "/stargate.StargateControlPlane/WatchStargates"), (":method", "POST"), (":scheme", "http"),
    ("te", "trailers"), ("content-type", "application/grpc"), ("x-big", "v" * 5000), ("", ""), (":authority", "\x00"),
    (":authority", "stargate-0.stargate.external:650710"), (":authority", "stargate-0.stargate.external:" + "0" * 9000),
    (":authority", "stargate-0.stargate.external.:65535"), ("host", "stargate-1.stargate.external:" + "9" * 300),
)


def mutate_h2(data: bytes, rng: random.Random) -> bytes | None:
    """Rewrite a header block (hpack), a frame's fields or the frame list, and fix frame lengths."""
    frames = split_frames(data, H2_PREFACE)
    if frames is None:
        return None
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.35:
            headers = rng.sample(_HEADER_POOL, rng.randint(1, 6))
            block = hpack.Encoder().encode(headers, huffman=rng.random() < 0.5)
            if rng.random() < 0.2:
                block = rng.choice((b"\x20", b"\x3f\xe1\x1f", b"\x3f\xff\xff\xff\x0f")) + block
            flags = rng.choice((4, 5, 0x24, 0x0C, 0))
            payload = (bytes((3,)) + block + bytes(3)) if flags & 8 else block
            payload = (b"\x00\x00\x00\x00\x10" + payload) if flags & 0x20 else payload
            frames.insert(rng.randrange(len(frames) + 1), (1, flags, rng.choice((1, 1, 3, 2, 0)), payload))
            if not flags & 4:
                frames.insert(rng.randrange(len(frames) + 1), (9, 4, 1, hpack.Encoder().encode(headers[:1])))
        elif roll < 0.55 and frames:
            i = rng.randrange(len(frames))
            frame_type, flags, stream, payload = frames[i]
            frames[i] = (frame_type, flags, stream, tweak(payload, rng))
        elif roll < 0.7 and frames:
            i = rng.randrange(len(frames))
            frame_type, flags, stream, payload = frames[i]
            field = rng.randrange(3)
            frames[i] = (
                rng.randrange(12) if field == 0 else frame_type,
                rng.randrange(256) if field == 1 else flags,
                rng.choice((0, 1, 2, 3, 0x8000_0001)) if field == 2 else stream,
                payload,
            )
        elif roll < 0.85:
            extra = rng.choice(((4, 1, 0, b""), (4, 0, 0, bytes(6)), (6, 0, 0, bytes(8)),
                                (8, 0, 0, b"\x00\x00\x10\x00"), (2, 0, 1, bytes(5)), (0, 1, 1, b"data"),
                                (0xEE, 0, 0, b"unknown")))
            frames.insert(rng.randrange(len(frames) + 1), extra)
        elif frames:
            i = rng.randrange(len(frames))
            if rng.random() < 0.5:
                frames.insert(i, frames[i])
            else:
                frames.pop(i)
    return H2_PREFACE + b"".join(frame(*f) for f in frames)


H2_TARGETS = (
    FuzzTarget("h2_request", run_h2_request, (H2PeekError,), h2_seeds, 20_000, H2_DICTIONARY, mutate_h2),
    FuzzTarget("settings_ack", run_settings_ack, (H2PeekError,), h2_seeds, 8_000, H2_DICTIONARY, mutate_h2),
)
