"""The TCP edge's task-free path: a TLS connection whose ClientHello came with it.

Why: on the usual connection (a worker's TLS ClientHello, read with the connection) the task,
its coroutine steps, the relay's future and their loop rounds are interpreter time spent on
nothing but waiting (2-4% of a connection's CPU on the bench, 0.96-0.98x; bench/README). Here
the accept callback itself reads the hello, routes, starts the dial and hands both fds to the C
pump (``native_relay``), which waits for the connect if it is still in progress; the pump's end
callback counts and writes the access line. Nothing else differs: the same parse, decision,
dial, relay, metrics, termination causes and access line as ``edge.TcpRouter._serve``. The
connection and the pod are bare fds here (``_relay.accept`` and ``_relay.dial``: no socket
objects, whose constructor asks ``getsockname`` and whose mode an ``ioctl`` sets), the client's
slot is held by the connection's ``Head``, and the engine closes both fds at the end.

Anything else leaves this path as soon as it is seen, with what was read so far (``Head``), for
the edge's task to go on from (``adopt``: a socket object, and the slot moved to it): first
bytes not all there yet, h2c (its SETTINGS exchange and filter), a malformed hello, a client
over its limit, a routing refusal; a dial that fails is answered by a task too. It is used only
when the C pump is there and no PROXY header is expected (``TcpRouter.start``).

The dials of one accept batch go out together (``serve`` queues, ``launch`` dials them all, then
starts their relays). On loopback or the same host, each connect and each first send runs the
pod's side in the caller's system call, waking the pod if it sleeps: an inter-processor wake-up
each, which a VM pays dearly. Back to back, a batch wakes a sleeping pod about once instead of
once per connection (0.95x CPU per connection on the bench; bench/README). A connection's dial
waits at most for the decisions of the rest of its batch (``ACCEPT_BATCH``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from discovery.targets import Target
from router import constants as c
from router.access_log import AccessRecord, Outcome
from router.metric_families import CounterSeries
from router.metrics import ProtocolSeries
from router.outcomes import GrpcOutcome, ProtocolLabel, Termination
from router.routing import Refusal
from router.tcp.client_intake import ClientIntake, Intake
from router.tcp.dial import DialError, dial_error, start_dial
from router.tcp.ending import RelayResult
from router.tcp.first_bytes import FirstBytes, Peeked, Rejected
from router.tcp.relay import Relay

if TYPE_CHECKING:
    from router.tcp._relay import Engine
    from router.tcp.edge import TcpRouterSettings

log = logging.getLogger("router.tcp_router")  # pinned: operators filter logs by this name (the edge's)


@dataclass(slots=True, eq=False)
class Head:
    """A connection's state so far, for the edge's task to go on from (hashed by identity: it
    holds the client's slot on this path)."""

    started: float
    record: AccessRecord
    progress: Peeked
    first: FirstBytes
    intake: Intake | None = None
    """Who the client is, once identified."""
    peeked: Peeked | None = None
    """The peek's result, once complete."""
    failure: Rejected | None = None
    """The first bytes were refused: the task answers."""

    @property
    def who(self) -> dict[str, str]:
        """The log fields naming the client (made only for a line that is written)."""
        return self.intake.log_fields() if self.intake is not None else {"peer": self.record.client}


class Edge(Protocol):
    """What this path uses of ``edge.TcpRouter``."""

    @property
    def settings(self) -> TcpRouterSettings: ...
    @property
    def clients(self) -> ClientIntake: ...
    def series(self, protocol: ProtocolLabel) -> ProtocolSeries: ...
    def outcome_series(self, protocol: ProtocolLabel, outcome: GrpcOutcome) -> CounterSeries: ...
    def open_connection(self, peer: tuple[Any, ...]) -> Head: ...
    def decide(self, peeked: Peeked) -> Target: ...
    def count(self, protocol: ProtocolLabel, outcome: GrpcOutcome) -> None: ...
    def spawn(self, work: Coroutine[Any, Any, None]) -> None: ...
    async def refuse_dial(self, conn: socket.socket, head: Head, peeked: Peeked, rej: Rejected) -> None: ...
    def relay_ended(self, protocol: ProtocolLabel, record: AccessRecord, result: RelayResult) -> None: ...
    def relay_cut(self, protocol: ProtocolLabel, record: AccessRecord) -> None: ...
    def end(
        self, record: AccessRecord, progress: Peeked, outcome: Outcome, termination: Termination,
        answered: tuple[int, int] = (0, 0),
    ) -> None: ...


def read_now(conn: socket.socket | int, first: FirstBytes) -> Peeked | None:
    """Feed ``first`` what the socket (or bare socket fd) holds already, without waiting; None if
    nothing came yet."""
    try:
        data = os.read(conn, c.MAX_PEEK_BYTES) if isinstance(conn, int) else conn.recv(c.MAX_PEEK_BYTES)
    except (BlockingIOError, InterruptedError):
        return None
    return first.feed(data)


@dataclass(slots=True)
class _Dial:
    """A connection decided and waiting for its batch's dials (``FastPath.launch``)."""

    conn: int
    peer: tuple[Any, ...]
    head: Head
    peeked: Peeked
    target: Target
    decided: float


class _Connection:
    """One connection on this path, from its dial to its relay's end."""

    __slots__ = ("accepted", "decided", "head", "path", "peeked", "relay", "target")

    def __init__(
        self, path: FastPath, head: Head, peeked: Peeked, target: Target, decided: float, relay: Relay
    ) -> None:
        self.path, self.head, self.peeked = path, head, peeked
        self.target, self.decided, self.relay = target, decided, relay
        self.accepted = False

    def connected(self) -> None:
        """The pod answered: counted as accepted, as the task's path counts it after its dial."""
        self.accepted = True
        path = self.path
        series = path.series
        series.dial.observe(time.monotonic() - self.decided)
        path.accepted.inc()
        series.active.inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "routing %s connection to %s", ProtocolLabel.TLS, self.target.pod_name,
                extra={**self.head.who, "hostname": self.peeked.hostname, "pod": self.target.pod_name,
                       "outcome": GrpcOutcome.ACCEPTED},
            )

    def ended(self, result: RelayResult) -> None:
        path = self.path
        path.forget(self)
        path.series.active.dec()
        edge = path.edge
        edge.relay_ended(ProtocolLabel.TLS, self.head.record, result)
        edge.clients.slots.release(self.head)
        self.relay.unlink()

    def dial_failed(self, code: int) -> None:
        """Not connected (refused, unreachable, the connect timeout): the task answers the client."""
        path = self.path
        path.forget(self)
        self.head.record.probe = None
        conn = path.adopt(self.relay.take_client(), self.head)
        self.relay.unlink()
        rej = Rejected(Refusal.DIAL_FAILED, str(dial_error(self.target, code)), self.target.pod_name)
        path.edge.spawn(path.edge.refuse_dial(conn, self.head, self.peeked, rej))

    def cut(self) -> None:
        """The drain ran out: cut as the task's path cuts (RST once relaying, else a close)."""
        path, record = self.path, self.head.record
        path.forget(self)
        edge = path.edge
        if self.accepted:
            self.relay.close(reset=True)
            edge.relay_cut(ProtocolLabel.TLS, record)
            edge.series(ProtocolLabel.TLS).active.dec()
        else:
            self.relay.close(reset=False)
            record.probe = None
            edge.end(record, self.head.progress, None, Termination.DRAIN)
        edge.clients.slots.release(self.head)
        self.relay.unlink()


class FastPath:
    """TLS connections relayed without a task (see the module's docstring)."""

    __slots__ = ("_connections", "_dials", "_engine", "_loop", "_native_dial", "accepted", "edge", "idle",
                 "native_accept", "series")

    def __init__(self, edge: Edge, loop: asyncio.AbstractEventLoop, engine: Engine) -> None:
        self.edge = edge
        self.series = edge.series(ProtocolLabel.TLS)
        self.accepted = edge.outcome_series(ProtocolLabel.TLS, GrpcOutcome.ACCEPTED)
        self._loop, self._engine = loop, engine
        from router.tcp._relay import accept, dial  # built: this path exists only with the C relay

        self._native_dial = dial
        self.native_accept = accept
        """The listener's accept for this path: bare non-blocking fds (``Acceptor.start``)."""
        self._dials: list[_Dial] = []
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

    def serve(self, conn: int, peer: tuple[Any, ...]) -> Head | None:
        """Queue the dial of ``conn`` (a bare fd from ``native_accept``) if it is the usual TLS
        connection (``launch`` relays it); else what was read, for the task (``adopt``)."""
        head = self.edge.open_connection(peer)
        try:
            return self._serve(conn, peer, head)
        except Exception:  # a bug must cost one connection, never the listener (as in the task)
            self._failed(conn, peer, head)
            return None

    def _failed(self, conn: int, peer: tuple[Any, ...], head: Head) -> None:
        """A bug before the relay took the sockets: this connection is closed and its line ended."""
        log.exception("unexpected error serving %s", peer)
        os.close(conn)
        self.edge.end(head.record, head.progress, None, Termination.ROUTER_ERROR)
        self.edge.clients.slots.release(head)

    def adopt(self, conn: int, head: Head) -> socket.socket:
        """A socket object for a connection leaving this path (the task goes on with it); its
        client's slot, held by ``head`` here, moves to it."""
        sock = socket.socket(fileno=conn)
        sock.setblocking(False)  # the fd is non-blocking already; the object must know it
        self.edge.clients.slots.move(head, sock)
        return sock

    def _serve(self, conn: int, peer: tuple[Any, ...], head: Head) -> Head | None:
        edge = self.edge
        intake = head.intake = edge.clients.identify_peer(head, (peer[0], peer[1]))
        try:
            peeked = head.peeked = read_now(conn, head.first)
        except Rejected as rej:
            head.failure = rej
            return head
        if peeked is None or peeked.protocol is not ProtocolLabel.TLS or not intake.within_limit:
            return head
        try:
            target = edge.decide(peeked)
        except Rejected:
            return head  # the task decides again (the same snapshot), refuses and answers
        record = head.record
        record.protocol, record.hostname = ProtocolLabel.TLS, peeked.hostname
        record.decided_at = decided = time.monotonic()
        series = self.series
        series.decision.observe(decided - head.started)
        record.pod, record.pod_address = target.pod_name, target.grpc_endpoint
        self._dials.append(_Dial(conn, peer, head, peeked, target, decided))
        return None

    def launch(self) -> None:
        """Dial every connection ``serve`` queued, then start their relays (see the module's docstring)."""
        dials, self._dials = self._dials, []
        ready: list[tuple[_Dial, socket.socket | int, bool]] = []
        edge = self.edge
        for dial in dials:
            try:
                pod, connected = self._dial(dial.target)
            except DialError as exc:
                refused = Rejected(Refusal.DIAL_FAILED, str(exc), dial.target.pod_name)
                edge.spawn(edge.refuse_dial(self.adopt(dial.conn, dial.head), dial.head, dial.peeked, refused))
                continue
            except Exception:  # a bug must cost one connection, never the batch
                self._failed(dial.conn, dial.peer, dial.head)
                continue
            ready.append((dial, pod, connected))
        for dial, pod, connected in ready:
            self._start(dial, pod, connected)

    def _dial(self, target: Target) -> tuple[socket.socket | int, bool]:
        """``start_dial`` in C (the pod's bare fd: no socket object), as long as the address is an
        IP literal; DialError if the connect failed at once."""
        try:
            return self._native_dial(target.address, target.grpc_port)
        except OSError as exc:
            raise dial_error(target, exc.errno or errno.EIO) from None
        except ValueError:  # not an IP literal: Python's resolver
            return start_dial(target)

    def _start(self, dial: _Dial, pod: socket.socket | int, connected: bool) -> None:
        """Hand a dialed connection to the C pump (which waits for the connect if need be)."""
        edge, series = self.edge, self.series
        conn, peer, head, peeked = dial.conn, dial.peer, dial.head, dial.peeked
        record = head.record
        settings = edge.settings
        relay = Relay(
            self._loop, self._engine, conn, pod, settings.use_splice is not False, settings.relay_idle_timeout_s,
            series.count_bytes,
        )
        connection = _Connection(self, head, peeked, dial.target, dial.decided, relay)
        relay.on_result = connection.ended
        self._connections[connection] = None
        self.idle.clear()
        try:
            if connected:
                connection.connected()
                handle = relay.start(peeked.buffered)
            else:
                handle = relay.start_connecting(
                    peeked.buffered, settings.connect_timeout_s, connection.connected, connection.dial_failed
                )
        except Exception:  # a bug, once both sockets are the relay's: both closed, the line ended
            log.exception("unexpected error serving %s", peer)
            self.forget(connection)
            relay.close(reset=True)
            if connection.accepted:
                series.active.dec()
            outcome = GrpcOutcome.RELAY_ERROR if connection.accepted else None
            edge.end(record, head.progress, outcome, Termination.ROUTER_ERROR)
            edge.clients.slots.release(head)
            relay.unlink()
            return None
        if connection in self._connections:  # not over already
            record.probe = handle.probe
        return None

