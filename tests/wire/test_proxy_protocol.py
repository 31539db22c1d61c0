"""PROXY protocol v1/v2 reader: the client named by the header, bounded, one error type."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import proxy_headers as ph
from wire.h2_frames import H2_PREFACE
from wire.proxy_protocol import (
    DEFAULT_MAX_V2_BLOCK_BYTES,
    V1_MAX_BYTES,
    V2_FIXED_BYTES,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    ProxyHeaderReader,
    client_address,
)

CLIENT_HELLO_START = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"


def read(data: bytes, **kwargs: int) -> tuple[ProxyHeader | None, bytes]:
    return ph.feed([data], **kwargs)


def read_bytewise(data: bytes) -> tuple[ProxyHeader | None, bytes]:
    return ph.feed(data[i : i + 1] for i in range(len(data)))


def test_v1_tcp4_names_the_client_and_leaves_its_first_bytes() -> None:
    data = ph.v1(("203.0.113.7", 51234), ("10.0.0.1", 50071)) + H2_PREFACE
    header, rest = read(data)
    assert header == ProxyHeader(1, ("203.0.113.7", 51234), ("10.0.0.1", 50071), len(data) - len(H2_PREFACE))
    assert rest == H2_PREFACE


def test_v1_tcp6_address_is_normalised() -> None:
    header, _ = read(b"PROXY TCP6 2001:DB8:0:0::1 ::1 65535 0\r\n")
    assert header is not None and header.source == ("2001:db8::1", 65535)


def test_v1_unknown_uses_the_socket_peer() -> None:
    header, rest = read(ph.v1_unknown(" ffff::1 ::1 1 2") + b"x")
    assert header is not None and header.source is None and rest == b"x"
    assert client_address(header, ("10.1.1.1", 9)) == ("10.1.1.1", 9)


def test_v1_longest_legal_line_is_accepted() -> None:
    full = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    line = f"PROXY TCP6 {full} {full} 65535 65535\r\n".encode()
    assert len(line) == 104  # the spec's worst case is 104 + room; the cap is 107
    header, _ = read(line)
    assert header is not None and header.source == (full, 65535)


def test_v2_tcp4_and_tcp6_name_the_client() -> None:
    for src in (("198.51.100.4", 40000), ("2001:db8::42", 443)):
        data = ph.v2(src) + CLIENT_HELLO_START
        header, rest = read(data)
        assert header is not None and header.version == 2 and header.source == src
        assert rest == CLIENT_HELLO_START


def test_v2_tlvs_are_skipped() -> None:
    tlvs = [ph.tlv(0x01, b"h2"), ph.tlv(0x05, b"u" * 128), ph.tlv(0xEA, b"\x01vpce-0123")]
    header, rest = read(ph.v2(("192.0.2.1", 1), tlvs=tlvs) + b"tail")
    assert header is not None and header.source == ("192.0.2.1", 1) and rest == b"tail"


@pytest.mark.parametrize(
    "data",
    [ph.v2(None, local=True), ph.v2(None), ph.v2(("192.0.2.1", 1), local=True),
     ph.v2(None, family_byte=0x31, tlvs=[b"\0" * 216])],
    ids=["local", "af_unspec", "local-with-address", "af_unix"],
)
def test_v2_local_unspec_and_unix_use_the_socket_peer(data: bytes) -> None:
    header, _ = read(data)
    assert header is not None and header.source is None
    assert client_address(header, ("10.0.0.9", 5)) == ("10.0.0.9", 5)


@pytest.mark.parametrize("data", [ph.v1(("203.0.113.7", 1), ("10.0.0.1", 2)) + b"rest", ph.v2(("::1", 7)) + b"rest"])
def test_a_slow_header_fed_byte_by_byte_gives_the_same_result(data: bytes) -> None:
    assert read_bytewise(data) == read(data)


@pytest.mark.parametrize(
    "data",
    [
        CLIENT_HELLO_START,
        H2_PREFACE,
        b"GET / HTTP/1.1\r\n",
        b"PROXY TCP5 1.2.3.4 1.2.3.4 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.4 1 2 3\r\n",
        b"PROXY TCP4 1.2.3.4  1.2.3.4 1 2\r\n",
        b"PROXY TCP4 01.2.3.4 1.2.3.4 1 2\r\n",
        b"PROXY TCP4 ::1 1.2.3.4 1 2\r\n",
        b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n",
        b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.4 65536 2\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.4 080 2\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.4 -1 2\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.4 1 2\n",
        b"PROXY TCP4 1.2.3.4\t1.2.3.4 1 2\r\n",
        b"PROXY TCP4 \xff.2.3.4 1.2.3.4 1 2\r\n",
        b"PROXY " + b"A" * 101 + b"\r\n",
        ph.v2(("1.2.3.4", 1), version_byte=0x11),
        ph.v2(("1.2.3.4", 1), version_byte=0x22),
        ph.v2(("1.2.3.4", 1), family_byte=0x41),
        ph.v2(("1.2.3.4", 1), family_byte=0x13),
        ph.v2(("1.2.3.4", 1), family_byte=0x12),
        ph.v2(("1.2.3.4", 1), family_byte=0x21),
        V2_SIGNATURE[:11] + b"X",
    ],
)
def test_malformed_or_missing_headers_raise_only_their_error(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        read(data)


def test_a_direct_client_is_refused_on_its_first_byte() -> None:
    reader = ProxyHeaderReader()
    with pytest.raises(ProxyHeaderError, match="no PROXY header"):
        reader.feed(b"\x16")


def test_v1_without_crlf_is_refused_at_107_bytes_not_later() -> None:
    reader = ProxyHeaderReader()
    assert reader.feed(b"PROXY UNKNOWN " + b"x" * (V1_MAX_BYTES - 15)) is None
    with pytest.raises(ProxyHeaderError, match="longer than 107"):
        reader.feed(b"x")


def test_v2_block_over_the_cap_is_refused_before_it_is_buffered() -> None:
    claim = V2_SIGNATURE + b"\x21\x11" + struct.pack("!H", DEFAULT_MAX_V2_BLOCK_BYTES + 1)
    assert len(claim) == V2_FIXED_BYTES
    with pytest.raises(ProxyHeaderError, match="exceeds"):
        ProxyHeaderReader().feed(claim)
    header, _ = read(ph.v2(("1.2.3.4", 1), tlvs=[ph.tlv(0xE0, b"x" * 100)]), max_v2_block_bytes=12 + 3 + 100)
    assert header is not None


def test_v2_block_shorter_than_its_address_is_refused() -> None:
    data = V2_SIGNATURE + b"\x21\x21" + struct.pack("!H", 12) + b"\0" * 12
    with pytest.raises(ProxyHeaderError, match="too short"):
        read(data)


def test_truncated_headers_wait_for_more() -> None:
    for data in (ph.v1(("1.2.3.4", 1), ("5.6.7.8", 2)), ph.v2(("1.2.3.4", 1))):
        for cut in range(len(data)):
            assert read(data[:cut])[0] is None


def test_the_cap_must_fit_the_length_field() -> None:
    with pytest.raises(ValueError):
        ProxyHeaderReader(max_v2_block_bytes=70_000)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(1, 40), max_size=20))
def test_any_bytes_any_split_raise_only_proxy_header_error(data: bytes, cuts: list[int]) -> None:
    whole: object
    try:
        whole = read(data)
    except ProxyHeaderError:
        whole = ProxyHeaderError
    steps = [*cuts, len(data)]
    starts = itertools.accumulate([0, *steps])
    try:
        split: object = ph.feed([data[start : start + step] for start, step in zip(starts, steps, strict=False)])
    except ProxyHeaderError:
        split = ProxyHeaderError
    assert split == whole


ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
ports = st.integers(0, 65535)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.tuples(ipv4, ipv4), st.tuples(ipv6, ipv6)), ports, ports, st.binary(max_size=50),
       st.booleans())
def test_every_valid_header_round_trips(
    ips: tuple[str, str], sport: int, dport: int, tail: bytes, binary: bool
) -> None:
    src, dst = (ips[0], sport), (ips[1], dport)
    head = ph.v2(src, dst) if binary else ph.v1(src, dst)
    header, rest = read(head + tail)
    assert header == ProxyHeader(2 if binary else 1, src, dst, len(head))
    assert rest == tail
