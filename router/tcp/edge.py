"""The TCP edge: accept worker connections, peek the hostname, dial the pod, splice.

The first bytes decide, with no configuration: a TLS ClientHello is routed by its SNI, an HTTP/2
prior-knowledge (h2c) connection by the ``:authority`` of its first request. The parsers are
sans-IO (``first_bytes`` over ``tls_peek``, ``h2c_peek``), the choice of pod is ``router.routing``'s;
this module owns the listener, the timeouts and the order of events: ``client_intake`` (the PROXY
header, the per-client slot), peek, decide, ``dial``, then ``relay`` (``settings_ack`` for h2c) or
``rejection``; the usual TLS connection takes ``fast_path`` instead, without a task.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from discovery.targets import Target, TargetSnapshot, host_port
from router import constants as c
from router.access_log import AccessLog
from router.access_record import AccessRecord, Outcome
from router.config import IPNetwork
from router.extensions import Extensions, choose
from router.hostname import HostnameTemplate
from router.log_limiter import RateLimitedLog
from router.metric_families import CounterSeries
from router.metrics import ProtocolSeries, RouterMetrics, TcpSeries
from router.outcomes import TCP_PROTOCOLS, GrpcOutcome, ProtocolLabel, Termination
from router.routing import Refusal, Refused, RoundRobin, route
from router.tcp.acceptor import Acceptor
from router.tcp.client_intake import ClientIntake
from router.tcp.dial import DialError, dial
from router.tcp.fast_path import FastPath, Head, read_now
from router.tcp.first_bytes import PEEK_READ_BYTES, FirstBytes
from router.tcp.first_bytes import Peeked as _Peeked  # edge-private names kept
from router.tcp.first_bytes import Rejected as _Rejected
from router.tcp.native_relay import engine_for
from router.tcp.poller import poller_for, recv, sendall
from router.tcp.rejection import answer_and_close, refusal_detail, rejection_bytes
from router.tcp.relay import RelayOutcome, RelayProbe, RelayResult, relay
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
    proxy_protocol_trusted_cidrs: tuple[IPNetwork, ...] = ()
    """Empty: every source may send a PROXY header."""
    max_connections_per_client: int = c.DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    defer_accept: bool = c.DEFAULT_TCP_DEFER_ACCEPT == "on"
    """The listener hands over connections once their first bytes came (``--tcp-defer-accept``)."""
    extensions: Extensions = field(default_factory=choose)
    """Which C extensions the edge uses: the pump (with the batched accept and dial of the usual
    TLS connection) and the ClientHello reading (``router.extensions``; the process chooses once)."""

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
        self._access = access if access is not None else AccessLog(metrics)
        self._template = template
        self._snapshot = snapshot
        self._metrics = metrics
        self._series = {p: TcpSeries(metrics, p) for p in TCP_PROTOCOLS}
        self._rejections = RateLimitedLog(log)
        self._clients = ClientIntake(
            settings.accept_proxy_protocol, settings.proxy_protocol_trusted_cidrs, settings.max_connections_per_client
        )
        self._acceptor = Acceptor(self._on_connection)
        self._tasks: set[asyncio.Task[None]] = set()
        self._round_robin = RoundRobin()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fast: FastPath | None = None  # the task-free path of TLS (C pump, no PROXY header)

    @property
    def active_connections(self) -> int:
        return len(self._tasks) + (self._fast.live if self._fast is not None else 0)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._loop = asyncio.get_running_loop()
        engine = engine_for(self._loop, self._settings.extensions.tcp_pump)
        defer_s = c.TCP_DEFER_ACCEPT_S if self._settings.defer_accept else 0
        if engine is None or self._settings.accept_proxy_protocol:
            return self._acceptor.start(host, port, defer_accept_s=defer_s)
        fast = self._fast = FastPath(self, self._loop, engine)
        return self._acceptor.start(
            host, port, defer_accept_s=defer_s, native_accept=fast.native_accept, on_batch_end=fast.launch
        )

    @property
    def settings(self) -> TcpRouterSettings:
        return self._settings

    @property
    def clients(self) -> ClientIntake:
        return self._clients

    def series(self, protocol: ProtocolLabel) -> ProtocolSeries:
        return self._series[protocol]

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
        head = None
        if isinstance(conn, int):
            assert self._fast is not None  # its accept is the only one handing over bare fds
            if (head := self._fast.serve(conn, peer)) is None:
                return  # to be relayed at the batch's end (or being refused) without a task
            conn = self._fast.adopt(conn, head)
        self.spawn(self._serve(conn, peer, head))

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run one connection's ``work`` as a task the drain waits for (and cancels at its end)."""
        assert self._loop is not None
        task = self._loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def count(self, protocol: ProtocolLabel, outcome: GrpcOutcome) -> None:
        self._series[protocol].outcomes[outcome].inc()

    def outcome_series(self, protocol: ProtocolLabel, outcome: GrpcOutcome) -> CounterSeries:
        """The counter ``count`` adds to, for a caller that counts often."""
        return self._series[protocol].outcomes[outcome]

    # -- one connection --------------------------------------------------------------------
    def open_connection(self, peer: tuple[Any, ...]) -> Head:
        """A new connection's record and peek state, before anything is read."""
        # Until the first bytes say TLS, an unidentified connection counts as h2c; FirstBytes
        # updates ``progress.protocol`` as soon as they do, so a timeout or a malformed
        # ClientHello is counted (and answered) as TLS.
        progress = _Peeked(ProtocolLabel.H2C, b"", None)
        started = time.monotonic()
        record = self._access.open(progress.protocol, host_port(peer[0], peer[1]), started)
        return Head(started, record, progress, FirstBytes(progress, self._settings.extensions.parse_client_hello))

    async def _serve(self, conn: socket.socket, peer: tuple[Any, ...], head: Head | None = None) -> None:
        if head is None:
            head = self.open_connection(peer)
        who, started, record, progress, first = head.who, head.started, head.record, head.progress, head.first
        protocol = progress.protocol
        intake = head.intake  # who the client is, once known (after the PROXY header)
        accepted = False
        peeked = head.peeked
        try:
            try:
                if head.failure is not None:  # what the fast path read was refused: answered here
                    raise head.failure
                if intake is None and not self._clients.accept_proxy_protocol:
                    # The client is the peer (identify does not suspend then), and its hello
                    # usually came with the connection: read it at once, and arm the peek
                    # timeout (and suspend) only when something is still missing.
                    intake = await self._clients.identify(conn, (peer[0], peer[1]))
                    peeked = read_now(conn, first)
                if peeked is None or first.settings_due:
                    async with asyncio.timeout(self._settings.peek_timeout_s):  # no extra task, unlike wait_for
                        if intake is None:
                            intake = await self._clients.identify(conn, (peer[0], peer[1]))
                            who = intake.log_fields()
                            record.client = who["peer"]
                            if intake.first_bytes:
                                peeked = first.feed(intake.first_bytes)
                        peeked = await self._peek(conn, first, peeked)
            except TimeoutError:  # before the PROXY header's end the bytes are not the client's
                outcome = GrpcOutcome.PEEK_TIMEOUT if intake is not None else GrpcOutcome.PROTOCOL_ERROR
                self.count(progress.protocol, outcome)
                self._rejections.info("peek timeout", extra={**who, "outcome": outcome})
                conn.close()
                self.end(record, progress, outcome, Termination.PEEK_TIMEOUT)
                return
            except ProxyHeaderError as exc:  # untrusted source, missing or malformed header: unanswered
                self.count(progress.protocol, GrpcOutcome.PROTOCOL_ERROR)
                self._rejections.info("rejected: %s", exc, extra={**who, "outcome": GrpcOutcome.PROTOCOL_ERROR})
                conn.close()
                self.end(record, progress, GrpcOutcome.PROTOCOL_ERROR, Termination.REJECTED)
                return
            except _Rejected as rej:  # unparsable first bytes
                self.count(progress.protocol, rej.outcome)
                self._rejections.info("rejected: %s", rej, extra={**who, "outcome": rej.outcome})
                answered = await self._answer_rejection(conn, progress, rej)  # TLS: decode_error; h2c: closed
                ending = Termination.CLIENT_CLOSE if progress.closed_early else Termination.REJECTED
                self.end(record, progress, rej.outcome, ending, answered)
                return
            assert intake is not None  # identified before the peek
            protocol = record.protocol = peeked.protocol
            record.hostname = peeked.hostname
            try:
                if not intake.within_limit:
                    raise _Rejected(Refusal.CLIENT_LIMIT, c.REASON_TOO_MANY_CONNECTIONS)
                target = self.decide(peeked)
                record.decided_at = decided = time.monotonic()
                self._series[protocol].decision.observe(decided - started)
                record.pod, record.pod_address = target.pod_name, target.grpc_endpoint
                try:
                    pod = await dial(target, self._settings.connect_timeout_s)
                except DialError as exc:
                    raise _Rejected(Refusal.DIAL_FAILED, str(exc), target.pod_name) from None
                self._series[protocol].dial.observe(time.monotonic() - decided)
            except _Rejected as rej:
                await self.refuse(conn, head, peeked, rej, who)
                return
            self.count(protocol, GrpcOutcome.ACCEPTED)
            accepted = True
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "routing %s connection to %s", protocol, target.pod_name,
                    extra={**who, "hostname": peeked.hostname, "pod": target.pod_name,
                           "outcome": GrpcOutcome.ACCEPTED},
                )
            await self._splice(conn, pod, peeked, protocol, record, progress.answered)
        except asyncio.CancelledError:  # the drain ran out (or the router is closing): cut
            conn.close()
            self.end(record, progress, None, Termination.DRAIN)  # a spliced one was ended by _splice
            raise
        except Exception:  # a bug must cost one connection, never the listener
            log.exception("unexpected error serving %s", peer)
            conn.close()
            self.end(record, progress, GrpcOutcome.RELAY_ERROR if accepted else None, Termination.ROUTER_ERROR)
        finally:
            self._clients.slots.release(conn)  # the connection's slot, if it took one

    async def refuse(
        self, conn: socket.socket, head: Head, peeked: _Peeked, rej: _Rejected, who: dict[str, str]
    ) -> None:
        """Refuse a peeked connection (routing, client limit, dial): count, log, answer, end."""
        protocol, record = peeked.protocol, head.record
        self.count(protocol, rej.outcome)
        self._rejections.info(
            "rejected %s connection: %s", protocol, rej,
            extra={**who, "hostname": peeked.hostname, "pod": rej.pod, "outcome": rej.outcome},
        )
        record.pod, record.decided_at = rej.pod, record.decided_at or time.monotonic()
        answered = await self._answer_rejection(conn, peeked, rej)
        dial_failed = rej.refusal is Refusal.DIAL_FAILED
        self.end(record, head.progress, rej.outcome,
                  Termination.DIAL_FAILED if dial_failed else Termination.REJECTED, answered)

    async def refuse_dial(self, conn: socket.socket, head: Head, peeked: _Peeked, rej: _Rejected) -> None:
        """``refuse`` for the fast path's dial, which ran without a task: the slot is released here."""
        try:
            await self.refuse(conn, head, peeked, rej, head.who)
        except asyncio.CancelledError:
            conn.close()
            self.end(head.record, head.progress, None, Termination.DRAIN)
            raise
        finally:
            self._clients.slots.release(conn)

    def relay_ended(self, protocol: ProtocolLabel, record: AccessRecord, result: RelayResult) -> None:
        """A relay's end: its outcome counted, its access line (either path)."""
        outcome = (
            GrpcOutcome.RELAY_ERROR if result.outcome is RelayOutcome.RELAY_ERROR else GrpcOutcome.COMPLETED
        )
        self.count(protocol, outcome)
        record.probe = None
        record.bytes_client_to_pod += result.client_to_pod_bytes
        record.bytes_pod_to_client += result.pod_to_client_bytes
        self._access.end(record, outcome, result.termination, time.monotonic())
        if result.error:
            self._rejections.info("relay ended: %s", result.error, extra={"outcome": outcome})

    def relay_cut(self, protocol: ProtocolLabel, record: AccessRecord) -> None:
        """A relay cut by the drain: what was relayed so far counts."""
        self.count(protocol, GrpcOutcome.COMPLETED)
        record.settle()
        self._access.end(record, GrpcOutcome.COMPLETED, Termination.DRAIN, time.monotonic())

    def end(
        self, record: AccessRecord, progress: _Peeked, outcome: Outcome, termination: Termination,
        answered: tuple[int, int] = (0, 0),
    ) -> None:
        """The connection's access line (once; a spliced one is ended by ``_splice``)."""
        if record.ended:
            return
        record.protocol = progress.protocol
        record.bytes_client_to_pod += progress.received + answered[1]
        record.bytes_pod_to_client += progress.answered + answered[0]
        self._access.end(record, outcome, termination, time.monotonic())

    async def _peek(self, conn: socket.socket, first: FirstBytes, peeked: _Peeked | None) -> _Peeked:
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

    def decide(self, peeked: _Peeked) -> Target:
        request = peeked.h2_request
        decision = route(
            peeked.hostname, request.path if request is not None else None, self._snapshot(),
            self._template, self._round_robin,
            round_robin_paths=self._settings.round_robin_paths, port_of=_grpc_port,
        )
        if isinstance(decision, Refused):
            raise _Rejected(decision.refusal, refusal_detail(decision, peeked.hostname), decision.pod_name)
        return decision

    async def _splice(
        self, conn: socket.socket, pod: socket.socket, peeked: _Peeked, protocol: ProtocolLabel,
        record: AccessRecord, answered: int,
    ) -> None:
        series = self._series[protocol]
        stripper = SettingsAckStripper() if protocol is ProtocolLabel.H2C else None
        client_filter: Callable[[bytes], bytes] | None = None
        if stripper is not None:
            feed = stripper.feed

            def client_filter(data: bytes) -> bytes:  # what the client sent counts, stripped or not
                out = feed(data)
                record.bytes_client_to_pod += len(data) - len(out)
                return out

        def on_start(probe: RelayProbe) -> None:
            record.probe = probe

        record.bytes_pod_to_client = answered
        active = series.active
        active.inc()
        try:
            result = await relay(
                conn, pod,
                initial_to_pod=peeked.buffered,
                client_filter=client_filter,
                client_filter_done=(lambda: stripper.done) if stripper is not None else None,
                idle_timeout_s=self._settings.relay_idle_timeout_s,
                on_bytes=series.count_bytes,
                use_splice=self._settings.use_splice,
                native=self._settings.extensions.tcp_pump,
                on_start=on_start,
                loop=self._loop,
            )
        except asyncio.CancelledError:  # cut by the drain: what was relayed so far counts
            self.relay_cut(protocol, record)
            raise
        finally:
            active.dec()
        self.relay_ended(protocol, record, result)

    async def _answer_rejection(self, conn: socket.socket, peeked: _Peeked, rej: _Rejected) -> tuple[int, int]:
        """Tell the client why, in its own protocol, then close without a RST; ``(sent, read)``."""
        request = peeked.h2_request
        stream_id = request.stream_id if request is not None else 1
        return await answer_and_close(conn, rejection_bytes(peeked.protocol, rej.refusal, stream_id, str(rej)))


def _grpc_port(target: Target) -> int:
    return target.grpc_port
