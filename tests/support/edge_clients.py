"""Clients that come from a chosen loopback address: raw TCP (send it ``tests.support.tls``'s real
ClientHellos), aioquic.

Per-client limits and "who is the client" tests need several distinct client addresses on one
machine; every 127.0.0.x is local, so a socket bound to one before connecting is that client.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aioquic.asyncio import QuicConnectionProtocol
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, QuicEvent

from router.demo.quic_pods import WHOAMI, client_configuration, request

TLS_ALERT_RECORD = b"\x15\x03\x03\x00\x02\x02"
"""A fatal alert record's first 6 bytes; the 7th is the alert description."""


def tcp_from(source_ip: str, port: int, timeout_s: float = 10.0) -> socket.socket:
    """A TCP connection to 127.0.0.1:``port`` whose source address is ``source_ip``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source_ip, 0))
    sock.settimeout(timeout_s)
    sock.connect(("127.0.0.1", port))
    return sock


def read_some(sock: socket.socket, timeout_s: float = 10.0) -> bytes:
    """The first bytes the peer sends (b"" if it closes or resets first)."""
    sock.settimeout(timeout_s)
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""


class _Recorder(QuicConnectionProtocol):
    """Keeps the CONNECTION_CLOSE that ended the connection (aioquic only raises ConnectionError)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.terminated: ConnectionTerminated | None = None

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ConnectionTerminated):
            self.terminated = event
        super().quic_event_received(event)


@dataclass
class QuicFrom:
    """One aioquic client connection from ``source_ip``; ``close()`` when done."""

    protocol: _Recorder
    transport: asyncio.DatagramTransport

    @property
    def close_reason(self) -> str:
        return self.protocol.terminated.reason_phrase if self.protocol.terminated else ""

    async def whoami(self, timeout_s: float = 5.0) -> str:
        answer = await request(self.protocol, WHOAMI, timeout_s)
        return answer.partition(b":")[0].decode()

    def close(self) -> None:
        self.protocol.close()
        self.transport.close()


async def quic_from(
    source_ip: str, port: int, server_name: str, cafile: Path, timeout_s: float = 5.0
) -> QuicFrom:
    """Connect from ``source_ip`` to 127.0.0.1:``port``; a refused connection is returned closed
    (``close_reason`` says why) instead of raising."""
    loop = asyncio.get_running_loop()
    connection = QuicConnection(configuration=client_configuration(server_name, cafile))
    protocol = _Recorder(connection)
    transport, _ = await loop.create_datagram_endpoint(lambda: protocol, local_addr=(source_ip, 0))
    client = QuicFrom(protocol, transport)
    connection.connect(("127.0.0.1", port), now=loop.time())
    protocol.transmit()
    try:
        await asyncio.wait_for(protocol.wait_connected(), timeout_s)
    except ConnectionError:
        transport.close()
    return client
