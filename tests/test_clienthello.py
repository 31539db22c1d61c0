"""ClientHello walker: real hellos from OpenSSL (ssl) and aioquic, crafted bad ones, fuzz."""

from __future__ import annotations

import contextlib
import ssl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quic import native as quic_native
from quic.clienthello import (
    MAX_TLS_CLIENT_HELLO_BYTES,
    ClientHelloError,
    ClientHelloInfo,
    client_hello_length,
    parse_client_hello,
    walk_client_hello,
)
from tests.support.tls import HOST, aioquic_client_hello, alpn_ext, build_hello, sni_ext, ssl_client_hello, u16

# --- real hellos -------------------------------------------------------------


pytestmark = pytest.mark.usefixtures("both_quic_readings")


def test_openssl_hello_with_sni_and_alpn() -> None:
    info = parse_client_hello(ssl_client_hello(alpn=("h2", "grpc-exp")))
    assert info == ClientHelloInfo(server_name=HOST, alpn=("h2", "grpc-exp"))


def test_openssl_hello_without_sni_or_alpn() -> None:
    assert parse_client_hello(ssl_client_hello(server_hostname=None, alpn=())) == ClientHelloInfo(None, ())


def test_openssl_tls12_only_hello() -> None:
    hello = ssl_client_hello(maximum_version=ssl.TLSVersion.TLSv1_2)
    assert parse_client_hello(hello).server_name == HOST


def test_aioquic_hello() -> None:
    info = parse_client_hello(aioquic_client_hello())
    assert info == ClientHelloInfo(server_name=HOST, alpn=("stargate",))


def test_every_truncation_of_a_real_hello_is_refused() -> None:
    hello = ssl_client_hello()
    for n in range(len(hello)):
        with pytest.raises(ClientHelloError):
            parse_client_hello(hello[:n])


def test_length_header_must_match_the_bytes_given() -> None:
    with pytest.raises(ClientHelloError):
        parse_client_hello(ssl_client_hello() + b"\x00")


# --- client_hello_length -----------------------------------------------------


@pytest.mark.parametrize("prefix", [b"", b"\x01", b"\x01\x00", b"\x01\x00\x01"])
def test_length_needs_four_bytes(prefix: bytes) -> None:
    assert client_hello_length(prefix) is None


def test_length_counts_the_header() -> None:
    assert client_hello_length(b"\x01\x00\x01\x00") == 260
    hello = ssl_client_hello()
    assert client_hello_length(hello[:4]) == len(hello)


def test_length_refuses_other_handshake_types_at_once() -> None:
    with pytest.raises(ClientHelloError, match="not client_hello"):
        client_hello_length(b"\x02")


def test_length_cap() -> None:
    at_cap = MAX_TLS_CLIENT_HELLO_BYTES - 4
    assert client_hello_length(b"\x01" + at_cap.to_bytes(3, "big")) == MAX_TLS_CLIENT_HELLO_BYTES
    with pytest.raises(ClientHelloError, match="exceeds"):
        client_hello_length(b"\x01" + (at_cap + 1).to_bytes(3, "big"))


# --- crafted hellos ----------------------------------------------------------


def test_hello_without_extensions() -> None:
    assert parse_client_hello(build_hello(None)) == ClientHelloInfo(None, ())


def test_other_name_types_are_ignored() -> None:
    hello = build_hello([sni_ext((7, b"ignored"), (0, b"a.stargate.external"))])
    assert parse_client_hello(hello).server_name == "a.stargate.external"


def test_non_ascii_and_nul_names_are_kept_replaced_not_raised() -> None:
    info = parse_client_hello(build_hello([sni_ext((0, b"st\xc3\xa4r\x00.x"))]))
    assert info.server_name == "st\ufffd\ufffdr\x00.x"


@pytest.mark.parametrize(
    ("hello", "reason"),
    [
        (build_hello([sni_ext((0, b"a")), sni_ext((0, b"b"))]), "duplicate extension 0"),
        (build_hello([alpn_ext(b"h2"), alpn_ext(b"h2")]), "duplicate extension 16"),
        (build_hello([sni_ext((0, b"a"), (0, b"b"))]), "more than one host_name"),
        (build_hello([], after_extensions=b"\x00"), "trailing"),
        (build_hello([(0, u16(3) + b"\x00\x00\x01a")]), "trailing"),
        (build_hello([(0, u16(5) + b"\x00\x00\x09a")]), "truncated"),
        (build_hello([(0, b"")]), "truncated"),
        (build_hello([alpn_ext()]), "empty ALPN protocol list"),
        (build_hello([alpn_ext(b"h2", b"")]), "empty ALPN protocol name"),
        (build_hello([], session_id=bytes(33)), "longer than 32"),
        (build_hello([], suites=b""), "cipher_suites"),
        (build_hello([], suites=b"\x13\x01\x13"), "cipher_suites"),
        (build_hello([], compression=b""), "compression"),
        (b"\x02" + build_hello([])[1:], "not client_hello"),
        (b"\x01\x00", "truncated handshake header"),
    ],
)
def test_malformed_hellos(hello: bytes, reason: str) -> None:
    with pytest.raises(ClientHelloError, match=reason):
        parse_client_hello(hello)


def test_extension_length_overrunning_the_block() -> None:
    hello = bytearray(build_hello([sni_ext((0, b"a.b"))]))
    hello[-len(b"a.b") - 7] = 0xFF  # extension body length high byte
    with pytest.raises(ClientHelloError):
        parse_client_hello(bytes(hello))


# --- fuzz ----------------------------------------------------------------------

REAL_HELLO = ssl_client_hello(alpn=("h2", "grpc-exp"))


def _parse_or_own_error(data: bytes) -> None:
    try:
        info = parse_client_hello(data)
    except ClientHelloError:
        return
    assert info.server_name is None or isinstance(info.server_name, str)
    assert all(isinstance(p, str) for p in info.alpn)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    _parse_or_own_error(data)
    with contextlib.suppress(ClientHelloError):
        client_hello_length(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_fuzz_body_behind_a_valid_header(body: bytes) -> None:
    _parse_or_own_error(b"\x01" + len(body).to_bytes(3, "big") + body)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(REAL_HELLO) - 1), st.integers(0, 255)), min_size=1, max_size=4))
def test_fuzz_mutated_real_hello(mutations: list[tuple[int, int]]) -> None:
    hello = bytearray(REAL_HELLO)
    for pos, value in mutations:
        hello[pos] = value
    _parse_or_own_error(bytes(hello))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([0, 16, 43, 51, 0xFFFF]), st.binary(max_size=40)), max_size=5),
    st.binary(max_size=40),
)
def test_fuzz_structured_extensions(extensions: list[tuple[int, bytes]], session_id: bytes) -> None:
    _parse_or_own_error(build_hello(extensions, session_id=session_id))


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from([
        REAL_HELLO,
        aioquic_client_hello(),
        build_hello([sni_ext((0, b"pod-0.stargate.external")), alpn_ext(b"a", b"bc")]),
    ]),
    st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=3),
    st.integers(0, 20),
)
def test_the_c_walk_answers_as_the_python_walk_or_declines(hello: bytes, mutations: list[tuple[int, int]],
                                                           cut: int) -> None:
    data = bytearray(hello)
    for pos, value in mutations:
        data[pos % len(data)] = value
    handshake = bytes(data[: len(data) - cut])
    extension = quic_native.active()
    if extension is None:
        return
    found = extension.client_hello_facts(handshake, MAX_TLS_CLIENT_HELLO_BYTES)
    try:
        reference: object = walk_client_hello(handshake)
    except ClientHelloError:
        reference = None
    if found is not None:
        assert reference == ClientHelloInfo(*found)
    if not mutations and not cut:
        assert found is not None  # a real hello is read in C, not declined
