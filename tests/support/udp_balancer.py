"""A UDP balancer on loopback in front of router replicas, as a Gateway's UDP proxy (Envoy) is.

It keys a session by the client's address. A new session goes to the next replica in turn (round
robin over ``replicas``), through its own upstream socket, so a replica sees each session as a new
client address; datagrams go both ways through it. A session without datagrams for ``idle_s`` is
forgotten (Envoy's UDP proxy: 60 s), so the client's next datagram opens a new session, on the next
replica. ``remove`` takes a replica out (as a Gateway takes out a terminating endpoint): its
sessions are forgotten too, and their clients' next datagrams go to the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, field
from typing import Any

from tests.support.polling import deliberate_pause

Address = tuple[Any, ...]


@dataclass(eq=False)
class Session:
    client: Address
    replica: Address
    sock: socket.socket
    last_active: float
    datagrams: list[int] = field(default_factory=lambda: [0, 0])
    """Datagrams client -> replica, replica -> client."""


class UdpBalancer(asyncio.DatagramProtocol):
    """Sessions by client address, each new one on the next replica; idle ones forgotten."""

    def __init__(self, replicas: list[Address], idle_s: float) -> None:
        self.replicas = list(replicas)
        self.idle_s = idle_s
        self.sessions: dict[Address, Session] = {}
        self.picked: list[Address] = []
        """The replica of every session opened, in order."""
        self._next = 0
        self._transport: Any = None
        """The front socket's datagram transport (whichever class the loop makes)."""
        self._loop = asyncio.get_running_loop()
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str = "127.0.0.1") -> Address:
        transport, _ = await self._loop.create_datagram_endpoint(lambda: self, local_addr=(host, 0))
        self._sweeper = self._loop.create_task(self._sweep())
        return tuple(transport.get_extra_info("sockname"))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def datagram_received(self, data: bytes, addr: Address) -> None:
        session = self.sessions.get(addr)
        if session is None:
            session = self._open(addr)
        session.last_active = self._loop.time()
        session.datagrams[0] += 1
        with contextlib.suppress(OSError):  # a replica gone: dropped, as UDP drops
            session.sock.send(data)

    def _open(self, client: Address) -> Session:
        replica = self.replicas[self._next % len(self.replicas)]
        self._next += 1
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
        sock.connect(replica)
        session = self.sessions[client] = Session(client, replica, sock, self._loop.time())
        self._loop.add_reader(sock.fileno(), self._from_replica, session)
        self.picked.append(replica)
        return session

    def _from_replica(self, session: Session) -> None:
        while True:
            try:
                data = session.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # ECONNREFUSED: the replica is gone
                return
            session.last_active = self._loop.time()
            session.datagrams[1] += 1
            if self._transport is not None:
                self._transport.sendto(data, session.client)

    def _forget(self, session: Session) -> None:
        if self.sessions.get(session.client) is session:
            del self.sessions[session.client]
        self._loop.remove_reader(session.sock.fileno())
        session.sock.close()

    def remove(self, replica: Address) -> None:
        """Take ``replica`` out: its sessions are forgotten, new ones go to the others."""
        self.replicas.remove(replica)
        for session in [s for s in self.sessions.values() if s.replica == replica]:
            self._forget(session)

    def add(self, replica: Address) -> None:
        self.replicas.append(replica)

    async def _sweep(self) -> None:
        while True:
            await deliberate_pause(self.idle_s / 4, "the balancer's sweep period, as a real one ticks")
            now = self._loop.time()
            for session in [s for s in self.sessions.values() if now - s.last_active >= self.idle_s]:
                self._forget(session)

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for session in list(self.sessions.values()):
            self._forget(session)
        if self._transport is not None:
            self._transport.close()
