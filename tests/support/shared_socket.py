"""One UDP socket, several real aioquic client connections: a QUIC endpoint as quinn's ``Endpoint`` is.

aioquic's ``connect`` gives each connection its own socket. Here one ``SharedSocket`` owns the
socket and hands each datagram to the connection whose connection IDs it carries (its
Destination Connection ID is one the connection issued: aioquic's ``_host_cids``), as a QUIC
endpoint demultiplexes; every connection is a stock ``QuicConnectionProtocol`` sending through
the shared transport. ``rebind`` moves them all to a new local port at once, as a NAT rebinding
or quinn's ``Endpoint::rebind`` does.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aioquic.asyncio import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from quic.packet import long_header_cids

HOST_CID_BYTES = 8
"""aioquic's connection ID length (``QuicConfiguration.connection_id_length``): a short header's DCID."""


class SharedSocket(asyncio.DatagramProtocol):
    """The socket's protocol: demultiplexes datagrams to the connections opened on it."""

    def __init__(self) -> None:
        self.transport: Any = None
        """The socket's transport (a datagram transport, whichever the loop makes)."""
        self.connections: list[QuicConnectionProtocol] = []
        self.unmatched = 0
        """Datagrams that named no connection of this endpoint (another connection's, or a stranger's)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        dcid = long_header_cids(data)[0] if data and data[0] & 0x80 else data[1 : 1 + HOST_CID_BYTES]
        for protocol in self.connections:
            if any(issued.cid == dcid for issued in protocol._quic._host_cids):
                protocol.datagram_received(data, addr)
                return
        self.unmatched += 1

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    async def connect(self, address: tuple[str, int], configuration: QuicConfiguration) -> QuicConnectionProtocol:
        """A new connection from this socket to ``address``, once its handshake is done."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        protocol = QuicConnectionProtocol(QuicConnection(configuration=configuration))
        protocol.connection_made(self.transport)
        self.connections.append(protocol)
        protocol._quic.connect(address, now=loop.time())
        protocol.transmit()
        await protocol.wait_connected()
        return protocol

    async def rebind(self, host: str) -> None:
        """Every connection moves to a new local port at once; the old socket is closed."""
        old = self.transport
        await asyncio.get_running_loop().create_datagram_endpoint(lambda: self, local_addr=(host, 0))
        for protocol in self.connections:
            protocol.connection_made(self.transport)
        if old is not None:
            old.close()

    def close(self) -> None:
        """Close every connection (their CONNECTION_CLOSE goes out), then the socket."""
        for protocol in self.connections:
            protocol.close()
        if self.transport is not None:
            self.transport.close()


async def open_shared_socket(host: str, port: int = 0) -> SharedSocket:
    """A bound ``SharedSocket`` on ``host:port`` (0: any port)."""
    _, shared = await asyncio.get_running_loop().create_datagram_endpoint(SharedSocket, local_addr=(host, port))
    return shared
