"""TLS record-layer peek: find the ClientHello in the first bytes of a TCP stream.

Sans-IO. The router never terminates TLS: it reads just enough records to see the SNI, forwards every byte
it read to the pod, or answers with one fatal alert. A ClientHello may arrive a byte at a time or over
several records, so the reader keeps state between ``feed`` calls and never holds more than ``max_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum

from wire.client_hello import ClientHelloError, ClientHelloInfo, client_hello_length, parse_client_hello

MAX_PEEK_BYTES = 16 * 1024
"""Stream bytes the reader looks at for the ClientHello's records; real hellos are < 4 KiB."""

RECORD_HEADER_BYTES = 5
"""content_type(1) + legacy_record_version(2) + uint16 length (RFC 8446 section 5.1)."""

MAX_RECORD_PAYLOAD_BYTES = 2**14 + 256
"""TLSCiphertext limit (RFC 8446 section 5.2); a plaintext hello record is never larger."""

TLS_MAJOR_VERSION = 3
"""Every SSL 3 / TLS 1.x record carries major version 3."""

LEGACY_RECORD_VERSION = b"\x03\x03"
"""TLS 1.2 record version, what TLS 1.3 peers put on every record after the first."""


class ContentType(IntEnum):
    ALERT = 21
    HANDSHAKE = 22


class AlertLevel(IntEnum):
    FATAL = 2


class TlsAlert(IntEnum):
    """Alert descriptions the router sends, always fatal (RFC 8446 section 6)."""

    DECODE_ERROR = 50
    """A ClientHello the router cannot parse (RFC 8446 section 6.2)."""
    INTERNAL_ERROR = 80
    """The named pod is unavailable (no TLS alert says 'try later')."""
    UNRECOGNIZED_NAME = 112
    """Missing or unknown SNI (RFC 6066 section 3)."""


class TlsPeekError(ValueError):
    """Not a well-formed TLS ClientHello; a ClientHelloError is re-raised as this (chained)."""


def looks_like_tls(first_bytes: bytes) -> bool:
    """True if the stream starts like a TLS handshake record (False when empty)."""
    if not first_bytes or first_bytes[0] != ContentType.HANDSHAKE:
        return False
    return len(first_bytes) < 2 or first_bytes[1] == TLS_MAJOR_VERSION


def tls_alert(description: int) -> bytes:
    """One fatal alert record, e.g. ``tls_alert(TlsAlert.UNRECOGNIZED_NAME)`` for an unknown SNI."""
    if not 0 <= description <= 255:
        raise ValueError(f"alert description {description} is not a uint8")
    return bytes([ContentType.ALERT, *LEGACY_RECORD_VERSION, 0, 2, AlertLevel.FATAL, description])


class ClientHelloReader:
    """Feed raw TCP bytes; get the ClientHello's facts once its last record arrived. ``parse`` reads
    the whole hello (``parse_client_hello``, or a faster reading that agrees with it)."""

    def __init__(
        self, max_bytes: int = MAX_PEEK_BYTES, parse: Callable[[bytes], ClientHelloInfo] = parse_client_hello
    ) -> None:
        self._max_bytes = max_bytes
        self._parse = parse
        self._fed = 0
        self._records = bytearray()
        """Record-layer bytes not yet consumed (at most one partial record)."""
        self._handshake = bytearray()
        """Concatenated handshake fragments so far."""
        self._info: ClientHelloInfo | None = None

    def feed(self, data: bytes) -> ClientHelloInfo | None:
        """Consume ``data``; None means more bytes are needed. Idempotent once complete."""
        if self._info is not None:
            return self._info
        if not self._fed and len(data) <= self._max_bytes:
            try:
                self._info = _hello_in_one_record(data, self._parse)
            except ClientHelloError as exc:
                raise TlsPeekError(f"bad ClientHello: {exc}") from exc
            if self._info is not None:
                self._fed = len(data)
                return self._info
        # Only the first max_bytes of the stream are looked at, so the outcome does not
        # depend on how the stream was chunked, and the buffer never exceeds max_bytes.
        self._records += data[: max(0, self._max_bytes - self._fed)]
        self._fed += len(data)
        try:
            self._info = self._consume_records()
        except ClientHelloError as exc:
            raise TlsPeekError(f"bad ClientHello: {exc}") from exc
        if self._info is None and self._fed > self._max_bytes:
            raise TlsPeekError(f"no complete ClientHello within {self._max_bytes} bytes")
        return self._info

    def _consume_records(self) -> ClientHelloInfo | None:
        buf = self._records
        while True:
            length = _check_record_header(buf)
            if length is None or len(buf) < RECORD_HEADER_BYTES + length:
                return None
            self._handshake += buf[RECORD_HEADER_BYTES : RECORD_HEADER_BYTES + length]
            del buf[: RECORD_HEADER_BYTES + length]
            total = client_hello_length(bytes(self._handshake[:4]))
            if total is not None and len(self._handshake) >= total:
                # Bytes of a following handshake message (none in practice) are ignored:
                # the pod receives them untouched anyway.
                return self._parse(bytes(self._handshake[:total]))


def _hello_in_one_record(data: bytes, parse: Callable[[bytes], ClientHelloInfo]) -> ClientHelloInfo | None:
    """The usual start: the whole hello in the first record of the first read. Parsed in place
    (no staging copies) with the same checks as the record loop; None to take that loop."""
    length = _check_record_header(data)
    if length is None or len(data) < RECORD_HEADER_BYTES + length:
        return None
    total = client_hello_length(data[RECORD_HEADER_BYTES : RECORD_HEADER_BYTES + min(length, 4)])
    if total is None or total > length:
        return None
    return parse(data[RECORD_HEADER_BYTES : RECORD_HEADER_BYTES + total])


def _check_record_header(buf: bytes | bytearray) -> int | None:
    """Validate as much of the next record header as has arrived; its length when complete."""
    if buf and buf[0] != ContentType.HANDSHAKE:
        raise TlsPeekError(f"record content type {buf[0]} before the ClientHello completed")
    if len(buf) >= 2 and buf[1] != TLS_MAJOR_VERSION:
        raise TlsPeekError(f"record major version {buf[1]} is not 3")
    if len(buf) < RECORD_HEADER_BYTES:
        return None
    length = int.from_bytes(buf[3:5], "big")
    if length == 0:
        raise TlsPeekError("empty handshake record")
    if length > MAX_RECORD_PAYLOAD_BYTES:
        raise TlsPeekError(f"record of {length} bytes exceeds {MAX_RECORD_PAYLOAD_BYTES}")
    return length
