"""The reference reading of a flow's first Initial payload, as ``InitialSniffer`` does it in Python
(``quic.frames`` into a ``CryptoReassembler``, then ``quic.clienthello``): what the C reading of
``quic/_initial_protection.c`` must equal whenever it answers (tests and the fuzzer check it)."""

from __future__ import annotations

from quic.clienthello import (
    HANDSHAKE_HEADER_BYTES,
    MAX_TLS_CLIENT_HELLO_BYTES,
    ClientHelloError,
    client_hello_length,
    parse_client_hello,
)
from quic.frames import QUIC_MAX_CRYPTO_BYTES, CryptoReassembler, walk_initial_frames
from quic.packet import QuicPacketError


def reference_hello(payload: bytes, max_crypto: int = QUIC_MAX_CRYPTO_BYTES) -> object:
    """What ``InitialSniffer`` makes of one first payload the reference way: facts, None, or an error."""
    crypto = CryptoReassembler(min(max_crypto, MAX_TLS_CLIENT_HELLO_BYTES))
    try:
        for offset, data in walk_initial_frames(payload):
            crypto.add(offset, data)
        available = crypto.contiguous_length
        if not available:
            return None
        total = client_hello_length(crypto.contiguous(HANDSHAKE_HEADER_BYTES))
        if total is None or available < total:
            return None
        return parse_client_hello(crypto.contiguous(total))
    except (QuicPacketError, ClientHelloError) as exc:
        return type(exc)
