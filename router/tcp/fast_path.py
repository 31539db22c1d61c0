"""The TCP edge's task-free path: a TLS connection whose ClientHello came with it (docs/architecture.md).

A task, its coroutine steps and loop rounds are interpreter time spent only waiting (bench/README.md), so
the accept callback reads the hello, routes, dials and hands both bare fds to the C pump (no socket objects:
each costs a ``getsockname`` and an ``ioctl``). Every step is ``connection``'s, so both paths count and log
alike. Anything else (bytes missing, h2c, a refusal, a failed dial) goes on in the edge's task (``adopt``).
An accept batch is dialled together: a same-host pod's side of each connect runs in the caller's system call,
and back to back they wake a sleeping pod about once; a dial waits at most for its batch's decisions.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from discovery.targets import Target
from router.outcomes import ProtocolLabel, Termination
from router.routing import Refusal
from router.tcp.connection import Connection, Connections, read_now
from router.tcp.dial import DialError, dial_error, start_dial
from router.tcp.ending import RelayResult
from router.tcp.first_bytes import Peeked, Rejected
from router.tcp.relay_policy import Relay

if TYPE_CHECKING:
    from router.tcp._relay import Engine


class _Connection(Connection):
    """A connection on this path, from its accept to its relay's end."""

    __slots__ = ("conn", "path", "relay")

    conn: int
    """The client's bare fd, until the relay holds it."""
    path: FastPath
    relay: Relay

    def ended(self, result: RelayResult) -> None:
        path = self.path
        path.forget(self)
        self.series.active.dec()
        life = self.life
        life.relay_ended(self, result)
        life.clients.slots.release(self)
        self.relay.unlink()

    def dial_failed(self, code: int) -> None:
        """Not connected (refused, unreachable, the connect timeout): the task answers the client."""
        path = self.path
        path.forget(self)
        self.record.probe = None
        conn = path.adopt(self.relay.take_client(), self)
        self.relay.unlink()
        target = self.target
        path.spawn(self.life.refuse_dial(conn, self, Rejected(
            Refusal.DIAL_FAILED, str(dial_error(target, code)), target.pod_name)))

    def cut(self) -> None:
        """The drain ran out: cut as the task's path cuts (RST once relaying, else a close)."""
        self.path.forget(self)
        life = self.life
        if self.accepted:
            self.relay.close(reset=True)
            life.relay_cut(self)
            self.series.active.dec()
        else:
            self.relay.close(reset=False)
            self.record.probe = None
            life.end(self, None, Termination.DRAIN)
        life.clients.slots.release(self)
        self.relay.unlink()


class FastPath:
    """TLS connections relayed without a task (see the module's docstring)."""

    __slots__ = ("_connect_timeout_s", "_connections", "_dials", "_engine", "_idle_timeout_s", "_loop",
                 "_native_dial", "_splice", "idle", "life", "native_accept", "spawn")

    def __init__(
        self,
        life: Connections,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        loop: asyncio.AbstractEventLoop,
        engine: Engine,
        *,
        splice: bool,
        idle_timeout_s: float,
        connect_timeout_s: float,
    ) -> None:
        self.life, self.spawn = life, spawn
        """``spawn``: runs a connection's coroutine as one of the edge's tasks (a refusal's answer)."""
        self._loop, self._engine = loop, engine
        self._splice, self._idle_timeout_s, self._connect_timeout_s = splice, idle_timeout_s, connect_timeout_s
        from router.tcp._relay import accept, dial  # built: this path exists only with the C relay

        self._native_dial = dial
        self.native_accept = accept
        """The listener's accept for this path: bare non-blocking fds (``Acceptor.start``)."""
        self._dials: list[tuple[_Connection, Peeked]] = []
        """Decided, to dial at the accept batch's end (``launch``)."""
        self._connections: dict[_Connection, None] = {}
        self.idle = asyncio.Event()
        """Set while no connection is on this path (the drain waits for it)."""
        self.idle.set()

    @property
    def live(self) -> int:
        return len(self._connections)

    def forget(self, connection: _Connection) -> None:
        self._connections.pop(connection, None)
        if not self._connections:
            self.idle.set()

    def cut_all(self) -> None:
        for connection in list(self._connections):
            connection.cut()

    def serve(self, conn: int, peer: tuple[Any, ...]) -> Connection | None:
        """Queue the dial of ``conn`` (a bare fd from ``native_accept``) if it is the usual TLS
        connection (``launch`` relays it); else what was read, for the task (``adopt``)."""
        connection = _Connection(self.life, peer)
        connection.path, connection.conn = self, conn
        try:
            return self._serve(connection)
        except Exception:  # a bug must cost one connection, never the listener (as in the task)
            self._failed(connection)
            return None

    def _failed(self, connection: _Connection) -> None:
        """A bug before the relay took the sockets: this connection is closed and its line ended."""
        os.close(connection.conn)
        self.life.failed(connection)
        self.life.clients.slots.release(connection)

    def adopt(self, conn: int, connection: Connection) -> socket.socket:
        """A socket object for a connection leaving this path, for the task; the client's slot moves to it."""
        sock = socket.socket(fileno=conn)
        sock.setblocking(False)  # the fd is non-blocking already; the object must know it
        self.life.clients.slots.move(connection, sock)
        return sock

    def _serve(self, connection: _Connection) -> Connection | None:
        life, peer = self.life, connection.peer
        connection.intake = life.clients.identify_peer(connection, (peer[0], peer[1]))
        try:
            peeked = connection.peeked = read_now(connection.conn, connection.first)
        except Rejected as rej:
            connection.failure = rej
            return connection
        if peeked is None or peeked.protocol is not ProtocolLabel.TLS:
            return connection
        try:
            life.decide(connection, peeked)
        except Rejected:
            return connection  # the task decides again (the same snapshot), refuses and answers
        self._dials.append((connection, peeked))
        return None

    def launch(self) -> None:
        """Dial every connection ``serve`` queued, then start their relays (see the module's docstring)."""
        dials, self._dials = self._dials, []
        ready: list[tuple[_Connection, Peeked, socket.socket | int, bool]] = []
        for connection, peeked in dials:
            try:
                pod, connected = self._dial(connection.target)
            except DialError as exc:
                refused = Rejected(Refusal.DIAL_FAILED, str(exc), connection.target.pod_name)
                self.spawn(self.life.refuse_dial(self.adopt(connection.conn, connection), connection, refused))
                continue
            except Exception:  # a bug must cost one connection, never the batch
                self._failed(connection)
                continue
            ready.append((connection, peeked, pod, connected))
        for connection, peeked, pod, connected in ready:
            self._start(connection, peeked, pod, connected)

    def _dial(self, target: Target) -> tuple[socket.socket | int, bool]:
        """``start_dial`` in C (the pod's bare fd: no socket object), as long as the address is an
        IP literal; DialError if the connect failed at once."""
        try:
            return self._native_dial(target.address, target.grpc_port)
        except OSError as exc:
            raise dial_error(target, exc.errno or errno.EIO) from None
        except ValueError:  # not an IP literal: Python's resolver
            return start_dial(target)

    def _start(self, connection: _Connection, peeked: Peeked, pod: socket.socket | int, connected: bool) -> None:
        """Hand a dialed connection to the C pump (which waits for the connect if need be)."""
        relay = connection.relay = Relay(
            self._loop, self._engine, connection.conn, pod, self._splice, self._idle_timeout_s,
            connection.series.count_bytes,
        )
        relay.on_result = connection.ended
        self._connections[connection] = None
        self.idle.clear()
        try:
            if connected:
                connection.connected()
                handle = relay.start(peeked.buffered)
            else:
                handle = relay.start_connecting(
                    peeked.buffered, self._connect_timeout_s, connection.connected, connection.dial_failed
                )
        except Exception:  # a bug, once both sockets are the relay's: both closed, the line ended
            self.forget(connection)
            relay.close(reset=True)
            if connection.accepted:
                connection.series.active.dec()
            self.life.failed(connection)
            self.life.clients.slots.release(connection)
            relay.unlink()
            return
        if connection in self._connections:  # not over already
            connection.record.probe = handle.probe
