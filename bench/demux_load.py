"""Several QUIC connections on one client socket, for ``quic_scenarios.udp_demux``; runs inside an
``Agent``.

Each connection opens with a real aioquic Initial (its own DCID and SCID). The echoing pod sends
each Initial back, so the middle box reads, in the pod's long header, an SCID it learns as that
connection's pod CID: the connection's short headers then carry it as their DCID, as a client's
do once the pod has answered, from one each before the load (``confirm``: the router confirms the
connection's flow, as a real client's is after its handshake). ``shared=True`` sends every
connection from one socket (one client address: the router tells them apart by that DCID);
``shared=False`` gives each its own socket (one address per connection, the established-flow
path). The blast sends round-robin over the connections, one datagram per call.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Any

from bench.quic_load import short_header
from quic.packet import parse_long_header

_STATE: dict[str, Any] = {}


def open_connections(addr: tuple[str, int], flights: list[list[bytes]], shared: bool) -> int:
    """One connection per flight to ``addr``, from one socket (``shared``) or one socket each;
    returns the client sockets opened. The last case's sockets stay open (``retire``): a closed
    socket's port could come back for one of these connections."""
    retire()
    socks: list[socket.socket] = []
    sends: list[tuple[socket.socket, bytes]] = []
    for flight in flights:
        if not socks or not shared:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # the echoes are not read
            sock.connect(addr)
            socks.append(sock)
        for datagram in flight:
            socks[-1].send(datagram)
        pod_cid = parse_long_header(flight[0]).scid  # what the echo teaches the middle box
        sends.append((socks[-1], pod_cid))
    _STATE["socks"], _STATE["sends"] = socks, sends
    return len(socks)


def resend_initials(flights: list[list[bytes]]) -> None:
    """The flights again (lost ones are retransmitted, as a client's PTO would)."""
    socks: list[socket.socket] = _STATE["socks"]
    for i, flight in enumerate(flights):
        for datagram in flight:
            socks[min(i, len(socks) - 1)].send(datagram)


def confirm(size: int) -> None:
    """One ``size``-byte short header per connection to its pod CID, once the echoes have taught
    the middle box those CIDs: each connection's flow is confirmed before any load, as a client
    past its handshake confirms it."""
    for sock, cid in _STATE["sends"]:
        with contextlib.suppress(OSError):
            sock.send(short_header(size, cid))


def blast(seconds: float, size: int) -> tuple[int, float]:
    """``size``-byte short headers, each connection's DCID in turn, as fast as the sends go:
    (sent, elapsed seconds)."""
    sends = [(sock.send, short_header(size, cid)) for sock, cid in _STATE["sends"]]
    sent = errors = 0
    clock = time.perf_counter
    started = clock()
    deadline = started + seconds
    while clock() < deadline:
        for _ in range(16):
            for send, payload in sends:
                try:
                    send(payload)
                except OSError:
                    errors += 1
            sent += len(sends)
    return sent - errors, clock() - started


def retire() -> None:
    """Stop using the open connections; their sockets stay open until ``close_all``."""
    _STATE.setdefault("retired", []).extend(_STATE.pop("socks", []))
    _STATE.pop("sends", None)


def close_all() -> None:
    retire()
    for sock in _STATE.pop("retired", []):
        sock.close()
