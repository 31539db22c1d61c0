"""A client's text, bounded before the router holds or writes it (issue 41, findings 3, 4 and 5).

Each attack runs against the router process, with real peers: an ``h2`` client that validates nothing
(the names below are no client library's), hand-built ClientHellos where no TLS library sends such a
name, aioquic clients for QUIC, and raw TCP pods.

* **Names longer than any legal authority never route and are never remembered**: the longest
  legal one (a 253-octet name, its trailing dot, ``:`` and 5 digits: 260) routes; one port digit
  more, or a 15,000-digit port, is refused as an unknown name (h2c, TLS, QUIC), and 1,500 distinct
  15 KB names leave the router's RSS where it was (the issue measured +22 MB).
* **What one client can make the router write is bounded**: an accepted connection's line has a
  bounded length whatever its ``:authority`` (cut with a visible marker), and lines beyond the
  access log's budget are dropped and counted in ``log_lines_dropped_total{log="access"}``.
* **No control character reaches the log raw**, in either format: ESC, BEL, DEL (the ones a
  client's ASCII name can carry) are escaped in rejection lines and access lines alike, and the
  JSON format gives the name back exactly.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import hpack
import pytest
from aioquic.asyncio import connect

from router import constants as c
from router.demo.pki import DemoPki
from router.demo.quic_pods import WHOAMI, bound_port, client_configuration, start_quic_pod
from router.extensions import Extensions
from tests.support.access_peers import RawPod, access_lines
from tests.support.h2 import frame, grpc_status_of
from tests.support.polling import becomes_true, eventually_blocking, holds_blocking
from tests.support.router_probes import raise_nofile_limit, rss_kib
from tests.support.router_process import RouterProcess, extensions_env, router_args, write_endpoints
from tests.support.tcp_peers import CountingPod, read_to_eof
from tests.support.tls import client_hello, sni_extension
from wire.grpc import GrpcStatus
from wire.h2_frames import H2_PREFACE, Flag, FrameType
from wire.tls import TlsAlert, tls_alert

pytestmark = pytest.mark.timeout(180)

POD = "stargate-0"
SUFFIX = ".".join(["x" * 61] * 3) + "." + "y" * 56
"""The template's suffix: ``stargate-0.`` and it make a 253-octet name, the longest DNS name."""
TEMPLATE = "{pod_name}." + SUFFIX
LONGEST_NAME = f"{POD}.{SUFFIX}"
LONGEST_AUTHORITY = f"{LONGEST_NAME}.:65535"
"""The longest authority that may name a pod: 253 + trailing dot + ``:`` + 5 digits = 260."""
ROUND_ROBIN_PATH = c.DEFAULT_ROUND_ROBIN_PATHS[0]
LINGER_RESET = struct.pack("ii", 1, 0)

assert len(LONGEST_NAME) == 253 and len(LONGEST_AUTHORITY) == 260


def h2c_bytes(authority: bytes, path: bytes = b"/x.Y/Z") -> bytes:
    """A client's first bytes: preface, SETTINGS and one gRPC request with exactly this authority, its
    header block not Huffman-coded (``h2`` would code a 15 KB name in ~15 ms of pure Python per request)."""
    headers = _request_headers(authority, path)
    block = hpack.Encoder().encode(headers, huffman=False)
    return H2_PREFACE + frame(FrameType.SETTINGS, 0, 0) + frame(
        FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, block)


def _request_headers(authority: bytes, path: bytes) -> list[tuple[bytes, bytes]]:
    return [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", authority),
            (b"content-type", b"application/grpc"), (b"te", b"trailers")]


def h2c_status(port: int, authority: bytes) -> str | None:
    """The grpc-status a real ``h2`` client (validating nothing) reads for its one request."""
    config = h2.config.H2Configuration(client_side=True, validate_outbound_headers=False,
                                       normalize_outbound_headers=False, validate_inbound_headers=False)
    conn = h2.connection.H2Connection(config)
    conn.initiate_connection()
    conn.send_headers(1, _request_headers(authority, b"/x.Y/Z"), end_stream=True)
    return grpc_status_of(conn, exchange(port, conn.data_to_send()))


def tls_bytes(name: bytes) -> bytes:
    """A ClientHello naming ``name`` (no TLS library sends a name longer than 255 octets)."""
    return client_hello([sni_extension(name)])


def exchange(port: int, first_bytes: bytes) -> bytes:
    """Send the first bytes, read the answer to the router's (or the pod's) close."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(first_bytes)
        return read_to_eof(sock, timeout_s=10)


async def exchange_many(port: int, requests: list[bytes], concurrency: int = 32) -> None:
    """Each request on its own connection, ``concurrency`` at a time, each read to the router's close."""
    gate = asyncio.Semaphore(concurrency)

    async def one(data: bytes) -> None:
        async with gate:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(data)
                await writer.drain()
                async with asyncio.timeout(10):
                    while await reader.read(65536):
                        pass
            except (ConnectionError, TimeoutError):
                pass
            finally:
                writer.close()

    await asyncio.gather(*(one(r) for r in requests))


def counts(router: RouterProcess, protocol: str, *outcomes: str) -> dict[str, float]:
    return {o: router.metric(c.GRPC_CONNECTIONS_TOTAL + "_total", protocol=protocol, outcome=o) for o in outcomes}


def wait_until(what: str, predicate: Any, timeout_s: float = 20.0) -> None:
    eventually_blocking(predicate, timeout_s, 0.05, what=what)


# ---------------------------------------------------------------------------
# 3. Names longer than any legal authority: never routed, never remembered
# ---------------------------------------------------------------------------
class Deployment:
    def __init__(self, router: RouterProcess, pod: CountingPod) -> None:
        self.router, self.pod = router, pod


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    pod = CountingPod("127.0.0.2")
    endpoints = tmp_path_factory.mktemp("untrusted") / "endpoints.json"
    write_endpoints(endpoints, [(POD, pod.address, pod.port, 1)])
    args = router_args(endpoints, "--advertised-hostname-template", TEMPLATE, "--log-format", "json")
    try:
        with RouterProcess(args) as router:
            router.wait_ready()
            yield Deployment(router, pod)
            assert router.stop() == 0
    finally:
        pod.stop()


TOO_LONG = {
    "port-of-6-digits": f"{LONGEST_NAME}:650710",
    "dot-and-port-of-6-digits": f"{LONGEST_NAME}.:000001",
    "port-of-15000-digits": f"{LONGEST_NAME}:" + "7" * 15_000,
}
"""Authorities (and SNIs) longer than the longest legal one whose name part matches the template."""


@pytest.mark.parametrize("protocol", ["h2c", "tls"])
def test_the_longest_legal_authority_routes(deployment: Deployment, protocol: str) -> None:
    router, accepted = deployment.router, deployment.pod.accepted
    before = counts(router, protocol, "accepted")
    exchange(router.grpc_port, h2c_bytes(LONGEST_AUTHORITY.encode()) if protocol == "h2c"
             else tls_bytes(LONGEST_AUTHORITY.encode()))
    wait_until("the pod's accept", lambda: deployment.pod.accepted == accepted + 1)
    assert counts(router, protocol, "accepted")["accepted"] == before["accepted"] + 1


@pytest.mark.parametrize("name", list(TOO_LONG.values()), ids=list(TOO_LONG))
@pytest.mark.parametrize("protocol", ["h2c", "tls"])
def test_a_longer_authority_is_an_unknown_name_never_routed(deployment: Deployment, protocol: str, name: str) -> None:
    router, accepted = deployment.router, deployment.pod.accepted
    outcome = "unknown_authority"
    before = counts(router, protocol, outcome, "accepted")
    if protocol == "h2c":
        assert h2c_status(router.grpc_port, name.encode()) == str(int(GrpcStatus.INVALID_ARGUMENT))
    else:
        assert exchange(router.grpc_port, tls_bytes(name.encode())) == tls_alert(TlsAlert.UNRECOGNIZED_NAME)
    after = counts(router, protocol, outcome, "accepted")
    assert (after[outcome] - before[outcome], after["accepted"] - before["accepted"]) == (1, 0)
    # a dial would have come before the answer: the pod's accept thread gets 50 ms to show one
    holds_blocking(lambda: deployment.pod.accepted == accepted, 0.05, what="an over-long name kept off the pod")


def test_distinct_15k_names_leave_the_rss_where_it_was(deployment: Deployment) -> None:
    """Before the fix every one was remembered (the cache holds only names of a pod, in or out of the
    snapshot): 1,500 of them took ~22 MB. Warm-up names of the same size that never matched come
    first, so the measured round holds only what the names themselves could add."""
    router = deployment.router
    pids = router.all_pids()

    def names(prefix: str, count: int) -> list[bytes]:
        return [h2c_bytes(f"{prefix}.{SUFFIX}:{i:015000d}".encode()) for i in range(count)]

    def refused() -> float:  # unknown_authority now; target_unavailable before the fix
        return sum(counts(router, "h2c", "unknown_authority", "target_unavailable").values())

    asyncio.run(exchange_many(router.grpc_port, [h2c_bytes(f"nobody{i}.example:{i:015000d}".encode())
                                                 for i in range(300)]))
    before_kib, before = rss_kib(pids), refused()
    asyncio.run(exchange_many(router.grpc_port, names("stargate-9", 1_500)))  # a pod not in the snapshot
    wait_until("the 1,500 refusals", lambda: refused() >= before + 1_500)
    grown_kib = rss_kib(pids) - before_kib
    assert grown_kib < 6 * 1024, f"RSS grew {grown_kib} KiB over 1,500 distinct 15 KB names"


async def test_a_quic_sni_longer_than_any_legal_authority_is_refused(
    pki: DemoPki, tmp_path: Path, extensions: Extensions
) -> None:
    """aioquic sends the name as it is; the router refuses it as an unknown SNI, and the longest
    legal one (the positive control) is routed."""
    pod = await start_quic_pod(POD, "127.0.0.2", 0, pki.cert_path, pki.key_path)
    endpoints = tmp_path / "endpoints.json"
    write_endpoints(endpoints, [(POD, "127.0.0.2", 1, bound_port(pod))])
    args = router_args(endpoints, "--advertised-hostname-template", TEMPLATE)
    router = RouterProcess(args, extensions_env(extensions))
    try:
        await asyncio.to_thread(router.wait_ready)

        def quic(outcome: str) -> float:
            return router.metric(c.QUIC_CONNECTIONS_TOTAL + "_total", outcome=outcome)

        for name, outcome in ((f"{LONGEST_NAME}:" + "0" * 6_000, "unknown_sni"),
                              (f"{LONGEST_NAME}:650710", "unknown_sni"),
                              (LONGEST_AUTHORITY, "accepted")):
            before = quic(outcome), quic("accepted")
            config = client_configuration(name, pki.ca_path)
            config.verify_mode = ssl.CERT_NONE  # the demo certificate does not name these
            with pytest.raises((ConnectionError, TimeoutError)) if outcome != "accepted" else _nothing():
                async with asyncio.timeout(10), connect("127.0.0.1", router.quic_port, configuration=config,
                                                        wait_connected=True) as client:
                    stream_reader, stream_writer = await client.create_stream()
                    stream_writer.write(WHOAMI)
                    stream_writer.write_eof()
                    assert (await stream_reader.read()).startswith(POD.encode())
            after = quic(outcome), quic("accepted")
            if outcome == "accepted":
                assert after[0] == before[0] + 1, name
            else:
                assert (after[0] - before[0], after[1] - before[1]) == (1, 0), name
        assert await asyncio.to_thread(router.stop) == 0
    finally:
        router.__exit__()
        pod.close()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# ---------------------------------------------------------------------------
# 4. What one client can make the router write: a bounded line, a budget, a count
# ---------------------------------------------------------------------------
DROPPED_LINES = c.LOG_LINES_DROPPED_TOTAL + "_total"
MAX_ACCESS_LINE_BYTES = 1024
"""An access line's length whatever the client sent: the hostname cut at 300 characters plus a marker,
the rest the router's own (addresses, pod name, numbers)."""


def test_an_over_long_name_is_cut_in_the_answer_and_the_logs(deployment: Deployment) -> None:
    router = deployment.router
    since = len(router.lines)
    name = TOO_LONG["port-of-15000-digits"]
    answer = exchange(router.grpc_port, h2c_bytes(name.encode()))
    assert len(answer) < 2048, "the gRPC answer quotes the whole name"
    wait_until("the rejection's lines", lambda: any(name[:200] in line for line in router.lines[since:]))
    mine = [line for line in router.lines[since:] if name[:200] in line]
    assert mine and all(len(line.encode()) < 4096 for line in mine), [len(x) for x in mine]


def test_rejection_lines_beyond_their_rate_are_counted(deployment: Deployment) -> None:
    """A burst of refusals: the rejection log and the rejected access lines write their rate's worth
    (20 a second each) and count the rest, under ``log="rejection"`` and ``log="access"``."""
    router = deployment.router

    def dropped() -> tuple[float, float]:
        return router.metric(DROPPED_LINES, log="rejection"), router.metric(DROPPED_LINES, log="access")

    before, burst = dropped(), 150
    asyncio.run(exchange_many(router.grpc_port, [h2c_bytes(f"nobody{i}.example".encode()) for i in range(burst)]))
    wait_until("the refusals' access lines", lambda: dropped()[1] > before[1])
    after = dropped()
    most_written = router.workers * 2 * c.REJECTION_LOG_LINES_PER_S  # each process's rate, refilled meanwhile
    assert after[0] - before[0] >= burst - most_written, (before, after)


def test_accepted_lines_are_bounded_whatever_the_authority(deployment: Deployment) -> None:
    """Round-robin requests are routed whatever their authority: before the fix each line carried
    the client's 15 KB name whole (the issue's 2,000 of them wrote 30 MB)."""
    router = deployment.router
    since = len(router.lines)
    names = [f"w{i}.example:{i:015000d}" for i in range(200)]
    accepted = counts(router, "h2c", "accepted")["accepted"]
    asyncio.run(exchange_many(router.grpc_port, [h2c_bytes(n.encode(), ROUND_ROBIN_PATH.encode()) for n in names]))
    assert counts(router, "h2c", "accepted")["accepted"] == accepted + 200
    wait_until("200 access lines", lambda: len(access_lines(router, since)) >= 200)
    lines = [line for line in router.lines[since:] if '"logger":"router.access"' in line]
    assert max(len(line.encode()) for line in lines) <= MAX_ACCESS_LINE_BYTES
    for line in lines:
        hostname = json.loads(line)["hostname"]
        assert hostname in names or re.fullmatch(r"w\d+\.example:0+\d*\[\.\.\.\+\d+ chars\]", hostname), hostname
    assert sum(len(line.encode()) for line in router.lines[since:]) < 200 * MAX_ACCESS_LINE_BYTES


def test_access_lines_beyond_the_budget_are_dropped_and_counted(tmp_path: Path) -> None:
    """1,500 routed connections held open, then all reset at once: their lines come in one burst,
    more than the budget's 1,000; the rest are counted, and every connection is in ``terminations``."""
    held = 1_500
    raise_nofile_limit()
    pod = RawPod("127.0.0.2", "hold")
    endpoints = tmp_path / "endpoints.json"
    write_endpoints(endpoints, [(POD, "127.0.0.2", pod.port, 1)])
    args = router_args(endpoints, "--log-format", "json")
    clients: list[socket.socket] = []
    try:
        with RouterProcess(args, one_process="the access-line budget is each process's") as router:
            router.wait_ready()
            assert router.metric(DROPPED_LINES, log="access") == 0
            request = h2c_bytes(b"a.example", ROUND_ROBIN_PATH.encode())
            for _ in range(held):
                sock = socket.create_connection(("127.0.0.1", router.grpc_port), timeout=10)
                sock.sendall(request)
                clients.append(sock)
            wait_until("every connection routed", lambda: len(pod.held) >= held, timeout_s=60)
            for sock in clients:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
                sock.close()
            clients.clear()

            def ended() -> float:
                return sum(router.metric(c.TERMINATIONS_TOTAL + "_total", protocol="h2c", termination=t)
                           for t in ("client_reset", "client_close"))

            wait_until("every connection ended", lambda: ended() >= held, timeout_s=60)
            # the last batch of lines is flushed within 20 ms: every ending written or counted dropped
            wait_until("every line written or dropped",
                       lambda: len(access_lines(router)) + router.metric(DROPPED_LINES, log="access") >= held)
            written = len(access_lines(router))
            dropped = router.metric(DROPPED_LINES, log="access")
            assert dropped > 0 and written + dropped == held, (written, dropped)
            assert written >= c.ACCESS_LOG_LINES_PER_S, written  # the bucket's depth, all at once
            assert router.stop() == 0
    finally:
        for sock in clients:
            sock.close()
        pod.close()


# ---------------------------------------------------------------------------
# 5. Control characters never reach the log raw
# ---------------------------------------------------------------------------
HOSTILE = "stargate-0\x1b]0;owned\x07\x1b[2J\x1b[31m\x08\x7f\x0b\x0c\x1c\x1d\x1e.example"
"""Terminal escapes (OSC title, clear screen, colour), BEL, BS, DEL and the separators ``str.splitlines``
honours (VT, FF, FS, GS, RS): every control character an ASCII name can carry."""
RAW_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def assert_no_raw_control(lines: list[str]) -> None:
    bad = [line for line in lines if RAW_CONTROL.search(line)]
    assert not bad, bad[:3]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_control_characters_of_names_are_escaped_in_every_line(tmp_path: Path, log_format: str) -> None:
    pod = CountingPod("127.0.0.2")
    endpoints = tmp_path / "endpoints.json"
    write_endpoints(endpoints, [(POD, pod.address, pod.port, 1)])
    try:
        with RouterProcess(router_args(endpoints, "--log-format", log_format)) as router:
            router.wait_ready()
            since = len(router.lines)
            hostile = HOSTILE.encode()
            exchange(router.grpc_port, h2c_bytes(hostile))  # refused: a rejection line and an access line
            exchange(router.grpc_port, tls_bytes(hostile))
            exchange(router.grpc_port, h2c_bytes(hostile, ROUND_ROBIN_PATH.encode()))  # accepted: the direct line
            wait_until("the lines", lambda: sum("owned" in line for line in router.lines[since:]) >= 5)
            assert router.stop() == 0
            mine = [line for line in router.lines[since:] if "owned" in line]
            assert_no_raw_control(router.lines)
            if log_format == "json":
                names = [json.loads(line).get("hostname") for line in mine]
                assert names.count(HOSTILE) >= 3, names  # escaped, not altered: JSON gives it back exactly
            else:
                assert any("hostname=\"stargate-0\\u001b]0;owned\\u0007" in line for line in mine), mine
    finally:
        pod.stop()


async def test_control_characters_of_a_quic_sni_are_escaped(
    pki: DemoPki, tmp_path: Path, extensions: Extensions
) -> None:
    endpoints = tmp_path / "endpoints.json"
    write_endpoints(endpoints, [(POD, "127.0.0.2", 1, 1)])
    router = RouterProcess(router_args(endpoints, "--log-format", "text"), extensions_env(extensions))
    try:
        await asyncio.to_thread(router.wait_ready)
        config = client_configuration(HOSTILE, pki.ca_path)
        with pytest.raises((ConnectionError, TimeoutError)):
            async with asyncio.timeout(10), connect("127.0.0.1", router.quic_port, configuration=config,
                                                    wait_connected=True):
                pass
        await becomes_true(lambda: sum("owned" in line for line in router.lines) >= 2, 5.0, 0.05)  # judged below
        assert await asyncio.to_thread(router.stop) == 0
        assert sum("owned" in line for line in router.lines) >= 2, router.lines[-5:]
        assert_no_raw_control(router.lines)
    finally:
        router.__exit__()
