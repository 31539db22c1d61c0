"""PROXY protocol v1 (text) and v2 (binary) header reader: who the client really is.

Sans-IO. A balancer opens each TCP connection with one header naming the client; the client's own bytes
follow (``ProxyHeaderReader.remainder``, where the peek starts). Bounded: a v1 line is at most 107 bytes, a
v2 header 16 bytes plus ``max_v2_block_bytes``, far below the 65,535 its length field allows; TLVs are skipped
unread. Bad input raises ``ProxyHeaderError`` only (docs/security.md).
Spec: https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import IntEnum

V1_PREFIX = b"PROXY "
"""Every v1 header starts with these 6 bytes."""

V1_MAX_BYTES = 107
"""Longest v1 line, CRLF included (spec section 2.1: worst case TCP6 with two full addresses)."""

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
"""The 12-byte v2 signature; it cannot start a TLS record, an HTTP request or a v1 line."""

V2_FIXED_BYTES = 16
"""Signature (12) + version/command (1) + family/transport (1) + block length (2)."""

V2_VERSION = 2
"""High nibble of byte 13: the only binary version defined."""

DEFAULT_MAX_V2_BLOCK_BYTES = 1024
"""Address + TLV block cap: AF_UNIX's 216 bytes plus the TLVs balancers send; a larger claim is refused unbuffered."""

PORT_MAX = 65_535
"""Largest TCP port a v1 header may name."""


class ProxyCommand(IntEnum):
    """Low nibble of v2 byte 13."""

    LOCAL = 0
    """The balancer's own connection (health check): no client, use the socket's peer."""
    PROXY = 1
    """A relayed connection: the block names the client."""


class AddressFamily(IntEnum):
    """High nibble of v2 byte 14."""

    UNSPEC = 0
    INET = 1
    INET6 = 2
    UNIX = 3


class TransportProtocol(IntEnum):
    """Low nibble of v2 byte 14."""

    UNSPEC = 0
    STREAM = 1
    DGRAM = 2


V2_ADDRESS_BYTES = {AddressFamily.UNSPEC: 0, AddressFamily.INET: 12, AddressFamily.INET6: 36, AddressFamily.UNIX: 216}
"""Size of the address part of the block per family (spec section 2.2); TLVs follow it."""


class ProxyHeaderError(ValueError):
    """The stream does not start with a well-formed PROXY header (missing, malformed, too long)."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """The facts of one PROXY header."""

    version: int
    """1 (text) or 2 (binary)."""
    source: tuple[str, int] | None
    """The client (address, port); None for LOCAL / UNKNOWN / AF_UNSPEC / AF_UNIX: use the socket peer."""
    destination: tuple[str, int] | None
    """The address the client connected to, as the balancer saw it (None when source is None)."""
    length: int
    """Bytes of the stream the header took."""


def client_address(header: ProxyHeader, socket_peer: tuple[str, int]) -> tuple[str, int]:
    """The client a connection stands for: the header's source, else the socket's peer."""
    return header.source if header.source is not None else socket_peer


class ProxyHeaderReader:
    """Feed the stream's first bytes; get the ``ProxyHeader`` once it is complete."""

    def __init__(self, max_v2_block_bytes: int = DEFAULT_MAX_V2_BLOCK_BYTES) -> None:
        if not 0 <= max_v2_block_bytes <= 0xFFFF:
            raise ValueError(f"max_v2_block_bytes must be 0..65535, got {max_v2_block_bytes}")
        self._max_block = max_v2_block_bytes
        self._buffer = bytearray()
        self.header: ProxyHeader | None = None
        """Set once the header is complete."""
        self.remainder = b""
        """The bytes fed after the header: the client's first bytes."""

    def feed(self, data: bytes) -> ProxyHeader | None:
        """Add bytes; the header once complete (later calls only add to ``remainder``)."""
        if self.header is not None:
            self.remainder += data
            return self.header
        buf = self._buffer
        buf += data
        if not buf:
            return None
        if buf[0] == V1_PREFIX[0]:
            header = self._feed_v1(buf)
        elif buf[0] == V2_SIGNATURE[0]:
            header = self._feed_v2(buf)
        else:
            raise ProxyHeaderError("no PROXY header: the stream starts with something else")
        if header is not None:
            self.header = header
            self.remainder = bytes(buf[header.length :])
            self._buffer = bytearray()
        return header

    # -- v1 --------------------------------------------------------------------------------
    def _feed_v1(self, buf: bytearray) -> ProxyHeader | None:
        head = bytes(buf[: len(V1_PREFIX)])
        if head != V1_PREFIX[: len(head)]:
            raise ProxyHeaderError("no PROXY header: bad v1 prefix")
        end = buf.find(b"\r\n", 0, V1_MAX_BYTES)
        if end < 0:
            if len(buf) >= V1_MAX_BYTES:
                raise ProxyHeaderError(f"v1 header longer than {V1_MAX_BYTES} bytes")
            if b"\n" in buf:
                raise ProxyHeaderError("v1 header line not ended by CRLF")
            return None
        return _parse_v1_line(bytes(buf[:end]), end + 2)

    # -- v2 --------------------------------------------------------------------------------
    def _feed_v2(self, buf: bytearray) -> ProxyHeader | None:
        signature = bytes(buf[: len(V2_SIGNATURE)])
        if signature != V2_SIGNATURE[: len(signature)]:
            raise ProxyHeaderError("no PROXY header: bad v2 signature")
        if len(buf) < V2_FIXED_BYTES:
            return None
        version, command = buf[12] >> 4, buf[12] & 0x0F
        if version != V2_VERSION:
            raise ProxyHeaderError(f"v2 header with version {version}")
        if command not in (ProxyCommand.LOCAL, ProxyCommand.PROXY):
            raise ProxyHeaderError(f"v2 header with unknown command {command}")
        family, transport = buf[13] >> 4, buf[13] & 0x0F
        if family not in V2_ADDRESS_BYTES or transport > TransportProtocol.DGRAM:
            raise ProxyHeaderError(f"v2 header with unknown family/transport 0x{buf[13]:02x}")
        block_len = int.from_bytes(buf[14:16], "big")
        if block_len > self._max_block:
            raise ProxyHeaderError(f"v2 address/TLV block of {block_len} bytes exceeds {self._max_block}")
        total = V2_FIXED_BYTES + block_len
        if len(buf) < total:
            return None
        if command == ProxyCommand.LOCAL:
            return ProxyHeader(2, None, None, total)
        address_bytes = V2_ADDRESS_BYTES[AddressFamily(family)]
        if block_len < address_bytes:
            raise ProxyHeaderError(f"v2 block of {block_len} bytes too short for family {family}")
        if family in (AddressFamily.UNSPEC, AddressFamily.UNIX):
            return ProxyHeader(2, None, None, total)
        if transport != TransportProtocol.STREAM:
            raise ProxyHeaderError(f"v2 header for transport {transport} on a TCP listener")
        block = bytes(buf[V2_FIXED_BYTES:total])
        size = 4 if family == AddressFamily.INET else 16
        src_ip = str(ipaddress.ip_address(block[:size]))
        dst_ip = str(ipaddress.ip_address(block[size : 2 * size]))
        src_port = int.from_bytes(block[2 * size : 2 * size + 2], "big")
        dst_port = int.from_bytes(block[2 * size + 2 : 2 * size + 4], "big")
        return ProxyHeader(2, (src_ip, src_port), (dst_ip, dst_port), total)


def _parse_v1_line(line: bytes, length: int) -> ProxyHeader:
    """``PROXY TCP4|TCP6 src dst sport dport`` or ``PROXY UNKNOWN[ anything]`` (no CRLF)."""
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        raise ProxyHeaderError("v1 header is not ASCII") from None
    if not text.isprintable():
        raise ProxyHeaderError("v1 header has control characters")
    parts = text.split(" ")
    if len(parts) >= 2 and parts[1] == "UNKNOWN":
        return ProxyHeader(1, None, None, length)  # the rest of the line is to be ignored
    if len(parts) != 6 or parts[1] not in ("TCP4", "TCP6"):
        raise ProxyHeaderError("v1 header is not 'PROXY TCP4|TCP6 src dst sport dport'")
    version = 4 if parts[1] == "TCP4" else 6
    src, dst = _v1_address(parts[2], version, "source"), _v1_address(parts[3], version, "destination")
    return ProxyHeader(1, (src, _v1_port(parts[4], "source")), (dst, _v1_port(parts[5], "destination")), length)


def _v1_address(text: str, version: int, which: str) -> str:
    """Messages name the field, never echo it: the bytes are untrusted and end up in logs."""
    try:
        address = ipaddress.IPv4Address(text) if version == 4 else ipaddress.IPv6Address(text)
    except ValueError:
        raise ProxyHeaderError(f"v1 header: {which} address is not IPv{version}") from None
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
        raise ProxyHeaderError(f"v1 header: {which} address has a scope")
    return str(address)


def _v1_port(text: str, which: str) -> int:
    if not text.isdigit() or len(text) > 5 or (len(text) > 1 and text[0] == "0") or int(text) > PORT_MAX:
        raise ProxyHeaderError(f"v1 header: {which} port is not 0-65535 without leading zeros")
    return int(text)
