"""ClientHello walker: real hellos from OpenSSL (ssl) and aioquic, crafted bad ones, fuzz."""

from __future__ import annotations

import contextlib
import ssl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quic.native import client_hello_parser
from tests.fuzz.seed_flights import quic_hellos
from tests.support.quic_readings import Native, both_readings
from tests.support.tls import (
    HOST,
    MAX_IDLE_TIMEOUT_PARAMETER,
    aioquic_client_hello,
    alpn_ext,
    build_hello,
    sni_ext,
    ssl_client_hello,
    transport_parameters_ext,
    u16,
    varint,
)
from wire.client_hello import (
    MAX_TLS_CLIENT_HELLO_BYTES,
    ClientHelloError,
    ClientHelloInfo,
    client_hello_length,
    parse_client_hello,
)

# --- real hellos -------------------------------------------------------------


@both_readings
def test_openssl_hello_with_sni_and_alpn(native: Native) -> None:
    info = client_hello_parser(native)(ssl_client_hello(alpn=("h2", "grpc-exp")))
    assert info == ClientHelloInfo(server_name=HOST, alpn=("h2", "grpc-exp"))


@both_readings
def test_openssl_hello_without_sni_or_alpn(native: Native) -> None:
    assert client_hello_parser(native)(ssl_client_hello(server_hostname=None, alpn=())) == ClientHelloInfo(None, ())


@both_readings
def test_openssl_tls12_only_hello(native: Native) -> None:
    hello = ssl_client_hello(maximum_version=ssl.TLSVersion.TLSv1_2)
    assert client_hello_parser(native)(hello).server_name == HOST


@both_readings
def test_aioquic_hello(native: Native) -> None:
    info = client_hello_parser(native)(aioquic_client_hello())
    assert info == ClientHelloInfo(server_name=HOST, alpn=("stargate",))


@both_readings
def test_every_truncation_of_a_real_hello_is_refused(native: Native) -> None:
    hello = ssl_client_hello()
    for n in range(len(hello)):
        with pytest.raises(ClientHelloError):
            client_hello_parser(native)(hello[:n])


@both_readings
def test_length_header_must_match_the_bytes_given(native: Native) -> None:
    with pytest.raises(ClientHelloError):
        client_hello_parser(native)(ssl_client_hello() + b"\x00")


# --- client_hello_length -----------------------------------------------------


@both_readings
@pytest.mark.parametrize("prefix", [b"", b"\x01", b"\x01\x00", b"\x01\x00\x01"])
def test_length_needs_four_bytes(native: Native, prefix: bytes) -> None:
    assert client_hello_length(prefix) is None


@both_readings
def test_length_counts_the_header(native: Native) -> None:
    assert client_hello_length(b"\x01\x00\x01\x00") == 260
    hello = ssl_client_hello()
    assert client_hello_length(hello[:4]) == len(hello)


@both_readings
def test_length_refuses_other_handshake_types_at_once(native: Native) -> None:
    with pytest.raises(ClientHelloError, match="not client_hello"):
        client_hello_length(b"\x02")


@both_readings
def test_length_cap(native: Native) -> None:
    at_cap = MAX_TLS_CLIENT_HELLO_BYTES - 4
    assert client_hello_length(b"\x01" + at_cap.to_bytes(3, "big")) == MAX_TLS_CLIENT_HELLO_BYTES
    with pytest.raises(ClientHelloError, match="exceeds"):
        client_hello_length(b"\x01" + (at_cap + 1).to_bytes(3, "big"))


# --- crafted hellos ----------------------------------------------------------


@both_readings
def test_hello_without_extensions(native: Native) -> None:
    assert client_hello_parser(native)(build_hello(None)) == ClientHelloInfo(None, ())


@both_readings
def test_other_name_types_are_ignored(native: Native) -> None:
    hello = build_hello([sni_ext((7, b"ignored"), (0, b"a.stargate.external"))])
    assert client_hello_parser(native)(hello).server_name == "a.stargate.external"


@both_readings
def test_non_ascii_and_nul_names_are_kept_replaced_not_raised(native: Native) -> None:
    info = client_hello_parser(native)(build_hello([sni_ext((0, b"st\xc3\xa4r\x00.x"))]))
    assert info.server_name == "st\ufffd\ufffdr\x00.x"


@both_readings
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
def test_malformed_hellos(native: Native, hello: bytes, reason: str) -> None:
    with pytest.raises(ClientHelloError, match=reason):
        client_hello_parser(native)(hello)


IDLE = MAX_IDLE_TIMEOUT_PARAMETER


@both_readings
def test_a_quic_clients_hello_says_its_max_idle_timeout(native: Native) -> None:
    """aioquic's first flight (its default 60 s idle timeout) and hand-built transport parameters."""
    assert [client_hello_parser(native)(h).max_idle_timeout_ms for h in quic_hellos()] == [60_000, 60_000]
    assert client_hello_parser(native)(ssl_client_hello()).max_idle_timeout_ms == 0  # TLS over TCP: none


@both_readings
@pytest.mark.parametrize(
    ("parameters", "idle_ms"),
    [
        ([], 0),
        ([(IDLE, varint(0))], 0),
        ([(IDLE, varint(2_000))], 2_000),
        ([(0x04, varint(1 << 20)), (IDLE, varint(30_000, 4)), (0x0F, b"")], 30_000),
        ([(IDLE, varint((1 << 62) - 1))], (1 << 62) - 1),
        ([(0x2A, b"\xff" * 9)], 0),  # other parameters are skipped, whatever their value
    ],
    ids=["empty", "zero", "two_seconds", "among_others", "largest", "others_only"],
)
def test_transport_parameters_give_the_idle_timeout(
    native: Native, parameters: list[tuple[int, bytes]], idle_ms: int
) -> None:
    info = client_hello_parser(native)(build_hello([sni_ext((0, b"a.b")), transport_parameters_ext(*parameters)]))
    assert (info.server_name, info.max_idle_timeout_ms) == ("a.b", idle_ms)


@both_readings
def test_a_non_minimal_parameter_id_is_still_max_idle_timeout(native: Native) -> None:
    body = varint(IDLE, 2) + varint(2) + varint(1_500, 2)
    assert client_hello_parser(native)(build_hello([(57, body)])).max_idle_timeout_ms == 1_500


@both_readings
@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (varint(IDLE) + varint(2) + varint(1) + varint(1), "trailing"),
        (varint(IDLE) + varint(1) + varint(100, 2)[:1], "truncated"),
        (varint(IDLE) + varint(0), "truncated max_idle_timeout"),
        (varint(IDLE) + varint(1) + varint(5) + varint(IDLE) + varint(1) + varint(6), "duplicate max_idle_timeout"),
        (varint(0x04) + varint(9) + b"\x00", "truncated transport parameter value"),
        (varint(0x04, 2)[:1], "truncated transport parameter id"),
        (varint(0x04), "truncated transport parameter length"),
    ],
    ids=["value_longer_than_varint", "value_cut", "empty_value", "duplicate", "length_overrun", "id_cut",
         "no_length"],
)
def test_malformed_transport_parameters_are_refused(native: Native, body: bytes, reason: str) -> None:
    with pytest.raises(ClientHelloError, match=reason):
        client_hello_parser(native)(build_hello([(57, body)]))


@both_readings
def test_extension_length_overrunning_the_block(native: Native) -> None:
    hello = bytearray(build_hello([sni_ext((0, b"a.b"))]))
    hello[-len(b"a.b") - 7] = 0xFF  # extension body length high byte
    with pytest.raises(ClientHelloError):
        client_hello_parser(native)(bytes(hello))


# --- fuzz ----------------------------------------------------------------------

REAL_HELLO = ssl_client_hello(alpn=("h2", "grpc-exp"))


def _parse_or_own_error(data: bytes, native: Native) -> None:
    try:
        info = client_hello_parser(native)(data)
    except ClientHelloError:
        return
    assert info.server_name is None or isinstance(info.server_name, str)
    assert all(isinstance(p, str) for p in info.alpn)


@both_readings
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_fuzz_arbitrary_bytes(native: Native, data: bytes) -> None:
    _parse_or_own_error(data, native)
    with contextlib.suppress(ClientHelloError):
        client_hello_length(data)


@both_readings
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_fuzz_body_behind_a_valid_header(native: Native, body: bytes) -> None:
    _parse_or_own_error(b"\x01" + len(body).to_bytes(3, "big") + body, native)


@both_readings
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(REAL_HELLO) - 1), st.integers(0, 255)), min_size=1, max_size=4))
def test_fuzz_mutated_real_hello(native: Native, mutations: list[tuple[int, int]]) -> None:
    hello = bytearray(REAL_HELLO)
    for pos, value in mutations:
        hello[pos] = value
    _parse_or_own_error(bytes(hello), native)


@both_readings
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([0, 16, 43, 51, 57, 0xFFFF]), st.binary(max_size=40)), max_size=5),
    st.binary(max_size=40),
)
def test_fuzz_structured_extensions(native: Native, extensions: list[tuple[int, bytes]], session_id: bytes) -> None:
    _parse_or_own_error(build_hello(extensions, session_id=session_id), native)


@both_readings
@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from([
        REAL_HELLO,
        aioquic_client_hello(),
        build_hello([sni_ext((0, b"pod-0.stargate.external")), alpn_ext(b"a", b"bc")]),
        *quic_hellos(),
        build_hello([transport_parameters_ext((0x04, varint(9)), (IDLE, varint(2_000, 4)), (0x0F, b"ab"))]),
    ]),
    st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=3),
    st.integers(0, 20),
)
def test_the_c_walk_answers_as_the_python_walk_or_declines(
    native: Native, hello: bytes, mutations: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(hello)
    for pos, value in mutations:
        data[pos % len(data)] = value
    handshake = bytes(data[: len(data) - cut])
    if native is None:
        pytest.skip("compares the C walk with the Python reference")
    found = native.client_hello_facts(handshake, MAX_TLS_CLIENT_HELLO_BYTES)
    try:
        reference: object = parse_client_hello(handshake)
    except ClientHelloError:
        reference = None
    if found is not None:
        assert reference == ClientHelloInfo(*found)
    if not mutations and not cut:
        assert found is not None  # a real hello is read in C, not declined
