"""Hard QUIC first flights, rebuilt from a real aioquic client's Initials.

Real clients do more than aioquic's one tidy Initial: Chrome splits the ClientHello
into small CRYPTO pieces, shuffles them and interleaves PING/PADDING ("chaos
protection"); post-quantum key shares make ClientHellos span two or three datagrams,
which the network may reorder or duplicate; clients coalesce 0-RTT packets after
the Initial. This module takes a real client's first flight, decrypts it, and re-emits
the same CRYPTO stream in those shapes, re-encrypted with the client Initial keys and
every datagram padded to >= 1200 bytes.

Parsing and packet protection here use aioquic (``pull_quic_header``, ``CryptoPair``),
not ``quic/``, so the sniffer is tested against an independent implementation.

Cases (``CASES``; ``SERVER_COMPLETABLE`` / ``SNIFFER_ONLY``):

=================  ======  ===============================================================
case               server  what the datagrams look like
=================  ======  ===============================================================
repacked           yes     the same CRYPTO stream re-encrypted in one Initial per datagram
chaos              yes     1-24 byte CRYPTO pieces, shuffled, with PING/PADDING between
chaos_spread       yes     shuffled small pieces spread over >= 3 datagrams sent shuffled
split_reordered    yes     the stream in 3 in-order chunks, datagrams sent last-first
duplicated         yes     2 chunks, each datagram sent twice (same packet number)
coalesced_junk     yes     each Initial followed by a junk 0-RTT packet and short junk
grown_extension    no      ClientHello grown by a 2.5 KB unknown extension, 3+ datagrams
grown_chaos        no      grown ClientHello in shuffled small pieces, datagrams reversed
=================  ======  ===============================================================

"server yes" means a real server (aioquic) completes the handshake when it receives
these datagrams instead of the client's originals and everything after is relayed
unchanged: the CRYPTO stream is byte-identical, so both TLS transcripts match. The
``grown_*`` cases change the ClientHello itself, so the transcripts differ and the
handshake fails at Finished: they exercise the sniffer only. To get a large ClientHello
a real server accepts, make the client big instead: ``client_first_flight(big_hello=True)``
offers many long ALPN names, so aioquic's own flight spans three datagrams, and any
"yes" case applies to it.

Packet numbers: the first emitted Initials reuse the client's own numbers; extra
Initials use ``EXTRA_PN_BASE + i``: above the few numbers the client will use next, so
the server never drops the client's later Initials as duplicates, yet close enough that
a reordered flight stays inside a server's duplicate-detection window (aioquic treats
numbers 128 below the largest received as already seen). Acknowledgements of numbers
the client never sent are harmless to aioquic.
"""

from __future__ import annotations

import random
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aioquic.buffer import Buffer, encode_uint_var
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.crypto import CryptoPair
from aioquic.quic.packet import QuicPacketType, encode_long_header_first_byte, pull_quic_header

from tests.support.quic_frames import crypto_frame

SERVER_NAME = "stargate-0.stargate.external"
ALPN = ("stargate",)
BIG_HELLO_ALPN = tuple(f"filler-{i:02d}-" + "x" * 200 for i in range(12))
"""Offered after the real protocols by ``big_hello`` clients: ~2.5 KB of ALPN."""
CLIENT_CID_BYTES = 8
"""aioquic's connection ID length (pull_quic_header wants one)."""
MIN_DATAGRAM = 1200
MAX_FRAMES_PER_PACKET = 1100
"""Frame bytes per rewritten Initial, so each datagram stays near 1200 bytes."""
EXTRA_PN_BASE = 32
PN_BYTES = 2
GROW_EXTENSION_TYPE = 0x1A1A
"""A GREASE extension type (RFC 8701): servers must ignore it, parsers must skip it."""
GROW_EXTENSION_BYTES = 2500

_PING = b"\x01"


@dataclass(frozen=True)
class FirstFlight:
    """What a client's first flight says, decrypted: enough to re-emit it differently."""

    version: int
    dcid: bytes
    scid: bytes
    token: bytes
    packet_numbers: tuple[int, ...]
    crypto: bytes
    """The whole Initial CRYPTO stream from offset 0 (the ClientHello)."""


def client_first_flight(
    version: int = 0x00000001,
    *,
    server_name: str = SERVER_NAME,
    alpn_protocols: Sequence[str] = ALPN,
    big_hello: bool = False,
    other_versions: Sequence[int] = (),
    cafile: str | None = None,
    addr: tuple[str, int] = ("127.0.0.1", 50072),
    now: float = 0.0,
) -> tuple[QuicConnection, list[bytes]]:
    """A real aioquic client connecting to ``addr``, and the datagrams of its first flight.

    The client starts with ``version`` and also accepts ``other_versions`` after
    Version Negotiation. ``cafile`` is the CA to verify the server with (``make_pki(...).ca_path``); without
    it the client does not verify (enough for sniffing and refusals).
    """
    protocols = list(alpn_protocols) + (list(BIG_HELLO_ALPN) if big_hello else [])
    configuration = QuicConfiguration(
        is_client=True,
        server_name=server_name,
        alpn_protocols=protocols,
        supported_versions=[version, *other_versions],
    )
    if cafile is None:
        configuration.verify_mode = ssl.CERT_NONE
    else:
        configuration.load_verify_locations(cafile)
    connection = QuicConnection(configuration=configuration)
    connection.connect(addr, now=now)
    return connection, [data for data, _ in connection.datagrams_to_send(now=now)]


def open_flight(datagrams: Sequence[bytes]) -> FirstFlight:
    """Decrypt every client Initial of ``datagrams`` and reassemble its CRYPTO stream."""
    first: tuple[int, bytes, bytes, bytes] | None = None
    pair = CryptoPair()
    pieces: dict[int, bytes] = {}
    numbers: list[int] = []
    for datagram in datagrams:
        buf = Buffer(data=datagram)
        while not buf.eof() and datagram[buf.tell()] & 0x80:  # stop at short headers/padding
            start = buf.tell()
            header = pull_quic_header(buf, host_cid_length=CLIENT_CID_BYTES)
            end = start + header.packet_length
            if header.packet_type == QuicPacketType.INITIAL:
                if first is None:
                    first = (header.version, header.destination_cid, header.source_cid, header.token)
                    pair.setup_initial(cid=header.destination_cid, is_client=False, version=header.version)
                _, payload, number = pair.decrypt_packet(datagram[start:end], buf.tell() - start, 0)
                numbers.append(number)
                pieces.update(_crypto_frames(payload))
            buf.seek(end)
    if first is None:
        raise ValueError("no Initial packet in the flight")
    crypto = bytearray()
    for offset in sorted(pieces):
        if offset > len(crypto):
            raise ValueError(f"CRYPTO gap before offset {offset}")
        crypto[offset : offset + len(pieces[offset])] = pieces[offset]
    version, dcid, scid, token = first
    return FirstFlight(version, dcid, scid, token, tuple(numbers), bytes(crypto))


def _crypto_frames(payload: bytes) -> dict[int, bytes]:
    """CRYPTO frames of a client first-flight Initial (which has nothing but PADDING/PING)."""
    buf = Buffer(data=payload)
    out: dict[int, bytes] = {}
    while not buf.eof():
        frame_type = buf.pull_uint_var()
        if frame_type == 0x06:
            offset = buf.pull_uint_var()
            out[offset] = buf.pull_bytes(buf.pull_uint_var())
        elif frame_type not in (0x00, 0x01):
            raise ValueError(f"unexpected frame 0x{frame_type:x} in a first flight")
    return out


def encrypt_client_initial(
    flight: FirstFlight, packet_number: int, frames: bytes, pad_to: int = MIN_DATAGRAM
) -> bytes:
    """One client Initial with ``frames``, PADDING-extended to ``pad_to`` bytes."""
    prefix = b"".join((
        bytes((encode_long_header_first_byte(flight.version, QuicPacketType.INITIAL, PN_BYTES - 1),)),
        flight.version.to_bytes(4, "big"),
        bytes((len(flight.dcid),)), flight.dcid,
        bytes((len(flight.scid),)), flight.scid,
        encode_uint_var(len(flight.token)), flight.token,
    ))
    overhead = len(prefix) + 2 + PN_BYTES + 16  # Length is always a 2-byte varint here
    payload = frames + bytes(max(pad_to - overhead - len(frames), 4))
    length = PN_BYTES + len(payload) + 16
    header = prefix + (0x4000 | length).to_bytes(2, "big") + packet_number.to_bytes(PN_BYTES, "big")
    pair = CryptoPair()
    pair.setup_initial(cid=flight.dcid, is_client=True, version=flight.version)
    return pair.encrypt_packet(header, payload, packet_number)


def _packet_numbers(flight: FirstFlight, count: int) -> list[int]:
    own = list(flight.packet_numbers)
    return (own + [EXTRA_PN_BASE + i for i in range(count)])[:count]


def _emit(flight: FirstFlight, payloads: Sequence[bytes]) -> list[bytes]:
    numbers = _packet_numbers(flight, len(payloads))
    return [encrypt_client_initial(flight, pn, frames) for pn, frames in zip(numbers, payloads, strict=True)]


def _chunks(crypto: bytes, count: int) -> list[bytes]:
    """``count`` in-order CRYPTO frames covering the stream."""
    step = -(-len(crypto) // count)
    return [crypto_frame(o, crypto[o : o + step]) for o in range(0, len(crypto), step)]


def _small_pieces(crypto: bytes, rng: random.Random, with_noise: bool) -> list[bytes]:
    """Shuffled 1-24 byte CRYPTO frames, optionally each followed by PING or PADDING."""
    frames: list[bytes] = []
    offset = 0
    while offset < len(crypto):
        size = rng.randint(1, 24)
        frames.append(crypto_frame(offset, crypto[offset : offset + size]))
        offset += size
    rng.shuffle(frames)
    if with_noise:
        frames = [f + rng.choice((b"", _PING, bytes(rng.randint(1, 8)))) for f in frames]
    return frames


def _pack(frames: Sequence[bytes], limit: int = MAX_FRAMES_PER_PACKET) -> list[bytes]:
    payloads: list[bytes] = [b""]
    for frame in frames:
        if payloads[-1] and len(payloads[-1]) + len(frame) > limit:
            payloads.append(b"")
        payloads[-1] += frame
    return payloads


def _spread(frames: Sequence[bytes], count: int, rng: random.Random) -> list[bytes]:
    """Frames dealt at random over ``count`` payloads (more if one would overflow)."""
    bins: list[list[bytes]] = [[] for _ in range(count)]
    for frame in frames:
        bins[rng.randrange(count)].append(frame)
    return [p for b in bins for p in _pack(b)]


def grow_client_hello(hello: bytes, extra: int = GROW_EXTENSION_BYTES) -> bytes:
    """``hello`` with a first extension of ``extra`` zero bytes, lengths fixed up."""
    pos = 4 + 2 + 32
    pos += 1 + hello[pos]  # legacy_session_id
    pos += 2 + int.from_bytes(hello[pos : pos + 2], "big")  # cipher_suites
    pos += 1 + hello[pos]  # legacy_compression_methods
    extensions = hello[pos + 2 :]
    added = GROW_EXTENSION_TYPE.to_bytes(2, "big") + extra.to_bytes(2, "big") + bytes(extra)
    body = hello[4:pos] + (len(extensions) + len(added)).to_bytes(2, "big") + added + extensions
    return hello[:1] + len(body).to_bytes(3, "big") + body


def _repacked(flight: FirstFlight, rng: random.Random) -> list[bytes]:
    return _emit(flight, _pack(_chunks(flight.crypto, -(-len(flight.crypto) // MAX_FRAMES_PER_PACKET))))


def _chaos(flight: FirstFlight, rng: random.Random) -> list[bytes]:
    return _emit(flight, _pack(_small_pieces(flight.crypto, rng, with_noise=True)))


def _chaos_spread(flight: FirstFlight, rng: random.Random) -> list[bytes]:
    datagrams = _emit(flight, _spread(_small_pieces(flight.crypto, rng, with_noise=True), 3, rng))
    rng.shuffle(datagrams)
    return datagrams


def _split_reordered(flight: FirstFlight, rng: random.Random) -> list[bytes]:
    return _emit(flight, _chunks(flight.crypto, max(3, len(flight.crypto) // 900 + 1)))[::-1]


def _duplicated(flight: FirstFlight, rng: random.Random) -> list[bytes]:
    datagrams = _emit(flight, _chunks(flight.crypto, max(2, len(flight.crypto) // 900 + 1)))
    return [d for d in datagrams for _ in range(2)]


def _coalesced_junk(flight: FirstFlight, rng: random.Random) -> list[bytes]:
    """Initials (each >= 1200 bytes alone) + a 0-RTT packet the server cannot open + junk."""
    out = []
    for initial in _repacked(flight, rng):
        junk = rng.randbytes(rng.randint(40, 120))
        zero_rtt = b"".join((
            bytes((encode_long_header_first_byte(flight.version, QuicPacketType.ZERO_RTT, 1),)),
            flight.version.to_bytes(4, "big"),
            bytes((len(flight.dcid),)), flight.dcid,
            bytes((len(flight.scid),)), flight.scid,
            encode_uint_var(len(junk)), junk,
        ))
        trailing = bytes((0x40 | rng.randrange(0x40),)) + rng.randbytes(rng.randint(0, 30))
        out.append(initial + zero_rtt + trailing)
    return out


def _grown(flight: FirstFlight) -> FirstFlight:
    return FirstFlight(
        flight.version, flight.dcid, flight.scid, flight.token, flight.packet_numbers,
        grow_client_hello(flight.crypto),
    )


def _grown_extension(flight: FirstFlight, rng: random.Random) -> list[bytes]:
    return _repacked(_grown(flight), rng)


def _grown_chaos(flight: FirstFlight, rng: random.Random) -> list[bytes]:
    grown = _grown(flight)
    return _emit(grown, _spread(_small_pieces(grown.crypto, rng, with_noise=True), 3, rng))[::-1]


@dataclass(frozen=True)
class Case:
    build: Callable[[FirstFlight, random.Random], list[bytes]]
    server_completes: bool


CASES: dict[str, Case] = {
    "repacked": Case(_repacked, True),
    "chaos": Case(_chaos, True),
    "chaos_spread": Case(_chaos_spread, True),
    "split_reordered": Case(_split_reordered, True),
    "duplicated": Case(_duplicated, True),
    "coalesced_junk": Case(_coalesced_junk, True),
    "grown_extension": Case(_grown_extension, False),
    "grown_chaos": Case(_grown_chaos, False),
}
SERVER_COMPLETABLE = frozenset(name for name, case in CASES.items() if case.server_completes)
SNIFFER_ONLY = frozenset(CASES) - SERVER_COMPLETABLE


def rewrite_flight(datagrams: Sequence[bytes], case: str, rng: random.Random) -> list[bytes]:
    """The client's first-flight ``datagrams`` re-emitted as ``case`` (see the module table).

    Only Initial packets are kept (a first flight without session resumption has no
    others). Send the result instead of the originals; relay everything after unchanged.
    """
    return CASES[case].build(open_flight(datagrams), rng)
