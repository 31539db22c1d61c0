"""Packets the router sends a QUIC client it refuses, shaped the way its server would.

A client that names no known pod learns why at once, not after a handshake timeout: a server
Initial with a transport CONNECTION_CLOSE, or Version Negotiation for a version the router cannot
open. Both are tiny next to the >= 1200-byte Initial that triggers them; the caller still enforces
"never more bytes than received" and a rate budget.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING

from quic.frames import FrameType
from quic.initial_keys import encrypt_initial, server_initial_keys
from quic.packet import QUIC_V1, QUIC_V2, QUIC_VERSION_NEGOTIATION, QuicErrorCode, QuicPacketError, encode_varint

if TYPE_CHECKING:
    from quic.native import InitialProtection

QUIC_ROUTER_SCID_BYTES = 8
"""Random SCID length of the router's refusal Initial: 8 bytes, like aioquic's and most servers' CIDs."""

QUIC_MAX_CLOSE_REASON_BYTES = 256
"""Reason phrases are cut to this, so a refusal stays far below the client's 1200-byte Initial."""


def connection_close_frame(error_code: int, reason: str, frame_type: int = 0) -> bytes:
    """A transport CONNECTION_CLOSE (0x1c) frame; the reason is cut to a whole UTF-8 prefix."""
    phrase = reason.encode("utf-8")[:QUIC_MAX_CLOSE_REASON_BYTES].decode("utf-8", "ignore").encode("utf-8")
    return b"".join((
        encode_varint(FrameType.CONNECTION_CLOSE),
        encode_varint(error_code),
        encode_varint(frame_type),
        encode_varint(len(phrase)),
        phrase,
    ))


def build_initial_close(
    version: int,
    original_dcid: bytes,
    client_scid: bytes,
    reason: str,
    error_code: int = QuicErrorCode.CONNECTION_REFUSED,
    scid: bytes | None = None,
    native: InitialProtection | None = None,
) -> bytes:
    """A server Initial under ``original_dcid``'s keys (in C with ``native``) closing that connection, to
    the client's SCID from ``scid`` (default random). Not padded: CONNECTION_CLOSE is not ack-eliciting,
    so RFC 9000 section 14.1 does not require it."""
    if scid is None:
        scid = secrets.token_bytes(QUIC_ROUTER_SCID_BYTES)
    payload = connection_close_frame(error_code, reason)
    keys = server_initial_keys(version, original_dcid, native)
    return encrypt_initial(version, client_scid, scid, 0, payload, keys)


def build_version_negotiation(
    client_dcid: bytes, client_scid: bytes, versions: Iterable[int] = (QUIC_V1, QUIC_V2)
) -> bytes:
    """Version Negotiation (RFC 9000 section 17.2.1) listing ``versions``; the CIDs echoed swapped at any
    invariant size (RFC 8999: up to 255 bytes, as the client's version may allow). Unused first-byte
    bits are random, with 0x40 set as RFC 9000 recommends (QUIC-bit-checking middleboxes)."""
    if len(client_dcid) > 255 or len(client_scid) > 255:
        raise QuicPacketError("connection ID longer than 255 bytes")
    listed = tuple(versions)
    if not listed or any(not 0 < v < 1 << 32 for v in listed):
        raise QuicPacketError("Version Negotiation needs non-zero 32-bit versions")
    return b"".join((
        bytes((0xC0 | secrets.randbits(6),)),
        QUIC_VERSION_NEGOTIATION.to_bytes(4, "big"),
        bytes((len(client_scid),)), client_scid,
        bytes((len(client_dcid),)), client_dcid,
        *(v.to_bytes(4, "big") for v in listed),
    ))
