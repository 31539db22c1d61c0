"""The C Initial path (``quic/_initial_protection.c``) answers exactly as the Python reference does.

The reference is Python, called directly (``tests/support/initial_reference.py``):
``derive_initial_keys`` and ``open_initial`` (``cryptography`` + ``hashlib``) for keys and opening,
``quic.frames`` and ``parse_client_hello`` for the ClientHello, ``read_long_header`` for the long
header. The C path may decline (``sniff_first_payload`` None: the sniffer then walks the payload
the reference way), but whatever it answers must be the reference's answer, on real Initials and
on hostile bytes alike.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quic import native as quic_native
from quic.frames import QUIC_MAX_CRYPTO_BYTES
from quic.initial_keys import client_initial_keys, encrypt_initial
from quic.packet import QUIC_V1, QUIC_V2, QuicPacketError, encode_varint, parse_long_header
from tests.support.initial_reference import (
    c_handshake_agrees,
    c_hello_agrees,
    c_keys_agree,
    c_long_header_agrees,
    c_opening_agrees,
)
from tests.support.quic_frames import ack, close, crypto_frame
from tests.support.quic_vectors import RFC_CLIENT_HELLO, V1_CLIENT_INITIAL, V2_CLIENT_INITIAL

pytestmark = pytest.mark.skipif(quic_native.EXTENSION is None, reason="quic._initial_protection is not built")

VERSIONS = st.sampled_from([QUIC_V1, QUIC_V2])


@settings(max_examples=200, deadline=None)
@given(version=st.one_of(VERSIONS, st.integers(0, 2**32 - 1)), dcid=st.binary(max_size=40))
def test_keys_agree(version: int, dcid: bytes) -> None:
    c_keys_agree(version, dcid)


@pytest.mark.parametrize("datagram", [V1_CLIENT_INITIAL, V2_CLIENT_INITIAL])
def test_the_rfc_initials_open_alike(datagram: bytes) -> None:
    header = parse_long_header(datagram)
    opened = c_opening_agrees(datagram, header, client_initial_keys(header.version, header.dcid))
    assert isinstance(opened, tuple) and opened[1].startswith(b"\x06\x00")  # a CRYPTO frame at offset 0


@settings(max_examples=300, deadline=None)
@given(
    version=VERSIONS,
    dcid=st.binary(max_size=20),
    token=st.binary(max_size=300),
    pn=st.integers(0, 2**31 - 1),
    pn_length=st.sampled_from([None, 1, 2, 3, 4]),
    payload=st.binary(min_size=0, max_size=1300),
    largest_pn=st.one_of(st.just(-1), st.integers(0, 2**40)),
    flips=st.lists(st.tuples(st.integers(0, 2000), st.integers(1, 255)), max_size=3),
    cut=st.integers(0, 40),
)
def test_opening_agrees_on_any_initial_and_its_damage(
    version: int, dcid: bytes, token: bytes, pn: int, pn_length: int | None, payload: bytes, largest_pn: int,
    flips: list[tuple[int, int]], cut: int,
) -> None:
    keys = client_initial_keys(version, dcid)
    size = pn_length if pn_length is not None and pn < 1 << (8 * pn_length) else None
    packet = bytearray(encrypt_initial(version, dcid, b"s" * 8, pn, payload, keys, token=token, pn_length=size))
    for at, xor in flips:
        packet[at % len(packet)] ^= xor
    datagram = bytes(packet[: len(packet) - cut])
    try:
        header = parse_long_header(datagram)
    except QuicPacketError:
        return
    opened = c_opening_agrees(datagram, header, keys, largest_pn)
    if not flips and not cut and largest_pn == -1:
        assert isinstance(opened, tuple) and opened[0] == pn and opened[1].startswith(payload)


agree = c_hello_agrees


HELLO = RFC_CLIENT_HELLO
"""The RFC 9001 A.2 ClientHello: one whole handshake message (example.com, ALPN "alpn")."""


@pytest.mark.parametrize("payload", [
    crypto_frame(0, HELLO) + bytes(300),
    ack(3, ecn=True) + b"\x01" + crypto_frame(0, HELLO),
    crypto_frame(0, HELLO[:100]) + crypto_frame(100, HELLO[100:]) + bytes(5),
    crypto_frame(0, HELLO[:100]) + b"\x01" + crypto_frame(100, HELLO[100:150]) + crypto_frame(150, HELLO[150:]),
    crypto_frame(0, HELLO) + crypto_frame(len(HELLO), b"more crypto after the hello") + close(b"bye"),
])
def test_the_usual_first_payloads_are_read_in_c(payload: bytes) -> None:
    assert agree(payload) == ("example.com", ("alpn",), 30_000)  # RFC 9001 A.2's max_idle_timeout


@pytest.mark.parametrize("payload", [
    crypto_frame(100, HELLO[100:]) + crypto_frame(0, HELLO[:100]),  # out of order
    crypto_frame(0, HELLO[:100]),  # not all there yet
    crypto_frame(0, HELLO) + b"\x08",  # a STREAM frame: not allowed in an Initial
    crypto_frame(0, HELLO[:38] + b"\x21" + HELLO[39:]),  # a 33-byte legacy_session_id
])
def test_anything_else_goes_the_reference_way(payload: bytes) -> None:
    assert agree(payload) is None


def _payloads() -> st.SearchStrategy[bytes]:
    cuts = st.lists(st.integers(0, len(HELLO)), max_size=4).map(lambda c: sorted({0, *c, len(HELLO)}))
    in_order = cuts.map(lambda c: b"".join(crypto_frame(a, HELLO[a:b]) for a, b in itertools.pairwise(c)))
    other = st.sampled_from([b"", b"\x00" * 7, b"\x01", ack(9), ack(2, [(1, 1)], ecn=True), close(b"x"), b"\x1e"])
    damaged = st.tuples(st.integers(0, len(HELLO) - 1), st.integers(1, 255)).map(
        lambda f: crypto_frame(0, HELLO[: f[0]] + bytes((HELLO[f[0]] ^ f[1],)) + HELLO[f[0] + 1 :])
    )
    pieces = st.one_of(in_order, other, damaged, st.binary(max_size=40),
                       st.builds(crypto_frame, st.integers(0, 70_000), st.binary(max_size=30)))
    return st.lists(pieces, min_size=1, max_size=5).map(b"".join)


@settings(max_examples=1500, deadline=None)
@given(payload=_payloads(), max_crypto=st.sampled_from([QUIC_MAX_CRYPTO_BYTES, 200, 300]))
def test_whatever_c_reads_of_a_hostile_payload_is_the_reference_reading(payload: bytes, max_crypto: int) -> None:
    agree(payload, max_crypto)


@settings(max_examples=500, deadline=None)
@given(hello=st.binary(min_size=0, max_size=400), junk=st.binary(max_size=8))
def test_random_hellos_never_read_otherwise(hello: bytes, junk: bytes) -> None:
    agree(crypto_frame(0, b"\x01" + len(hello).to_bytes(3, "big") + hello) + junk)
    agree(crypto_frame(0, hello))
    c_handshake_agrees(b"\x01" + len(hello).to_bytes(3, "big") + hello)


@settings(max_examples=1000, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, len(RFC_CLIENT_HELLO) - 1), st.integers(1, 255)), max_size=3),
       cut=st.integers(0, 8))
def test_whatever_c_reads_of_a_whole_handshake_is_the_walks_reading(flips: list[tuple[int, int]], cut: int) -> None:
    """``client_hello_facts`` (TLS over TCP's peek, and the QUIC hello) against ``parse_client_hello``."""
    hello = bytearray(RFC_CLIENT_HELLO)
    for at, xor in flips:
        hello[at] ^= xor
    c_handshake_agrees(bytes(hello[: len(hello) - cut]))


# -- long headers: the C parse answers as quic.packet's reading, or declines -----------------------


def _header(first: int, version: int, dcid: bytes, scid: bytes, token: bytes | None, length: int, rest: bytes) -> bytes:
    out = bytes((first | 0x80,)) + version.to_bytes(4, "big") + bytes((len(dcid),)) + dcid + bytes((len(scid),)) + scid
    if token is not None:
        out += encode_varint(len(token)) + token
    return out + encode_varint(length) + rest


def _long_headers() -> st.SearchStrategy[tuple[bytes, int]]:
    cid = st.binary(max_size=22)
    built = st.builds(
        _header, st.integers(0, 255), st.sampled_from([QUIC_V1, QUIC_V2, 0, 0x1A2A3A4A, 0xFF00001D]), cid, cid,
        st.one_of(st.none(), st.binary(max_size=40)), st.integers(0, 300), st.binary(max_size=200),
    )
    real = st.sampled_from([V1_CLIENT_INITIAL, V2_CLIENT_INITIAL])
    cut = st.tuples(real, st.integers(0, 60)).map(lambda r: r[0][: r[1]])
    flipped = st.tuples(real, st.integers(0, 40), st.integers(1, 255)).map(
        lambda r: r[0][: r[1]] + bytes((r[0][r[1]] ^ r[2],)) + r[0][r[1] + 1 :]
    )
    data = st.one_of(built, cut, flipped, real, st.binary(max_size=80))
    return st.tuples(data, st.integers(-2, 12)).map(lambda d: (d[0], d[1] if d[1] < 0 else min(d[1], 3) * (d[1] % 2)))


@pytest.mark.parametrize("datagram", [V1_CLIENT_INITIAL, V2_CLIENT_INITIAL])
def test_the_rfc_initials_long_headers_are_read_in_c(datagram: bytes) -> None:
    extension = quic_native.EXTENSION
    assert extension is not None and extension.long_header(datagram, 0) is not None
    c_long_header_agrees(datagram, 0)


@pytest.mark.parametrize("datagram", [
    _header(0x30, QUIC_V1, b"d", b"s", None, 0, b""),  # a v1 Retry: the rest of the datagram is its own
    _header(0x00, QUIC_V2, b"d", b"s", None, 0, b""),  # a v2 Retry
    _header(0x00, 0, b"d", b"s", None, 0, b""),  # Version Negotiation
    _header(0x00, 0x1A2A3A4A, b"d", b"s", None, 0, b""),  # a version of its own
    _header(0x00, QUIC_V1, bytes(21), b"s", b"", 0, b""),  # a 21-byte DCID
    _header(0x00, QUIC_V1, b"d", b"s", b"", 10, b"short"),  # Length past the datagram
    _header(0x20, QUIC_V1, b"d", b"s", None, 0, b"")[:-1],  # no Length at all
])
def test_anything_unusual_in_a_long_header_is_read_the_reference_way(datagram: bytes) -> None:
    extension = quic_native.EXTENSION
    assert extension is not None and extension.long_header(datagram, 0) is None


@settings(max_examples=2000, deadline=None)
@given(case=_long_headers())
def test_whatever_c_reads_of_a_long_header_is_the_reference_reading(case: tuple[bytes, int]) -> None:
    datagram, offset = case
    c_long_header_agrees(datagram, offset)
