"""TLS ClientHellos and records for the tests: real ones from OpenSSL and aioquic, and hand-built
ones (real clients refuse to send hostile names or broken lengths).

Unit tests (``test_clienthello``, ``test_tls_peek``), the fault suite and the fuzz targets all
build their hellos here. A *handshake* is the ClientHello message (type byte, 3-byte length,
body); *records* wrap it in TLS handshake records.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Sequence

from aioquic import tls as aioquic_tls
from aioquic.buffer import Buffer

HOST = "stargate-0.stargate.external"
TLS_RECORD_MAX_FRAGMENT = 2**14
"""A handshake message longer than this is split over several records (RFC 8446 section 5.1)."""
SERVER_NAME_EXTENSION = 0
ALPN_EXTENSION = 16
QUIC_TRANSPORT_PARAMETERS_EXTENSION = 57
MAX_IDLE_TIMEOUT_PARAMETER = 0x01

Extension = tuple[int, bytes]
"""(extension type, extension body) of one ClientHello extension, unencoded."""


# -- real clients -------------------------------------------------------------------------
def ssl_client_hello_records(
    server_hostname: str | None = HOST,
    alpn: Sequence[str] = ("h2",),
    maximum_version: ssl.TLSVersion | None = None,
) -> bytes:
    """The record-layer bytes a real OpenSSL client (Python's ``ssl``) sends first."""
    ctx = ssl.create_default_context()
    if server_hostname is None:
        ctx.check_hostname = False
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    if maximum_version is not None:
        ctx.maximum_version = maximum_version
    obj = ctx.wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO(), server_hostname=server_hostname)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        return out.read()
    raise AssertionError("the TLS client finished a handshake without a server")


def ssl_client_hello(
    server_hostname: str | None = HOST,
    alpn: Sequence[str] = ("h2",),
    maximum_version: ssl.TLSVersion | None = None,
) -> bytes:
    """The handshake message inside the (single) record of a real OpenSSL ClientHello."""
    records = ssl_client_hello_records(server_hostname, alpn, maximum_version)
    assert records[0] == 22 and int.from_bytes(records[3:5], "big") == len(records) - 5
    return records[5:]


def aioquic_client_hello(server_name: str | None = HOST, alpn: tuple[str, ...] = ("stargate",)) -> bytes:
    """The ClientHello handshake message aioquic's TLS puts in a QUIC client's first CRYPTO data."""
    ctx = aioquic_tls.Context(is_client=True, alpn_protocols=list(alpn), server_name=server_name)
    bufs = {epoch: Buffer(capacity=4096) for epoch in aioquic_tls.Epoch}
    ctx.handle_message(b"", bufs)
    return bufs[aioquic_tls.Epoch.INITIAL].data


# -- hand-built hellos --------------------------------------------------------------------
def u16(n: int) -> bytes:
    """Two bytes, big-endian, wrapping: a mutation that overflows a length still builds."""
    return (n & 0xFFFF).to_bytes(2, "big")


def vector(length_bytes: int, body: bytes) -> bytes:
    """``body`` behind its length (a TLS variable-length vector)."""
    return len(body).to_bytes(length_bytes, "big") + body


def sni_ext(*names: tuple[int, bytes]) -> Extension:
    """server_name (RFC 6066 section 3) listing ``(name_type, name)`` entries."""
    entries = b"".join(bytes([t]) + u16(len(n)) + n for t, n in names)
    return SERVER_NAME_EXTENSION, u16(len(entries)) + entries


def alpn_ext(*protocols: bytes) -> Extension:
    """application_layer_protocol_negotiation (RFC 7301) listing ``protocols``."""
    entries = b"".join(bytes([len(p)]) + p for p in protocols)
    return ALPN_EXTENSION, u16(len(entries)) + entries


def extension(ext_type: int, body: bytes) -> bytes:
    """One extension as it sits on the wire: type, length, body."""
    return u16(ext_type) + vector(2, body)


def sni_extension(*names: bytes, name_type: int = 0) -> bytes:
    """server_name listing ``names``, every one with ``name_type``, encoded."""
    return extension(*sni_ext(*((name_type, name) for name in names)))


def alpn_extension(*protocols: bytes) -> bytes:
    """ALPN listing ``protocols``, encoded."""
    return extension(*alpn_ext(*protocols))


def varint(value: int, size: int | None = None) -> bytes:
    """A QUIC variable-length integer (RFC 9000 section 16) of ``size`` bytes (1, 2, 4, 8), or the
    shortest that holds ``value``: values need not be minimally encoded."""
    if size is None:
        size = next(n for n in (1, 2, 4, 8) if value < 1 << (8 * n - 2))
    prefix = {1: 0, 2: 1, 4: 2, 8: 3}[size] << (8 * size - 2)
    return (prefix | value).to_bytes(size, "big")


def transport_parameters_ext(*parameters: tuple[int, bytes]) -> Extension:
    """quic_transport_parameters (RFC 9001 section 8.2) listing ``(id, value)`` pairs, each encoded
    as varint id, varint length, value."""
    return QUIC_TRANSPORT_PARAMETERS_EXTENSION, b"".join(varint(i) + varint(len(v)) + v for i, v in parameters)


def hello_from_parts(head: bytes, extensions: Sequence[Extension], after_extensions: bytes = b"") -> bytes:
    """A ClientHello handshake message from its fields before the extensions and its extensions."""
    block = b"".join(u16(t) + u16(len(d)) + d for t, d in extensions)
    body = head + u16(len(block)) + block + after_extensions
    return b"\x01" + len(body).to_bytes(3, "big") + body


def build_hello(
    extensions: list[Extension] | None = None,
    *,
    session_id: bytes = b"",
    suites: bytes = b"\x13\x01",
    compression: bytes = b"\x00",
    after_extensions: bytes = b"",
) -> bytes:
    """A synthetic ClientHello handshake message (only the fields the walker reads)."""
    head = b"\x03\x03" + bytes(32) + bytes([len(session_id)]) + session_id
    head += u16(len(suites)) + suites + bytes([len(compression)]) + compression
    if extensions is None:
        return b"\x01" + len(head).to_bytes(3, "big") + head
    return hello_from_parts(head, extensions, after_extensions)


def hello_parts(hello: bytes) -> tuple[bytes, list[Extension]] | None:
    """(fields before the extensions, [(type, body)]) of a ClientHello, or None if it does not walk."""
    try:
        pos = 4 + 2 + 32
        pos += 1 + hello[pos]
        pos += 2 + int.from_bytes(hello[pos : pos + 2], "big")
        pos += 1 + hello[pos]
    except IndexError:
        return None
    if pos + 2 > len(hello):
        return None
    extensions, at, end = [], pos + 2, min(len(hello), pos + 2 + int.from_bytes(hello[pos : pos + 2], "big"))
    while at + 4 <= end:
        size = int.from_bytes(hello[at + 2 : at + 4], "big")
        extensions.append((int.from_bytes(hello[at : at + 2], "big"), hello[at + 4 : at + 4 + size]))
        at += 4 + size
    return hello[4:pos], extensions


def client_hello(extensions: Sequence[bytes]) -> bytes:
    """A syntactically valid TLS 1.2-style ClientHello carrying encoded ``extensions``, as records."""
    body = (
        b"\x03\x03" + os.urandom(32) + vector(1, os.urandom(32))
        + vector(2, b"\x13\x01\xc0\x2f") + vector(1, b"\x00")
        + vector(2, b"".join(extensions))
    )
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return tls_records(handshake)


def append_extension(record: bytes, ext: bytes) -> bytes:
    """A one-record ClientHello (e.g. from a real ``ssl`` client) with encoded ``ext`` appended."""
    handshake = bytearray(record[5:])
    pos = 4 + 2 + 32
    pos += 1 + handshake[pos]  # legacy_session_id
    pos += 2 + int.from_bytes(handshake[pos : pos + 2], "big")  # cipher_suites
    pos += 1 + handshake[pos]  # legacy_compression_methods
    ext_len = int.from_bytes(handshake[pos : pos + 2], "big") + len(ext)
    handshake[pos : pos + 2] = ext_len.to_bytes(2, "big")
    handshake += ext
    handshake[1:4] = (len(handshake) - 4).to_bytes(3, "big")
    return tls_records(bytes(handshake))


# -- records ------------------------------------------------------------------------------
def tls_records(handshake: bytes, sizes: Sequence[int] = ()) -> bytes:
    """``handshake`` in handshake records: fragments of the given sizes first, then of 16 KiB
    (always at least one record)."""
    out, pos = bytearray(), 0
    pending = list(sizes)
    while pos < len(handshake) or not out:
        end = min(len(handshake), pos + (pending.pop(0) if pending else TLS_RECORD_MAX_FRAGMENT))
        out += b"\x16\x03\x01" + vector(2, handshake[pos:end])
        pos = end
    return bytes(out)


def record_payloads(records: bytes) -> bytes:
    """The handshake bytes carried by a run of records (a cut last record yields what is there)."""
    out, pos = bytearray(), 0
    while pos + 5 <= len(records):
        size = int.from_bytes(records[pos + 3 : pos + 5], "big")
        out += records[pos + 5 : pos + 5 + size]
        pos += 5 + size
    return bytes(out)
