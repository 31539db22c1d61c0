"""Byte builders for PROXY protocol v1/v2 headers, as HAProxy and cloud balancers write them,
and one way to feed them to the reader (whole or in pieces) shared by unit and fuzz tests."""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable, Sequence

from wire.proxy_protocol import V2_SIGNATURE, ProxyHeader, ProxyHeaderReader


def v1(source: tuple[str, int], destination: tuple[str, int]) -> bytes:
    """``PROXY TCP4|TCP6 src dst sport dport\\r\\n``."""
    family = "TCP6" if ":" in source[0] else "TCP4"
    return f"PROXY {family} {source[0]} {destination[0]} {source[1]} {destination[1]}\r\n".encode()


def v1_unknown(rest: str = "") -> bytes:
    return f"PROXY UNKNOWN{rest}\r\n".encode()


def tlv(kind: int, value: bytes) -> bytes:
    return struct.pack("!BH", kind, len(value)) + value


def v2(
    source: tuple[str, int] | None,
    destination: tuple[str, int] | None = None,
    *,
    local: bool = False,
    tlvs: Sequence[bytes] = (),
    family_byte: int | None = None,
    version_byte: int | None = None,
) -> bytes:
    """A v2 header: PROXY over TCP4/TCP6 for ``source``; LOCAL/AF_UNSPEC when ``source`` is None."""
    if source is None:
        fam, block = 0x00, b""
    else:
        dst = destination or (("::1" if ":" in source[0] else "127.0.0.1"), 50071)
        src_ip, dst_ip = ipaddress.ip_address(source[0]), ipaddress.ip_address(dst[0])
        fam = 0x21 if src_ip.version == 6 else 0x11
        block = src_ip.packed + dst_ip.packed + struct.pack("!HH", source[1], dst[1])
    block += b"".join(tlvs)
    ver_cmd = 0x20 if local else 0x21
    if version_byte is not None:
        ver_cmd = version_byte
    if family_byte is not None:
        fam = family_byte
    return V2_SIGNATURE + bytes([ver_cmd, fam]) + struct.pack("!H", len(block)) + block


def feed(chunks: Iterable[bytes], **limits: int) -> tuple[ProxyHeader | None, bytes]:
    """Feed ``chunks`` to one fresh reader: what its last ``feed`` returned, and its remainder."""
    reader = ProxyHeaderReader(**limits)
    header = None
    for chunk in chunks:
        header = reader.feed(chunk)
    return header, reader.remainder
