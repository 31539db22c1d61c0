"""The access log of TCP connections, through the router process with real peers.

Every connection writes exactly one ``router.access`` line when it ends, with the bytes the
client really sent (counted by a raw client socket, peeked bytes included) and really received
(the router's own SETTINGS and rejection answers included), and a termination produced for real:
client close, client reset, pod close, pod reset, idle timeout, drain cut, dial failure, peek
timeout and rejection; plus grpcio h2c and TLS clients.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from router.demo.grpc_pods import call_whoami, start_pod
from router.demo.pki import DemoPki
from router.extensions import Extensions
from tests.support.access_peers import (
    H2C_SETTINGS_BYTES,
    SETTINGS_ACK,
    CountingClient,
    RawPod,
    access_lines,
    h2c_request,
    wait_access,
)
from tests.support.names import host
from tests.support.polling import eventually_blocking, holds_blocking
from tests.support.router_process import RouterProcess, extensions_env, router_args, write_endpoints
from tests.support.tls import client_hello, sni_extension

pytestmark = pytest.mark.timeout(60)
"""Every test on both relay pumps (the ``extensions`` fixture), one router per pump for the module:
the same lines, causes and counts from each."""

IDLE_TIMEOUT_MS = 800
PEEK_TIMEOUT_MS = 500
PAYLOAD = bytes(range(256)) * 40
"""10 KiB after the first bytes: crosses several reads, stays in the buffered relay path."""
SECOND_LINE_CHANCE_S = 0.1
"""How long a connection's one line is watched for a second (a bug) before it is taken: a line
is written once, when the connection ends; nothing marks the moment a second could no longer come."""


def _closed_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


class Peers:
    """The pods of the shared router, by name."""

    def __init__(self, pki: DemoPki) -> None:
        self.pki = pki
        self.raw = {
            "sg-echo": RawPod("127.0.0.2", "echo"),
            "sg-closer": RawPod("127.0.0.2", "close_first", expect=len(h2c_request(host("sg-closer")))),
            "sg-resetter": RawPod("127.0.0.2", "reset", expect=len(h2c_request(host("sg-resetter")))),
            "sg-hold": RawPod("127.0.0.2", "hold"),
        }
        self.grpc = start_pod("sg-grpc", "127.0.0.3")
        self.grpc_tls = start_pod("sg-tls", "127.0.0.4", cert_pem=self.pki.cert_pem, key_pem=self.pki.key_pem)

    def rows(self) -> list[tuple[str, str, int, int]]:
        rows = [(name, "127.0.0.2", pod.port, 1) for name, pod in self.raw.items()]
        rows += [("sg-grpc", "127.0.0.3", self.grpc.port, 1), ("sg-tls", "127.0.0.4", self.grpc_tls.port, 1)]
        rows.append(("sg-dead", "127.0.0.5", _closed_port("127.0.0.5"), 1))
        return rows

    def close(self) -> None:
        for pod in self.raw.values():
            pod.close()
        self.grpc.stop()
        self.grpc_tls.stop()


@pytest.fixture(scope="module")
def peers(pki: DemoPki) -> Iterator[Peers]:
    p = Peers(pki)
    try:
        yield p
    finally:
        p.close()


def start_router(tmp: Path, peers: Peers, extensions: Extensions, *extra: str) -> RouterProcess:
    endpoints = tmp / "endpoints.json"
    write_endpoints(endpoints, peers.rows())
    router = RouterProcess(router_args(
        endpoints, "--log-format", "json", "--relay-idle-timeout-ms", str(IDLE_TIMEOUT_MS),
        "--peek-timeout-ms", str(PEEK_TIMEOUT_MS), *extra,
    ), extensions_env(extensions))
    router.wait_ready()
    return router


@pytest.fixture(scope="module")
def router(peers: Peers, tmp_path_factory: pytest.TempPathFactory, extensions: Extensions) -> Iterator[RouterProcess]:
    with start_router(tmp_path_factory.mktemp("access"), peers, extensions) as r:
        yield r
        r.stop()


def line_of(router: RouterProcess, client: CountingClient | str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The one access line of the connection from ``client``'s address (fails on two)."""
    address, since = (client, 0) if isinstance(client, str) else (client.address, client.log_from)

    def mine() -> list[dict[str, Any]]:
        return [line for line in access_lines(router, since) if line["client"] == address]

    eventually_blocking(mine, timeout_s, what=lambda: f"an access line for {address}: {access_lines(router)[-5:]}")
    holds_blocking(lambda: len(mine()) == 1, SECOND_LINE_CHANCE_S, what=lambda: f"one line for {address}: {mine()}")
    return mine()[0]


def assert_bytes(line: dict[str, Any], client: CountingClient) -> None:
    assert (line["bytes_client_to_pod"], line["bytes_pod_to_client"]) == (client.sent, len(client.received))


def test_h2c_client_close_counts_exact_bytes_including_the_peek(router: RouterProcess) -> None:
    client = CountingClient(router)
    client.send(h2c_request(host("sg-echo")))
    client.read(H2C_SETTINGS_BYTES)
    client.send(SETTINGS_ACK + PAYLOAD)  # the ACK is stripped on the way: the client still sent it
    client.sock.shutdown(socket.SHUT_WR)
    client.read_to_eof()
    client.close()
    line = line_of(router, client)
    assert line["event"] == "access" and line["level"] == "info"
    assert (line["protocol"], line["hostname"], line["pod"]) == ("h2c", host("sg-echo"), "sg-echo")
    assert line["pod_address"] == f"127.0.0.2:{router_port_of(line)}"
    assert (line["outcome"], line["termination"]) == ("completed", "client_close")
    assert_bytes(line, client)
    assert client.sent == len(h2c_request(host("sg-echo"))) + len(SETTINGS_ACK) + len(PAYLOAD)
    assert isinstance(line["decision_us"], int) and line["decision_us"] >= 0
    assert line["duration_ms"] > 0


def router_port_of(line: dict[str, Any]) -> str:
    return str(line["pod_address"]).rpartition(":")[2]


def test_tls_client_close_counts_exact_bytes(router: RouterProcess) -> None:
    client = CountingClient(router)
    client.send(client_hello([sni_extension(host("sg-echo").encode())]) + PAYLOAD)
    client.sock.shutdown(socket.SHUT_WR)
    client.read_to_eof()
    client.close()
    line = line_of(router, client)
    assert (line["protocol"], line["pod"], line["outcome"], line["termination"]) == (
        "tls", "sg-echo", "completed", "client_close")
    assert_bytes(line, client)
    assert len(client.received) == client.sent  # an echo


def test_pod_close_and_pod_reset(router: RouterProcess) -> None:
    closed = CountingClient(router)
    closed.send(h2c_request(host("sg-closer")))
    assert closed.read_to_eof().endswith(b"bye")
    closed.close()
    line = line_of(router, closed)
    assert (line["outcome"], line["termination"]) == ("completed", "pod_close")
    assert_bytes(line, closed)

    reset = CountingClient(router)
    reset.send(h2c_request(host("sg-resetter")))
    reset.read_to_eof()
    reset.close()
    line = line_of(router, reset)
    assert (line["pod"], line["outcome"], line["termination"]) == ("sg-resetter", "relay_error", "pod_reset")
    assert line["bytes_client_to_pod"] == reset.sent


def test_client_reset(router: RouterProcess) -> None:
    client = CountingClient(router)
    client.send(h2c_request(host("sg-echo")) + PAYLOAD)
    client.read(H2C_SETTINGS_BYTES + len(h2c_request(host("sg-echo"))) + len(PAYLOAD))
    client.reset()
    line = line_of(router, client)
    assert (line["outcome"], line["termination"]) == ("relay_error", "client_reset")
    assert_bytes(line, client)


def test_idle_timeout(router: RouterProcess) -> None:
    client = CountingClient(router)
    client.send(client_hello([sni_extension(host("sg-hold").encode())]))
    started = time.monotonic()
    client.read_to_eof()
    assert time.monotonic() - started >= IDLE_TIMEOUT_MS / 1000 - 0.05
    client.close()
    line = line_of(router, client)
    assert (line["pod"], line["outcome"], line["termination"]) == ("sg-hold", "completed", "idle_timeout")
    assert_bytes(line, client)
    assert line["duration_ms"] >= IDLE_TIMEOUT_MS - 50


def test_dial_failure_peek_timeout_and_rejection(router: RouterProcess) -> None:
    dial = CountingClient(router)
    dial.send(h2c_request(host("sg-dead")))
    dial.sock.shutdown(socket.SHUT_WR)
    dial.read_to_eof()
    dial.close()
    line = line_of(router, dial)
    assert (line["pod"], line["outcome"], line["termination"]) == ("sg-dead", "connect_error", "dial_failed")
    assert line["pod_address"].startswith("127.0.0.5:")
    assert_bytes(line, dial)

    silent = CountingClient(router)
    silent.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # the preface, then nothing
    silent.read_to_eof()
    silent.close()
    line = line_of(router, silent)
    assert (line["hostname"], line["pod"], line["outcome"], line["termination"]) == (
        None, None, "peek_timeout", "peek_timeout")
    assert_bytes(line, silent)
    assert (silent.sent, len(silent.received)) == (24, H2C_SETTINGS_BYTES)

    unknown = CountingClient(router)
    unknown.send(h2c_request("nobody.example.org"))
    unknown.sock.shutdown(socket.SHUT_WR)
    unknown.read_to_eof()
    unknown.close()
    line = line_of(router, unknown)
    assert (line["hostname"], line["pod"], line["pod_address"]) == ("nobody.example.org", None, None)
    assert (line["outcome"], line["termination"]) == ("unknown_authority", "rejected")
    assert_bytes(line, unknown)
    assert len(unknown.received) > H2C_SETTINGS_BYTES  # the gRPC answer


def test_grpcio_h2c_and_tls_calls_write_one_line_each(router: RouterProcess, peers: Peers) -> None:
    before = len(access_lines(router))
    target = f"127.0.0.1:{router.grpc_port}"
    with grpc.insecure_channel(target, options=[("grpc.default_authority", host("sg-grpc"))]) as ch:
        assert call_whoami(ch) == "sg-grpc"
    creds = grpc.ssl_channel_credentials(root_certificates=peers.pki.ca_pem)
    options = [("grpc.ssl_target_name_override", host("sg-tls"))]
    with grpc.secure_channel(target, creds, options=options) as ch:
        assert call_whoami(ch) == "sg-tls"
    lines = wait_access(router, before + 2)[before:]
    # A line is written when its connection ends; grpcio closes channels in the background, and under
    # --workers the two connections may be served by two processes, so the lines come in either order.
    assert sorted((x["protocol"], x["pod"]) for x in lines) == [("h2c", "sg-grpc"), ("tls", "sg-tls")]
    for line in lines:  # grpcio closes a channel with a FIN, or a RST when replies were left unread
        assert (line["outcome"], line["termination"]) in (
            ("completed", "client_close"), ("relay_error", "client_reset"))
        assert line["bytes_client_to_pod"] > 0 and line["bytes_pod_to_client"] > 0


def test_drain_cuts_what_is_still_open(peers: Peers, tmp_path: Path, extensions: Extensions) -> None:
    with start_router(tmp_path, peers, extensions, "--drain-timeout-ms", "300") as router:
        client = CountingClient(router)
        client.send(h2c_request(host("sg-echo")) + PAYLOAD)
        client.read(H2C_SETTINGS_BYTES + len(h2c_request(host("sg-echo"))) + len(PAYLOAD))
        assert router.stop() == 0
        client.read_to_eof()
        client.close()
        line = line_of(router, client)
        assert (line["outcome"], line["termination"]) == ("completed", "drain")
        assert_bytes(line, client)


def test_access_log_off_writes_no_line(peers: Peers, tmp_path: Path, extensions: Extensions) -> None:
    with start_router(tmp_path, peers, extensions, "--access-log", "off") as router:
        client = CountingClient(router)
        client.send(h2c_request("nobody.example.org"))
        client.read_to_eof()
        client.close()
        rejected = {"protocol": "h2c", "termination": "rejected"}
        eventually_blocking(lambda: router.metric("stargate_k8s_router_terminations_total", **rejected) == 1,
                            what="the rejection counted")
        router.stop()
        router.wait_exit()  # its stderr read to the end: every line it wrote is in router.lines
        assert access_lines(router) == []
