"""``--workers N``: the supervisor's pure pieces, then two real worker processes behind one port."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from router import constants as c
from router.config import config_from_args
from router.demo.grpc_pods import RunningPod, call_whoami, start_pod
from router.demo.pki import DemoPki
from router.demo.quic_pods import bound_port, quic_whoami, start_quic_pod
from router.flag_values import SocketAddress
from router.supervisor import held_address
from router.worker_process import LineSplitter, describe_exit, stop_budget_s, worker_argv
from router.worker_scrape import ProbeError, WorkerClient
from router.worker_seat import (
    SeatError,
    WorkerReport,
    WorkerSeat,
    decode_report,
    encode_report,
    seat_from_environ,
)
from tests.support.router_process import Supervised, router_args, write_endpoints

# ---------------------------------------------------------------------------
# Pure pieces
# ---------------------------------------------------------------------------


def concrete_address(addr: SocketAddress, kind: socket.SocketKind) -> SocketAddress:
    """``held_address``'s address, the socket let go at once."""
    concrete, probe = held_address(addr, kind)
    probe.close()
    return concrete


def test_worker_argv_overrides_win_because_argparse_keeps_the_last_value() -> None:
    argv = ["--workers=4", "--listen-addr", "0.0.0.0:0", "--work", "3", "--target-namespace", "ns"]
    child = worker_argv(argv, SocketAddress("0.0.0.0", 5000), SocketAddress("::", 5001))
    config = config_from_args(child, environ={})
    assert config.workers == 1
    assert config.listen_addr == SocketAddress("0.0.0.0", 5000)
    assert config.reverse_tunnel_listen_addr == SocketAddress("::", 5001)
    assert config.health_listen_addr == config_from_args(argv, environ={}).health_listen_addr  # the seat's socket
    assert config.target_namespace == "ns"


def test_a_seat_survives_the_environment_and_names_every_descriptor_once() -> None:
    seat = WorkerSeat(1, 3, 10, 11, 12, client_table_fd=13)
    assert WorkerSeat.from_env(seat.to_env()) == seat
    assert sorted(seat.fds()) == list(range(10, 14))
    assert seat_from_environ({}) is None
    assert seat_from_environ({c.WORKER_SEAT_ENV: seat.to_env()}) == seat


@pytest.mark.parametrize(
    "text",
    [
        "", "[]", "{}", '{"index":0}', "not json",
        '{"index":0,"count":1,"health":10,"control":11,"cid_index":12,"client_table":null}',
        '{"index":2,"count":2,"health":10,"control":11,"cid_index":12,"client_table":null}',
        '{"index":0,"count":2,"health":10,"control":10,"cid_index":12,"client_table":null}',
        '{"index":0,"count":2,"health":10,"control":11,"cid_index":12,"client_table":11}',
        '{"index":0,"count":2,"health":1,"control":11,"cid_index":12,"client_table":null}',
        '{"index":0,"count":2,"health":"10","control":11,"cid_index":12,"client_table":null}',
        '{"index":true,"count":2,"health":10,"control":11,"cid_index":12,"client_table":null}',
        '{"index":0,"count":2,"health":10,"control":11,"client_table":null}',
    ],
)
def test_a_malformed_seat_is_a_config_error_naming_the_variable(text: str) -> None:
    with pytest.raises(SeatError, match=c.WORKER_SEAT_ENV):
        seat_from_environ({c.WORKER_SEAT_ENV: text})


def test_control_reports_are_one_bounded_line_and_nothing_else_is_one() -> None:
    assert decode_report(encode_report(WorkerReport.BOUND)) == (WorkerReport.BOUND, "")
    line = encode_report(WorkerReport.CONFIG_ERROR, "--listen-addr x:1: bad\nsecond line")
    assert line.count(b"\n") == 1
    assert decode_report(line) == (WorkerReport.CONFIG_ERROR, "--listen-addr x:1: bad second line")
    assert len(encode_report(WorkerReport.CONFIG_ERROR, "x" * 100_000)) == c.WORKER_REPORT_MAX_BYTES
    assert decode_report(b"listening grpc=a quic=b health=127.0.0.1:1\n") is None


def test_line_splitter_keeps_partial_lines_and_cuts_over_long_ones() -> None:
    splitter = LineSplitter(max_line_bytes=8)
    assert splitter.feed(b"ab") == []
    assert splitter.feed(b"c\nde") == [b"abc\n"]
    assert splitter.feed(b"fghijklmn") == [b"defghijk"]
    assert splitter.feed(b"o\np") == [b"lmno\n"]
    assert splitter.flush() == [b"p"]
    assert splitter.flush() == []


async def serve_raw(answer: bytes | None) -> tuple[asyncio.Server, int]:
    """A fake worker health port: reads the request head, then sends ``answer`` (None: stays silent)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if answer is None:
            await reader.read()  # until the client gives up and closes
        else:
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def fetch_from(
    answer: bytes | None,
    timeout_s: float = c.WORKER_PROBE_TIMEOUT_S,
    max_response_bytes: int = c.WORKER_MAX_RESPONSE_BYTES,
) -> tuple[int, bytes]:
    server, port = await serve_raw(answer)
    client = WorkerClient(timeout_s, max_response_bytes)
    try:
        return await client.fetch(("127.0.0.1", port), "/readyz")
    finally:
        await client.close()
        server.close()


async def test_worker_answers_are_read_and_malformed_ones_are_probe_errors() -> None:
    raw = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 10\r\n\r\nnot ready\n"
    assert await fetch_from(raw) == (503, b"not ready\n")
    assert await fetch_from(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nready\n") == (200, b"ready\n")
    for bad in (b"", b"HTTP/1.1 200 OK\r\n", b"garbage\r\n\r\n", b"HTTP/1.1 xx OK\r\n\r\n"):
        with pytest.raises(ProbeError):
            await fetch_from(bad)
    with pytest.raises(ProbeError):  # nothing listens
        await WorkerClient().fetch(("127.0.0.1", concrete_address(SocketAddress("127.0.0.1", 0),
                                                                  socket.SOCK_STREAM).port), "/readyz")


async def test_a_worker_answer_over_the_size_cap_is_refused() -> None:
    body = b"x" * 5000
    declared = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    undeclared = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1388\r\n%s\r\n0\r\n\r\n" % body
    for raw in (declared, undeclared, chunked):
        assert await fetch_from(raw, max_response_bytes=len(body)) == (200, body)
        with pytest.raises(ProbeError, match="larger than 4999 bytes"):
            await fetch_from(raw, max_response_bytes=len(body) - 1)


async def test_a_silent_worker_is_a_probe_error_at_the_probe_timeout() -> None:
    with pytest.raises(ProbeError):
        await fetch_from(None, timeout_s=0.2)


def test_describe_exit() -> None:
    assert describe_exit(-9) == "signal SIGKILL"
    assert describe_exit(1) == "status 1"
    assert describe_exit(None) == "unknown status"


def test_stop_budget_covers_the_workers_own_delay_and_drain() -> None:
    config = config_from_args(
        ["--shutdown-delay-ms", "1000", "--drain-timeout-ms", "2000"], environ={"POD_NAMESPACE": "ns"}
    )
    assert stop_budget_s(config) == 3.0 + c.WORKER_STOP_GRACE_S


def test_port_zero_becomes_a_concrete_port_that_is_free_again() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        fixed = SocketAddress("127.0.0.1", probe.getsockname()[1])
    assert concrete_address(fixed, socket.SOCK_STREAM) is fixed
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        addr = concrete_address(SocketAddress("127.0.0.1", 0), kind)
        assert addr.port > 0
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind((addr.host, addr.port))


def test_an_address_no_worker_could_bind_fails_before_any_worker_starts() -> None:
    """A port another program holds (without SO_REUSEPORT) raises the kernel's error at once."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as holder:
            holder.bind(("127.0.0.1", 0))
            if kind == socket.SOCK_STREAM:
                holder.listen()
            with pytest.raises(OSError) as raised:
                concrete_address(SocketAddress("127.0.0.1", holder.getsockname()[1]), kind)
            assert raised.value.errno == errno.EADDRINUSE


# ---------------------------------------------------------------------------
# Two real workers behind the supervisor
# ---------------------------------------------------------------------------
AUTHORITY = "stargate-0.stargate.external"
ACCEPTED = (f"{c.GRPC_CONNECTIONS_TOTAL}_total", {"protocol": "h2c", "outcome": "accepted"})


def calls(port: int, n: int) -> list[str]:
    """``n`` WhoAmI calls, each on its own channel and so on its own TCP connection."""
    answers = []
    for _ in range(n):
        options = [("grpc.default_authority", AUTHORITY), ("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            answers.append(call_whoami(channel, timeout=10.0))
    return answers


@pytest.fixture()
def pods(tmp_path: Path) -> Iterator[Path]:
    running: list[RunningPod] = [start_pod("stargate-0", "127.0.0.2"), start_pod("stargate-1", "127.0.0.3")]
    endpoints = tmp_path / "endpoints.json"
    write_endpoints(endpoints, [(p.pod_name, p.address, p.port, 1) for p in running])
    try:
        yield endpoints
    finally:
        for pod in running:
            pod.stop()


def test_two_workers_share_the_port_survive_a_kill_and_stop_on_sigterm(pods: Path) -> None:
    args = router_args(pods, "--workers", "2", "--shutdown-delay-ms", "500")
    with Supervised(args) as router:
        router.wait_ready(timeout=30.0)
        assert router.http_get("/livez") == (200, "ok\n")  # the supervisor's own liveness
        workers = router.private_health()
        assert sorted(workers) == [0, 1]
        assert router.health_port not in workers.values()

        assert calls(router.grpc_port, 20) == ["stargate-0"] * 20
        assert router.metric(ACCEPTED[0], **ACCEPTED[1]) == 20
        per_worker = [router.worker_metric(port, ACCEPTED[0], **ACCEPTED[1]) for port in workers.values()]
        assert sum(per_worker) == 20
        assert all(n > 0 for n in per_worker), per_worker  # all 20 on one worker: p = 2**-19
        assert router.metric(c.READY_TARGETS) == 2  # max, not the sum of two workers' 2
        assert router.metric(f"{c.WORKER_RESTARTS_TOTAL}_total") == 0

        old_pid = router.pids()[0]
        os.kill(old_pid, signal.SIGKILL)
        router.wait_for("worker 0 restarted", lambda: router.pids().get(0, old_pid) != old_pid)
        router.wait_ready(timeout=30.0)
        assert calls(router.grpc_port, 10) == ["stargate-0"] * 10
        # The dead worker's counts (from the last scrape) are kept: the merged counter never drops.
        assert router.metric(ACCEPTED[0], **ACCEPTED[1]) == 30
        assert router.metric(f"{c.WORKER_RESTARTS_TOTAL}_total") == 1

        router.proc.send_signal(signal.SIGTERM)
        router.wait_for("/readyz 503 during shutdown", lambda: router.http_get("/readyz")[0] == 503)
        assert router.http_get("/livez") == (200, "ok\n")  # draining, still alive
        assert router.stop(timeout=30.0) == 0
        children = list(router.pids().values())
        for pid in children:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


async def test_quic_flows_stay_on_the_worker_that_routed_them(tmp_path: Path, pki: DemoPki) -> None:
    """Each handshake spans several datagrams each way: it only completes if the kernel keeps
    every datagram of the 4-tuple on one worker (the one holding that flow)."""
    pod = await start_quic_pod("stargate-0", "127.0.0.2", 0, pki.cert_path, pki.key_path)
    endpoints = tmp_path / "endpoints.json"
    write_endpoints(endpoints, [("stargate-0", "127.0.0.2", 1, bound_port(pod))])
    try:
        with Supervised(router_args(endpoints, "--workers", "2")) as router:
            await asyncio.to_thread(router.wait_ready, 30.0)
            answers = [
                await quic_whoami("127.0.0.1", router.quic_port, AUTHORITY, str(pki.ca_path))
                for _ in range(16)
            ]
            assert answers == ["stargate-0"] * 16
            name, labels = f"{c.QUIC_CONNECTIONS_TOTAL}_total", {"outcome": "accepted"}
            assert await asyncio.to_thread(router.metric, name, **labels) == 16
            ports = router.private_health().values()
            per_worker = [await asyncio.to_thread(router.worker_metric, p, name, **labels) for p in ports]
            assert all(n > 0 for n in per_worker), per_worker  # all 16 on one worker: p = 2**-15
            assert await asyncio.to_thread(router.stop, signal.SIGTERM, 30.0) == 0
    finally:
        pod.close()
