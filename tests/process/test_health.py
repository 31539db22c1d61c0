"""The probe listener on the wire: answers, and the bounds kept from the hand-written server."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from router import constants as c
from router.health import PROMETHEUS_CONTENT_TYPE, HealthServer, ProbeHttpServer, text_response
from router.metrics import RouterMetrics

WAIT_S = 10.0
"""Bound on every read in these tests (a hang fails the test instead of stalling the suite)."""


async def exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` and read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), WAIT_S)
    finally:
        writer.close()


def split(raw: bytes) -> tuple[bytes, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status.encode(), headers, body


@pytest.fixture()
async def router_health() -> AsyncIterator[tuple[HealthServer, int, list[bool]]]:
    ready = [False]
    server = HealthServer(RouterMetrics(), lambda: ready[0])
    _host, port = await server.start("127.0.0.1", 0)
    try:
        yield server, port, ready
    finally:
        await server.close()


async def test_answers_status_body_and_content_type(router_health: tuple[HealthServer, int, list[bool]]) -> None:
    _server, port, ready = router_health
    get = b"GET %s HTTP/1.1\r\nHost: probe\r\n\r\n"
    status, headers, body = split(await exchange(port, get % b"/healthz"))
    assert (status, headers["content-type"], body) == (b"HTTP/1.1 200 OK", "text/plain; charset=utf-8", b"ok\n")
    assert headers["connection"] == "close"
    assert split(await exchange(port, get % b"/readyz"))[::2] == (b"HTTP/1.1 503 Service Unavailable", b"not ready\n")
    ready[0] = True
    assert split(await exchange(port, get % b"/readyz?verbose=1"))[::2] == (b"HTTP/1.1 200 OK", b"ready\n")
    status, headers, body = split(await exchange(port, get % b"/metrics"))
    assert status == b"HTTP/1.1 200 OK" and headers["content-type"] == PROMETHEUS_CONTENT_TYPE
    assert c.READY_TARGETS.encode() in body
    assert split(await exchange(port, get % b"/nope"))[::2] == (b"HTTP/1.1 404 Not Found", b"not found\n")


async def test_livez_answers_200_from_the_event_loop_whether_or_not_the_router_is_ready(
    router_health: tuple[HealthServer, int, list[bool]],
) -> None:
    """The Rust router's chart asks ``/livez``: alive is "the loop answers", never "ready"."""
    _server, port, ready = router_health
    get = b"GET /livez HTTP/1.1\r\nHost: probe\r\n\r\n"
    for readiness in (False, True, False):  # not yet synced, serving, draining
        ready[0] = readiness
        status, headers, body = split(await exchange(port, get))
        assert (status, headers["content-type"], body) == (b"HTTP/1.1 200 OK", "text/plain; charset=utf-8", b"ok\n")
    post = b"POST /healthz HTTP/1.1\r\nHost: probe\r\nContent-Length: 0\r\n\r\n"
    assert split(await exchange(port, post))[::2] == (b"HTTP/1.1 405 Method Not Allowed", b"method not allowed\n")
    status, headers, body = split(await exchange(port, b"HEAD /healthz HTTP/1.1\r\nHost: probe\r\n\r\n"))
    assert (status, headers["content-length"], body) == (b"HTTP/1.1 200 OK", "3", b"")
    assert split(await exchange(port, b"garbage\r\n\r\n"))[::2] == (b"HTTP/1.0 400 Bad Request", b"bad request\n")


async def test_an_oversized_request_head_is_cut_without_an_answer(
    router_health: tuple[HealthServer, int, list[bool]],
) -> None:
    _server, port, _ready = router_health
    filler = b"x" * (c.HEALTH_MAX_REQUEST_HEAD_BYTES // 4)
    headers = b"".join(b"X-Pad-%d: %s\r\n" % (i, filler) for i in range(5))  # each field is small
    assert await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: probe\r\n" + headers + b"\r\n") == b""
    # just under the limit is answered
    fits = b"GET /healthz HTTP/1.1\r\nHost: probe\r\nX-Pad: " + filler + b"\r\n\r\n"
    assert split(await exchange(port, fits))[0] == b"HTTP/1.1 200 OK"


async def test_a_slow_request_head_is_cut_at_the_header_timeout() -> None:
    server = HealthServer(RouterMetrics(), lambda: True)
    server = ProbeHttpServer(server.routes, timeout_s=0.3)
    _host, port = await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: pro")  # and never the rest
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
        writer.close()
        # a silent connection is cut as well
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
        writer.close()
    finally:
        await server.close()


async def test_a_slow_route_is_not_cut_by_the_header_timeout() -> None:
    """The supervisor's routes scrape workers (their own timeout); only the client's part is timed."""

    async def slow() -> web.Response:
        await asyncio.sleep(0.5)
        return text_response(200, "late\n")

    server = ProbeHttpServer({"/slow": slow}, timeout_s=0.2)
    _host, port = await server.start("127.0.0.1", 0)
    try:
        raw = await exchange(port, b"GET /slow HTTP/1.1\r\nHost: probe\r\n\r\n")
        assert split(raw)[::2] == (b"HTTP/1.1 200 OK", b"late\n")
    finally:
        await server.close()


def test_adding_a_route_is_one_entry() -> None:
    server = HealthServer(RouterMetrics(), lambda: True)

    async def targets() -> web.Response:
        return text_response(200, "[]\n")

    server.routes["/debug/targets"] = targets
    assert server.respond("GET", "/debug/targets").endswith(b"\r\n\r\n[]\n")
    assert server.respond("GET", "/healthz").startswith(b"HTTP/1.1 200 OK\r\n")


async def test_a_failing_route_answers_500_and_its_log_lines_are_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A route that raises (a bug: untrusted input gets a 4xx before it reaches code that can raise)
    answers a terse 500; its traceback is logged, but a client repeating the request cannot turn
    it into a log flood: ``PROBE_ERROR_LOG_LINES_PER_S``, the rest counted in the next line."""

    async def broken() -> web.Response:
        raise RuntimeError("a bug")

    server = ProbeHttpServer({"/broken": broken})
    _host, port = await server.start("127.0.0.1", 0)
    started = time.monotonic()
    try:
        with caplog.at_level(logging.ERROR, logger="router.health"):
            for _ in range(30):
                raw = await exchange(port, b"GET /broken HTTP/1.1\r\nHost: probe\r\n\r\n")
                assert split(raw)[::2] == (b"HTTP/1.1 500 Internal Server Error", b"internal server error\n")
    finally:
        await server.close()
    elapsed = time.monotonic() - started
    errors = [r for r in caplog.records if r.name == "router.health"]
    assert 1 <= len(errors) <= 1 + elapsed * c.PROBE_ERROR_LOG_LINES_PER_S < 30
    assert errors[0].exc_info is not None and "/broken" in errors[0].getMessage()
