"""The reference reading of a flow's first Initial payload, as ``InitialSniffer`` does it in Python
(``quic.frames`` into a ``CryptoReassembler``, then ``wire.client_hello``): what the C reading of
``quic/_initial_protection.c`` must equal whenever it answers (tests and the fuzzer check it)."""

from __future__ import annotations

from collections.abc import Sequence

from quic.frames import QUIC_MAX_CRYPTO_BYTES, CryptoReassembler, walk_initial_frames
from quic.initial_sniffer import InitialSniffer
from quic.native import InitialProtection
from quic.packet import LongHeader, QuicPacketError, parse_long_header
from wire.client_hello import (
    HANDSHAKE_HEADER_BYTES,
    MAX_TLS_CLIENT_HELLO_BYTES,
    ClientHelloError,
    client_hello_length,
    parse_client_hello,
)


def reference_hello(payload: bytes, max_crypto: int = QUIC_MAX_CRYPTO_BYTES) -> object:
    """What ``InitialSniffer`` makes of one first payload the reference way: facts, None, or an error."""
    crypto = CryptoReassembler(min(max_crypto, MAX_TLS_CLIENT_HELLO_BYTES))
    try:
        for offset, data in walk_initial_frames(payload):
            crypto.add(offset, data)
        available = crypto.contiguous_length
        if not available:
            return None
        total = client_hello_length(crypto.contiguous(HANDSHAKE_HEADER_BYTES))
        if total is None or available < total:
            return None
        return parse_client_hello(crypto.contiguous(total))
    except (QuicPacketError, ClientHelloError) as exc:
        return type(exc)


def first_header(datagram: bytes, native: InitialProtection | None = None) -> LongHeader | None:
    """The first datagram's long header, as the edge passes it to the sniffer (None: the sniffer
    parses, and names what is wrong); read in C with ``native``."""
    try:
        return parse_long_header(datagram, 0, native)
    except QuicPacketError:
        return None


def sniffer_reading(datagrams: Sequence[bytes], native: InitialProtection | None = None) -> tuple[object, ...]:
    """What a fresh sniffer answers to each datagram (the first with its long header, as the edge
    passes it; an error as its type and text), and the state it is left in: version, DCIDs, largest
    packet number, and its keys only while the hello is incomplete (the one-call first Initial keeps
    none that no later datagram needs). ``native``: the C reading (None: the reference)."""
    sniffer = InitialSniffer(native=native)
    answers: list[object] = []
    for i, datagram in enumerate(datagrams):
        try:
            answers.append(sniffer.feed(datagram, None if i else first_header(datagram, native)))
        except QuicPacketError as exc:
            answers.append((type(exc), str(exc)))
    keys = sniffer._keys if sniffer.client_hello is None else None
    return tuple(answers), sniffer.version, sniffer.original_dcid, sniffer.client_scid, sniffer._largest_pn, keys
