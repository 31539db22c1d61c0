"""Router replicas behind a UDP balancer, with QUIC-LB pods behind them: a rollout on loopback.

``replicas`` starts two QUIC-LB pods (``quic_lb_pods``: stargate-0 on 127.0.0.2, stargate-1 on
127.0.0.3; stargate-1 may be the quinn peer's QUIC-LB pod instead), two router processes
(``python -m router``) reading one endpoints file, and a ``UdpBalancer`` in front of them that
sends each new client address to the next replica and forgets a session idle for ``idle_s``. The
``Replicas`` it yields starts more routers (a rollout's new pods), sends SIGTERM to one (its
drain), and reads their metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aioquic.asyncio import QuicConnectionProtocol
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from router import constants as c
from router.demo.pki import DemoPki
from router.demo.quic_pods import bound_port
from router.extensions import Extensions
from router.udp.quic_lb import pod_server_id
from tests.support.quic_lb_pods import PodCids, start_quic_lb_pod
from tests.support.quinn_client import start_quinn_pod
from tests.support.router_process import RouterProcess, extensions_env, router_args, write_endpoints
from tests.support.udp_balancer import Address, UdpBalancer

PODS = {"stargate-0": "127.0.0.2", "stargate-1": "127.0.0.3"}
SERVER_ID_BYTES = 4
"""A pod's whole IPv4 address is its server ID."""


@dataclass
class Replicas:
    """The routers, the balancer in front of them, and the pods' connection ID generators."""

    balancer: UdpBalancer
    front: Address
    flags: tuple[str, ...]
    endpoints: Path
    cids: dict[str, PodCids]
    extensions: Extensions
    """The path every router takes (the suite's ``extensions`` fixture)."""
    routers: list[RouterProcess] = field(default_factory=list)

    async def start_router(self) -> RouterProcess:
        """One more replica, ready, added to the balancer (a rollout's new pod)."""
        router = RouterProcess(router_args(self.endpoints, "--log-format", "json", *self.flags),
                               extensions_env(self.extensions))
        self.routers.append(router)
        await asyncio.to_thread(router.wait_ready)
        self.balancer.add(self.address(router))
        return router

    @staticmethod
    def address(router: RouterProcess) -> Address:
        return ("127.0.0.1", router.quic_port)

    def terminate(self, router: RouterProcess) -> None:
        """SIGTERM (the router drains) and out of the balancer, as a Gateway takes out a terminating pod."""
        router.proc.send_signal(signal.SIGTERM)
        self.balancer.remove(self.address(router))

    async def exit_status(self, router: RouterProcess) -> int:
        return await asyncio.to_thread(router.proc.wait, 20)

    async def metric(self, router: RouterProcess, name: str, **labels: str) -> float:
        return await asyncio.to_thread(router.metric, name, **labels)

    async def outcome(self, router: RouterProcess, outcome: str) -> float:
        return await self.metric(router, f"{c.QUIC_CONNECTIONS_TOTAL}_total", outcome=outcome)

    async def dropped(self, router: RouterProcess, reason: str) -> float:
        return await self.metric(router, f"{c.QUIC_DROPPED_DATAGRAMS_TOTAL}_total", reason=reason)


@asynccontextmanager
async def replicas(pki: DemoPki, tmp: Path, extensions: Extensions, *flags: str, idle_s: float = 0.5,
                   self_encoded: bool = True, quinn: Path | None = None) -> AsyncIterator[Replicas]:
    """Two QUIC-LB pods, two routers on ``extensions``' path with ``flags`` and the balancer; all
    stopped at the end.
    ``quinn``: the quinn peer's binary, which then serves stargate-1 (``quinn_peer pod``)."""
    cids = {name: PodCids(host, SERVER_ID_BYTES, self_encoded=self_encoded) for name, host in PODS.items()}
    pods = {name: await start_quic_lb_pod(name, PODS[name], pki.cert_path, pki.key_path, cids[name])
            for name in PODS if quinn is None or name == "stargate-0"}
    ports = {name: bound_port(pod) for name, pod in pods.items()}
    quinn_pod = None
    if quinn is not None:
        cert, key = _der_files(pki, tmp)
        server_id = pod_server_id(PODS["stargate-1"], SERVER_ID_BYTES)
        assert server_id is not None
        quinn_pod, ports["stargate-1"] = await start_quinn_pod(quinn, PODS["stargate-1"], cert, key, "stargate-1",
                                                               server_id)
    endpoints = tmp / "endpoints.json"
    write_endpoints(endpoints, [(name, PODS[name], 1, port) for name, port in ports.items()])
    balancer = UdpBalancer([], idle_s)
    front = await balancer.start()
    r = Replicas(balancer, front, flags, endpoints, cids, extensions)
    try:
        for _ in range(2):
            await r.start_router()
        yield r
    finally:
        balancer.close()
        for router in r.routers:
            router.__exit__()
        for pod in pods.values():
            pod.close()
        if quinn_pod is not None:
            quinn_pod.kill()
            await quinn_pod.wait()


def _der_files(pki: DemoPki, tmp: Path) -> tuple[Path, Path]:
    """The pods' certificate and key as the quinn pod reads them: DER, the key PKCS#8."""
    cert = x509.load_pem_x509_certificate(Path(pki.cert_path).read_bytes())
    key = serialization.load_pem_private_key(Path(pki.key_path).read_bytes(), password=None)
    cert_der, key_der = tmp / "pod-cert.der", tmp / "pod-key.der"
    cert_der.write_bytes(cert.public_bytes(serialization.Encoding.DER))
    key_der.write_bytes(key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert_der, key_der


@contextlib.contextmanager
def keeping_alive(client: QuicConnectionProtocol, interval_s: float = 0.1) -> Iterator[None]:
    """PINGs from the client every ``interval_s``, as a tunnel's keep-alive (quinn's
    ``keep_alive_interval``) sends them: a client that only reads still speaks now and then."""
    loop = asyncio.get_running_loop()
    count = [0]

    def ping() -> None:
        count[0] += 1
        client._quic.send_ping(count[0])
        client.transmit()
        handle[0] = loop.call_later(interval_s, ping)

    handle: list[Any] = [loop.call_later(interval_s, ping)]
    try:
        yield
    finally:
        handle[0].cancel()
