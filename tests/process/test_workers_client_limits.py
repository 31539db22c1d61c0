"""Per-client limits under ``--workers N``: the router process with real workers behind one
port, real TLS ClientHellos and aioquic clients from one loopback address on many source ports,
which the kernel's SO_REUSEPORT hash spreads over both workers. The limit holds exactly, for the
client's connections on every worker, and a SIGKILLed worker's slots come back with its successor.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from router import constants as c
from router.demo.grpc_pods import RunningPod, start_pod
from router.demo.pki import DemoPki
from router.demo.quic_pods import bound_port, start_quic_pod
from tests.support.edge_clients import TLS_ALERT_RECORD, QuicFrom, quic_from, read_some, tcp_from
from tests.support.names import host
from tests.support.polling import eventually, eventually_blocking
from tests.support.router_process import Supervised, router_args, write_endpoints
from tests.support.tls import ssl_client_hello_records

pytestmark = pytest.mark.timeout(120)

TLS_POD = ("stargate-tls-0", "127.0.0.4")
CLIENT = "127.0.0.21"
GRPC = f"{c.GRPC_CONNECTIONS_TOTAL}_total"
QUIC = f"{c.QUIC_CONNECTIONS_TOTAL}_total"
ALERT_INTERNAL_ERROR = 80
MAX_ATTEMPTS = 96
"""Attempts before giving up on the kernel spreading them over every worker (3 workers: p < 1e-15)."""


@pytest.fixture()
def tls_pod(tmp_path: Path, pki: DemoPki) -> Iterator[Path]:
    pod: RunningPod = start_pod(*TLS_POD, cert_pem=pki.cert_pem, key_pem=pki.key_pem)
    endpoints = tmp_path / "endpoints.json"
    write_endpoints(endpoints, [(pod.pod_name, pod.address, pod.port, 1)])
    try:
        yield endpoints
    finally:
        pod.stop()


def tls_attempt(router: Supervised) -> socket.socket | None:
    """A TLS connection from ``CLIENT``: open (the pod's ServerHello came) or None (refused)."""
    sock = tcp_from(CLIENT, router.grpc_port)
    sock.sendall(ssl_client_hello_records(host(TLS_POD[0]), alpn=()))
    first = read_some(sock)
    if first[:1] == b"\x16":
        return sock
    sock.close()
    assert first == TLS_ALERT_RECORD + bytes([ALERT_INTERNAL_ERROR]), first
    return None


def per_worker(router: Supervised, name: str, **labels: str) -> dict[int, float]:
    return {i: router.worker_metric(port, name, **labels) for i, port in router.private_health().items()}


def tls_seen(router: Supervised) -> dict[int, float]:
    """TLS connections each worker took: routed or refused for the limit."""
    accepted = per_worker(router, GRPC, protocol="tls", outcome="accepted")
    refused = per_worker(router, GRPC, protocol="tls", outcome="client_limit")
    return {i: accepted[i] + refused[i] for i in accepted}


def open_until_refused(router: Supervised, held: list[socket.socket]) -> int:
    """Open connections from ``CLIENT`` until one is refused; how many were let in."""
    admitted = 0
    while (sock := tls_attempt(router)) is not None:
        held.append(sock)
        admitted += 1
        assert admitted <= 10, "no limit held"
    return admitted


@pytest.mark.parametrize("workers", [2, 3])
def test_tcp_connections_of_a_client_count_once_across_the_workers(tls_pod: Path, workers: int) -> None:
    args = router_args(tls_pod, "--workers", str(workers), "--max-connections-per-client", "3")
    held: list[socket.socket] = []
    with Supervised(args) as router:
        router.wait_ready(timeout=30.0)
        try:
            attempts = 0
            while attempts < 12 or min(tls_seen(router).values()) == 0:
                assert attempts < MAX_ATTEMPTS, tls_seen(router)
                if (sock := tls_attempt(router)) is not None:
                    held.append(sock)
                attempts += 1
            assert len(held) == 3  # not 3 per worker
            assert router.metric(GRPC, protocol="tls", outcome="client_limit") == attempts - 3
            assert router.metric(GRPC, protocol="tls", outcome="accepted") == 3
            assert sorted(tls_seen(router)) == list(range(workers)) and all(tls_seen(router).values())

            for sock in held:
                sock.close()
            held.clear()

            def three_fit_again() -> bool:
                while len(held) < 3 and (sock := tls_attempt(router)) is not None:
                    held.append(sock)
                return len(held) == 3

            eventually_blocking(three_fit_again, 20, what="the closed connections' slots")
            assert tls_attempt(router) is None
        finally:
            for sock in held:
                sock.close()
        assert router.stop(timeout=30.0) == 0


def test_a_killed_workers_slots_come_back_when_it_is_restarted(tls_pod: Path) -> None:
    args = router_args(tls_pod, "--workers", "2", "--max-connections-per-client", "2")
    held: list[socket.socket] = []
    with Supervised(args) as router:
        router.wait_ready(timeout=30.0)
        try:
            assert open_until_refused(router, held) == 2
            active = per_worker(router, c.ACTIVE_CONNECTIONS, protocol="tls")
            assert sum(active.values()) == 2
            victim = max(active, key=lambda i: active[i])  # holds 1 or 2 of the client's slots
            old_pid = router.pids()[victim]
            os.kill(old_pid, signal.SIGKILL)
            router.wait_for(f"worker {victim} restarted", lambda: router.pids().get(victim, old_pid) != old_pid)
            router.wait_ready(timeout=30.0)
            # The survivor's connections still count; the dead worker's count no more.
            assert open_until_refused(router, held) == int(active[victim])
        finally:
            for sock in held:
                sock.close()
        assert router.stop(timeout=30.0) == 0


# -- QUIC -------------------------------------------------------------------------------
def test_quic_flows_of_a_client_count_once_across_two_workers(tmp_path: Path, pki: DemoPki) -> None:
    asyncio.run(_quic_flows_count_once(tmp_path, pki))


async def _quic_flows_count_once(tmp_path: Path, pki: DemoPki) -> None:
    pod = await start_quic_pod("stargate-0", "127.0.0.2", 0, pki.cert_path, pki.key_path)
    endpoints = tmp_path / "endpoints.json"
    write_endpoints(endpoints, [("stargate-0", "127.0.0.2", 1, bound_port(pod))])
    args = router_args(endpoints, "--workers", "2", "--max-quic-flows-per-client", "2", "--relay-idle-timeout-ms=1500")
    held: list[QuicFrom] = []

    async def attempt() -> bool:
        """One connection from ``CLIENT`` (a new source port each): True if it reached the pod."""
        client = await quic_from(CLIENT, router.quic_port, host("stargate-0"), pki.ca_path)
        if client.close_reason:
            client.close()
            assert client.close_reason == c.REASON_TOO_MANY_CONNECTIONS
            return False
        assert await client.whoami() == "stargate-0"
        held.append(client)
        return True

    async def keep_alive() -> None:
        """A request on every held connection, so none goes idle while the test opens more."""
        for client in held:
            assert await client.whoami() == "stargate-0"

    async def seen() -> dict[int, float]:
        accepted = await asyncio.to_thread(per_worker, router, QUIC, outcome="accepted")
        refused = await asyncio.to_thread(per_worker, router, QUIC, outcome="client_limit")
        return {i: accepted[i] + refused[i] for i in accepted}

    try:
        with Supervised(args) as router:
            await asyncio.to_thread(router.wait_ready, 30.0)
            attempts = 0
            while attempts < 12 or min((await seen()).values()) == 0:
                assert attempts < MAX_ATTEMPTS, await seen()
                await attempt()
                await keep_alive()
                attempts += 1
            assert len(held) == 2  # not 2 per worker
            assert await asyncio.to_thread(router.metric, QUIC, outcome="client_limit") == attempts - 2
            assert sorted(await seen()) == [0, 1] and all((await seen()).values())

            for client in held:
                client.close()  # the flows end when idle (1.5 s here): then the slots are free
            held.clear()

            async def two_fit_again() -> bool:
                while len(held) < 2 and await attempt():
                    await keep_alive()
                return len(held) == 2

            await eventually(two_fit_again, 30, 0.2, what="the QUIC slots released")
            assert not await attempt()
            assert await asyncio.to_thread(router.stop, signal.SIGTERM, 30.0) == 0
    finally:
        for client in held:
            client.close()
        pod.close()
