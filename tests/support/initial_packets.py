"""Client Initials built with the router's own packet protection (``quic.initial_keys``).

For tests that need an Initial carrying exactly the frames they choose (the sniffer's unit
tests, the flood): ``quic_initial_rewriter`` builds from a real client with aioquic's
protection instead, as an independent implementation.
"""

from __future__ import annotations

from quic.initial_keys import client_initial_keys, encrypt_initial
from quic.packet import QUIC_V1

MIN_CLIENT_INITIAL_BYTES = 1200
"""RFC 9000 section 14.1: a client pads the datagrams carrying its Initials to at least 1200 bytes."""


def protected_initial(frames: bytes, *, version: int = QUIC_V1, dcid: bytes = bytes(8), scid: bytes = bytes(8),
                      pn: int = 0, size: int = MIN_CLIENT_INITIAL_BYTES) -> bytes:
    """A client Initial carrying ``frames``, PADDING-extended to exactly ``size`` bytes (or as
    small as its frames allow)."""
    keys = client_initial_keys(version, dcid)
    packet = encrypt_initial(version, dcid, scid, pn, frames, keys)
    padding = 0
    for _ in range(3):  # padding may widen the Length varint: converge on the exact size
        if len(packet) == size or padding + size - len(packet) < 0:
            break
        padding += size - len(packet)
        packet = encrypt_initial(version, dcid, scid, pn, frames + bytes(padding), keys)
    return packet


def long_header_packet(
    packet_type: int, size: int, version: int = QUIC_V1, dcid: bytes = b"D" * 8, scid: bytes = b"S" * 8
) -> bytes:
    """A v1-shaped long header packet (type bits, CIDs, token, Length) padded to ``size``, unprotected:
    what the verdicts read in the clear (``packet_type`` 0 Initial, 1 0-RTT, 2 Handshake)."""
    head = bytes((0xC0 | packet_type << 4,)) + version.to_bytes(4, "big")
    head += bytes((len(dcid),)) + dcid + bytes((len(scid),)) + scid
    if packet_type == 0:
        head += b"\x00"  # empty token
    rest = size - len(head) - 2
    return head + (0x4000 | rest).to_bytes(2, "big") + bytes(rest)
