"""One TCP connection's life, written once for both ways the edge carries it (docs/architecture.md).

Each step (peek, decision, ``connected``, relay end, refusal, bug) counts its metrics and writes its log or
access line here. The edge's task walks the steps awaiting what is missing; ``fast_path`` walks them from its
callbacks and hands a connection it cannot finish to the task, which goes on from the same ``Connection``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from discovery.targets import Target, TargetSnapshot, host_port
from router import constants as c
from router.access_log import AccessLog
from router.access_record import Outcome
from router.hostname import HostnameTemplate
from router.log_limiter import RateLimitedLog
from router.log_text import clip_optional
from router.metrics import RouterMetrics, TcpSeries
from router.outcomes import TCP_PROTOCOLS, DroppedLog, GrpcOutcome, ProtocolLabel, Termination
from router.routing import Refusal, Refused, RoundRobin, route
from router.tcp.client_intake import ClientIntake, Intake
from router.tcp.ending import RelayOutcome, RelayResult
from router.tcp.first_bytes import PEEK_READ_BYTES, FirstBytes, Peeked, Rejected
from router.tcp.rejection import answer_and_close, refusal_detail, rejection_bytes
from wire.client_hello import ClientHelloInfo, parse_client_hello

log = logging.getLogger("router.tcp_router")  # pinned: operators filter logs by this name (the edge's)


def read_now(conn: socket.socket | int, first: FirstBytes) -> Peeked | None:
    """Feed ``first`` what the socket (or bare fd) holds already, without waiting; None while incomplete."""
    try:
        data = os.read(conn, PEEK_READ_BYTES) if isinstance(conn, int) else conn.recv(PEEK_READ_BYTES)
    except (BlockingIOError, InterruptedError):
        return None
    return first.feed(data)


class Connection:
    """One connection's state so far, on either path (hashed by identity: on the task-free path
    it holds the client's slot)."""

    __slots__ = ("accepted", "decided", "failure", "first", "intake", "life", "peeked", "peer", "progress",
                 "record", "series", "started", "target")

    target: Target
    """Set by the decision, with ``decided`` (its time) and ``series`` (its protocol's)."""
    decided: float
    series: TcpSeries

    def __init__(self, life: Connections, peer: tuple[Any, ...]) -> None:
        # h2c until the first bytes say TLS (FirstBytes then updates ``progress.protocol``), so a
        # timeout or a malformed ClientHello is counted (and answered) as TLS.
        progress = self.progress = Peeked(ProtocolLabel.H2C, b"", None)
        self.started = started = time.monotonic()
        self.record = life.access.open(progress.protocol, host_port(peer[0], peer[1]), started)
        self.first = FirstBytes(progress, life.parse_hello)
        self.life, self.peer = life, peer
        self.intake: Intake | None = None
        """Who the client is, once identified."""
        self.peeked: Peeked | None = None
        """The peek's result, once complete."""
        self.failure: Rejected | None = None
        """The first bytes were refused (on the task-free path): the task answers."""
        self.accepted = False

    @property
    def who(self) -> dict[str, str]:
        """The log fields naming the client (made only for a line that is written)."""
        return self.intake.log_fields() if self.intake is not None else {"peer": self.record.client}

    def connected(self) -> None:
        """The pod answered: the dial's time, the accepted outcome, one more active connection."""
        self.accepted = True
        series = self.series
        series.dial.observe(time.monotonic() - self.decided)
        series.outcomes[GrpcOutcome.ACCEPTED].inc()
        series.active.inc()
        if log.isEnabledFor(logging.DEBUG):
            record = self.record
            log.debug(
                "routing %s connection to %s", record.protocol, record.pod,
                extra={**self.who, "hostname": record.hostname, "pod": record.pod, "outcome": GrpcOutcome.ACCEPTED},
            )


class Connections:
    """What every connection of the edge shares (routing inputs, metrics, logs), and each one's steps."""

    def __init__(
        self,
        template: HostnameTemplate,
        snapshot: Callable[[], TargetSnapshot],
        round_robin_paths: frozenset[str],
        metrics: RouterMetrics,
        access: AccessLog,
        clients: ClientIntake,
        parse_hello: Callable[[bytes], ClientHelloInfo] = parse_client_hello,
    ) -> None:
        self.access, self.clients = access, clients
        self.parse_hello = parse_hello
        """How a whole ClientHello is read (``Extensions.parse_client_hello``: C first, or Python)."""
        self._template, self._snapshot, self._round_robin_paths = template, snapshot, round_robin_paths
        self._round_robin = RoundRobin()
        self._series = {p: TcpSeries(metrics, p) for p in TCP_PROTOCOLS}
        self.rejections = RateLimitedLog(log, dropped=metrics.dropped_lines(DroppedLog.REJECTION))

    def series(self, protocol: ProtocolLabel) -> TcpSeries:
        return self._series[protocol]

    def count(self, protocol: ProtocolLabel, outcome: GrpcOutcome) -> None:
        self._series[protocol].outcomes[outcome].inc()

    def decide(self, connection: Connection, peeked: Peeked) -> Target:
        """The pod for a peeked connection (its record and decision histogram updated); ``Rejected``
        for a client over its limit or a routing refusal."""
        record = connection.record
        protocol = record.protocol = peeked.protocol
        record.hostname = clip_optional(peeked.hostname)  # what the line and the live view show: bounded
        intake = connection.intake
        if intake is not None and not intake.within_limit:
            raise Rejected(Refusal.CLIENT_LIMIT, c.REASON_TOO_MANY_CONNECTIONS)
        request = peeked.h2_request
        decision = route(
            peeked.hostname, request.path if request is not None else None, self._snapshot(),
            self._template, self._round_robin, round_robin_paths=self._round_robin_paths, port_of=_grpc_port,
        )
        if isinstance(decision, Refused):
            raise Rejected(decision.refusal, refusal_detail(decision, peeked.hostname), decision.pod_name)
        record.decided_at = decided = time.monotonic()
        series = connection.series = self._series[protocol]
        series.decision.observe(decided - connection.started)
        record.pod, record.pod_address = decision.pod_name, decision.grpc_endpoint
        connection.target, connection.decided = decision, decided
        return decision

    def relay_ended(self, connection: Connection, result: RelayResult) -> None:
        """A relay's end: its outcome counted, its access line (the caller drops the active count)."""
        outcome = (
            GrpcOutcome.RELAY_ERROR if result.outcome is RelayOutcome.RELAY_ERROR else GrpcOutcome.COMPLETED
        )
        record = connection.record
        connection.series.outcomes[outcome].inc()
        record.probe = None
        record.bytes_client_to_pod += result.client_to_pod_bytes
        record.bytes_pod_to_client += result.pod_to_client_bytes
        self.access.end(record, outcome, result.termination, time.monotonic())
        if result.error:
            self.rejections.info("relay ended: %s", result.error, extra={"outcome": outcome})

    def relay_cut(self, connection: Connection) -> None:
        """A relay cut by the drain: what was relayed so far counts."""
        record = connection.record
        connection.series.outcomes[GrpcOutcome.COMPLETED].inc()
        record.settle()
        self.access.end(record, GrpcOutcome.COMPLETED, Termination.DRAIN, time.monotonic())

    def end(
        self, connection: Connection, outcome: Outcome, termination: Termination, answered: tuple[int, int] = (0, 0),
    ) -> None:
        """The access line of a connection that was not relayed (once; a relayed one: ``relay_ended``)."""
        record, progress = connection.record, connection.progress
        if record.ended:
            return
        record.protocol = progress.protocol
        record.bytes_client_to_pod += progress.received + answered[1]
        record.bytes_pod_to_client += progress.answered + answered[0]
        self.access.end(record, outcome, termination, time.monotonic())

    def failed(self, connection: Connection) -> None:
        """A bug costs one connection (closed by the caller), never the listener: logged, line ended."""
        log.exception("unexpected error serving %s", connection.peer)
        self.end(connection, GrpcOutcome.RELAY_ERROR if connection.accepted else None, Termination.ROUTER_ERROR)

    async def refuse(self, conn: socket.socket, connection: Connection, rej: Rejected) -> None:
        """Refuse a peeked connection (routing, client limit, dial): count, log, answer, end."""
        peeked, record = connection.peeked, connection.record
        assert peeked is not None  # refused after its peek
        self.count(peeked.protocol, rej.outcome)
        self.rejections.info(
            "rejected %s connection: %s", peeked.protocol, rej,
            extra={**connection.who, "hostname": clip_optional(peeked.hostname), "pod": rej.pod,
                   "outcome": rej.outcome},
        )
        record.pod, record.decided_at = rej.pod, record.decided_at or time.monotonic()
        answered = await self.answer(conn, peeked, rej)
        dial_failed = rej.refusal is Refusal.DIAL_FAILED
        self.end(connection, rej.outcome, Termination.DIAL_FAILED if dial_failed else Termination.REJECTED, answered)

    async def refuse_dial(self, conn: socket.socket, connection: Connection, rej: Rejected) -> None:
        """``refuse`` for the task-free path's dial, which ran without a task: the slot is released here."""
        try:
            await self.refuse(conn, connection, rej)
        except asyncio.CancelledError:
            conn.close()
            self.end(connection, None, Termination.DRAIN)
            raise
        finally:
            self.clients.slots.release(conn)

    async def answer(self, conn: socket.socket, peeked: Peeked, rej: Rejected) -> tuple[int, int]:
        """Tell the client why, in its own protocol, then close without a RST; ``(sent, read)``."""
        request = peeked.h2_request
        stream_id = request.stream_id if request is not None else 1
        return await answer_and_close(conn, rejection_bytes(peeked.protocol, rej.refusal, stream_id, str(rej)))


def _grpc_port(target: Target) -> int:
    return target.grpc_port
