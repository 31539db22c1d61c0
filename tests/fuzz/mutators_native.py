"""Structure-aware mutations of the native targets' inputs (the C of ``quic/_initial_protection.c``
against the Python reference): the shapes a security review of that C tries, built whole so that
they get past the first length check, then stacked with the engine's byte mutations.

Lying lengths (a CRYPTO frame, ACK range count, CONNECTION_CLOSE reason, token or Length field
longer or shorter than what follows, non-minimal varints, offsets near 2^62), connection IDs of
21-255 bytes, coalesced packets, CRYPTO pieces shuffled, duplicated, overlapping or with a gap,
and truncations anywhere.
"""

from __future__ import annotations

import random

from quic.packet import QUIC_V1, QUIC_V2
from tests.fuzz.target import SEPARATOR
from tests.fuzz.targets_tls import hellos, mutate_hello

VARINT_MAX = (1 << 62) - 1
VERSIONS = (QUIC_V1, QUIC_V1, QUIC_V2, QUIC_V2, 0, 0x1A2A3A4A, 0xFF00001D)
"""v1 and v2 mostly; Version Negotiation and other versions, which the C declines."""


def varint(value: int, rng: random.Random) -> bytes:
    """``value`` as a QUIC varint, sometimes longer than it needs (still valid)."""
    value = max(0, min(value, VARINT_MAX))
    sizes = [s for s in (1, 2, 4, 8) if value < 1 << (8 * s - 2)]
    size = sizes[0] if rng.random() < 0.7 else rng.choice(sizes)
    return (value | ((size.bit_length() - 1) << (8 * size - 2))).to_bytes(size, "big")


def lie(true: int, rng: random.Random) -> int:
    """A length that is ``true`` most of the time, else a little or a lot off."""
    roll = rng.random()
    if roll < 0.8:
        return true
    if roll < 0.93:
        return max(0, true + rng.choice((-3, -2, -1, 1, 2, 3, 16)))
    return rng.choice((0, 1, 0x3F, 0x40, 0x3FFF, 0x4000, 1 << 20, VARINT_MAX))


def cut(data: bytes, rng: random.Random, chance: float = 0.15) -> bytes:
    """``data``, or (with ``chance``) ``data`` cut short anywhere."""
    return data[: rng.randrange(len(data) + 1)] if data and rng.random() < chance else data


def crypto_frame(offset: int, data: bytes, rng: random.Random) -> bytes:
    """CRYPTO at ``offset``, its length field sometimes lying."""
    return b"\x06" + varint(offset, rng) + varint(lie(len(data), rng), rng) + data


def crypto_pieces(hello: bytes, rng: random.Random) -> list[bytes]:
    """The hello as CRYPTO frames: whole or in pieces, in order, shuffled or reversed, with a piece
    duplicated, an overlapping piece (same bytes, or others), or a gap."""
    size = rng.choice((len(hello) or 1, 1, 3, 40, 100, 300))
    cuts = list(range(0, len(hello), size)) or [0]
    frames = [crypto_frame(at, hello[at : at + size], rng) for at in cuts]
    roll = rng.random()
    if roll < 0.3:
        rng.shuffle(frames)
    elif roll < 0.4:
        frames.reverse()
    if rng.random() < 0.2 and frames:
        frames.insert(rng.randrange(len(frames) + 1), rng.choice(frames))
    if rng.random() < 0.2 and hello:
        at = rng.randrange(len(hello))
        overlap = hello[at : at + rng.choice((1, 10, 50, 400))]
        if rng.random() < 0.4:
            overlap = bytes(b ^ 0xFF for b in overlap)  # conflicting bytes at the same offset
        frames.insert(rng.randrange(len(frames) + 1), crypto_frame(at, overlap, rng))
    if rng.random() < 0.1 and len(frames) > 1:
        del frames[rng.randrange(len(frames))]  # a gap
    return frames


def noise_frame(rng: random.Random) -> bytes:
    """Another frame an Initial may carry (PADDING, PING, ACK, CONNECTION_CLOSE), its lengths
    sometimes lying; or a frame no Initial may carry; or a CRYPTO frame near the end of the stream."""
    roll = rng.random()
    if roll < 0.25:
        return bytes(rng.choice((1, 1, 7, 30)))
    if roll < 0.35:
        return b"\x01"
    if roll < 0.6:
        ranges = rng.choice((0, 1, 2))
        body = varint(rng.randrange(1 << 20), rng) + varint(0, rng) + varint(lie(ranges, rng), rng) + varint(0, rng)
        body += b"".join(varint(rng.randrange(10), rng) + varint(rng.randrange(10), rng) for _ in range(ranges))
        ecn = rng.random() < 0.3
        return (b"\x03" if ecn else b"\x02") + body + (b"".join(varint(1, rng) for _ in range(3)) if ecn else b"")
    if roll < 0.8:
        reason = rng.choice((b"", b"bye", b"x" * 40))
        return b"\x1c" + varint(0x0A, rng) + varint(6, rng) + varint(lie(len(reason), rng), rng) + reason
    if roll < 0.85:
        return bytes((rng.choice((0x04, 0x08, 0x1E, 0x1D, 0x40)),)) + rng.randbytes(rng.randint(0, 6))
    return crypto_frame(rng.choice((VARINT_MAX - 5, VARINT_MAX, 1 << 32, 70_000)), rng.randbytes(4), rng)


def hello_frames(rng: random.Random) -> list[bytes]:
    """A real ClientHello (mutated half the time) as CRYPTO pieces, with noise frames between."""
    hello = rng.choice(hellos())
    if rng.random() < 0.5:
        hello = mutate_hello(hello, rng) or hello
    frames = crypto_pieces(hello, rng)
    for _ in range(rng.choice((0, 0, 1, 2, 4))):
        frames.insert(rng.randrange(len(frames) + 1), noise_frame(rng))
    return frames


def mutate_frames(data: bytes, rng: random.Random) -> bytes | None:
    """``initial_native``'s input: one first Initial payload of CRYPTO pieces and noise, maybe cut."""
    return cut(b"".join(hello_frames(rng)), rng)


def mutate_first_payloads(data: bytes, rng: random.Random) -> bytes | None:
    """``first_initial_native``'s input: byte 0 picks version and packet number length, then the
    frames of 1-3 Initials (the first read in one C call, the rest the reference way)."""
    frames = hello_frames(rng)
    parts = rng.choice((1, 1, 1, 2, 3))
    payloads = [cut(b"".join(frames[i::parts]), rng, 0.05) for i in range(parts)]
    return bytes((rng.randrange(8),)) + SEPARATOR.join(payloads)


def cid(rng: random.Random) -> bytes:
    """A connection ID: usual sizes, the v1/v2 limit's edges, or 21-255 bytes (the invariants allow it)."""
    size = rng.choice((0, 8, 8, 8, 20, 4, 21, rng.randint(21, 255), 255))
    return rng.randbytes(size)


def long_header(rng: random.Random) -> bytes:
    """One long-header packet: any version and type, CIDs of any size, a token and Length that may lie."""
    version = rng.choice(VERSIONS)
    first = 0xC0 | (rng.randrange(4) << 4) | rng.randrange(16)
    dcid, scid = cid(rng), cid(rng)
    out = bytes((first,)) + version.to_bytes(4, "big") + bytes((len(dcid),)) + dcid + bytes((len(scid),)) + scid
    initial = (first >> 4) & 3 == (0 if version == QUIC_V1 else 1)
    if initial or rng.random() < 0.1:
        token = rng.choice((b"", b"", rng.randbytes(rng.choice((1, 16, 77)))))
        out += varint(lie(len(token), rng), rng) + token
    body = rng.randbytes(rng.choice((0, 4, 20, 60, 300, 1200)))
    return out + varint(lie(len(body), rng), rng) + body


def mutate_long_headers(data: bytes, rng: random.Random) -> bytes | None:
    """``long_header_native``'s input: 1-3 datagrams, each 1-4 coalesced long headers, maybe cut
    short or followed by junk."""
    datagrams = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        datagram = b"".join(long_header(rng) for _ in range(rng.choice((1, 1, 2, 3, 4))))
        if rng.random() < 0.15:
            datagram += rng.choice((b"\x00" * 20, b"\x40" + rng.randbytes(20), rng.randbytes(7)))
        datagrams.append(cut(datagram, rng, 0.2))
    return SEPARATOR.join(datagrams)
