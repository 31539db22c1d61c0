"""The TCP edge: accept worker connections, peek the hostname, dial the pod, splice.

The first bytes decide, with no configuration: a TLS ClientHello is routed by its SNI,
an HTTP/2 prior-knowledge (h2c) connection by the ``:authority`` of its first request.
The parsers are sans-IO (``tls_peek``, ``h2c_peek``) and the choice of pod is
``router.routing``'s; this module owns the listener, the timeouts and the order of events:
peek, decide, ``dial``, then ``relay`` (through ``settings_ack`` for h2c), or ``rejection``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from discovery.targets import Target, TargetSnapshot
from quic.clienthello import ClientHelloInfo
from router import constants as c
from router.hostname import HostnameTemplate
from router.log_limiter import RateLimitedLog
from router.metrics import ProtocolSeries, RouterMetrics
from router.outcomes import TCP_PROTOCOLS, GrpcOutcome, ProtocolLabel
from router.routing import REFUSAL_ANSWERS, Refusal, Refused, RoundRobin, route
from router.tcp.dial import DialError, dial
from router.tcp.h2_frames import EMPTY_SETTINGS_FRAME, H2PeekError
from router.tcp.h2c_peek import H2Request, H2RequestReader, looks_like_h2c
from router.tcp.rejection import answer_and_close, rejection_bytes
from router.tcp.relay import RelayOutcome, relay
from router.tcp.settings_ack import SettingsAckStripper
from router.tcp.tls_peek import ClientHelloReader, TlsPeekError, looks_like_tls

log = logging.getLogger("router.tcp_router")  # pinned: operators filter logs by this name

_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""accept() failures that persist while the listener stays readable: pause, do not spin."""


@dataclass(frozen=True, slots=True)
class TcpRouterSettings:
    connect_timeout_s: float = c.DEFAULT_CONNECT_TIMEOUT_MS / 1000
    relay_idle_timeout_s: float = c.DEFAULT_RELAY_IDLE_TIMEOUT_MS / 1000
    peek_timeout_s: float = c.DEFAULT_PEEK_TIMEOUT_MS / 1000
    round_robin_paths: frozenset[str] = frozenset(c.DEFAULT_ROUND_ROBIN_PATHS)
    use_splice: bool | None = None


class _TcpSeries(ProtocolSeries):
    """One TCP protocol's series, with its outcome counters."""

    __slots__ = ("outcomes",)

    def __init__(self, metrics: RouterMetrics, protocol: ProtocolLabel) -> None:
        super().__init__(metrics, protocol)
        self.outcomes = {
            o: metrics.grpc_connections.labels(protocol=protocol, outcome=o) for o in GrpcOutcome
        }


class _Rejected(Exception):
    """Internal: the connection is answered (per ``REFUSAL_ANSWERS``) and closed."""

    def __init__(self, refusal: Refusal, detail: str, pod: str | None = None) -> None:
        super().__init__(detail)
        self.refusal = refusal
        self.pod = pod

    @property
    def outcome(self) -> GrpcOutcome:
        outcome = REFUSAL_ANSWERS[self.refusal].grpc_outcome
        assert outcome is not None, f"{self.refusal} is not a TCP refusal"
        return outcome


def _detail(refused: Refused, hostname: str | None) -> str:
    """The grpc-message / log text of a routing refusal (the Rust router's wording)."""
    if refused.refusal is Refusal.NO_READY_TARGET:
        return "no ready stargate for round-robin"
    if refused.refusal is Refusal.MISSING_NAME:
        return "missing authority"
    if refused.refusal is Refusal.UNKNOWN_NAME:
        return f"unknown authority {hostname!r}"
    return f"target stargate not ready for {hostname!r}"


@dataclass(slots=True)
class _Peeked:
    protocol: ProtocolLabel
    buffered: bytes
    hostname: str | None
    h2_request: H2Request | None = None
    tls_hello: ClientHelloInfo | None = None


class TcpRouter:
    """Routes each accepted TCP connection to the pod its hostname names."""

    def __init__(
        self,
        settings: TcpRouterSettings,
        template: HostnameTemplate,
        snapshot: Callable[[], TargetSnapshot],
        metrics: RouterMetrics,
    ) -> None:
        self._settings = settings
        self._template = template
        self._snapshot = snapshot
        self._metrics = metrics
        self._series = {p: _TcpSeries(metrics, p) for p in TCP_PROTOCOLS}
        self._rejections = RateLimitedLog(log)
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._round_robin = RoundRobin()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accept_resume: asyncio.TimerHandle | None = None
        self._accept_exhausted = False

    @property
    def active_connections(self) -> int:
        return len(self._tasks)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(4096)
        sock.setblocking(False)
        self._listener = sock
        self._loop.add_reader(sock.fileno(), self._on_acceptable)
        name = sock.getsockname()
        return name[0], name[1]

    def stop_accepting(self) -> None:
        if self._accept_resume is not None:
            self._accept_resume.cancel()
            self._accept_resume = None
        if self._listener is not None and self._loop is not None:
            self._loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None

    async def drain(self, timeout_s: float) -> None:
        """Let open connections finish for ``timeout_s``, then cut the rest."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        await self.close()

    async def close(self) -> None:
        self.stop_accepting()
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)

    # -- accepting -------------------------------------------------------------------------
    def _on_acceptable(self) -> None:
        listener = self._listener
        if listener is None or self._loop is None:
            return
        for _ in range(c.ACCEPT_BATCH):
            try:
                conn, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # the client gave up while queued: next one
                continue
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRNOS:
                    # Out of fds (a slowloris, a burst): the pending connection keeps the
                    # listener readable, so retrying now would spin the loop and flood the log.
                    # Pause; peeks time out and relays end meanwhile, freeing fds.
                    self._pause_accepting(exc)
                else:
                    log.warning("accept failed: %s", exc)
                return
            if self._accept_exhausted:
                self._accept_exhausted = False
                log.info("accepting again")
            conn.setblocking(False)
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self._loop.create_task(self._serve(conn, peer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _pause_accepting(self, exc: OSError) -> None:
        assert self._loop is not None and self._listener is not None
        # One warning per exhaustion episode; the retries of the same episode stay at debug.
        level = logging.DEBUG if self._accept_exhausted else logging.WARNING
        log.log(level, "accept failed (%s): pausing accepts for %d ms", exc, c.ACCEPT_PAUSE_ON_EXHAUSTION_MS)
        self._accept_exhausted = True
        self._loop.remove_reader(self._listener.fileno())
        self._accept_resume = self._loop.call_later(
            c.ACCEPT_PAUSE_ON_EXHAUSTION_MS / 1000, self._resume_accepting
        )

    def _resume_accepting(self) -> None:
        self._accept_resume = None
        if self._listener is not None and self._loop is not None:
            self._loop.add_reader(self._listener.fileno(), self._on_acceptable)

    def _count(self, protocol: ProtocolLabel, outcome: GrpcOutcome) -> None:
        self._series[protocol].outcomes[outcome].inc()

    # -- one connection --------------------------------------------------------------------
    async def _serve(self, conn: socket.socket, peer: object) -> None:
        # Until the first bytes say TLS, an unidentified connection counts as h2c; _peek
        # updates ``progress.protocol`` as soon as they do, so a timeout or a malformed
        # ClientHello is counted (and answered) as TLS.
        progress = _Peeked(ProtocolLabel.H2C, b"", None)
        protocol = progress.protocol
        try:
            started = time.monotonic()
            try:
                async with asyncio.timeout(self._settings.peek_timeout_s):  # no extra task, unlike wait_for
                    peeked = await self._peek(conn, progress)
            except TimeoutError:
                self._count(progress.protocol, GrpcOutcome.PEEK_TIMEOUT)
                self._rejections.info("peek timeout", extra={"peer": str(peer), "outcome": GrpcOutcome.PEEK_TIMEOUT})
                conn.close()
                return
            except _Rejected as rej:  # unparsable first bytes
                self._count(progress.protocol, rej.outcome)
                self._rejections.info("rejected: %s", rej, extra={"peer": str(peer), "outcome": rej.outcome})
                await self._answer_rejection(conn, progress, rej)  # TLS: decode_error; h2c: closed
                return
            protocol = peeked.protocol
            try:
                target = self._decide(peeked)
                self._series[protocol].decision.observe(time.monotonic() - started)
                dial_started = time.monotonic()
                try:
                    pod = await dial(target, self._settings.connect_timeout_s)
                except DialError as exc:
                    raise _Rejected(Refusal.DIAL_FAILED, str(exc), target.pod_name) from None
                self._series[protocol].dial.observe(time.monotonic() - dial_started)
            except _Rejected as rej:
                self._count(protocol, rej.outcome)
                self._rejections.info(
                    "rejected %s connection: %s", protocol, rej,
                    extra={"peer": str(peer), "hostname": peeked.hostname, "pod": rej.pod,
                           "outcome": rej.outcome},
                )
                await self._answer_rejection(conn, peeked, rej)
                return
            self._count(protocol, GrpcOutcome.ACCEPTED)
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "routing %s connection to %s", protocol, target.pod_name,
                    extra={"peer": str(peer), "hostname": peeked.hostname, "pod": target.pod_name,
                           "outcome": GrpcOutcome.ACCEPTED},
                )
            await self._splice(conn, pod, peeked, protocol)
        except asyncio.CancelledError:
            conn.close()
            raise
        except Exception:  # a bug must cost one connection, never the listener
            log.exception("unexpected error serving %s", peer)
            conn.close()

    async def _peek(self, conn: socket.socket, progress: _Peeked) -> _Peeked:
        loop = asyncio.get_running_loop()
        buffered = bytearray()
        tls: ClientHelloReader | None = None
        h2: H2RequestReader | None = None
        settings_sent = False
        while True:
            data = await loop.sock_recv(conn, c.MAX_PEEK_BYTES)
            if not data:
                raise _Rejected(Refusal.MALFORMED, "connection closed before the hostname")
            buffered += data
            if tls is None and h2 is None:
                if looks_like_tls(bytes(buffered)):
                    tls = ClientHelloReader(c.MAX_PEEK_BYTES)
                    progress.protocol = ProtocolLabel.TLS
                    data = bytes(buffered)
                elif looks_like_h2c(bytes(buffered)):
                    h2 = H2RequestReader(c.MAX_PEEK_BYTES)
                    data = bytes(buffered)
                else:
                    raise _Rejected(Refusal.MALFORMED, "neither TLS nor HTTP/2 prior knowledge")
            try:
                if tls is not None:
                    hello = tls.feed(data)
                    if hello is not None:
                        return _Peeked(ProtocolLabel.TLS, bytes(buffered), hello.server_name, tls_hello=hello)
                elif h2 is not None:
                    request = h2.feed(data)
                    if not settings_sent and h2.saw_preface:
                        # grpcio waits for the server's SETTINGS before its first HEADERS.
                        await loop.sock_sendall(conn, EMPTY_SETTINGS_FRAME)
                        settings_sent = True
                    if request is not None:
                        return _Peeked(ProtocolLabel.H2C, bytes(buffered), request.authority, h2_request=request)
            except (TlsPeekError, H2PeekError) as exc:
                raise _Rejected(Refusal.MALFORMED, str(exc)) from None

    def _decide(self, peeked: _Peeked) -> Target:
        request = peeked.h2_request
        decision = route(
            peeked.hostname, request.path if request is not None else None, self._snapshot(),
            self._template, self._round_robin,
            round_robin_paths=self._settings.round_robin_paths, port_of=_grpc_port,
        )
        if isinstance(decision, Refused):
            raise _Rejected(decision.refusal, _detail(decision, peeked.hostname), decision.pod_name)
        return decision

    async def _splice(
        self, conn: socket.socket, pod: socket.socket, peeked: _Peeked, protocol: ProtocolLabel
    ) -> None:
        series = self._series[protocol]
        up, down = series.up, series.down

        def on_bytes(to_pod: int, to_client: int) -> None:
            if to_pod:
                up.inc(to_pod)
            if to_client:
                down.inc(to_client)

        stripper = SettingsAckStripper() if protocol is ProtocolLabel.H2C else None
        active = series.active
        active.inc()
        try:
            result = await relay(
                conn, pod,
                initial_to_pod=peeked.buffered,
                client_filter=stripper.feed if stripper is not None else None,
                client_filter_done=(lambda: stripper.done) if stripper is not None else None,
                idle_timeout_s=self._settings.relay_idle_timeout_s,
                on_bytes=on_bytes,
                use_splice=self._settings.use_splice,
            )
        finally:
            active.dec()
        outcome = (
            GrpcOutcome.RELAY_ERROR if result.outcome is RelayOutcome.RELAY_ERROR else GrpcOutcome.COMPLETED
        )
        self._count(protocol, outcome)
        if result.error:
            self._rejections.info("relay ended: %s", result.error, extra={"outcome": outcome})

    async def _answer_rejection(self, conn: socket.socket, peeked: _Peeked, rej: _Rejected) -> None:
        """Tell the client why, in its own protocol, then close without a RST."""
        request = peeked.h2_request
        stream_id = request.stream_id if request is not None else 1
        await answer_and_close(conn, rejection_bytes(peeked.protocol, rej.refusal, stream_id, str(rej)))


def _grpc_port(target: Target) -> int:
    return target.grpc_port
