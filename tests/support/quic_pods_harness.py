"""The QUIC edge in this process between real aioquic clients and two real aioquic pods.

``running`` starts pods stargate-0 and stargate-1 (127.0.0.2/3) and a ``UdpRouter`` on 127.0.0.1
routing to them; the ``Harness`` it yields reads the router's metrics and asks pods who they are.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aioquic.asyncio import QuicConnectionProtocol, connect
from aioquic.quic import events
from aioquic.quic.connection import QuicConnection

from discovery.targets import Target, TargetSnapshot
from router import constants as c
from router.demo.pki import DemoPki
from router.demo.quic_pods import QUIC_V1, bound_port, client_configuration, quic_whoami, start_quic_pod
from router.extensions import Extensions
from router.metrics import RouterMetrics
from router.udp.edge import UdpRouter
from router.udp.flow_limits import FlowLimits
from router.udp.settings import UdpRouterSettings
from tests.support.udp_router import running_udp_router

ROUTER_HOST = "127.0.0.1"
POD_HOSTS = {"stargate-0": "127.0.0.2", "stargate-1": "127.0.0.3"}
T = 5.0
"""Bound of every await: far under the clients' 30 s idle timeout, so 'fails fast' is real."""


@dataclass
class Harness:
    """A ``UdpRouter`` in this process with two real aioquic pods behind it, and its metrics."""

    router: UdpRouter
    metrics: RouterMetrics
    port: int
    targets: dict[str, Target]
    cafile: Path
    snapshot: list[TargetSnapshot] = field(default_factory=list)

    def publish(self, *pods: str, **overrides: Target) -> None:
        targets = [self.targets[p] for p in pods] + list(overrides.values())
        self.snapshot[0] = TargetSnapshot.of(targets)

    def count(self, name: str, **labels: str) -> float:
        self.router.flush_metrics()
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def outcome(self, outcome: str) -> float:
        return self.count(f"{c.QUIC_CONNECTIONS_TOTAL}_total", outcome=outcome)

    def dropped(self, reason: str) -> float:
        return self.count(f"{c.QUIC_DROPPED_DATAGRAMS_TOTAL}_total", reason=reason)

    def terminations(self, termination: str) -> float:
        return self.count(f"{c.TERMINATIONS_TOTAL}_total", protocol="quic", termination=termination)

    async def whoami(self, pod_or_name: str | None, version: int = QUIC_V1) -> str:
        return await quic_whoami(ROUTER_HOST, self.port, pod_or_name, self.cafile, version, timeout_s=T)


@asynccontextmanager
async def running(
    pki: DemoPki, extensions: Extensions, retry: bool = False, pod_versions: tuple[int, ...] | None = None,
    **settings: Any,
) -> AsyncIterator[Harness]:
    """The router on ``ROUTER_HOST`` with pods stargate-0/1 on 127.0.0.2/3, on the path
    ``extensions`` chose (the suite's ``extensions`` fixture); ``settings`` are the other
    ``UdpRouterSettings`` and ``FlowLimits`` fields by name."""
    pods = {
        name: await start_quic_pod(
            name, host, 0, pki.cert_path, pki.key_path, retry=retry, versions=pod_versions
        )
        for name, host in POD_HOSTS.items()
    }
    targets = {name: Target(name, POD_HOSTS[name], 1, bound_port(pod)) for name, pod in pods.items()}
    metrics = RouterMetrics()
    snapshot = [TargetSnapshot.of(list(targets.values()))]
    limits = {name: settings.pop(name) for name in list(settings) if name in FlowLimits.__dataclass_fields__}
    udp_settings = UdpRouterSettings(FlowLimits(**limits), extensions=extensions, **settings)
    try:
        async with running_udp_router(lambda: snapshot[0], udp_settings, metrics) as (router, port):
            yield Harness(router, metrics, port, targets, pki.ca_path, snapshot)
    finally:
        for pod in pods.values():
            pod.close()


class Recorder(QuicConnectionProtocol):
    """An aioquic client protocol that keeps the CONNECTION_CLOSE it received."""

    terminated: events.ConnectionTerminated | None = None

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.ConnectionTerminated):
            self.terminated = event
        super().quic_event_received(event)


async def refusal(h: Harness, server_name: str | None) -> events.ConnectionTerminated:
    """Connect expecting a refusal; the CONNECTION_CLOSE the client received."""
    made: list[Recorder] = []

    def create(*args: Any, **kwargs: Any) -> Recorder:
        made.append(Recorder(*args, **kwargs))
        return made[-1]

    config = client_configuration(server_name, h.cafile)
    with pytest.raises(ConnectionError):
        async with connect(ROUTER_HOST, h.port, configuration=config, create_protocol=create):
            pass
    terminated = made[0].terminated
    assert terminated is not None
    return terminated




def first_flight(h: Harness, server_name: str | None, version: int = QUIC_V1) -> list[bytes]:
    """A real client's first flight, for tests that speak raw UDP."""
    conn = QuicConnection(configuration=client_configuration(server_name, h.cafile, version))
    conn.connect((ROUTER_HOST, h.port), now=0.0)
    return [d for d, _ in conn.datagrams_to_send(now=0.0)]


@asynccontextmanager
async def raw_socket() -> AsyncIterator[socket.socket]:
    """A non-blocking UDP socket on ``ROUTER_HOST``, for tests that speak raw datagrams."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((ROUTER_HOST, 0))
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def received(sock: socket.socket) -> list[bytes]:
    """Every datagram waiting on the non-blocking ``sock``."""
    out = []
    while True:
        try:
            out.append(sock.recv(65536))
        except BlockingIOError:
            return out
