"""The QUIC edge's public UDP socket: client datagrams in; pod replies and refusals out.

It stays on the event loop's C receive path (``DatagramProtocol``: uvloop hands over a few
dozen datagrams per readiness event) with send and receive buffers enlarged for bursts of
Initials. Its flow control flag tells the pod -> client path when the kernel buffer is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Protocol

from router import constants as c
from router.udp.flow_table import Address

log = logging.getLogger("router.udp_router")
"""The router's logger: socket errors keep the name operators filter on."""


class ClientDatagramSink(Protocol):
    """The edge, which takes every client datagram (looked up per datagram, so it may be wrapped)."""

    def _from_client(self, data: bytes, addr: Address) -> None: ...


class Listener(asyncio.DatagramProtocol):
    """The public socket's protocol; while its send buffer is over the high-water mark, UDP drops."""

    def __init__(self, edge: ClientDatagramSink) -> None:
        self._edge = edge
        self.paused = False

    def datagram_received(self, data: bytes, addr: Address) -> None:
        self._edge._from_client(data, addr)

    def error_received(self, exc: Exception) -> None:
        log.debug("quic listener socket error: %s", exc)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False


async def open_listener(
    host: str, port: int, reuse_port: bool, edge: ClientDatagramSink
) -> tuple[asyncio.DatagramTransport, Listener]:
    """Bind the public socket (SO_REUSEPORT when workers share it) and size its buffers."""
    loop = asyncio.get_running_loop()
    transport, listener = await loop.create_datagram_endpoint(
        lambda: Listener(edge), local_addr=(host, port), reuse_port=reuse_port or None
    )
    sock = transport.get_extra_info("socket")
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        with contextlib.suppress(OSError):  # best effort: the kernel clamps or refuses
            sock.setsockopt(socket.SOL_SOCKET, option, c.QUIC_SOCKET_BUFFER_BYTES)
    return transport, listener
