"""``--tunnel-protocol webtransport``: WebTransport sessions route by SNI like raw QUIC tunnels and
count in ``webtransport_sessions_total``, through the router process with real aioquic HTTP/3 peers.

The worker is aioquic's HTTP/3 client (ALPN ``h3``) opening a WebTransport session with an
extended CONNECT, and the pods are aioquic HTTP/3 servers that accept it: the router reads only
the Initial's SNI, so the session's CONNECT and streams reach the pod the SNI names.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from discovery.targets import Target, TargetSnapshot
from router import constants as c
from router.demo.pki import DemoPki
from router.demo.quic_pods import bound_port
from router.extensions import Extensions
from router.metrics import RouterMetrics
from router.outcomes import QuicOutcome, WebTransportOutcome
from router.udp.settings import UdpRouterSettings
from tests.support.access_peers import access_lines
from tests.support.names import host
from tests.support.polling import eventually
from tests.support.router_process import RouterProcess, extensions_env, router_args, write_endpoints
from tests.support.udp_router import ROUTER_HOST, running_udp_router
from tests.support.webtransport import start_webtransport_pod, webtransport_whoami

pytestmark = pytest.mark.timeout(60)
"""Every test of a router here runs on the pure-Python path and on the C splice, each within 60 s."""

PODS = {"stargate-0": "127.0.0.2", "stargate-1": "127.0.0.3"}
IDLE_TIMEOUT_MS = 1000
"""Short, so the sessions' flows end (``completed``) within the test."""

WEBTRANSPORT_SESSIONS = c.WEBTRANSPORT_SESSIONS_TOTAL + "_total"
QUIC_CONNECTIONS = c.QUIC_CONNECTIONS_TOTAL + "_total"

RUST_ROUTER_SESSION_OUTCOMES = (
    "accepted", "missing_sni", "unknown_sni", "target_unavailable", "invalid_connect",
    "upstream_connect_error", "upstream_rejected", "completed", "relay_error",
)
"""The Rust router's ``webtransport_sessions_total`` labels (its ``WEBTRANSPORT_SESSION_OUTCOMES``)."""


@asynccontextmanager
async def webtransport_router(
    pki: DemoPki, tmp: Path, extensions: Extensions, *extra: str
) -> AsyncIterator[RouterProcess]:
    pods = {name: await start_webtransport_pod(name, ip, 0, pki.cert_path, pki.key_path)
            for name, ip in PODS.items()}
    endpoints = tmp / "endpoints.json"
    write_endpoints(endpoints, [(name, PODS[name], 1, bound_port(pod)) for name, pod in pods.items()])
    router = RouterProcess(router_args(
        endpoints, "--log-format", "json", "--relay-idle-timeout-ms", str(IDLE_TIMEOUT_MS), *extra,
    ), env=extensions_env(extensions))
    try:
        await asyncio.to_thread(router.wait_ready)
        yield router
        assert await asyncio.to_thread(router.stop) == 0
    finally:
        router.__exit__()
        for pod in pods.values():
            pod.close()


def sessions(router: RouterProcess) -> dict[str, float]:
    """Every ``webtransport_sessions_total`` series of one scrape, by outcome."""
    return {o.value: router.metric(WEBTRANSPORT_SESSIONS, outcome=o) for o in WebTransportOutcome}


def quic_connections(router: RouterProcess) -> dict[str, float]:
    return {o.value: router.metric(QUIC_CONNECTIONS, outcome=o) for o in QuicOutcome}


def test_the_session_counter_has_the_rust_routers_labels_and_the_per_client_limits() -> None:
    ours = {WebTransportOutcome.CLIENT_LIMIT, WebTransportOutcome.JOINED}  # this router's own outcomes
    assert [o.value for o in WebTransportOutcome if o not in ours] == list(RUST_ROUTER_SESSION_OUTCOMES)


async def test_h3_sessions_route_by_sni_and_count_as_webtransport_sessions(
    pki: DemoPki, tmp_path: Path, extensions: Extensions
) -> None:
    async with webtransport_router(
        pki, tmp_path, extensions, "--tunnel-protocol=webtransport", f"--upstream-tls-cert-path={pki.ca_path}",
    ) as router:
        before = sessions(router)
        assert set(before) == {o.value for o in WebTransportOutcome} and set(before.values()) == {0.0}
        assert set(quic_connections(router).values()) == {0.0}

        for pod in PODS:
            assert await webtransport_whoami("127.0.0.1", router.quic_port, host(pod), pki.ca_path) == pod
        with pytest.raises(ConnectionError, match=c.REASON_TARGET_NOT_READY):
            await webtransport_whoami("127.0.0.1", router.quic_port, host("stargate-9"), pki.ca_path)
        with pytest.raises(ConnectionError, match=c.REASON_UNKNOWN_SNI):
            await webtransport_whoami("127.0.0.1", router.quic_port, "stargate-0.example.org", pki.ca_path)

        expected = dict.fromkeys(before, 0.0) | {
            "accepted": 2.0, "completed": 2.0, "target_unavailable": 1.0, "unknown_sni": 1.0,
        }
        await eventually(lambda: sessions(router) == expected, timeout_s=10.0, what="the sessions' flows to end")
        assert set(quic_connections(router).values()) == {0.0}  # the QUIC listener's flows count once

        lines = access_lines(router)
        assert {line["protocol"] for line in lines} == {"quic"}  # still QUIC to the router
        assert sorted(line["outcome"] for line in lines) == [
            "completed", "completed", "target_unavailable", "unknown_sni",
        ]
        started = [line for line in router.lines if "no effect at L4" in line]
        assert len(started) == 1 and "--upstream-tls-cert-path" in started[0]


async def test_raw_quic_mode_keeps_every_session_series_at_zero(
    pki: DemoPki, tmp_path: Path, extensions: Extensions
) -> None:
    """The default tunnel protocol: the same h3 session counts as a QUIC connection instead."""
    async with webtransport_router(pki, tmp_path, extensions) as router:
        assert await webtransport_whoami("127.0.0.1", router.quic_port, host("stargate-1"), pki.ca_path) == "stargate-1"
        await eventually(lambda: router.metric(QUIC_CONNECTIONS, outcome="completed") == 1.0, timeout_s=10.0,
                         what="the flow to end")
        assert quic_connections(router)["accepted"] == 1.0
        assert set(sessions(router).values()) == {0.0}


async def test_a_pod_whose_socket_cannot_be_opened_counts_as_an_upstream_connect_error(
    pki: DemoPki, extensions: Extensions
) -> None:
    """The one session outcome with no QUIC twin: the pod was chosen, its UDP socket could not be
    connected (the broadcast address: EACCES), and the worker is told ``target stargate not ready``."""
    metrics = RouterMetrics(webtransport=True)
    unreachable = TargetSnapshot.of([Target("stargate-0", "255.255.255.255", 1, 50052)])
    settings = UdpRouterSettings(extensions=extensions)
    async with running_udp_router(lambda: unreachable, settings, metrics) as (_router, port):
        with pytest.raises(ConnectionError, match=c.REASON_TARGET_NOT_READY):
            await webtransport_whoami(ROUTER_HOST, port, host("stargate-0"), pki.ca_path)
    counted = {values[0]: metrics.webtransport_sessions.labels(*values).value
               for values in metrics.webtransport_sessions.label_values()}
    assert {outcome: n for outcome, n in counted.items() if n} == {"upstream_connect_error": 1.0}
