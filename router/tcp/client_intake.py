"""The TCP edge's first step: who is the client, and may it hold one more connection?

With ``--accept-proxy-protocol`` the socket's peer must be a trusted source, or anyone could claim to be any
client: an untrusted one is closed before a byte is read. The PROXY header is removed, so the pod's byte
stream starts at the client's first byte; the caller bounds the intake by ``--peek-timeout-ms``. A client
with no slot left is refused after the peek, in its own protocol (docs/security.md).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from discovery.targets import host_port
from router.client_limits import ClientCounts, ClientSlots
from router.flag_values import IPNetwork
from router.tcp.first_bytes import PEEK_READ_BYTES
from router.tcp.poller import poller_for, recv
from wire.proxy_protocol import ProxyHeaderError, ProxyHeaderReader, client_address

Peer = tuple[str, int]
"""(host, port) of a socket peer or of the client a PROXY header names."""


class TrustedSources:
    """The socket peers allowed to send a PROXY header; none listed trusts no source (every
    connection is closed unread), so trusting every source takes an explicit ``0.0.0.0/0,::/0``."""

    __slots__ = ("_networks",)

    def __init__(self, networks: Sequence[IPNetwork] = ()) -> None:
        self._networks = tuple(networks)

    def allows(self, host: str) -> bool:
        """True for a host inside a trusted network (an IPv4-mapped IPv6 peer counts as IPv4)."""
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

    client: Peer
    first_bytes: bytes
    via: Peer | None = None
    """The balancer that sent the PROXY header (the socket's peer), if there was one."""
    within_limit: bool = True
    """False when the client already held ``--max-connections-per-client`` connections."""

    def log_fields(self) -> dict[str, str]:
        """``peer`` is always the client; ``via`` the balancer, when one named the client."""
        fields = {"peer": host_port(*self.client)}
        if self.via is not None:
            fields["via"] = host_port(*self.via)
        return fields


async def read_proxy_header(conn: socket.socket, peer: Peer) -> Intake:
    """Read and remove the PROXY header; ``ProxyHeaderError`` if it is missing, malformed or cut.
    One slow byte at a time works (the caller's timeout bounds it)."""
    poller = poller_for(asyncio.get_running_loop())
    reader = ProxyHeaderReader()
    while True:
        data = await recv(poller, conn, PEEK_READ_BYTES)
        if not data:
            raise ProxyHeaderError("connection closed before the end of the PROXY header")
        header = reader.feed(data)
        if header is not None:
            return Intake(client_address(header, peer), reader.remainder, via=peer)


class ClientIntake:
    """Names the client of each TCP connection and counts what each client holds."""

    def __init__(
        self, accept_proxy_protocol: bool, trusted: Sequence[IPNetwork] = (), max_per_client: ClientCounts | int = 0
    ) -> None:
        """``max_per_client``: the limit, counted in this process, or the counts the workers share."""
        self.accept_proxy_protocol = accept_proxy_protocol
        self._trusted = TrustedSources(trusted)
        self.slots = ClientSlots(max_per_client)
        """Held per connection (its socket; on the fast path its ``Connection``); released when it ends."""
        self._unlimited = not self.slots.table.enabled

    async def identify(self, conn: socket.socket, peer: Peer) -> Intake:
        """The connection's client and first bytes; ``ProxyHeaderError`` for an untrusted source
        (nothing read) or a missing, malformed or cut header."""
        if not self.accept_proxy_protocol:
            return self.identify_peer(conn, peer)
        if not self._trusted.allows(peer[0]):
            raise ProxyHeaderError("untrusted PROXY source: closed unread")
        return self._limited(conn, await read_proxy_header(conn, peer))

    def identify_peer(self, owner: object, peer: Peer) -> Intake:
        """``identify`` without a PROXY header: the client is the peer (nothing to wait for).
        ``owner`` holds the slot (the connection's socket, or on the fast path its ``Connection``)."""
        intake = Intake(peer, b"")
        return intake if self._unlimited else self._limited(owner, intake)

    def _limited(self, owner: object, intake: Intake) -> Intake:
        if self.slots.take(owner, intake.client[0]):
            return intake
        return Intake(intake.client, intake.first_bytes, intake.via, within_limit=False)
