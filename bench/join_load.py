"""Datagrams of connections that moved here, for ``quic_lb_scenarios.quic_lb_join``; runs inside an
``Agent``.

Each call sends one short header from each of ``count`` new sockets (``count`` new client
addresses), its DCID a QUIC-LB connection ID (``router/udp/quic_lb.py``'s plaintext layout, its
length self-encoded) carrying ``server_id``: the first datagram of a connection the router never
saw. The sockets stay open until ``close_all``: a closed socket's port could come back as the
address of an existing flow, whose datagrams the router takes without a look.
"""

from __future__ import annotations

import os
import socket
import time

CID_BYTES = 12
"""A first octet, a 4-byte server ID, a 7-byte nonce."""
_SOCKETS: list[socket.socket] = []


def short_header(server_id: bytes, size: int, rotation: int = 0) -> bytes:
    """A ``size``-byte short header whose DCID carries ``server_id`` under ``rotation`` (``0b111``:
    not encoded, no server ID to read)."""
    first = bytes([rotation << 5 | CID_BYTES - 1])
    cid = first + server_id + os.urandom(CID_BYTES - 1 - len(server_id))
    return b"\x40" + cid + os.urandom(size - 1 - CID_BYTES)


def send_from_new_addresses(addr: tuple[str, int], count: int, server_id: bytes, size: int, rotation: int = 0,
                            batch: int = 50, pause_s: float = 0.005) -> int:
    """One datagram from each of ``count`` new sockets to ``addr``, paced at ``batch`` per ``pause_s``
    (a burst would overflow the middle box's socket buffer); returns the sockets now open."""
    for i in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(addr)
        sock.send(short_header(server_id, size, rotation))
        _SOCKETS.append(sock)
        if (i + 1) % batch == 0:
            time.sleep(pause_s)
    return len(_SOCKETS)


def close_all() -> None:
    while _SOCKETS:
        _SOCKETS.pop().close()
