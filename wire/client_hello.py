"""Bounded TLS ClientHello walker, shared by TLS-over-TCP and QUIC Initial peeking. Sans-IO.

The router needs only the SNI host_name, ALPN (for logs) and a QUIC client's ``max_idle_timeout``, but it
walks every field so that a malformed hello is refused rather than half-trusted. Untrusted input can only
raise :class:`ClientHelloError`; every read is bounds-checked.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

HANDSHAKE_HEADER_BYTES = 4
"""msg_type(1) + uint24 length (RFC 8446 section 4)."""

MAX_TLS_CLIENT_HELLO_BYTES = 16 * 1024
"""Handshake message length cap; larger claims are rejected before buffering them."""

RANDOM_BYTES = 32
MAX_SESSION_ID_BYTES = 32


class HandshakeType(IntEnum):
    CLIENT_HELLO = 1


class ExtensionType(IntEnum):
    SERVER_NAME = 0
    ALPN = 16
    QUIC_TRANSPORT_PARAMETERS = 57
    """RFC 9001 section 8.2: the QUIC transport parameters, a list of (varint id, varint length, value)."""


class TransportParameter(IntEnum):
    """QUIC transport parameter IDs read here (RFC 9000 section 18.2)."""

    MAX_IDLE_TIMEOUT = 0x01
    """A varint of milliseconds; 0 (or absent) means no idle timeout."""


class NameType(IntEnum):
    HOST_NAME = 0


class ClientHelloError(ValueError):
    """The bytes are not a well-formed ClientHello; the only error this module raises."""


class ClientHelloInfo(NamedTuple):
    """What the router learns from a ClientHello. A named tuple: one is built per connection and
    per QUIC flow, in one call (a frozen dataclass sets each field through ``object.__setattr__``)."""

    server_name: str | None
    """host_name from server_name (ASCII, undecodable bytes replaced); None if absent."""
    alpn: tuple[str, ...]
    """ALPN protocol names in client order; () if the extension is absent."""
    max_idle_timeout_ms: int = 0
    """The QUIC client's ``max_idle_timeout`` transport parameter (ms); 0 if absent or 0 (none)."""


class _Reader:
    """Bounds-checked cursor over bytes: every overrun is a ClientHelloError."""

    __slots__ = ("_data", "_end", "_pos")

    def __init__(self, data: bytes, start: int = 0, end: int | None = None) -> None:
        self._data = data
        self._pos = start
        self._end = len(data) if end is None else end

    @property
    def remaining(self) -> int:
        return self._end - self._pos

    def take(self, n: int, what: str) -> bytes:
        pos = self._pos
        if n < 0 or n > self._end - pos:
            raise ClientHelloError(f"truncated {what}")
        self._pos = pos + n
        return self._data[pos : pos + n]

    def uint(self, n: int, what: str) -> int:
        pos = self._pos
        if n > self._end - pos:
            raise ClientHelloError(f"truncated {what}")
        self._pos = pos + n
        return int.from_bytes(self._data[pos : pos + n], "big")

    def vector(self, length_bytes: int, what: str) -> _Reader:
        """A sub-reader over a length-prefixed vector; this reader skips past it.
        (Inlined reads: a hello has a dozen extensions, and this runs for every one.)"""
        data, pos, end = self._data, self._pos, self._end
        if length_bytes > end - pos:
            raise ClientHelloError(f"truncated {what} length")
        start = pos + length_bytes
        n = int.from_bytes(data[pos:start], "big")
        if n > end - start:
            raise ClientHelloError(f"truncated {what}")
        self._pos = start + n
        return _Reader(data, start, start + n)

    def varint(self, what: str) -> int:
        """A QUIC variable-length integer (RFC 9000 section 16): 1, 2, 4 or 8 bytes by its top bits."""
        pos = self._pos
        if pos >= self._end:
            raise ClientHelloError(f"truncated {what}")
        n = 1 << (self._data[pos] >> 6)
        return self.uint(n, what) & ((1 << (8 * n - 2)) - 1)

    def take_rest(self) -> bytes:
        return self.take(self.remaining, "rest")

    def expect_end(self, what: str) -> None:
        if self.remaining:
            raise ClientHelloError(f"{self.remaining} trailing bytes after {what}")


def client_hello_length(prefix: bytes) -> int | None:
    """Total size (header + body) of the handshake message starting ``prefix``; None until its 4-byte
    header is in. Lets a caller stop buffering at the hello's end and refuse an oversized claim before storing it."""
    if not prefix:
        return None
    if prefix[0] != HandshakeType.CLIENT_HELLO:
        raise ClientHelloError(f"handshake type {prefix[0]} is not client_hello")
    if len(prefix) < HANDSHAKE_HEADER_BYTES:
        return None
    total = HANDSHAKE_HEADER_BYTES + int.from_bytes(prefix[1:4], "big")
    if total > MAX_TLS_CLIENT_HELLO_BYTES:
        raise ClientHelloError(f"client_hello of {total} bytes exceeds {MAX_TLS_CLIENT_HELLO_BYTES}")
    return total


def parse_client_hello(handshake: bytes) -> ClientHelloInfo:
    """Walk one complete handshake message (type 1, uint24 length, body) to its facts. The
    reference reading: ``quic.native.client_hello_parser`` reads in C first where it is built and
    chosen, and must agree with this walk."""
    total = client_hello_length(handshake)
    if total is None:
        raise ClientHelloError("truncated handshake header")
    if len(handshake) != total:
        raise ClientHelloError(f"handshake is {len(handshake)} bytes, header says {total}")
    r = _Reader(handshake, HANDSHAKE_HEADER_BYTES)
    r.take(2, "legacy_version")
    r.take(RANDOM_BYTES, "random")
    session_id = r.vector(1, "legacy_session_id")
    if session_id.remaining > MAX_SESSION_ID_BYTES:
        raise ClientHelloError("legacy_session_id longer than 32 bytes")
    suites = r.vector(2, "cipher_suites")
    if suites.remaining < 2 or suites.remaining % 2:
        raise ClientHelloError("cipher_suites length must be even and >= 2")
    compression = r.vector(1, "legacy_compression_methods")
    if compression.remaining < 1:
        raise ClientHelloError("empty legacy_compression_methods")
    server_name: str | None = None
    alpn: tuple[str, ...] = ()
    max_idle_timeout_ms = 0
    if r.remaining:  # extensions are optional in a TLS 1.2 hello
        extensions = r.vector(2, "extensions")
        r.expect_end("extensions")
        # Walked inline (a hello carries a dozen or more extensions): type, uint16 length, body.
        data, pos, end = extensions._data, extensions._pos, extensions._end
        # Plain ints, looked up once: an enum member lookup per extension cost ~15% of the walk.
        sni_type, alpn_type = int(ExtensionType.SERVER_NAME), int(ExtensionType.ALPN)
        parameters_type = int(ExtensionType.QUIC_TRANSPORT_PARAMETERS)
        seen: set[int] = set()
        while pos < end:
            if end - pos < 4:
                raise ClientHelloError("truncated extension header")
            ext_type = (data[pos] << 8) | data[pos + 1]
            start = pos + 4
            pos = start + ((data[pos + 2] << 8) | data[pos + 3])
            if pos > end:
                raise ClientHelloError("truncated extension body")
            if ext_type in seen:
                raise ClientHelloError(f"duplicate extension {ext_type}")
            seen.add(ext_type)
            if ext_type == sni_type:
                server_name = _parse_server_name(_Reader(data, start, pos))
            elif ext_type == alpn_type:
                alpn = _parse_alpn(_Reader(data, start, pos))
            elif ext_type == parameters_type:
                max_idle_timeout_ms = _parse_max_idle_timeout(_Reader(data, start, pos))
    return ClientHelloInfo(server_name, alpn, max_idle_timeout_ms)


def _parse_server_name(body: _Reader) -> str | None:
    """RFC 6066 section 3: a list of (name_type, name); at most one host_name."""
    names = body.vector(2, "server_name_list")
    body.expect_end("server_name_list")
    host: str | None = None
    while names.remaining:
        name_type = names.uint(1, "name_type")
        name = names.vector(2, "server name").take_rest()
        if name_type != NameType.HOST_NAME:
            continue
        if host is not None:
            raise ClientHelloError("more than one host_name in server_name")
        # Replacement characters (and NUL) are kept: the hostname matcher rejects them,
        # which answers "unknown name" instead of a protocol error.
        host = name.decode("ascii", errors="replace")
    return host


def _parse_alpn(body: _Reader) -> tuple[str, ...]:
    """RFC 7301 section 3.1: a non-empty list of non-empty protocol names."""
    protocols = body.vector(2, "protocol_name_list")
    body.expect_end("protocol_name_list")
    out: list[str] = []
    while protocols.remaining:
        name = protocols.vector(1, "protocol name").take_rest()
        if not name:
            raise ClientHelloError("empty ALPN protocol name")
        out.append(name.decode("ascii", errors="replace"))
    if not out:
        raise ClientHelloError("empty ALPN protocol list")
    return tuple(out)


def _parse_max_idle_timeout(body: _Reader) -> int:
    """RFC 9000 section 18: every transport parameter's id and length well-formed; ``max_idle_timeout``
    at most once, one varint filling its value. Other parameters are skipped, unread."""
    idle: int | None = None
    while body.remaining:
        parameter = body.varint("transport parameter id")
        length = body.varint("transport parameter length")
        value = _Reader(body.take(length, "transport parameter value"))
        if parameter != TransportParameter.MAX_IDLE_TIMEOUT:
            continue
        if idle is not None:
            raise ClientHelloError("duplicate max_idle_timeout transport parameter")
        idle = value.varint("max_idle_timeout")
        value.expect_end("max_idle_timeout")
    return idle or 0
