"""The TCP edge's first step with ``--accept-proxy-protocol``: who is the client?

Two checks before the TLS / h2c peek. The socket's peer must be a trusted source
(``--proxy-protocol-trusted-cidrs``): anyone else could claim to be any client, so such a
connection is closed before a byte is read. Then the PROXY header is read off the socket
(``router.tcp.proxy_protocol``, sans-IO) and removed: what follows it is the client's
first bytes, handed to the peek, and the pod's byte stream starts there. The caller bounds
the whole intake with ``--peek-timeout-ms``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from router import constants as c
from router.config import IPNetwork
from router.tcp.proxy_protocol import ProxyHeaderError, ProxyHeaderReader, client_address


class TrustedSources:
    """The socket peers allowed to send a PROXY header; none listed means every source."""

    __slots__ = ("_networks",)

    def __init__(self, networks: Sequence[IPNetwork] = ()) -> None:
        self._networks = tuple(networks)

    def allows(self, host: str) -> bool:
        """True for a host inside a trusted network (an IPv4-mapped IPv6 peer counts as IPv4)."""
        if not self._networks:
            return True
        try:
            address = ipaddress.ip_address(host.partition("%")[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self._networks)


@dataclass(frozen=True, slots=True)
class Intake:
    """The client a connection stands for, and the client's first bytes already read."""

    client: tuple[str, int]
    first_bytes: bytes


async def read_proxy_header(conn: socket.socket, peer: tuple[str, int]) -> Intake:
    """Read and remove the PROXY header; ``ProxyHeaderError`` if it is missing, malformed or cut.

    Reads at most what the peek would (``MAX_PEEK_BYTES``); the header is found incrementally,
    so one slow byte at a time works (the caller's timeout bounds it).
    """
    loop = asyncio.get_running_loop()
    reader = ProxyHeaderReader()
    while True:
        data = await loop.sock_recv(conn, c.MAX_PEEK_BYTES)
        if not data:
            raise ProxyHeaderError("connection closed before the end of the PROXY header")
        header = reader.feed(data)
        if header is not None:
            return Intake(client_address(header, peer), reader.remainder)
