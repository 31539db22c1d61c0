"""``--debug-endpoints``: the live view's HTTP answers, for one router and for the supervisor.

Off by default because the answers show client addresses: the paths are then not routed at all (404).
The shapes come from the pure ``router.live_view``; with ``--workers N`` the supervisor merges its workers'.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterable
from http import HTTPStatus
from typing import Any

from aiohttp import web

from discovery.targets import Target
from router.health import QueryRoute, Route, text_response
from router.live_view import (
    LimitError,
    LiveConnections,
    is_connections_view,
    is_targets_view,
    merge_connections,
    merge_targets,
    parse_limit,
    targets_view,
)

TARGETS_PATH = "/debug/targets"
CONNECTIONS_PATH = "/debug/connections"

FetchAll = Callable[[str], Awaitable[list[tuple[int, bytes] | BaseException]]]
"""GET a path from every live worker: ``(status, body)`` or the error, per worker."""


def json_response(payload: Any, status: int = HTTPStatus.OK) -> web.Response:
    response = web.Response(status=status, text=json.dumps(payload, separators=(",", ":")),
                            content_type="application/json", charset="utf-8")
    response.force_close()
    return response


def _bad_limit(exc: LimitError) -> web.Response:
    return text_response(HTTPStatus.BAD_REQUEST, f"{exc}\n")


def router_routes(
    live: LiveConnections,
    targets: Callable[[], Iterable[Target]],
    source: str,
    is_ready: Callable[[], bool],
    sync_age_s: Callable[[], float],
    clock: Callable[[], float] = time.monotonic,
) -> tuple[dict[str, Route], dict[str, QueryRoute]]:
    """One router's debug routes: ``(plain routes, query routes)`` for ``ProbeHttpServer``."""

    async def targets_route() -> web.Response:
        age = sync_age_s()
        return json_response(targets_view(targets(), source, is_ready(), None if age < 0 else age))

    async def connections_route(query: str) -> web.Response:
        try:
            limit = parse_limit(query)
        except LimitError as exc:
            return _bad_limit(exc)
        return json_response(live.view(limit, clock()))

    return {TARGETS_PATH: targets_route}, {CONNECTIONS_PATH: connections_route}


def _answers(
    results: list[tuple[int, bytes] | BaseException], well_formed: Callable[[object], bool]
) -> list[dict[str, Any]]:
    """The workers' JSON answers; a worker that failed or answered garbage (not ``well_formed``) is left out."""
    out = []
    for result in results:
        if isinstance(result, tuple) and result[0] == HTTPStatus.OK:
            try:
                answer = json.loads(result[1])
            except (ValueError, RecursionError):
                continue
            if well_formed(answer):
                out.append(answer)
    return out


def supervisor_routes(fetch_all: FetchAll) -> tuple[dict[str, Route], dict[str, QueryRoute]]:
    """The supervisor's debug routes: every live worker asked at once, their answers merged."""

    async def targets_route() -> web.Response:
        answers = _answers(await fetch_all(TARGETS_PATH), is_targets_view)
        if not answers:
            return text_response(HTTPStatus.SERVICE_UNAVAILABLE, "no worker answered\n")
        return json_response(merge_targets(answers))

    async def connections_route(query: str) -> web.Response:
        try:
            limit = parse_limit(query)
        except LimitError as exc:
            return _bad_limit(exc)
        answers = _answers(await fetch_all(f"{CONNECTIONS_PATH}?limit={limit}"), is_connections_view)
        return json_response(merge_connections(answers, limit))

    return {TARGETS_PATH: targets_route}, {CONNECTIONS_PATH: connections_route}
