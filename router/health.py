"""The probe and scrape endpoint: ``/healthz``, ``/readyz``, ``/metrics`` over HTTP/1.1.

A deliberately tiny server (one request per connection, bounded request size and time):
kubelet probes and Prometheus scrapes need nothing more, and it keeps a web framework
out of the data-path process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from router.metrics import RouterMetrics

MAX_REQUEST_HEAD_BYTES = 8 * 1024
"""Probe and scrape requests are a few hundred bytes; anything larger is refused."""

REQUEST_TIMEOUT_S = 5.0
"""A client that cannot send its request line in this long is cut off."""

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class HealthServer:
    """Serves liveness, readiness (from ``is_ready()``) and the metrics exposition."""

    def __init__(self, metrics: RouterMetrics, is_ready: Callable[[], bool]) -> None:
        self._metrics = metrics
        self._is_ready = is_ready
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

    def respond(self, method: str, path: str) -> bytes:
        """The full HTTP response for one request (pure, so it is testable without sockets)."""
        path = path.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _response("405 Method Not Allowed", b"method not allowed\n")
        if path == "/healthz":
            return _response("200 OK", b"ok\n")
        if path == "/readyz":
            if self._is_ready():
                return _response("200 OK", b"ready\n")
            return _response("503 Service Unavailable", b"not ready\n")
        if path == "/metrics":
            return _response("200 OK", self._metrics.render(), PROMETHEUS_CONTENT_TYPE)
        return _response("404 Not Found", b"not found\n")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            if len(head) > MAX_REQUEST_HEAD_BYTES:
                raise ValueError("request head too large")
            request_line = head.split(b"\r\n", 1)[0].decode("ascii", "replace")
            parts = request_line.split(" ")
            response = (
                self.respond(parts[0], parts[1])
                if len(parts) == 3
                else _response("400 Bad Request", b"bad request\n")
            )
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
