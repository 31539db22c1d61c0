"""PROXY trust by default (issue 41, finding 8): a router that takes PROXY headers trusts no source
until ``--proxy-protocol-trusted-cidrs`` names one, as nginx's ``set_real_ip_from`` does.

The attack: another pod that reaches the gRPC listener (127.0.0.7 here, not the balancer) opens a
connection and sends a PROXY header claiming any client address. Believed, it is that client in
the rejection and access logs, in ``/debug/connections`` and against the per-client limits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from router.demo.grpc_pods import RunningPod, start_pod
from tests.support import proxy_headers as ph
from tests.support.edge_clients import tcp_from
from tests.support.polling import eventually_blocking
from tests.support.router_process import RouterProcess, router_args, write_endpoints
from tests.support.tcp_peers import read_to_eof
from tests.support.tls import ssl_client_hello_records

pytestmark = pytest.mark.timeout(60)

BALANCER = "127.0.0.9"
"""The only source the trusting routers here name."""
OTHER_POD = "127.0.0.7"
"""A pod that can reach the router but is not the balancer."""
FORGED = ("203.0.113.50", 4444)
"""The client address the forged headers claim."""
MISSING_CIDRS = (
    "stargate-router: error: --proxy-protocol-trusted-cidrs: required with --accept-proxy-protocol "
    "(the balancer's addresses; no source is trusted by default)"
)


@pytest.fixture(scope="module")
def pods() -> Iterator[list[RunningPod]]:
    running = [start_pod("stargate-0", "127.0.0.2")]
    try:
        yield running
    finally:
        for pod in running:
            pod.stop()


def router(tmp: Path, pods: list[RunningPod], *flags: str) -> RouterProcess:
    endpoints = tmp / "endpoints.json"
    write_endpoints(endpoints, [(p.pod_name, p.address, p.port, 1) for p in pods])
    return RouterProcess(router_args(endpoints, "--peek-timeout-ms=1500", *flags))


def forge(router: RouterProcess, source: str) -> None:
    """From ``source``: a PROXY v2 header claiming ``FORGED``, then a ClientHello naming no pod."""
    with tcp_from(source, router.grpc_port) as sock:
        sock.sendall(ph.v2(FORGED) + ssl_client_hello_records("nobody.example.com", alpn=()))
        read_to_eof(sock)


def naming_the_forged_client(router: RouterProcess) -> list[str]:
    return [line for line in list(router.lines) if f"{FORGED[0]}:{FORGED[1]}" in line]


@pytest.mark.parametrize(
    "proxy_on",
    [("--accept-proxy-protocol",), ("--accept-proxy-protocol=true",), ("--accept-proxy-protocol", "true")],
    ids=["bare", "equals", "separate"],
)
def test_proxy_on_without_trusted_cidrs_refuses_to_start_with_one_line(
    tmp_path: Path, pods: list[RunningPod], proxy_on: tuple[str, ...]
) -> None:
    with router(tmp_path, pods, *proxy_on) as proc:
        status = proc.wait_exit()
        if status is None:  # it started: show what that lets any pod do, then fail
            proc.wait_ready()
            forge(proc, OTHER_POD)
            eventually_blocking(lambda: naming_the_forged_client(proc), 10, what="a line naming the forged client")
            pytest.fail(f"started trusting every source; {OTHER_POD} was believed: {naming_the_forged_client(proc)}")
        assert (status, proc.lines) == (2, [MISSING_CIDRS])


def test_a_pod_outside_the_trusted_cidrs_cannot_claim_a_client_address(
    tmp_path: Path, pods: list[RunningPod]
) -> None:
    flags = ("--accept-proxy-protocol", f"--proxy-protocol-trusted-cidrs={BALANCER}/32")
    with router(tmp_path, pods, *flags) as proc:
        proc.wait_ready()
        forge(proc, OTHER_POD)
        eventually_blocking(
            lambda: [line for line in list(proc.lines) if "untrusted" in line and f"peer={OTHER_POD}:" in line],
            10, what="the untrusted source's line",
        )
        assert naming_the_forged_client(proc) == []
        forge(proc, BALANCER)  # the balancer's header is believed: the client is the one it names
        eventually_blocking(lambda: naming_the_forged_client(proc), 10, what="the balancer's client named")
        assert any(f"via={BALANCER}:" in line for line in naming_the_forged_client(proc))
        assert proc.stop() == 0


def test_trusting_every_source_takes_an_explicit_cidr_and_is_warned_about(
    tmp_path: Path, pods: list[RunningPod]
) -> None:
    """``0.0.0.0/0,::/0`` stays allowed (nginx allows it too: a router only a balancer can reach),
    but never by default, and the start says what it means in one warning line naming the flag."""
    flags = ("--accept-proxy-protocol", "--proxy-protocol-trusted-cidrs=0.0.0.0/0,::/0")
    with router(tmp_path, pods, *flags) as proc:
        proc.wait_ready()
        warnings = [line for line in proc.lines if "--proxy-protocol-trusted-cidrs" in line]
        assert len(warnings) == 1 and " warning " in warnings[0], proc.lines
        assert "trusts every source" in warnings[0]
        forge(proc, OTHER_POD)
        eventually_blocking(lambda: naming_the_forged_client(proc), 10, what="the forged client, as asked")
        assert proc.stop() == 0
