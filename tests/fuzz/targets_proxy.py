"""Fuzz target ``proxy_protocol``: ``ProxyHeaderReader.feed``, whole and chunked must agree.

Allowed error: ``ProxyHeaderError``. Invariants besides "no other error": a header never takes
more than its bound (107 bytes for v1, 16 + the block cap for v2), header + remainder is exactly
the input, a named client has a port in 0..65535 and a parsable address.
"""

from __future__ import annotations

import ipaddress

from tests.fuzz.target import FuzzTarget, check, pieces
from tests.support import proxy_headers as ph
from wire.proxy_protocol import (
    DEFAULT_MAX_V2_BLOCK_BYTES,
    V1_MAX_BYTES,
    V2_FIXED_BYTES,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
)

ALLOWED: tuple[type[BaseException], ...] = (ProxyHeaderError,)
MAX_LEN = 4096
"""Longer than any header the reader accepts (16 + 1024), so over-long claims are reached."""

CLIENT_FIRST_BYTES = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"\x16\x03\x01\x00\xc8\x01\x00\x00\xc4\x03\x03", b"")
DICTIONARY: tuple[bytes, ...] = (
    b"PROXY ", b"TCP4 ", b"TCP6 ", b"UNKNOWN", b"\r\n", b"\r", b"\n", b" ", V2_SIGNATURE,
    b"\x20", b"\x21", b"\x11", b"\x12", b"\x21\x11", b"\x21\x21", b"\x31", b"\x00\x0c", b"\x00\x24", b"\x00\xd8",
    b"\x04\x00", b"\xff\xff", b"65535", b"65536", b"0", b"00", b"255.255.255.255", b"::ffff:", b"::", b"%eth0",
)


def _feed(chunks: list[bytes]) -> tuple[ProxyHeader | None, bytes] | ProxyHeaderError:
    try:
        return ph.feed(chunks)
    except ProxyHeaderError as exc:
        return exc


def run(data: bytes) -> str:
    whole, chunked = _feed([data]), _feed(pieces(data))
    check(isinstance(whole, ProxyHeaderError) == isinstance(chunked, ProxyHeaderError),
          f"whole feed {whole!r} but chunked feed {chunked!r}")
    if isinstance(whole, ProxyHeaderError):
        raise whole
    check(whole == chunked, "chunked feed read another header")
    header, remainder = whole
    if header is None:
        return "incomplete"
    bound = V1_MAX_BYTES if header.version == 1 else V2_FIXED_BYTES + DEFAULT_MAX_V2_BLOCK_BYTES
    check(0 < header.length <= bound, f"v{header.version} header of {header.length} bytes")
    check(data[header.length :] == remainder, "remainder is not what follows the header")
    for end in (header.source, header.destination):
        if end is not None:
            check(0 <= end[1] <= 65535, "port out of range")
            ipaddress.ip_address(end[0])  # a ValueError here is a crash
    check((header.source is None) == (header.destination is None), "half an address")
    return f"v{header.version}-{'client' if header.source else 'socket'}"


def seeds() -> list[bytes]:
    heads = [
        ph.v1(("203.0.113.7", 51234), ("10.0.0.1", 50071)),
        ph.v1(("2001:db8::1", 65535), ("::1", 0)),
        ph.v1_unknown(),
        ph.v1_unknown(" ffff:f...f:ffff ffff:f...f:ffff 65535 65535"),
        ph.v2(("198.51.100.4", 40000)),
        ph.v2(("2001:db8::42", 443), ("2001:db8::1", 50071)),
        ph.v2(None, local=True),
        ph.v2(None),
        ph.v2(None, family_byte=0x31, tlvs=[b"/run/sock".ljust(216, b"\0")]),
        ph.v2(("192.0.2.1", 1), tlvs=[ph.tlv(0x01, b"h2"), ph.tlv(0x05, b"u" * 64), ph.tlv(0xEA, b"\x01vpce-1")]),
    ]
    return [head + tail for head in heads for tail in CLIENT_FIRST_BYTES]

PROXY_TARGETS = (FuzzTarget("proxy_protocol", run, ALLOWED, seeds, MAX_LEN, DICTIONARY),)
