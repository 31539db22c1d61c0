"""Trust at the edge, end to end: Debian's HAProxy (send-proxy-v2 / send-proxy) in front of the
router process, real grpcio h2c and TLS calls, raw ClientHellos and aioquic clients.

HAProxy's connections to the router come from 127.0.0.9 (the only trusted PROXY source);
raw clients come from other loopback addresses (127.0.0.7, 127.0.0.2x), so the router's socket
peer is never the client and the logs must name the client from the header.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from router import constants as c
from router.demo.grpc_pods import RunningPod, call_whoami, start_pod
from router.demo.pki import DemoPki
from router.demo.quic_pods import bound_port, start_quic_pod
from router.outcomes import TCP_PROTOCOLS, GrpcOutcome, QuicOutcome
from tests.support import proxy_headers as ph
from tests.support.edge_clients import TLS_ALERT_RECORD, quic_from, read_some, tcp_from
from tests.support.haproxy import HaproxyFront, haproxy_available
from tests.support.names import host
from tests.support.polling import deliberate_pause_blocking, eventually, eventually_blocking
from tests.support.router_process import RouterProcess, router_args, write_endpoints
from tests.support.tcp_peers import read_to_eof
from tests.support.tls import ssl_client_hello_records

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(not haproxy_available(), reason="Debian's haproxy is not installed"),
]

HAPROXY_SOURCE = "127.0.0.9"
RAW_CLIENT = "127.0.0.7"
H2C_POD, TLS_POD = ("stargate-0", "127.0.0.2"), ("stargate-tls-0", "127.0.0.4")
PEEK_TIMEOUT_MS = 1500
GRPC = f"{c.GRPC_CONNECTIONS_TOTAL}_total"
QUIC = f"{c.QUIC_CONNECTIONS_TOTAL}_total"
ALERT_INTERNAL_ERROR, ALERT_UNRECOGNIZED_NAME = 80, 112


@dataclass
class Edge:
    router: RouterProcess
    haproxy: HaproxyFront
    pki: DemoPki

    def h2c(self, version: int, pod: str) -> grpc.Channel:
        return grpc.insecure_channel(
            f"127.0.0.1:{self.haproxy.port(version)}",
            options=[("grpc.default_authority", host(pod)), ("grpc.use_local_subchannel_pool", 1)],
        )

    def tls(self, version: int, pod: str) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(root_certificates=self.pki.ca_pem)
        return grpc.secure_channel(
            f"127.0.0.1:{self.haproxy.port(version)}", creds,
            options=[("grpc.ssl_target_name_override", host(pod)), ("grpc.use_local_subchannel_pool", 1)],
        )

    def count(self, protocol: str, outcome: str) -> float:
        return self.router.metric(GRPC, protocol=protocol, outcome=outcome)

    def log_lines(self, *needles: str) -> list[str]:
        return [line for line in list(self.router.lines) if all(n in line for n in needles)]

    def wait_log(self, *needles: str) -> list[str]:
        """The router's log lines holding every needle, once there is one."""
        eventually_blocking(lambda: self.log_lines(*needles), 10, what=f"a log line with {needles}")
        return self.log_lines(*needles)


@pytest.fixture(scope="module")
def pods(pki: DemoPki) -> Iterator[list[RunningPod]]:
    running = [start_pod(*H2C_POD), start_pod(*TLS_POD, cert_pem=pki.cert_pem, key_pem=pki.key_pem)]
    try:
        yield running
    finally:
        for pod in running:
            pod.stop()


def _edge(tmp: Path, pods: list[RunningPod], pki: DemoPki, *flags: str) -> tuple[RouterProcess, HaproxyFront]:
    endpoints = tmp / "endpoints.json"
    write_endpoints(endpoints, [(p.pod_name, p.address, p.port, 1) for p in pods])
    router = RouterProcess(router_args(
        endpoints, "--accept-proxy-protocol", f"--proxy-protocol-trusted-cidrs={HAPROXY_SOURCE}/32",
        f"--peek-timeout-ms={PEEK_TIMEOUT_MS}", "--connect-timeout-ms=1000", *flags,
    ))
    try:
        router.wait_ready()
        return router, HaproxyFront(router.grpc_port, source_ip=HAPROXY_SOURCE)
    except BaseException:
        router.stop()
        raise


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory, pods: list[RunningPod], pki: DemoPki) -> Iterator[Edge]:
    router, haproxy = _edge(tmp_path_factory.mktemp("edge"), pods, pki)
    try:
        yield Edge(router, haproxy, pki)
    finally:
        haproxy.close()
        router.stop()


# -- through HAProxy ----------------------------------------------------------------------
def test_client_limit_series_exist_at_zero_from_the_first_scrape(edge: Edge) -> None:
    for protocol in TCP_PROTOCOLS:
        assert edge.count(protocol, GrpcOutcome.CLIENT_LIMIT) == 0
    assert edge.router.metric(QUIC, outcome=QuicOutcome.CLIENT_LIMIT) == 0


@pytest.mark.parametrize("version", [2, 1], ids=["send-proxy-v2", "send-proxy"])
def test_grpc_h2c_and_tls_calls_through_haproxy_reach_the_named_pod(edge: Edge, version: int) -> None:
    with edge.h2c(version, H2C_POD[0]) as channel:
        assert call_whoami(channel) == H2C_POD[0]
    with edge.tls(version, TLS_POD[0]) as channel:
        assert call_whoami(channel) == TLS_POD[0]


@pytest.mark.parametrize("version", [2, 1], ids=["send-proxy-v2", "send-proxy"])
def test_the_rejection_log_names_the_client_from_the_header_not_haproxy(edge: Edge, version: int) -> None:
    with tcp_from(RAW_CLIENT, edge.haproxy.port(version)) as sock:
        client_port = sock.getsockname()[1]
        sock.sendall(ssl_client_hello_records("nobody.example.com", alpn=()))
        assert read_to_eof(sock) == TLS_ALERT_RECORD + bytes([ALERT_UNRECOGNIZED_NAME])
    client = f"{RAW_CLIENT}:{client_port}"
    [line] = edge.wait_log("unknown_authority", f"peer={client}")
    assert f"via={HAPROXY_SOURCE}:" in line  # the balancer is named as such, never as the client
    [access] = edge.wait_log("termination=rejected", f"client={client}")  # its access line, too
    assert "via=" not in access and "outcome=unknown_authority" in access


def test_grpcio_client_is_named_in_the_rejection_log(edge: Edge) -> None:
    with edge.h2c(2, "nobody") as channel, pytest.raises(grpc.RpcError) as err:
        call_whoami(channel)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # a pod name, of no pod: target_unavailable
    [line] = edge.wait_log("target_unavailable", "pod=nobody", "peer=127.0.0.1:")
    assert f"via={HAPROXY_SOURCE}:" in line


# -- without HAProxy: refused, unanswered ---------------------------------------------------
def test_a_direct_connection_without_header_is_closed_unanswered(edge: Edge) -> None:
    before = edge.count("h2c", "protocol_error")
    with tcp_from(HAPROXY_SOURCE, edge.router.grpc_port) as sock:  # trusted source, no header
        sock.sendall(ssl_client_hello_records(host(TLS_POD[0]), alpn=()))
        assert read_to_eof(sock) == b""  # no TLS alert: those bytes are not the client's
    eventually_blocking(lambda: edge.count("h2c", "protocol_error") == before + 1, 10, what="protocol_error counted")


def test_an_untrusted_source_is_closed_before_anything_is_read(edge: Edge) -> None:
    with tcp_from("127.0.0.1", edge.router.grpc_port) as sock:  # sends nothing at all
        assert read_some(sock) == b""  # closed by the router, not by the peek timeout
    edge.wait_log("untrusted", "peer=127.0.0.1:")


@pytest.mark.parametrize(
    "first_bytes",
    [b"PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n", ph.v2(("1.2.3.4", 1), version_byte=0x11), b"PROXY TCP4 1.2.3.4"],
    ids=["malformed-v1", "malformed-v2", "truncated"],
)
def test_malformed_and_truncated_headers_are_closed_within_the_peek_timeout(edge: Edge, first_bytes: bytes) -> None:
    before = edge.count("h2c", "protocol_error")
    with tcp_from(HAPROXY_SOURCE, edge.router.grpc_port, timeout_s=PEEK_TIMEOUT_MS / 1000 + 5) as sock:
        sock.sendall(first_bytes)
        assert read_to_eof(sock, timeout_s=PEEK_TIMEOUT_MS / 1000 + 5) == b""
    eventually_blocking(lambda: edge.count("h2c", "protocol_error") == before + 1, 10, what="protocol_error counted")


def test_a_slow_header_then_the_client_bytes_reach_the_pod(edge: Edge) -> None:
    header = ph.v2((RAW_CLIENT, 40_000), ("127.0.0.1", edge.router.grpc_port))
    with tcp_from(HAPROXY_SOURCE, edge.router.grpc_port) as sock:
        for i in range(len(header)):
            sock.sendall(header[i : i + 1])
            deliberate_pause_blocking(0.005, "a slow sender: the header arrives a byte at a time")
        sock.sendall(ssl_client_hello_records(host(TLS_POD[0]), alpn=()))
        assert read_some(sock)[:1] == b"\x16"  # the pod's ServerHello: the header was removed


# -- per-client limits (TCP) --------------------------------------------------------------
@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, pods: list[RunningPod], pki: DemoPki) -> Iterator[Edge]:
    router, haproxy = _edge(tmp_path_factory.mktemp("limited"), pods, pki, "--max-connections-per-client=2")
    try:
        yield Edge(router, haproxy, pki)
    finally:
        haproxy.close()
        router.stop()


def _routed_tls(edge: Edge, source: str) -> socket.socket:
    """A TLS connection from ``source`` through HAProxy that reached the pod (it sent its ServerHello)."""
    sock = tcp_from(source, edge.haproxy.port(2))
    sock.sendall(ssl_client_hello_records(host(TLS_POD[0]), alpn=()))
    first = read_some(sock)
    assert first[:1] == b"\x16", first
    return sock


def test_tls_past_the_limit_gets_a_fatal_alert_and_a_released_slot_is_reusable(limited: Edge) -> None:
    held = [_routed_tls(limited, "127.0.0.21") for _ in range(2)]
    other = _routed_tls(limited, "127.0.0.22")  # another client is not affected
    try:
        with tcp_from("127.0.0.21", limited.haproxy.port(2)) as third:
            third.sendall(ssl_client_hello_records(host(TLS_POD[0]), alpn=()))
            assert read_to_eof(third) == TLS_ALERT_RECORD + bytes([ALERT_INTERNAL_ERROR])
        assert limited.count("tls", "client_limit") == 1
        limited.wait_log("client_limit", "peer=127.0.0.21:")
        held.pop().close()

        def fits_again() -> bool:
            try:
                held.append(_routed_tls(limited, "127.0.0.21"))
            except AssertionError:
                return False
            return True

        eventually_blocking(fits_again, 10, what="the released slot")
    finally:
        for sock in [*held, other]:
            sock.close()


def test_h2c_past_the_limit_gets_unavailable_and_then_fits_again(limited: Edge) -> None:
    held = [_routed_tls(limited, "127.0.0.1") for _ in range(2)]  # grpcio connects from 127.0.0.1
    try:
        with limited.h2c(2, H2C_POD[0]) as channel, pytest.raises(grpc.RpcError) as err:
            call_whoami(channel)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert c.REASON_TOO_MANY_CONNECTIONS in (err.value.details() or "")
        assert limited.count("h2c", "client_limit") == 1
    finally:
        for sock in held:
            sock.close()

    def call_works() -> bool:
        with limited.h2c(2, H2C_POD[0]) as channel:
            try:
                return call_whoami(channel) == H2C_POD[0]
            except grpc.RpcError:
                return False

    eventually_blocking(call_works, 10, what="slots released when the connections closed")


# -- per-client limits (QUIC) -------------------------------------------------------------
def test_quic_past_the_limit_is_closed_with_the_reason_and_the_slot_returns(tmp_path: Path, pki: DemoPki) -> None:
    asyncio.run(_quic_limit(tmp_path, pki))


async def _quic_limit(tmp_path: Path, pki: DemoPki) -> None:
    pod = await start_quic_pod("stargate-0", "127.0.0.2", 0, pki.cert_path, pki.key_path)
    endpoints = tmp_path / "endpoints.json"
    write_endpoints(endpoints, [("stargate-0", "127.0.0.2", 1, bound_port(pod))])
    router = RouterProcess(router_args(endpoints, "--max-quic-flows-per-client=1", "--relay-idle-timeout-ms=1000"))
    try:
        await asyncio.to_thread(router.wait_ready)
        first = await quic_from("127.0.0.31", router.quic_port, host("stargate-0"), pki.ca_path)
        assert await first.whoami() == "stargate-0"
        second = await quic_from("127.0.0.31", router.quic_port, host("stargate-0"), pki.ca_path)
        assert second.close_reason == c.REASON_TOO_MANY_CONNECTIONS
        second.close()
        other = await quic_from("127.0.0.32", router.quic_port, host("stargate-0"), pki.ca_path)
        assert await other.whoami() == "stargate-0"  # another client is not affected
        other.close()
        assert await asyncio.to_thread(router.metric, QUIC, outcome="client_limit") == 1
        first.close()  # the flow ends when idle (1 s here): then the slot is free again

        async def fits_again() -> bool:
            again = await quic_from("127.0.0.31", router.quic_port, host("stargate-0"), pki.ca_path)
            reason = again.close_reason
            if not reason:
                assert await again.whoami() == "stargate-0"
            again.close()
            assert not reason or reason == c.REASON_TOO_MANY_CONNECTIONS, reason
            return not reason

        await eventually(fits_again, 20.0, 0.2, what="the QUIC slot released")
    finally:
        await asyncio.to_thread(router.stop)
        pod.close()
