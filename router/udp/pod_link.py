"""One routed QUIC flow's connected UDP socket to its pod, and the client datagrams it collects.

A link's *outbox* collects what the edge forwards to it in one loop iteration; ``Outboxes`` flushes
every touched link right after that iteration's I/O callbacks, equal-sized runs in one
``UDP_SEGMENT`` send. No timer and no added round trip; every datagram reaches the pod unchanged
and in order. The socket's pod side is read by the datapath.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from router import constants as c
from router.udp.batching import enable_gro, path_segment_limit, send_datagrams

F = TypeVar("F")
"""The flow this link belongs to (the router's ``Flow[PodLink]``)."""


class PodLink(Generic[F]):
    """A flow's connected, non-blocking socket to its pod, plus its outbox of client datagrams."""

    __slots__ = ("_failed", "flow", "max_segment", "outbox", "sock")

    def __init__(self, sock: socket.socket, failed: Callable[[F, Exception], None]) -> None:
        self.sock: socket.socket | None = sock
        self.flow: F | None = None
        self.outbox: list[bytes] = []
        self.max_segment = -1
        """Longest datagram a GSO send may cut (0: never batch); -1 until a send of several asks the kernel."""
        self._failed = failed

    def flush(self) -> int:
        """Send the outbox to the pod; returns the bytes sent (the rest dropped on a full buffer).
        An error such as ECONNREFUSED (the pod port is gone) fails the flow."""
        outbox, sock = self.outbox, self.sock
        if not outbox or sock is None:
            return 0
        try:
            if len(outbox) == 1:  # the common case of sparse traffic: no planning
                return sock.send(outbox[0])
            if self.max_segment < 0:
                self.max_segment = path_segment_limit(sock)
            return send_datagrams(sock, outbox, self.max_segment)
        except BlockingIOError:  # the socket buffer is full: dropped, as UDP drops
            return 0
        except OSError as exc:
            if self.flow is not None:
                self._failed(self.flow, exc)
            return 0
        finally:
            outbox.clear()  # reused: no list per flush

    def close(self) -> None:
        """Close the socket (its datapath let go of it first); what the outbox still holds is dropped."""
        self.flow = None
        self.outbox = []
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class Outboxes(Generic[F]):
    """The links with client datagrams to send once this loop iteration's reads are done
    (``schedule``: the loop's ``call_soon``); a full outbox (``QUIC_OUTBOX_DATAGRAMS``) is sent at once."""

    __slots__ = ("_links", "_schedule", "_scheduled", "sent_bytes")

    def __init__(self, schedule: Callable[[Callable[[], None]], object]) -> None:
        self._schedule = schedule
        self._links: list[PodLink[F]] = []
        self._scheduled = False
        self.sent_bytes = 0
        """Bytes sent to pods since the owner last took them (for ``relayed_bytes``)."""

    def add(self, link: PodLink[F], datagram: bytes) -> None:
        outbox = link.outbox
        outbox.append(datagram)
        if len(outbox) == 1:
            self._links.append(link)
            if not self._scheduled:
                self._scheduled = True
                self._schedule(self._send)
        elif len(outbox) >= c.QUIC_OUTBOX_DATAGRAMS:
            self.sent_bytes += link.flush()

    def _send(self) -> None:
        self._scheduled = False
        links, self._links = self._links, []
        for link in links:
            self.sent_bytes += link.flush()


def connect_udp(address: str, port: int) -> socket.socket:
    """A non-blocking UDP socket connected to a pod IP (never a name: no DNS here), GRO on if offered,
    so a pod's GSO batch is one read, passed on as one ``UDP_SEGMENT`` send."""
    family, sockaddr = _pod_sockaddr(address, port)
    sock = socket.socket(family, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)  # no ioctl to unblock it
    try:
        enable_gro(sock)
        sock.connect(sockaddr)
    except OSError:
        sock.close()
        raise
    return sock


@functools.lru_cache(maxsize=c.QUIC_POD_SOCKADDR_CACHE)
def _pod_sockaddr(address: str, port: int) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    """Family and socket address of a numeric pod IP (a name raises ``gaierror``), resolved once
    per pod endpoint instead of one ``getaddrinfo`` per flow."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        address, port, type=socket.SOCK_DGRAM, flags=socket.AI_NUMERICHOST
    )[0]
    return family, sockaddr
