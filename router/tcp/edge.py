"""The TCP edge: accept worker connections, peek the hostname, dial the pod, splice.

The first bytes decide, with no configuration: a TLS ClientHello is routed by its SNI, an h2c connection by
the ``:authority`` of its first request. This module owns the listener, the timeouts and the order of events
(docs/architecture.md); the usual TLS connection takes ``fast_path`` instead, without a task.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from discovery.targets import TargetSnapshot
from router import constants as c
from router.access_log import AccessLog
from router.client_limits import ClientCounts
from router.extensions import PYTHON, Extensions
from router.flag_values import IPNetwork
from router.hostname import HostnameTemplate
from router.metrics import ProtocolSeries, RouterMetrics
from router.outcomes import GrpcOutcome, ProtocolLabel, Termination
from router.routing import Refusal
from router.tcp.acceptor import Acceptor
from router.tcp.client_intake import ClientIntake
from router.tcp.connection import Connection, Connections, read_now
from router.tcp.dial import DialError, dial
from router.tcp.fast_path import FastPath
from router.tcp.first_bytes import PEEK_READ_BYTES, FirstBytes, Peeked, Rejected
from router.tcp.native_relay import engine_for
from router.tcp.poller import poller_for, recv, sendall
from router.tcp.relay import RelayProbe, relay
from wire.h2_frames import EMPTY_SETTINGS_FRAME
from wire.proxy_protocol import ProxyHeaderError
from wire.settings_ack import SettingsAckStripper

log = logging.getLogger("router.tcp_router")  # pinned: operators filter logs by this name

@dataclass(frozen=True, slots=True)
class TcpRouterSettings:
    connect_timeout_s: float = c.DEFAULT_CONNECT_TIMEOUT_MS / 1000
    relay_idle_timeout_s: float = c.DEFAULT_RELAY_IDLE_TIMEOUT_MS / 1000
    peek_timeout_s: float = c.DEFAULT_PEEK_TIMEOUT_MS / 1000
    round_robin_paths: frozenset[str] = frozenset(c.DEFAULT_ROUND_ROBIN_PATHS)
    use_splice: bool | None = None
    accept_proxy_protocol: bool = c.DEFAULT_ACCEPT_PROXY_PROTOCOL
    proxy_protocol_trusted_cidrs: tuple[IPNetwork, ...] = c.DEFAULT_PROXY_PROTOCOL_TRUSTED_CIDRS
    """The sources allowed to send a PROXY header; empty: none (every PROXY connection closed unread)."""
    max_connections_per_client: int = c.DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    client_counts: ClientCounts | None = None
    """Where connections per client are counted: None, in this process; else the workers' table (same limit)."""
    defer_accept: bool = c.DEFAULT_TCP_DEFER_ACCEPT == "on"
    """The listener hands over connections once their first bytes came (``--tcp-defer-accept``)."""
    extensions: Extensions = PYTHON
    """The C extensions the edge uses (pump, batched accept and dial, ClientHello), chosen once by the process."""

    def __post_init__(self) -> None:
        self.extensions.require()


class TcpRouter:
    """Routes each accepted TCP connection to the pod its hostname names."""

    def __init__(
        self,
        settings: TcpRouterSettings,
        template: HostnameTemplate,
        snapshot: Callable[[], TargetSnapshot],
        metrics: RouterMetrics,
        access: AccessLog | None = None,
    ) -> None:
        self._settings = settings
        self._clients = ClientIntake(
            settings.accept_proxy_protocol, settings.proxy_protocol_trusted_cidrs,
            settings.max_connections_per_client if settings.client_counts is None else settings.client_counts,
        )
        self.connections = Connections(
            template, snapshot, settings.round_robin_paths, metrics,
            access if access is not None else AccessLog(metrics), self._clients, settings.extensions.parse_client_hello,
        )
        self._acceptor = Acceptor(self._on_connection)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fast: FastPath | None = None  # the task-free path of TLS (C pump, no PROXY header)

    @property
    def active_connections(self) -> int:
        return len(self._tasks) + (self._fast.live if self._fast is not None else 0)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._loop = asyncio.get_running_loop()
        settings = self._settings
        engine = engine_for(self._loop, settings.extensions.tcp_pump)
        defer_s = c.TCP_DEFER_ACCEPT_S if settings.defer_accept else 0
        if engine is None or settings.accept_proxy_protocol:
            return self._acceptor.start(host, port, defer_accept_s=defer_s)
        fast = self._fast = FastPath(
            self.connections, self.spawn, self._loop, engine, splice=settings.use_splice is not False,
            idle_timeout_s=settings.relay_idle_timeout_s, connect_timeout_s=settings.connect_timeout_s,
        )
        return self._acceptor.start(
            host, port, defer_accept_s=defer_s, native_accept=fast.native_accept, on_batch_end=fast.launch
        )

    @property
    def clients(self) -> ClientIntake:
        return self._clients

    def series(self, protocol: ProtocolLabel) -> ProtocolSeries:
        return self.connections.series(protocol)

    @property
    def pump(self) -> str:
        """Which pump relays TLS connections (h2c's is always Python's): ``c`` or ``python``."""
        assert self._loop is not None, "started"
        return "c" if engine_for(self._loop, self._settings.extensions.tcp_pump) is not None else "python"

    def stop_accepting(self) -> None:
        self._acceptor.stop()

    async def drain(self, timeout_s: float) -> None:
        """Let open connections finish for ``timeout_s``, then cut the rest."""
        waits: set[asyncio.Future[Any]] = set(self._tasks)
        if self._fast is not None and self._fast.live:
            waits.add(asyncio.ensure_future(self._fast.idle.wait()))
        if waits:
            await asyncio.wait(waits, timeout=timeout_s)
            for waiting in waits - self._tasks:
                waiting.cancel()
        await self.close()

    async def close(self) -> None:
        self.stop_accepting()
        if self._fast is not None:
            self._fast.cut_all()
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)

    def _on_connection(self, conn: socket.socket | int, peer: Any) -> None:
        """An accepted connection: a bare fd when the fast path accepts (``FastPath.native_accept``)."""
        connection = None
        if isinstance(conn, int):
            assert self._fast is not None  # its accept is the only one handing over bare fds
            if (connection := self._fast.serve(conn, peer)) is None:
                return  # to be relayed at the batch's end (or being refused) without a task
            conn = self._fast.adopt(conn, connection)
        self.spawn(self._serve(conn, peer, connection))

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run one connection's ``work`` as a task the drain waits for (and cancels at its end)."""
        assert self._loop is not None
        task = self._loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- one connection --------------------------------------------------------------------
    async def _serve(self, conn: socket.socket, peer: tuple[Any, ...], connection: Connection | None = None) -> None:
        life = self.connections
        if connection is None:
            connection = Connection(life, peer)
        record, progress, first = connection.record, connection.progress, connection.first
        intake = connection.intake  # who the client is, once known (after the PROXY header)
        peeked = connection.peeked
        try:
            try:
                if connection.failure is not None:  # what the fast path read was refused: answered here
                    raise connection.failure
                if intake is None and not self._clients.accept_proxy_protocol:
                    # The client is the peer (identify does not suspend then), and its hello
                    # usually came with the connection: read it at once, and arm the peek
                    # timeout (and suspend) only when something is still missing.
                    intake = connection.intake = await self._clients.identify(conn, (peer[0], peer[1]))
                    peeked = read_now(conn, first)
                if peeked is None or first.settings_due:
                    async with asyncio.timeout(self._settings.peek_timeout_s):  # no extra task, unlike wait_for
                        if intake is None:
                            intake = connection.intake = await self._clients.identify(conn, (peer[0], peer[1]))
                            record.client = connection.who["peer"]
                            if intake.first_bytes:
                                peeked = first.feed(intake.first_bytes)
                        peeked = await self._peek(conn, first, peeked)
            except TimeoutError:  # before the PROXY header's end the bytes are not the client's
                outcome = GrpcOutcome.PEEK_TIMEOUT if intake is not None else GrpcOutcome.PROTOCOL_ERROR
                life.count(progress.protocol, outcome)
                life.rejections.info("peek timeout", extra={**connection.who, "outcome": outcome})
                conn.close()
                life.end(connection, outcome, Termination.PEEK_TIMEOUT)
                return
            except ProxyHeaderError as exc:  # untrusted source, missing or malformed header: unanswered
                life.count(progress.protocol, GrpcOutcome.PROTOCOL_ERROR)
                life.rejections.info(
                    "rejected: %s", exc, extra={**connection.who, "outcome": GrpcOutcome.PROTOCOL_ERROR}
                )
                conn.close()
                life.end(connection, GrpcOutcome.PROTOCOL_ERROR, Termination.REJECTED)
                return
            except Rejected as rej:  # unparsable first bytes
                life.count(progress.protocol, rej.outcome)
                life.rejections.info("rejected: %s", rej, extra={**connection.who, "outcome": rej.outcome})
                answered = await life.answer(conn, progress, rej)  # TLS: decode_error; h2c: closed
                ending = Termination.CLIENT_CLOSE if progress.closed_early else Termination.REJECTED
                life.end(connection, rej.outcome, ending, answered)
                return
            connection.peeked = peeked
            try:
                target = life.decide(connection, peeked)
                try:
                    pod = await dial(target, self._settings.connect_timeout_s)
                except DialError as exc:
                    raise Rejected(Refusal.DIAL_FAILED, str(exc), target.pod_name) from None
            except Rejected as rej:
                await life.refuse(conn, connection, rej)
                return
            connection.connected()
            await self._splice(conn, pod, connection, peeked)
        except asyncio.CancelledError:  # the drain ran out (or the router is closing): cut
            conn.close()
            life.end(connection, None, Termination.DRAIN)  # a spliced one was ended by _splice
            raise
        except Exception:  # a bug must cost one connection, never the listener
            conn.close()
            life.failed(connection)
        finally:
            self._clients.slots.release(conn)  # the connection's slot, if it took one

    async def _peek(self, conn: socket.socket, first: FirstBytes, peeked: Peeked | None) -> Peeked:
        """Wait for the rest of the first request, answering h2c's preface with SETTINGS."""
        assert self._loop is not None
        poller = poller_for(self._loop)
        while True:
            if first.settings_due:
                # grpcio waits for the server's SETTINGS before its first HEADERS.
                await sendall(poller, conn, EMPTY_SETTINGS_FRAME)
                first.settings_due = False
                first.progress.answered += len(EMPTY_SETTINGS_FRAME)
            if peeked is not None:
                return peeked
            # Every way here has just read the socket dry (or found it empty): wait, then read,
            # not a read that would only say EAGAIN (level-triggered: bytes already there wake at once).
            await poller.wait(conn.fileno())
            peeked = first.feed(await recv(poller, conn, PEEK_READ_BYTES))

    async def _splice(self, conn: socket.socket, pod: socket.socket, connection: Connection, peeked: Peeked) -> None:
        """Relay an accepted connection (counted active by ``connected``) until its end, and count that."""
        record = connection.record
        active = connection.series.active
        try:
            stripper = SettingsAckStripper() if peeked.protocol is ProtocolLabel.H2C else None
            client_filter: Callable[[bytes], bytes] | None = None
            if stripper is not None:
                feed = stripper.feed

                def client_filter(data: bytes) -> bytes:  # what the client sent counts, stripped or not
                    out = feed(data)
                    record.bytes_client_to_pod += len(data) - len(out)
                    return out

            def on_start(probe: RelayProbe) -> None:
                record.probe = probe

            record.bytes_pod_to_client = connection.progress.answered
            result = await relay(
                conn, pod,
                initial_to_pod=peeked.buffered,
                client_filter=client_filter,
                client_filter_done=(lambda: stripper.done) if stripper is not None else None,
                idle_timeout_s=self._settings.relay_idle_timeout_s,
                on_bytes=connection.series.count_bytes,
                use_splice=self._settings.use_splice,
                native=self._settings.extensions.tcp_pump,
                on_start=on_start,
                loop=self._loop,
            )
        except asyncio.CancelledError:  # cut by the drain: what was relayed so far counts
            self.connections.relay_cut(connection)
            raise
        finally:
            active.dec()
        self.connections.relay_ended(connection, result)
