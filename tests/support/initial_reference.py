"""The pure-Python reference of ``quic/_initial_protection.c``, and the comparisons that hold the C to it.

Every differential test (``tests/test_quic_*native*.py``) and native fuzz target
(``tests/fuzz/targets_quic.py``) compares the C path with these, never C with C: the ClientHello
walk is ``parse_client_hello``, the long header ``read_long_header``, the key schedule
``derive_initial_keys``, the opening ``open_initial``, all called directly; the sniffer as a whole
runs with ``native=None``. The C is ``quic.native.EXTENSION``, looked up at each call (a test may
swap it). A disagreement raises ``CDivergence``; a C path may always decline (answer None), which
sends the caller the reference way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from quic import native as quic_native
from quic.frames import QUIC_MAX_CRYPTO_BYTES, CryptoReassembler, walk_initial_frames
from quic.initial_keys import (
    InitialKeys,
    client_initial_keys,
    decrypt_initial,
    derive_initial_keys,
    open_initial,
    server_initial_keys,
)
from quic.initial_sniffer import InitialSniffer, sniff_first_payload
from quic.native import InitialProtection, client_hello_parser
from quic.packet import LongHeader, QuicPacketError, parse_long_header, read_long_header
from wire.client_hello import (
    HANDSHAKE_HEADER_BYTES,
    MAX_TLS_CLIENT_HELLO_BYTES,
    ClientHelloError,
    ClientHelloInfo,
    client_hello_length,
    parse_client_hello,
)

ClientHelloFacts = tuple[str | None, tuple[str, ...]]
"""(server name, ALPN) as the C answers them."""


class CDivergence(AssertionError):
    """The C path answered otherwise than the Python reference."""


def outcome(call: Callable[..., object], *args: object) -> object:
    """``call(*args)``'s result, or its ``QuicPacketError`` as (type, message)."""
    try:
        return call(*args)
    except QuicPacketError as exc:
        return (type(exc), str(exc))


def reference_hello(payload: bytes, max_crypto: int = QUIC_MAX_CRYPTO_BYTES) -> object:
    """What ``InitialSniffer`` makes of one first payload the reference way, all in Python (the
    frames into a ``CryptoReassembler``, then ``parse_client_hello``): facts, None, or the error."""
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
        return exc


def c_hello_agrees(payload: bytes, max_crypto: int = QUIC_MAX_CRYPTO_BYTES) -> ClientHelloFacts | None:
    """The C reading of a first payload (``sniff_first_payload``): None (declined) or the reference's facts."""
    found = sniff_first_payload(payload, min(max_crypto, MAX_TLS_CLIENT_HELLO_BYTES), quic_native.EXTENSION)
    if found is not None and reference_hello(payload, max_crypto) != ClientHelloInfo(*found):
        raise CDivergence(f"C read {found}, the reference {reference_hello(payload, max_crypto)}")
    return found


def c_handshake_agrees(handshake: bytes) -> object:
    """The C-first hello reading (``quic.native.client_hello_parser``) answers as ``parse_client_hello``:
    facts or the same error."""
    in_c = _hello_outcome(client_hello_parser(quic_native.EXTENSION), handshake)
    reference = _hello_outcome(parse_client_hello, handshake)
    if in_c != reference:
        raise CDivergence(f"C read {in_c}, the reference {reference}")
    return in_c


def _hello_outcome(call: Callable[[bytes], ClientHelloInfo], handshake: bytes) -> object:
    try:
        return call(handshake)
    except ClientHelloError as exc:
        return (type(exc), str(exc))


def c_long_header_agrees(datagram: bytes, offset: int = 0) -> object:
    """``parse_long_header`` (C first) answers as ``read_long_header``: the header or the same error."""
    in_c = outcome(parse_long_header, datagram, offset, quic_native.EXTENSION)
    reference = outcome(read_long_header, datagram, offset)
    if in_c != reference:
        raise CDivergence(f"C parsed {in_c}, the reference {reference}")
    return in_c


def c_keys_agree(version: int, dcid: bytes) -> object:
    """Both directions' Initial keys (C first) equal ``derive_initial_keys``'s."""
    answers = []
    for keys, direction in ((client_initial_keys, b"client in"), (server_initial_keys, b"server in")):
        in_c = outcome(keys, version, dcid, quic_native.EXTENSION)
        reference = outcome(derive_initial_keys, version, dcid, direction)
        if in_c != reference:
            raise CDivergence(f"C derived {in_c}, the reference {reference}")
        answers.append(in_c)
    return tuple(answers)


def c_opening_agrees(datagram: bytes, header: LongHeader, keys: InitialKeys, largest_pn: int = -1) -> object:
    """``decrypt_initial`` (C first) answers as ``open_initial``: the opened packet or the same error."""
    in_c = outcome(decrypt_initial, datagram, header, keys, largest_pn, quic_native.EXTENSION)
    reference = outcome(open_initial, datagram, header, keys, largest_pn)
    if in_c != reference:
        raise CDivergence(f"C opened {in_c!r:.200}, the reference {reference!r:.200}")
    return in_c


def c_sniffer_agrees(datagrams: Sequence[bytes]) -> tuple[object, ...]:
    """A fresh sniffer reads ``datagrams`` with the C path (one-call first Initial included) as it does
    on the Python path alone: ``sniffer_reading`` of both."""
    in_c = sniffer_reading(datagrams, quic_native.EXTENSION)
    reference = sniffer_reading(datagrams, None)
    if in_c != reference:
        raise CDivergence(f"the sniffer read {in_c!r:.300} with C, {reference!r:.300} in Python")
    return in_c


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
