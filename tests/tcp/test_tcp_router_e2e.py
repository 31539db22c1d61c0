"""End to end through the router process: real grpcio clients and servers, real TLS.

Pods: ``stargate-0``/``stargate-1`` serve h2c on 127.0.0.2/127.0.0.3; ``stargate-tls-0``/
``stargate-tls-1`` serve gRPC over TLS (test CA, ``*.stargate.external``) on 127.0.0.4/.5.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
import pytest

from router import constants as c
from router.demo.grpc_pods import ECHO, WATCH, RunningPod, call_whoami, start_pod
from router.demo.pki import DemoPki, make_pki
from router.outcomes import TCP_PROTOCOLS, DroppedLog, GrpcOutcome, QuicOutcome, WebTransportOutcome
from tests.support.bulk_tls import BulkTlsPod, bulk_tls_client
from tests.support.polling import deliberate_pause_blocking, eventually_blocking
from tests.support.router_process import RouterProcess, router_args, write_endpoints
from wire.grpc import GrpcStatus

H2C_PODS = (("stargate-0", "127.0.0.2"), ("stargate-1", "127.0.0.3"))
TLS_PODS = (("stargate-tls-0", "127.0.0.4"), ("stargate-tls-1", "127.0.0.5"))


def host(pod: str) -> str:
    return f"{pod}.stargate.external"


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.pki: DemoPki = make_pki(tmp / "pki")
        self.pods: list[RunningPod] = []
        for name, ip in H2C_PODS:
            self.pods.append(start_pod(name, ip))
        for name, ip in TLS_PODS:
            self.pods.append(start_pod(name, ip, cert_pem=self.pki.cert_pem, key_pem=self.pki.key_pem))
        self.endpoints = tmp / "endpoints.json"
        self.rows = [(p.pod_name, p.address, p.port, 1) for p in self.pods]
        write_endpoints(self.endpoints, self.rows)
        self.router = RouterProcess(router_args(self.endpoints, "--connect-timeout-ms", "1000"))
        self.router.wait_ready()
        self.target = f"127.0.0.1:{self.router.grpc_port}"

    def h2c_channel(self, authority: str) -> grpc.Channel:
        return grpc.insecure_channel(self.target, options=[("grpc.default_authority", authority)])

    def tls_channel(self, sni: str) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(root_certificates=self.pki.ca_pem)
        return grpc.secure_channel(self.target, creds, options=[("grpc.ssl_target_name_override", sni)])

    def close(self) -> None:
        self.router.stop()
        for pod in self.pods:
            pod.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cl = Cluster(tmp_path_factory.mktemp("tcp-e2e"))
    try:
        yield cl
    finally:
        cl.close()


def test_metrics_exist_at_zero_on_first_scrape(tmp_path: Path) -> None:
    write_endpoints(tmp_path / "e.json", [])
    with RouterProcess(router_args(tmp_path / "e.json")) as router:
        router.wait_ready()
        for protocol in TCP_PROTOCOLS:
            for outcome in GrpcOutcome:
                assert router.metric(
                    c.GRPC_CONNECTIONS_TOTAL + "_total", protocol=protocol, outcome=outcome
                ) == 0
        for outcome in QuicOutcome:
            assert router.metric(c.QUIC_CONNECTIONS_TOTAL + "_total", outcome=outcome) == 0
        for session_outcome in WebTransportOutcome:
            assert router.metric(c.WEBTRANSPORT_SESSIONS_TOTAL + "_total", outcome=session_outcome) == 0
        for log in DroppedLog:
            assert router.metric(c.LOG_LINES_DROPPED_TOTAL + "_total", log=log) == 0
        assert router.stop() == 0


@pytest.mark.parametrize("pod", [p for p, _ in H2C_PODS])
def test_h2c_unary_reaches_the_pod_named_by_authority(cluster: Cluster, pod: str) -> None:
    with cluster.h2c_channel(host(pod)) as ch:
        assert call_whoami(ch) == pod


@pytest.mark.parametrize("pod", [p for p, _ in TLS_PODS])
def test_tls_unary_reaches_the_pod_named_by_sni(cluster: Cluster, pod: str) -> None:
    with cluster.tls_channel(host(pod)) as ch:
        assert call_whoami(ch) == pod


def test_authority_match_is_case_insensitive_and_ignores_port(cluster: Cluster) -> None:
    with cluster.h2c_channel("STARGATE-1.Stargate.External:50071") as ch:
        assert call_whoami(ch) == "stargate-1"


@pytest.mark.parametrize("kind", ["h2c", "tls"])
def test_bidirectional_streaming(cluster: Cluster, kind: str) -> None:
    pod = "stargate-0" if kind == "h2c" else "stargate-tls-1"
    channel = cluster.h2c_channel(host(pod)) if kind == "h2c" else cluster.tls_channel(host(pod))
    with channel as ch:
        echo = ch.stream_stream(ECHO, request_serializer=bytes, response_deserializer=bytes)
        messages = [os.urandom(n) for n in (1, 100, 65_536, 300_000, 7)]
        replies = list(echo(iter(messages), timeout=10))
        assert replies == messages


def test_unknown_authority_is_invalid_argument(cluster: Cluster) -> None:
    with cluster.h2c_channel("example.com") as ch, pytest.raises(grpc.RpcError) as err:
        call_whoami(ch)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "example.com" in (err.value.details() or "")


def test_dotted_pod_label_never_routes(cluster: Cluster) -> None:
    with cluster.h2c_channel("x.stargate-0.stargate.external") as ch, pytest.raises(grpc.RpcError) as err:
        call_whoami(ch)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_pod_not_in_snapshot_is_unavailable(cluster: Cluster) -> None:
    with cluster.h2c_channel(host("stargate-7")) as ch, pytest.raises(grpc.RpcError) as err:
        call_whoami(ch)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "stargate-7" in (err.value.details() or "")


def test_round_robin_fallback_for_watch_path(tmp_path: Path) -> None:
    pods = [start_pod(name, ip) for name, ip in H2C_PODS]
    try:
        write_endpoints(tmp_path / "e.json", [(p.pod_name, p.address, p.port, 1) for p in pods])
        with RouterProcess(router_args(tmp_path / "e.json")) as router:
            router.wait_ready()
            seen = set()
            # one TCP connection per call (a local subchannel pool): the router decides per connection
            opts = [("grpc.default_authority", "not-a-stargate.example"), ("grpc.use_local_subchannel_pool", 1)]
            for _ in range(6):
                with grpc.insecure_channel(f"127.0.0.1:{router.grpc_port}", options=opts) as ch:
                    watch = ch.unary_stream(WATCH, request_serializer=bytes, response_deserializer=bytes)
                    replies = list(watch(b"", timeout=5))
                assert len(replies) == 3
                seen.add(replies[0].split(b":")[0].decode())
            assert seen == {name for name, _ in H2C_PODS}  # spread over the pods, not pinned to one
            # a non-fallback path with the same authority is still rejected
            with grpc.insecure_channel(f"127.0.0.1:{router.grpc_port}", options=opts) as ch:
                with pytest.raises(grpc.RpcError) as err:
                    call_whoami(ch)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            router.stop()
    finally:
        for pod in pods:
            pod.stop()


def test_tls_unknown_sni_fails_at_once_with_alert(cluster: Cluster) -> None:
    ctx = ssl.create_default_context(cadata=cluster.pki.ca_pem.decode())
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", cluster.router.grpc_port), timeout=5) as raw:
        with pytest.raises(ssl.SSLError) as err:
            ctx.wrap_socket(raw, server_hostname="nobody.example.org")
    assert "UNRECOGNIZED_NAME" in str(err.value).upper()
    assert time.monotonic() - started < c.DEFAULT_PEEK_TIMEOUT_MS / 1000


def _h2_exchange(port: int, authority: str | None) -> dict[str, str]:
    """hyper/tonic style: HEADERS sent at once, without waiting for the server's SETTINGS."""
    config = h2.config.H2Configuration(client_side=True, validate_outbound_headers=authority is not None)
    conn = h2.connection.H2Connection(config)
    conn.initiate_connection()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", "/stargate.StargateControlPlane/WhoAmI")]
    if authority is not None:
        headers.append((":authority", authority))
    headers += [("content-type", "application/grpc"), ("te", "trailers")]
    conn.send_headers(1, headers)
    conn.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
    received: dict[str, str] = {}
    body = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(conn.data_to_send())
        ended = False
        while not ended:
            data = sock.recv(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    received.update({k.decode() if isinstance(k, bytes) else k:
                                     v.decode() if isinstance(v, bytes) else v for k, v in event.headers})
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded | h2.events.ConnectionTerminated):
                    ended = True
            sock.sendall(conn.data_to_send())
    received["body"] = body[5:].decode(errors="replace")
    return received


def test_h2_client_sending_headers_first_is_routed(cluster: Cluster) -> None:
    got = _h2_exchange(cluster.router.grpc_port, host("stargate-1"))
    assert got.get("grpc-status") == "0"
    assert got["body"] == "stargate-1"


def test_h2_missing_authority_is_invalid_argument(cluster: Cluster) -> None:
    got = _h2_exchange(cluster.router.grpc_port, None)
    assert got.get("grpc-status") == str(GrpcStatus.INVALID_ARGUMENT)


def test_tls_client_hello_one_byte_at_a_time(cluster: Cluster) -> None:
    ctx = ssl.create_default_context(cadata=cluster.pki.ca_pem.decode())
    ctx.set_alpn_protocols(["h2"])
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=host("stargate-tls-0"))
    with socket.create_connection(("127.0.0.1", cluster.router.grpc_port), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with pytest.raises(ssl.SSLWantReadError):
            tls.do_handshake()
        hello = outgoing.read()
        for i in range(len(hello)):
            sock.send(hello[i : i + 1])
            if i % 64 == 0:
                deliberate_pause_blocking(0.001, "a slow client: the hello trickles in, many reads for the router")
        while True:
            data = sock.recv(65536)
            assert data, "router closed before the handshake finished"
            incoming.write(data)
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
        sock.sendall(outgoing.read())
    assert tls.selected_alpn_protocol() == "h2"
    names = [v for k, v in tls.getpeercert()["subjectAltName"] if k == "DNS"]
    assert "*.stargate.external" in names


def test_dial_failure_is_unavailable_connect_error(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port with nothing listening on 127.0.0.6
        probe.bind(("127.0.0.6", 0))
        dead_port = probe.getsockname()[1]
    write_endpoints(tmp_path / "e.json", [("stargate-0", "127.0.0.6", dead_port, 1)])
    with RouterProcess(router_args(tmp_path / "e.json")) as router:
        router.wait_ready()
        target = f"127.0.0.1:{router.grpc_port}"
        with grpc.insecure_channel(target, options=[("grpc.default_authority", host("stargate-0"))]) as ch:
            with pytest.raises(grpc.RpcError) as err:
                call_whoami(ch)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert router.metric(c.GRPC_CONNECTIONS_TOTAL + "_total", protocol="h2c", outcome="connect_error") >= 1
        router.stop()


def test_endpoints_change_reroutes_new_connections_within_2s(tmp_path: Path) -> None:
    a = start_pod("stargate-0", "127.0.0.2")
    b = start_pod("stargate-0-new", "127.0.0.3")
    try:
        endpoints = tmp_path / "e.json"
        write_endpoints(endpoints, [("stargate-0", a.address, a.port, 1)])
        with RouterProcess(router_args(endpoints)) as router:
            router.wait_ready()
            target = f"127.0.0.1:{router.grpc_port}"
            opts = [("grpc.default_authority", host("stargate-0"))]
            with grpc.insecure_channel(target, options=opts) as ch:
                assert call_whoami(ch) == "stargate-0"
            # the pod is rescheduled: same pod name, new IP and port
            write_endpoints(endpoints, [("stargate-0", b.address, b.port, 1)])

            def rerouted() -> bool:
                with grpc.insecure_channel(target, options=opts) as ch:
                    return call_whoami(ch) == "stargate-0-new"

            eventually_blocking(rerouted, 2.0, 0.05, what="new connections routed to the rescheduled pod")
            router.stop()
    finally:
        a.stop()
        b.stop()


def test_metrics_count_after_traffic(cluster: Cluster) -> None:
    before = cluster.router.metric(c.GRPC_CONNECTIONS_TOTAL + "_total", protocol="h2c", outcome="accepted")
    with cluster.h2c_channel(host("stargate-0")) as ch:
        assert call_whoami(ch) == "stargate-0"
    after = cluster.router.metric(c.GRPC_CONNECTIONS_TOTAL + "_total", protocol="h2c", outcome="accepted")
    assert after == before + 1
    assert cluster.router.metric(c.READY_TARGETS) == len(H2C_PODS) + len(TLS_PODS)


# -- 64 MiB both ways, byte-exact, through a TLS pod that is a plain TLS peer ------------------

def test_64_mib_both_ways_byte_exact(tmp_path: Path, pki: DemoPki) -> None:
    size = 64 * 1024 * 1024
    up, down = os.urandom(size), os.urandom(size)

    async def scenario() -> tuple[str, str]:
        pod = BulkTlsPod(pki, down, expect_up=size)
        pod_port = await pod.start("127.0.0.2")
        write_endpoints(tmp_path / "e.json", [("stargate-bulk", "127.0.0.2", pod_port, 1)])
        router = RouterProcess(router_args(tmp_path / "e.json"))
        try:
            await asyncio.to_thread(router.wait_ready)
            got_down = await asyncio.wait_for(
                bulk_tls_client(router.grpc_port, pki, host("stargate-bulk"), up, size), 60
            )
            await asyncio.wait_for(pod.done.wait(), 10)
            return pod.received.hexdigest(), got_down
        finally:
            pod.close()
            await asyncio.to_thread(router.stop)

    got_up, got_down = asyncio.run(scenario())
    assert got_up == hashlib.sha256(up).hexdigest()
    assert got_down == hashlib.sha256(down).hexdigest()
