"""A NAT rebinding, as a client sees none of it: its QUIC connection goes on from a new UDP port."""

from __future__ import annotations

import asyncio
import socket

from aioquic.asyncio.protocol import QuicConnectionProtocol


async def rebind(client: QuicConnectionProtocol) -> asyncio.DatagramTransport:
    """Move ``client`` to a new local port (the QUIC state stays); the old socket is closed.
    The new socket is dual-stack, as ``aioquic.asyncio.connect``'s is."""
    old = client._transport
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", 0, 0, 0))
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(lambda: client, sock=sock)
    if old is not None:
        old.close()
    return transport
