"""Connections whose client moves to a new port, for ``worker_follow_scenarios``; runs inside an
``Agent``, on the connections ``demux_load.open_connections`` opened (one socket each).

``move`` gives every connection a new socket (a NAT rebinding: its next datagram comes from a new
address, carrying its pod CID), sending one short header from it; ``send_each`` then sends from
every connection's current socket, round after round, paced. The old sockets stay open until
``demux_load.close_all``: a closed socket's port could come back for another connection.
"""

from __future__ import annotations

import os
import socket
import time

from bench import demux_load


def _short_header(cid: bytes, size: int) -> bytes:
    payload = bytearray(os.urandom(size))
    payload[0] = 0x40 | (payload[0] & 0x3F)
    payload[1 : 1 + len(cid)] = cid
    return bytes(payload)


def move(addr: tuple[str, int], size: int) -> int:
    """Every open connection to a new socket, one datagram from it; returns how many moved."""
    state = demux_load._STATE
    moved = []
    for old, cid in state["sends"]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # the echoes are not read
        sock.connect(addr)
        sock.send(_short_header(cid, size))
        state["socks"].append(sock)
        moved.append((sock, cid))
        del old
    state["sends"] = moved
    return len(moved)


def send_each(rounds: int, size: int, pause_s: float = 0.002) -> int:
    """``rounds`` datagrams from every connection's current socket, one round at a time; returns how
    many were sent."""
    sends = [(sock.send, _short_header(cid, size)) for sock, cid in demux_load._STATE["sends"]]
    sent = 0
    for _ in range(rounds):
        for send, payload in sends:
            try:
                send(payload)
                sent += 1
            except OSError:
                pass
        time.sleep(pause_s)
    return sent
