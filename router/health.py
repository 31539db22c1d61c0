"""The probe and scrape endpoint: ``/healthz``, ``/readyz``, ``/metrics`` over HTTP/1.1.

A deliberately tiny server (one request per connection, bounded request size and time):
kubelet probes and Prometheus scrapes need nothing more, and it keeps a web framework
out of the data-path process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from router import constants as c
from router.metrics import RouterMetrics

MAX_REQUEST_HEAD_BYTES = c.HEALTH_MAX_REQUEST_HEAD_BYTES
REQUEST_TIMEOUT_S = c.HEALTH_REQUEST_TIMEOUT_S

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def http_response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    """A complete ``Connection: close`` HTTP/1.1 response."""
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


Responder = Callable[[str, str], Awaitable[bytes]]
"""``(method, path) -> full HTTP response``."""


class ProbeHttpServer:
    """One bounded request per connection, answered by ``respond``; shared by the router and the
    ``--workers`` supervisor, whose answers differ but whose HTTP handling must not."""

    def __init__(self, respond: Responder) -> None:
        self._respond = respond
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._handle, host, port, reuse_address=True)
        sockname = self._server.sockets[0].getsockname()
        return sockname[0], sockname[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            if len(head) > MAX_REQUEST_HEAD_BYTES:
                raise ValueError("request head too large")
            parts = head.split(b"\r\n", 1)[0].decode("ascii", "replace").split(" ")
            if len(parts) == 3:
                response = await self._respond(parts[0], parts[1])
            else:
                response = http_response("400 Bad Request", b"bad request\n")
            if parts[0] == "HEAD":
                response = response.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
            writer.write(response)
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError,
                ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class HealthServer(ProbeHttpServer):
    """Serves liveness, readiness (from ``is_ready()``) and the metrics exposition."""

    def __init__(self, metrics: RouterMetrics, is_ready: Callable[[], bool]) -> None:
        super().__init__(self._respond_async)
        self._metrics = metrics
        self._is_ready = is_ready

    async def _respond_async(self, method: str, path: str) -> bytes:
        return self.respond(method, path)

    def respond(self, method: str, path: str) -> bytes:
        """The full HTTP response for one request (pure, so it is testable without sockets)."""
        route = probe_route(method, path)
        if isinstance(route, bytes):
            return route
        if route == "readyz":
            return readiness_response(self._is_ready())
        if route == "metrics":
            return metrics_response(self._metrics.render())
        return HEALTHY_RESPONSE


HEALTHY_RESPONSE = http_response("200 OK", b"ok\n")


def probe_route(method: str, path: str) -> str | bytes:
    """``"healthz"``, ``"readyz"`` or ``"metrics"`` for a probe request, else the error response.

    The router and the ``--workers`` supervisor answer the same paths from different state.
    """
    path = path.split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        return http_response("405 Method Not Allowed", b"method not allowed\n")
    if path in ("/healthz", "/readyz", "/metrics"):
        return path[1:]
    return http_response("404 Not Found", b"not found\n")


def readiness_response(ready: bool) -> bytes:
    if ready:
        return http_response("200 OK", b"ready\n")
    return http_response("503 Service Unavailable", b"not ready\n")


def metrics_response(exposition: bytes) -> bytes:
    return http_response("200 OK", exposition, PROMETHEUS_CONTENT_TYPE)
