"""An in-process ``UdpRouter`` (the QUIC edge) listening on loopback, closed when the test is done."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from discovery.targets import TargetSnapshot
from router import constants as c
from router.hostname import HostnameTemplate
from router.metrics import RouterMetrics
from router.udp.edge import UdpRouter
from router.udp.settings import UdpRouterSettings

ROUTER_HOST = "127.0.0.1"
CLOSE_TIMEOUT_S = 5.0
"""Bound on the router's close: a hung close fails the test instead of stalling the suite."""


def default_template() -> HostnameTemplate:
    """The advertised-hostname template every in-process test routes with."""
    return HostnameTemplate.parse(c.DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE, "default")


@asynccontextmanager
async def running_udp_router(
    snapshot: Callable[[], TargetSnapshot],
    settings: UdpRouterSettings | None = None,
    metrics: RouterMetrics | None = None,
    host: str = ROUTER_HOST,
) -> AsyncIterator[tuple[UdpRouter, int]]:
    """(router, its port): a ``UdpRouter`` reading ``snapshot`` and listening on ``host``."""
    router = UdpRouter(settings or UdpRouterSettings(), default_template(), snapshot, metrics or RouterMetrics())
    _, port = await router.start(host, 0)
    try:
        yield router, port
    finally:
        await asyncio.wait_for(router.close(), CLOSE_TIMEOUT_S)


def has_datagram(sock: socket.socket) -> bool:
    """Whether a datagram waits on ``sock`` (peeked, not read): the splice's tests drain until none does."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    return True


UDP_TIMEOUT_S = 5.0
"""A test socket's blocking timeout: a datagram that never comes fails the test instead of hanging it."""


def udp_socket(host: str, timeout: float | None = UDP_TIMEOUT_S) -> socket.socket:
    """A UDP socket bound to ``host`` (any port), with a 4 MiB receive buffer so a burst is kept."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    sock.settimeout(timeout)
    return sock
