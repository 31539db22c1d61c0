"""The messages workers of one router pass each other about client datagrams: bytes <-> records.

Sans-IO. A message (one ``AF_UNIX`` datagram, ``worker_link``) is its sender's index (u8) and one
or more records, each:

    kind: u8 | ask id: u32 | family: u8 (4 or 6) | client IP (4 or 16 octets) | client port: u16
    | (family 6: flowinfo u32, scope id u32) | payload length: u16 | payload

An ``ASK`` carries a client datagram no flow of the sender took (its ask id, for the answer); a
``FORWARD`` a datagram of a client whose flow another worker holds; a ``CLAIM`` (no payload)
answers an ask: the flow is here. The client address is the tuple asyncio reports, ``(host, port)``
or ``(host, port, flowinfo, scope_id)``, and decodes to an equal tuple, so it keys the flow table
alike in every worker. Anything else raises ``HandoffError``, never a ``struct.error``.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

MAX_PAYLOAD_BYTES = 0xFFFF
"""A UDP datagram's payload fits the u16 length (IPv4's largest is 65,507 octets)."""

_SENDER = struct.Struct("!B")
_HEAD = struct.Struct("!BIB")
_PORT = struct.Struct("!H")
_SCOPE = struct.Struct("!II")
_LENGTH = struct.Struct("!H")
_FAMILIES = {4: (socket.AF_INET, 4), 6: (socket.AF_INET6, 16)}


class HandoffError(ValueError):
    """A record that cannot be encoded (an address of another shape) or decoded (bad bytes)."""


class HandoffKind(IntEnum):
    """What a record asks of the worker that reads it."""

    ASK = 1
    """Does one of your flows own this datagram? Take it if so, and ``CLAIM``."""
    FORWARD = 2
    """This datagram is your flow's (you claimed its address): take it."""
    CLAIM = 3
    """Answer to an ``ASK``: this worker holds the flow; forward the address's next datagrams here."""


@dataclass(frozen=True, slots=True)
class Handoff:
    """One decoded record."""

    kind: HandoffKind
    ask_id: int
    """The asker's number for an ``ASK`` and its ``CLAIM`` (0 for a ``FORWARD``)."""
    address: tuple[Any, ...]
    """The client's address, as the listener reported it."""
    payload: bytes = b""
    """The client's datagram (empty in a ``CLAIM``)."""


def encode_handoff(kind: HandoffKind, ask_id: int, address: tuple[Any, ...], payload: bytes = b"") -> bytes:
    """One record; ``HandoffError`` for an address that is not a numeric IPv4 or IPv6 one (a scoped
    ``fe80::1%eth0`` host included: such a client is not followed) or an over-long payload."""
    if not 0 <= ask_id <= 0xFFFFFFFF or len(payload) > MAX_PAYLOAD_BYTES:
        raise HandoffError(f"ask id {ask_id} or payload of {len(payload)} bytes out of range")
    try:
        if len(address) == 2:
            ip = socket.inet_pton(socket.AF_INET, address[0])
            tail = _PORT.pack(address[1])
            family = 4
        elif len(address) == 4:
            ip = socket.inet_pton(socket.AF_INET6, address[0])
            tail = _PORT.pack(address[1]) + _SCOPE.pack(address[2], address[3])
            family = 6
        else:
            raise HandoffError(f"address {address!r} is neither (host, port) nor (host, port, flowinfo, scope)")
    except (OSError, TypeError, struct.error) as exc:
        raise HandoffError(f"address {address!r}: {exc}") from None
    return b"".join((_HEAD.pack(kind, ask_id, family), ip, tail, _LENGTH.pack(len(payload)), payload))


def decode_handoffs(message: bytes) -> list[Handoff]:
    """Every record of a message, in order; ``HandoffError`` if any is malformed or bytes trail."""
    records: list[Handoff] = []
    view, offset, end = memoryview(message), 0, len(message)
    while offset < end:
        if end - offset < _HEAD.size:
            raise HandoffError(f"truncated record head at offset {offset}")
        kind_byte, ask_id, family = _HEAD.unpack_from(view, offset)
        offset += _HEAD.size
        try:
            kind = HandoffKind(kind_byte)
            af, ip_size = _FAMILIES[family]
        except (ValueError, KeyError):
            raise HandoffError(f"unknown kind {kind_byte} or family {family}") from None
        fixed = ip_size + _PORT.size + (_SCOPE.size if family == 6 else 0) + _LENGTH.size
        if end - offset < fixed:
            raise HandoffError(f"truncated address at offset {offset}")
        host = socket.inet_ntop(af, bytes(view[offset:offset + ip_size]))
        offset += ip_size
        (port,) = _PORT.unpack_from(view, offset)
        offset += _PORT.size
        address: tuple[Any, ...] = (host, port)
        if family == 6:
            address = (host, port, *_SCOPE.unpack_from(view, offset))
            offset += _SCOPE.size
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += _LENGTH.size
        if end - offset < length:
            raise HandoffError(f"payload of {length} bytes, {end - offset} left")
        if kind is HandoffKind.CLAIM and length:
            raise HandoffError("a claim carries no payload")
        records.append(Handoff(kind, ask_id, address, bytes(view[offset:offset + length])))
        offset += length
    return records


def encode_message_head(sender: int) -> bytes:
    """What every message of worker ``sender`` starts with."""
    if not 0 <= sender <= 0xFF:
        raise HandoffError(f"worker index {sender} does not fit a message head")
    return _SENDER.pack(sender)


def decode_message(message: bytes, workers: int) -> tuple[int, list[Handoff]]:
    """``(sender, records)`` of one message from one of ``workers`` workers; ``HandoffError`` otherwise."""
    if len(message) < _SENDER.size:
        raise HandoffError("empty message")
    (sender,) = _SENDER.unpack_from(message)
    if sender >= workers:
        raise HandoffError(f"sender {sender} is not one of {workers} workers")
    return sender, decode_handoffs(message[_SENDER.size:])
