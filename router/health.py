"""The probe and scrape endpoint: ``/healthz`` and ``/livez``, ``/readyz``, ``/metrics`` on ``aiohttp.web``.

Probes and scrapes need one small request per connection, so a low-level ``web.Server`` serves a path
table and bounds every connection: its request head in size and time, its answer in time, one answer
each. The router and the ``--workers`` supervisor share this server; only their route tables differ.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any, cast

from aiohttp import web

from router import constants as c
from router.log_limiter import RateLimitedLog
from router.metrics import RouterMetrics

log = logging.getLogger("router.health")  # pinned: operators filter logs by this name

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The text exposition format Prometheus negotiates by default."""

CLOSE_TIMEOUT_S = 1.0
"""At close, in-flight probe answers get this long: a probe is retried, the shutdown must not wait."""

Route = Callable[[], Awaitable[web.Response]]
"""Answers one probe path; the method (GET or HEAD) is checked before it is called."""

QueryRoute = Callable[[str], Awaitable[web.Response]]
"""Answers one path given its query string (``limit=5``; empty when absent): the debug views."""


def text_response(status: int, text: str) -> web.Response:
    """A ``text/plain`` answer; every probe answer closes its connection (one request each)."""
    response = web.Response(status=status, text=text, content_type="text/plain", charset="utf-8")
    response.force_close()
    return response


def metrics_response(exposition: bytes) -> web.Response:
    response = web.Response(body=exposition, headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})
    response.force_close()
    return response


def readiness_response(ready: bool) -> web.Response:
    if ready:
        return text_response(HTTPStatus.OK, "ready\n")
    return text_response(HTTPStatus.SERVICE_UNAVAILABLE, "not ready\n")


async def healthy() -> web.Response:
    """Liveness: the loop answers, so the process is alive (a draining router still is)."""
    return text_response(HTTPStatus.OK, "ok\n")


LIVENESS_PATHS = ("/healthz", "/livez")
"""``/healthz`` (ours) and ``/livez`` (the Rust router's chart); answered on the loop, so a 200 proves it turns."""


def liveness_routes() -> dict[str, Route]:
    """``healthy`` at every liveness path, for the router and the ``--workers`` supervisor alike."""
    return dict.fromkeys(LIVENESS_PATHS, healthy)


ERROR_TEXT: Mapping[int, str] = {
    HTTPStatus.BAD_REQUEST: "bad request\n",
    HTTPStatus.NOT_FOUND: "not found\n",
    HTTPStatus.METHOD_NOT_ALLOWED: "method not allowed\n",
    HTTPStatus.INTERNAL_SERVER_ERROR: "internal server error\n",
}
"""Bodies of the error answers (aiohttp's own would name the parser's exception)."""


class _ProbeConnection(web.RequestHandler):
    """aiohttp's HTTP/1.1 connection, bounded: a head over ``max_head_bytes`` or slower than ``timeout_s``
    is cut unanswered, and an answer not read within ``timeout_s`` is aborted."""

    def __init__(
        self, manager: web.Server, *, max_head_bytes: int, timeout_s: float, errors: RateLimitedLog, **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._errors = errors
        self._max_head_bytes = max_head_bytes
        self._timeout_s = timeout_s
        self._received = 0
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        # One bodiless request per connection: every byte received is request head.
        self._received += len(data)
        if self._received > self._max_head_bytes:
            if self.transport is not None:
                self.transport.abort()
            return
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def answering(self) -> None:
        """The head arrived and the answer is computed: the client now has ``timeout_s`` to read it."""
        if self.transport is not None:
            self._arm(self.transport)

    def computing(self) -> None:
        """A route runs (the supervisor's scrape its workers with their own timeout): no deadline."""
        self._disarm()

    def _arm(self, transport: asyncio.Transport) -> None:
        self._disarm()
        self._deadline = asyncio.get_running_loop().call_later(self._timeout_s, transport.abort)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A malformed request gets our terse 400; a failing route answers 500 and is logged, at
        most ``PROBE_ERROR_LOG_LINES_PER_S`` (one server's limiter, so every connection shares it)."""
        if status >= 500:
            self._errors.log(logging.ERROR, "probe request %s failed", request.path, exc_info=exc)
        known = HTTPStatus(status) if status in ERROR_TEXT else HTTPStatus.BAD_REQUEST
        self.answering()
        return text_response(known, ERROR_TEXT[known])


class _BoundedServer(web.Server):
    """Makes ``_ProbeConnection``\\ s (``web.Server`` is the protocol factory of the listener)."""

    def __init__(self, handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
                 max_head_bytes: int, timeout_s: float) -> None:
        super().__init__(handler, access_log=None)
        self._max_head_bytes = max_head_bytes
        self._timeout_s = timeout_s
        self._errors = RateLimitedLog(log, per_second=c.PROBE_ERROR_LOG_LINES_PER_S)

    def __call__(self) -> web.RequestHandler:
        return _ProbeConnection(
            self, loop=asyncio.get_running_loop(), access_log=None,
            max_head_bytes=self._max_head_bytes, timeout_s=self._timeout_s, errors=self._errors,
        )


class ProbeHttpServer:
    """Serves a ``path -> Route`` table to GET and HEAD (the router's and the supervisor's alike)."""

    def __init__(
        self, routes: Mapping[str, Route],
        query_routes: Mapping[str, QueryRoute] | None = None,
        max_head_bytes: int = c.HEALTH_MAX_REQUEST_HEAD_BYTES,
        timeout_s: float = c.HEALTH_REQUEST_TIMEOUT_S,
    ) -> None:
        self.routes = dict(routes)
        self.query_routes = dict(query_routes or {})
        self._max_head_bytes = max_head_bytes
        self._timeout_s = timeout_s
        self._runner: web.ServerRunner | None = None

    async def answer(self, method: str, path: str) -> web.Response:
        """The answer to ``method path`` (the query string reaches query routes only), without sockets."""
        if method not in ("GET", "HEAD"):
            return text_response(HTTPStatus.METHOD_NOT_ALLOWED, ERROR_TEXT[HTTPStatus.METHOD_NOT_ALLOWED])
        base, _, query = path.partition("?")
        query_route = self.query_routes.get(base)
        if query_route is not None:
            return await query_route(query)
        route = self.routes.get(base)
        if route is None:
            return text_response(HTTPStatus.NOT_FOUND, ERROR_TEXT[HTTPStatus.NOT_FOUND])
        return await route()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        connection = request.protocol
        if isinstance(connection, _ProbeConnection):
            connection.computing()
        response = await self.answer(request.method, request.path_qs)
        if isinstance(connection, _ProbeConnection):
            connection.answering()
        return response

    async def start(self, host: str, port: int) -> tuple[str, int]:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return await self.start_on(socket.create_server((host, port), family=family))

    async def start_on(self, sock: socket.socket) -> tuple[str, int]:
        """Serve on a bound socket (a worker's private port is bound by its supervisor)."""
        server = _BoundedServer(self._handle, self._max_head_bytes, self._timeout_s)
        self._runner = web.ServerRunner(server, shutdown_timeout=CLOSE_TIMEOUT_S)
        await self._runner.setup()
        try:
            await web.SockSite(self._runner, sock).start()
        except BaseException:
            sock.close()
            await self.close()
            raise
        sockname = sock.getsockname()
        return sockname[0], sockname[1]

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            with contextlib.suppress(Exception):
                await runner.cleanup()


class HealthServer(ProbeHttpServer):
    """Serves liveness, readiness (from ``is_ready()``) and the metrics exposition."""

    def __init__(self, metrics: RouterMetrics, is_ready: Callable[[], bool]) -> None:
        self._metrics = metrics
        self._is_ready = is_ready
        super().__init__({**liveness_routes(), "/readyz": self._readyz, "/metrics": self._metrics_route})

    async def _readyz(self) -> web.Response:
        return readiness_response(self._is_ready())

    async def _metrics_route(self) -> web.Response:
        return metrics_response(self._metrics.render())

    def respond(self, method: str, path: str) -> bytes:
        """The answer as HTTP/1.1 text (status line, content type, body), for tests without a socket."""
        response = asyncio.run(self.answer(method, path))
        body = response.body if isinstance(response.body, bytes) else b""
        head = (
            f"HTTP/1.1 {response.status} {response.reason}\r\n"
            f"Content-Type: {response.headers['Content-Type']}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body
