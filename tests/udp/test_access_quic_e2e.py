"""The access log of QUIC flows, through the router process with real aioquic clients and pods.

A flow writes one line when it ends: idle expiry (``idle_timeout``, outcome ``completed``) with
the exact bytes the client's socket sent and received, a refusal (``rejected``), and flows that
end at their connections' own idle timeout (``quic_idle_timeout``), one line each, also when
they shared a client address.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aioquic.asyncio import QuicConnectionProtocol, connect

from router import constants as c
from router.demo.pki import DemoPki
from router.demo.quic_pods import WHOAMI, bound_port, client_configuration, request, start_quic_pod
from router.extensions import Extensions
from tests.support.access_peers import access_lines, wait_access
from tests.support.names import host
from tests.support.polling import becomes_true, eventually
from tests.support.quic_initial_rewriter import client_first_flight
from tests.support.router_process import RouterProcess, extensions_env, router_args, write_endpoints

pytestmark = pytest.mark.timeout(60)
"""Every test here runs on the pure-Python path and on the C splice, each within 60 s."""

IDLE_TIMEOUT_MS = 1000
PODS = {"sg-0": "127.0.0.2", "sg-1": "127.0.0.3"}


class _CountingTransport:
    """The client's UDP transport, counting every byte it sends (the rest passes through)."""

    def __init__(self, transport: Any, counts: list[int]) -> None:
        self._transport, self._counts = transport, counts

    def sendto(self, data: bytes, addr: Any = None) -> None:
        self._counts[0] += len(data)
        self._transport.sendto(data, addr)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CountingClient(QuicConnectionProtocol):
    """An aioquic client protocol that counts the bytes of every datagram sent and received."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts = [0, 0]

    def connection_made(self, transport: Any) -> None:
        super().connection_made(_CountingTransport(transport, self.counts))

    def datagram_received(self, data: bytes | bytearray, addr: Any) -> None:
        self.counts[1] += len(data)
        super().datagram_received(data, addr)

    @property
    def address(self) -> str:
        """As the router sees it (aioquic binds the dual-stack ``::``; the client dials 127.0.0.1)."""
        port = self._transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
        return f"127.0.0.1:{port}"


@asynccontextmanager
async def quic_router(pki: DemoPki, tmp: Path, extensions: Extensions, idle_ms: int) -> AsyncIterator[RouterProcess]:
    pods = {name: await start_quic_pod(name, ip, 0, pki.cert_path, pki.key_path) for name, ip in PODS.items()}
    endpoints = tmp / "endpoints.json"
    write_endpoints(endpoints, [(name, PODS[name], 1, bound_port(pod)) for name, pod in pods.items()])
    router = RouterProcess(router_args(
        endpoints, "--log-format", "json", "--relay-idle-timeout-ms", str(idle_ms), "--debug-endpoints",
    ), extensions_env(extensions))
    try:
        await asyncio.to_thread(router.wait_ready)
        yield router
        assert await asyncio.to_thread(router.stop) == 0
    finally:
        router.__exit__()
        for pod in pods.values():
            pod.close()


def lines_from(router: RouterProcess, address: str) -> list[dict[str, Any]]:
    return [x for x in access_lines(router) if x["client"] == address]


async def line_of(router: RouterProcess, address: str, timeout_s: float = 10.0) -> dict[str, Any]:
    await eventually(lambda: lines_from(router, address), timeout_s, 0.05,
                     what=lambda: f"an access line for {address}: {access_lines(router)[-5:]}")
    mine = lines_from(router, address)
    assert len(mine) == 1, mine
    return mine[0]


async def test_an_idle_flow_ends_completed_with_the_bytes_its_client_moved(
    pki: DemoPki, tmp_path: Path, extensions: Extensions
) -> None:
    async with quic_router(pki, tmp_path, extensions, IDLE_TIMEOUT_MS) as router:
        config = client_configuration(host("sg-0"), pki.ca_path)
        async with connect("127.0.0.1", router.quic_port, configuration=config,
                           create_protocol=CountingClient) as client:
            assert isinstance(client, CountingClient)
            assert (await request(client, WHOAMI)).startswith(b"sg-0:")
            line = await line_of(router, client.address, timeout_s=IDLE_TIMEOUT_MS / 1000 + 10)
            sent, received = client.counts
        assert (line["protocol"], line["hostname"], line["pod"]) == ("quic", host("sg-0"), "sg-0")
        assert line["pod_address"].startswith(PODS["sg-0"] + ":")
        assert (line["outcome"], line["termination"]) == ("completed", "idle_timeout")
        assert (line["bytes_client_to_pod"], line["bytes_pod_to_client"]) == (sent, received)
        assert line["duration_ms"] >= IDLE_TIMEOUT_MS - 50 and isinstance(line["decision_us"], int)


async def test_a_refused_flow_is_one_rejected_line(pki: DemoPki, tmp_path: Path, extensions: Extensions) -> None:
    async with quic_router(pki, tmp_path, extensions, IDLE_TIMEOUT_MS) as router:
        config = client_configuration("nobody.example.org", pki.ca_path)
        with pytest.raises(ConnectionError):
            async with connect("127.0.0.1", router.quic_port, configuration=config, wait_connected=True):
                pass
        [line] = wait_access(router, 1)
        assert (line["protocol"], line["hostname"], line["pod"], line["pod_address"]) == (
            "quic", "nobody.example.org", None, None)
        assert (line["outcome"], line["termination"]) == ("unknown_sni", "rejected")
        assert line["bytes_client_to_pod"] >= 1200 and line["bytes_pod_to_client"] > 0


async def test_a_pending_flow_is_listed_without_a_pod_then_ends_at_the_pending_timeout(
    pki: DemoPki, tmp_path: Path, extensions: Extensions
) -> None:
    async with quic_router(pki, tmp_path, extensions, IDLE_TIMEOUT_MS) as router:
        _client, flight = client_first_flight(big_hello=True, addr=("127.0.0.1", router.quic_port))
        assert len(flight) > 1
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", 0))
            sock.sendto(flight[0], ("127.0.0.1", router.quic_port))  # the rest of the ClientHello never comes
            address = f"127.0.0.1:{sock.getsockname()[1]}"
            pending: list[dict[str, Any]] = []

            async def listed() -> bool:
                nonlocal pending
                view = json.loads((await asyncio.to_thread(router.http_get, "/debug/connections"))[1])
                pending = [e for e in view["connections"] if e["client"] == address]
                return bool(pending)

            # seen well before the pending timeout ends it
            await becomes_true(listed, c.QUIC_PENDING_FLOW_TIMEOUT_MS / 1000 * 0.8)
            assert [(e["protocol"], e["pod"]) for e in pending] == [("quic", None)]
            assert pending[0]["bytes_client_to_pod"] == len(flight[0])  # held, waiting for the rest
            line = await line_of(router, address, timeout_s=c.QUIC_PENDING_FLOW_TIMEOUT_MS / 1000 + 10)
        assert (line["pod"], line["outcome"], line["termination"]) == (None, None, "peek_timeout")
        assert line["bytes_client_to_pod"] == len(flight[0]) and line["bytes_pod_to_client"] == 0


async def test_connections_from_one_address_each_write_their_own_line_at_their_own_idle_timeout(
    pki: DemoPki, tmp_path: Path, extensions: Extensions
) -> None:
    """Two clients one after the other on one local port, each advertising a 2 s idle timeout: two
    flows side by side, each listed live with its own pod, each ending as ``quic_idle_timeout``."""
    async with quic_router(pki, tmp_path, extensions, 30_000) as router:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.bind(("127.0.0.1", 0))
        local_port = probe.getsockname()[1]
        probe.close()
        address = f"127.0.0.1:{local_port}"

        async def whoami_from_port(pod: str) -> str:
            config = client_configuration(host(pod), pki.ca_path, idle_timeout_s=2.0)
            async with connect("127.0.0.1", router.quic_port, configuration=config, local_port=local_port) as cl:
                return (await request(cl, WHOAMI)).partition(b":")[0].decode()

        assert [await whoami_from_port(pod) for pod in ("sg-0", "sg-1")] == ["sg-0", "sg-1"]
        view = json.loads((await asyncio.to_thread(router.http_get, "/debug/connections"))[1])
        live = sorted((e["pod"], e["hostname"]) for e in view["connections"] if e["client"] == address)
        assert live == [("sg-0", host("sg-0")), ("sg-1", host("sg-1"))]
        await becomes_true(lambda: len(lines_from(router, address)) >= 2, 10.0, 0.05)
        lines = lines_from(router, address)
        assert sorted((x["pod"], x["outcome"], x["termination"]) for x in lines) == [
            ("sg-0", "completed", "quic_idle_timeout"), ("sg-1", "completed", "quic_idle_timeout")]
        assert all(x["bytes_client_to_pod"] > 0 and x["bytes_pod_to_client"] > 0 for x in lines)
