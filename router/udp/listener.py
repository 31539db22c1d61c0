"""The QUIC edge's public UDP socket: client datagrams in; pod replies and refusals out.

Python path: an asyncio ``DatagramProtocol`` (uvloop's C receive path), whose flow control tells the
pod -> client path when the kernel buffer is full. C splice: the splice reads the socket itself and
the edge's own sends go through ``SocketOut``. Both enlarge the buffers for bursts of Initials.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

from router import constants as c
from router.udp.batching import enable_gro
from router.udp.flows import Address

log = logging.getLogger("router.udp_router")
"""The router's logger: socket errors keep the name operators filter on."""


class Listener(asyncio.DatagramProtocol):
    """The public socket's protocol; while its send buffer is over the high-water mark, UDP drops."""

    def __init__(self, deliver: Callable[[bytes, Address], None]) -> None:
        self.datagram_received = deliver  # type: ignore[method-assign,assignment]  # the edge's: no frame between
        self.paused = False

    def error_received(self, exc: Exception) -> None:
        log.debug("quic listener socket error: %s", exc)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False


class SocketOut:
    """The public socket's sends when the C splice reads it (no transport): a full buffer drops,
    as UDP drops, and other errors are logged like the transport's."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def sendto(self, data: bytes, addr: Address) -> None:
        try:
            self.sock.sendto(data, addr)
        except BlockingIOError:
            pass
        except OSError as exc:
            log.debug("quic listener socket error: %s", exc)

    def close(self) -> None:
        self.sock.close()


def open_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    """The C splice's public socket: bound, non-blocking, buffers sized, GRO on if offered (the splice
    cuts a GRO batch into its datagrams; asyncio cannot, so the Python listener never has GRO)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
    try:
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(sockaddr)
    except OSError:
        sock.close()
        raise
    _size_buffers(sock)
    enable_gro(sock)
    return sock


def _size_buffers(sock: socket.socket) -> None:
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        with contextlib.suppress(OSError):  # best effort: the kernel clamps or refuses
            sock.setsockopt(socket.SOL_SOCKET, option, c.QUIC_SOCKET_BUFFER_BYTES)


async def open_listener(
    host: str, port: int, reuse_port: bool, deliver: Callable[[bytes, Address], None]
) -> tuple[asyncio.DatagramTransport, Listener]:
    """Bind the public socket and size its buffers; every datagram goes to ``deliver(data, address)``."""
    loop = asyncio.get_running_loop()
    transport, listener = await loop.create_datagram_endpoint(
        lambda: Listener(deliver), local_addr=(host, port), reuse_port=reuse_port or None
    )
    _size_buffers(transport.get_extra_info("socket"))
    return transport, listener
