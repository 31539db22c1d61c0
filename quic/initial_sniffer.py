"""Reads the ClientHello (SNI, ALPN) out of a client's Initial datagrams, sans-IO; one per pending flow.

It opens copies (the caller forwards the datagrams untouched). Error policy, so an off-path injector
cannot kill a flow it does not own: until an Initial has opened, a useless datagram raises
(``NotInitial``, ``ShortInitial``, ``UnsupportedVersion``, ``QuicPacketError``); after that, datagrams of
another DCID or version, failing authentication, or garbage are ignored (``feed`` returns None); errors
inside authenticated data (a frame not allowed, CRYPTO over the bound or conflicting,
``InvalidClientHello``) always raise: the flow is dead.
"""

from __future__ import annotations

from quic.frames import QUIC_MAX_CRYPTO_BYTES, CryptoReassembler, walk_initial_frames
from quic.initial_keys import (
    CLIENT_KEY_INPUTS,
    MAX_PN_BYTES,
    SAMPLE_BYTES,
    InitialKeys,
    client_initial_keys,
    decrypt_initial,
)
from quic.native import InitialProtection, client_hello_parser
from quic.packet import (
    LONG_FORM,
    QUIC_MIN_INITIAL_DATAGRAM_BYTES,
    QUIC_VERSION_NEGOTIATION,
    SUPPORTED_VERSIONS,
    LongHeader,
    PacketType,
    QuicPacketError,
    UnsupportedVersion,
    is_long_header,
    iter_long_headers,
)
from wire.client_hello import (
    HANDSHAKE_HEADER_BYTES,
    MAX_TLS_CLIENT_HELLO_BYTES,
    ClientHelloError,
    ClientHelloInfo,
    client_hello_length,
)


def sniff_first_payload(
    payload: bytes, max_crypto: int, native: InitialProtection | None
) -> tuple[str | None, tuple[str, ...], int] | None:
    """The ClientHello facts (server name, ALPN, max_idle_timeout) of a first opened Initial payload, read
    in C when its CRYPTO frames hold a whole hello in order from offset 0; None otherwise or without
    ``native`` (then ``InitialSniffer`` walks it the reference way, which names whatever is wrong)."""
    if native is None:
        return None
    return native.sniff_initial(payload, max_crypto, MAX_TLS_CLIENT_HELLO_BYTES)


def parse_client_hello(handshake: bytes, native: InitialProtection | None) -> ClientHelloInfo:
    """A reassembled hello's facts, read in C first with ``native`` (``quic.native.client_hello_parser``)."""
    return client_hello_parser(native)(handshake)


class NotInitial(QuicPacketError):
    """The datagram carries no Initial packet (short header, 0-RTT or Handshake only)."""


class ShortInitial(QuicPacketError):
    """An Initial in a datagram under 1200 bytes, which servers must discard (RFC 9000 14.1)."""


class InvalidClientHello(QuicPacketError):
    """The reassembled CRYPTO stream is not a valid ClientHello (wraps ClientHelloError)."""


class InitialSniffer:
    """Fed a pending flow's client datagrams in arrival order, returns the ClientHelloInfo once complete.
    With ``native`` (``quic.native.EXTENSION``) the keys, the opening and a usual hello are read in C."""

    def __init__(
        self,
        max_crypto_bytes: int = QUIC_MAX_CRYPTO_BYTES,
        min_datagram_bytes: int = QUIC_MIN_INITIAL_DATAGRAM_BYTES,
        native: InitialProtection | None = None,
    ) -> None:
        self._native = native
        self.version: int | None = None
        self.original_dcid: bytes | None = None
        self.client_scid: bytes | None = None
        self.client_hello: ClientHelloInfo | None = None
        """Set once complete; later ``feed`` calls return it without reading anything."""
        self._min_datagram = min_datagram_bytes
        self._keys: InitialKeys | None = None
        self._largest_pn = -1
        # CRYPTO past the largest ClientHello accepted can never complete one; not buffering
        # it keeps one 1200-byte datagram from costing a 64 KiB reassembly buffer per flow.
        self._max_crypto = min(max_crypto_bytes, MAX_TLS_CLIENT_HELLO_BYTES)
        self._crypto: CryptoReassembler | None = None
        """Made for the first payload the reference walk reads (a hello read in one call needs none)."""

    def feed(self, datagram: bytes, first: LongHeader | None = None) -> ClientHelloInfo | None:
        """Take one client datagram; the ClientHello facts once complete, else None. ``first`` is
        the datagram's first long header if the caller parsed it already."""
        if self.client_hello is not None:
            return self.client_hello
        opening = self.version is None
        native = self._native
        if opening and first is not None and native is not None and self._usual_first(datagram, first):
            return self._sniff_first(native, datagram, first)
        try:
            payloads = self._open(datagram, first)
        except QuicPacketError:
            if opening:
                raise
            return None
        if opening and len(payloads) == 1:
            # The usual first datagram: one Initial whose CRYPTO frames hold the whole hello, in order.
            found = sniff_first_payload(payloads[0], self._max_crypto, native)
            if found is not None:
                self.client_hello = ClientHelloInfo(*found)
                return self.client_hello
        return self._walk(payloads)

    def _usual_first(self, datagram: bytes, first: LongHeader) -> bool:
        """A first datagram the C path reads in one call: one v1/v2 Initial of the right size, with
        room for its header protection sample, and no long-header packet coalesced after it."""
        end = first.offset + first.packet_length
        size = len(datagram)
        return (
            first.packet_type is PacketType.INITIAL and first.version in CLIENT_KEY_INPUTS
            and size >= self._min_datagram and first.header_length + MAX_PN_BYTES + SAMPLE_BYTES <= end <= size
            and (end == size or not datagram[end] & LONG_FORM)
        )

    def _sniff_first(self, native: InitialProtection, datagram: bytes,
                     first: LongHeader) -> ClientHelloInfo | None:
        """``feed`` of a usual first datagram: keys, opening and the usual hello in one C call (what
        ``_open`` and ``sniff_first_payload`` would do, in ~12 Python calls fewer per new flow)."""
        sniffed = native.sniff_first(
            datagram, *CLIENT_KEY_INPUTS[first.version], first.dcid, first.header_length,
            first.offset + first.packet_length, self._max_crypto, MAX_TLS_CLIENT_HELLO_BYTES,
        )
        if sniffed is None:
            raise QuicPacketError("Initial packet failed authentication")
        packet_number, facts, opened = sniffed
        self.version, self.original_dcid, self.client_scid = first.version, first.dcid, first.scid
        self._largest_pn = packet_number
        if facts is not None:
            self.client_hello = ClientHelloInfo(*facts)
            return self.client_hello
        if opened is None:  # pragma: no cover - the extension gives one or the other
            raise QuicPacketError("no Initial payload")
        key, iv, hp, payload = opened
        self._keys = InitialKeys(key, iv, hp)
        return self._walk([payload])

    def _open(self, datagram: bytes, first: LongHeader | None) -> list[bytes]:
        """Decrypted payloads of this flow's Initials in ``datagram``; raises if none."""
        if not is_long_header(datagram):
            raise NotInitial("short header packet")
        payloads: list[bytes] = []
        failure: QuicPacketError | None = None
        native = self._native
        for header in iter_long_headers(datagram, first, native):
            if header.version not in SUPPORTED_VERSIONS:
                if header.offset:
                    break  # a coalesced packet of another version: trailing junk
                if header.version == QUIC_VERSION_NEGOTIATION:
                    raise QuicPacketError("Version Negotiation packet from a client")
                raise UnsupportedVersion(header.version, header.dcid, header.scid)
            if header.packet_type is not PacketType.INITIAL:
                continue
            if self.version is not None and (
                header.version != self.version or header.dcid != self.original_dcid
            ):
                continue
            if len(datagram) < self._min_datagram:
                raise ShortInitial(f"Initial in a {len(datagram)}-byte datagram")
            keys = self._keys or client_initial_keys(header.version, header.dcid, native)
            try:
                packet_number, payload = decrypt_initial(datagram, header, keys, self._largest_pn, native)
            except QuicPacketError as exc:
                failure = failure or exc
                continue
            if self.version is None:
                self.version, self.original_dcid, self.client_scid = header.version, header.dcid, header.scid
                self._keys = keys
            self._largest_pn = max(self._largest_pn, packet_number)
            payloads.append(payload)
        if not payloads:
            raise failure or NotInitial("no Initial packet in the datagram")
        return payloads

    def _walk(self, payloads: list[bytes]) -> ClientHelloInfo | None:
        """The reference reading: CRYPTO frames into the reassembler, then the ClientHello once whole."""
        crypto = self._crypto
        if crypto is None:
            crypto = self._crypto = CryptoReassembler(self._max_crypto)
        for payload in payloads:
            for offset, data in walk_initial_frames(payload):
                crypto.add(offset, data)
        available = crypto.contiguous_length
        if not available:
            return None
        try:
            total = client_hello_length(crypto.contiguous(HANDSHAKE_HEADER_BYTES))
            if total is None or available < total:
                return None
            info = parse_client_hello(crypto.contiguous(total), self._native)
        except ClientHelloError as exc:
            raise InvalidClientHello(str(exc)) from exc
        self.client_hello = info
        return info
