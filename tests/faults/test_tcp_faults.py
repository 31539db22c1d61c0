"""TCP faults through the router process: slowloris, fd exhaustion, failing pods, load integrity.

Each test runs its own router (``python -m router``) on 127.0.0.1 with the timeouts it
needs; pods are real grpcio servers or small raw TCP servers on 127.0.0.2+. Figures (fds,
RSS, connections held) are printed so ``pytest -s`` shows them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import random
import resource
import selectors
import socket
import ssl
import struct
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from router import constants as c
from router.demo.grpc_pods import RunningPod, start_pod
from tests.support.h2 import grpc_status_of, h2c_grpc_request
from tests.support.polling import (
    becomes_true,
    deliberate_pause_blocking,
    eventually,
    eventually_blocking,
    steady,
)
from tests.support.router_probes import (
    CHART_PEAK_RSS_KIB,
    WhoAmIProbe,
    cpu_seconds,
    echo_stream,
    h2c_channel,
    open_fds,
    open_tcp_connections,
    outcome_count,
    outcome_counts,
    peak_rss_kib,
    raise_nofile_limit,
    rss_kib,
    settle_fds,
    timed_whoami,
)
from tests.support.router_process import RouterProcess, router_args, write_endpoints
from tests.support.tcp_peers import (
    BlackholePod,
    IntegrityPods,
    ResettingProxy,
    SynDroppingPod,
    closed_port,
    echo_pod,
    flooding_pod,
    integrity_client,
    read_to_eof,
)
from tests.support.tls import alpn_extension, client_hello, sni_extension
from wire.grpc import GrpcStatus
from wire.h2_frames import H2_PREFACE
from wire.tls import TlsAlert, tls_alert

T = TypeVar("T")

TERMINATIONS = "stargate_k8s_router_terminations_total"
EMFILE_WINDOW_S = 0.5
"""How long the router is watched at its fd limit: its CPU share and log lines over that time."""


def unread(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive queue (``FIONREAD``)."""
    return int(struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, bytes(4)))[0])

PEEK_TIMEOUT_MS = 1500
CONNECT_TIMEOUT_MS = 1000
RELAY_IDLE_TIMEOUT_MS = 1000
PROMPTLY_S = 5.0
"""Generous bound for "promptly" on a shared 2-core machine."""
FD_SLACK = 2
"""Router fds allowed above the baseline afterwards (a health-scrape connection in flight)."""


def host(pod: str) -> str:
    return f"{pod}.stargate.external"


@pytest.fixture(autouse=True)
def _nofile_limit() -> None:
    raise_nofile_limit()


@pytest.fixture
def grpc_pod() -> Iterator[RunningPod]:
    pod = start_pod("stargate-0", "127.0.0.2")
    try:
        yield pod
    finally:
        pod.stop()


def start_router(
    tmp_path: Path, rows: list[tuple[str, str, int, int]], *extra: str, one_process: str = ""
) -> RouterProcess:
    endpoints = tmp_path / "endpoints.json"
    write_endpoints(endpoints, rows)
    router = RouterProcess(router_args(endpoints, *extra), one_process=one_process)
    router.wait_ready()
    return router


def whoami(router: RouterProcess, pod: str, timeout_s: float = 10.0) -> tuple[str, float]:
    """(answering pod or status code name, seconds) of one WhoAmI naming ``pod``."""
    return timed_whoami(router, host(pod), timeout_s)


# ---------------------------------------------------------------------------
# Slowloris
# ---------------------------------------------------------------------------
SILENT, H2C_DRIP, TLS_DRIP = "silent", "h2c-drip", "tls-drip"
DRIP_BYTES = {H2C_DRIP: H2_PREFACE, TLS_DRIP: b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"}
"""What a drip connection sends, one byte a second: a valid start that never completes in time."""


@pytest.mark.parametrize(
    "connections", [300, pytest.param(2000, marks=pytest.mark.slow)], ids=lambda n: f"{n}conns"
)
def test_slowloris_peeks_close_at_the_peek_timeout_while_real_calls_pass(
    tmp_path: Path, grpc_pod: RunningPod, connections: int,
) -> None:
    router = start_router(
        tmp_path, [("stargate-0", grpc_pod.address, grpc_pod.port, 1)],
        "--peek-timeout-ms", str(PEEK_TIMEOUT_MS),
    )
    with router:
        pids = router.all_pids()
        assert whoami(router, "stargate-0")[0] == "stargate-0"  # warm
        base_fds = settle_fds(pids, 0, timeout_s=0.5)
        before = outcome_counts(router)
        kinds = [(SILENT, H2C_DRIP, TLS_DRIP)[i % 3] for i in range(connections)]
        socks: list[socket.socket] = []
        opened: dict[int, float] = {}
        closed: dict[int, float] = {}
        sel = selectors.DefaultSelector()
        caller = WhoAmIProbe(router, host("stargate-0"), max_calls=100)
        try:
            for i in range(connections):
                sock = socket.create_connection(("127.0.0.1", router.grpc_port), timeout=5)
                sock.setblocking(False)
                opened[i] = time.monotonic()
                socks.append(sock)
                sel.register(sock, selectors.EVENT_READ, i)
            hold_started = time.monotonic()
            caller.start()
            peak_fds, sent_rounds = base_fds, 0
            deadline = hold_started + PEEK_TIMEOUT_MS / 1000 + 10
            next_drip = hold_started
            while len(closed) < connections and time.monotonic() < deadline:
                now = time.monotonic()
                if now >= next_drip:  # one byte a second on every drip connection still open
                    for i, kind in enumerate(kinds):
                        if kind != SILENT and i not in closed:
                            with contextlib.suppress(OSError):
                                socks[i].send(DRIP_BYTES[kind][sent_rounds : sent_rounds + 1])
                    sent_rounds += 1
                    next_drip += 1.0
                for key, _ in sel.select(timeout=0.05):
                    i = key.data
                    try:
                        data = socks[i].recv(4096)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        closed[i] = time.monotonic()
                        sel.unregister(socks[i])
                peak_fds = max(peak_fds, open_fds(pids))
            caller.stop()
        finally:
            sel.close()
            for sock in socks:
                sock.close()
        after_fds = settle_fds(pids, base_fds + FD_SLACK)
        after = outcome_counts(router)
        lifetimes = [closed[i] - opened[i] for i in closed]
        peak_rss = peak_rss_kib(pids)
        print(
            f"\nslowloris {connections}: router fds base={base_fds} peak={peak_fds} after={after_fds}; "
            f"held {min(lifetimes):.2f}-{max(lifetimes):.2f}s; legit calls={len(caller.results)} "
            f"max latency={caller.max_latency_s:.3f}s; peak RSS (VmHWM) {peak_rss} KiB"
        )
        assert peak_rss < CHART_PEAK_RSS_KIB
        assert len(closed) == connections, f"{connections - len(closed)} connections never closed"
        assert min(lifetimes) >= PEEK_TIMEOUT_MS / 1000 - 0.05  # not before the peek timeout
        assert max(lifetimes) <= PEEK_TIMEOUT_MS / 1000 + PROMPTLY_S  # and promptly at it
        assert peak_fds >= base_fds + connections // 2, "the router never held the connections"
        during_hold = [r for r in caller.results if r[0] < hold_started + PEEK_TIMEOUT_MS / 1000]
        assert during_hold, "no legitimate call was made while the connections were held"
        assert caller.failures("stargate-0") == []  # each answered by its pod within its own 10 s deadline
        tls_drips = kinds.count(TLS_DRIP)
        assert after["h2c", "peek_timeout"] - before["h2c", "peek_timeout"] == connections - tls_drips
        assert after["tls", "peek_timeout"] - before["tls", "peek_timeout"] == tls_drips
        assert after_fds <= base_fds + FD_SLACK
        assert router.stop() == 0


def _held_in_peek(router: RouterProcess) -> socket.socket:
    """A connection the router accepts and then holds, waiting for the rest of its hello: its first
    byte is sent (a silent one stays in the kernel, ``--tcp-defer-accept``, and holds no fd)."""
    sock = socket.create_connection(("127.0.0.1", router.grpc_port), timeout=5)
    sock.sendall(b"\x16")  # a TLS handshake record's first byte
    return sock


def test_fd_exhaustion_answers_unavailable_pauses_accepts_and_recovers(
    tmp_path: Path, grpc_pod: RunningPod,
) -> None:
    """The router at its fd limit: no busy accept loop, no log flood, service returns by itself."""
    peek_timeout_ms = 2000  # the held peeks must outlive the set-up on a loaded machine
    router = start_router(
        tmp_path, [("stargate-0", grpc_pod.address, grpc_pod.port, 1)],
        "--peek-timeout-ms", str(peek_timeout_ms),
        one_process="one process's fd limit, filled to its last fd: the kernel picks the worker that "
        "accepts each connection, so no client can fill one worker's fds exactly",
    )
    with router:
        pid = router.proc.pid
        assert whoami(router, "stargate-0")[0] == "stargate-0"
        base_fds = settle_fds(pid, 0, timeout_s=0.5)
        headroom = 20
        # Lower only the soft limit (the router raised it to the hard one at start): restorable.
        old_limit = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (base_fds + headroom, old_limit[1]))
        idle: list[socket.socket] = []
        try:
            # Leave the router exactly one free fd: the next client is accepted, its dial fails.
            for _ in range(headroom - 1):
                idle.append(_held_in_peek(router))
            eventually_blocking(lambda: open_fds(pid) >= base_fds + headroom - 1, interval_s=0.01,
                                what="the held peeks' fds: one left")
            answer, _elapsed = whoami(router, "stargate-0")
            assert answer == "UNAVAILABLE", answer  # its dial failed (EMFILE), not left hanging
            settle_fds(pid, base_fds + headroom - 2, timeout_s=PROMPTLY_S)  # room for a scrape
            assert outcome_count(router, "h2c", "connect_error") == 1  # answered and counted
            # Now beyond the limit: accept() fails with EMFILE while connections queue.
            for _ in range(30):
                idle.append(_held_in_peek(router))
            lines_before, cpu_before, t0 = len(router.lines), cpu_seconds(pid), time.monotonic()
            deliberate_pause_blocking(EMFILE_WINDOW_S, "a window to measure the router at EMFILE over")
            cpu_share = (cpu_seconds(pid) - cpu_before) / (time.monotonic() - t0)
            log_lines = len(router.lines) - lines_before
            # The held peeks time out (1.5 s), fds come back, the queued ones are accepted and
            # time out too; a real call then succeeds without anyone restarting anything.
            started = time.monotonic()
            eventually_blocking(lambda: whoami(router, "stargate-0", timeout_s=2.0)[0] == "stargate-0",
                                peek_timeout_ms / 1000 * 3 + PROMPTLY_S, 0.2, what="service back by itself")
            recovered_after = time.monotonic() - started
        finally:
            for sock in idle:
                sock.close()
            resource.prlimit(pid, resource.RLIMIT_NOFILE, old_limit)
        print(f"\nfd exhaustion: cpu share while at EMFILE={cpu_share:.2f}, log lines in {EMFILE_WINDOW_S} s="
              f"{log_lines}, recovered after {recovered_after:.2f}s")
        assert cpu_share < 0.3, "accept loop spins at EMFILE"
        assert log_lines < 50, "log flood at EMFILE"
        assert not [line for line in router.lines if "unexpected error" in line]
        assert settle_fds(pid, base_fds + FD_SLACK) <= base_fds + FD_SLACK
        assert router.stop() == 0


# ---------------------------------------------------------------------------
# Pod faults
# ---------------------------------------------------------------------------
def _tls_status(router: RouterProcess, pod: str) -> tuple[bytes, float]:
    """(what the router answered, seconds) to a hand-built ClientHello naming ``pod``."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", router.grpc_port), timeout=5) as sock:
        sock.sendall(client_hello([sni_extension(host(pod).encode()), alpn_extension(b"h2")]))
        answer = read_to_eof(sock, timeout_s=10)
    return answer, time.monotonic() - started


@pytest.mark.parametrize("fault", ["refused", "syn-dropped"])
def test_unreachable_pod_is_unavailable_within_the_connect_timeout(tmp_path: Path, fault: str) -> None:
    dropping = SynDroppingPod("127.0.0.6") if fault == "syn-dropped" else None
    port = dropping.port if dropping is not None else closed_port("127.0.0.6")
    try:
        router = start_router(
            tmp_path, [("stargate-0", "127.0.0.6", port, 1)], "--connect-timeout-ms", str(CONNECT_TIMEOUT_MS),
        )
        with router:
            answer, elapsed = whoami(router, "stargate-0")
            assert answer == "UNAVAILABLE"
            assert elapsed < CONNECT_TIMEOUT_MS / 1000 + PROMPTLY_S
            alert, tls_elapsed = _tls_status(router, "stargate-0")
            assert alert == tls_alert(TlsAlert.INTERNAL_ERROR)
            assert tls_elapsed < CONNECT_TIMEOUT_MS / 1000 + PROMPTLY_S
            print(f"\n{fault}: h2c UNAVAILABLE after {elapsed:.3f}s, TLS internal_error after {tls_elapsed:.3f}s")
            assert outcome_count(router, "h2c", "connect_error") == 1
            assert outcome_count(router, "tls", "connect_error") == 1
            assert router.stop() == 0
    finally:
        if dropping is not None:
            dropping.close()


def test_pod_reset_mid_stream_reaches_the_client_promptly(tmp_path: Path, grpc_pod: RunningPod) -> None:
    proxy = ResettingProxy("127.0.0.3", (grpc_pod.address, grpc_pod.port))
    try:
        router = start_router(tmp_path, [("stargate-0", "127.0.0.3", proxy.port, 1)])
        with router:
            base_fds = settle_fds(router.all_pids(), 0, timeout_s=0.5)
            with h2c_channel(router, host("stargate-0")) as channel:
                outbox, replies = echo_stream(channel)
                outbox.put(b"first")
                assert next(replies) == b"first"
                assert proxy.reset_all() == 1
                reset_at = time.monotonic()
                outbox.put(b"second")
                with pytest.raises(grpc.RpcError) as err:
                    next(replies)
                seen_after = time.monotonic() - reset_at
                outbox.put(None)
            print(f"\npod reset: client saw {err.value.code().name} after {seen_after:.3f}s")
            # the reset reached the client as such (a reset left unpropagated would meet the
            # stream's own deadline: DEADLINE_EXCEEDED), and the router ended the relay for it
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert outcome_count(router, "h2c", "relay_error") == 1
            assert router.metric(TERMINATIONS, protocol="h2c", termination="pod_reset") == 1
            assert settle_fds(router.all_pids(), base_fds + FD_SLACK) <= base_fds + FD_SLACK
            assert router.stop() == 0
    finally:
        proxy.close()


@pytest.mark.parametrize("protocol", ["h2c", "tls"])
def test_blackholed_pod_is_cut_at_the_relay_idle_timeout(tmp_path: Path, protocol: str) -> None:
    pod = BlackholePod("127.0.0.4")
    try:
        router = start_router(
            tmp_path, [("stargate-0", "127.0.0.4", pod.port, 1)],
            "--relay-idle-timeout-ms", str(RELAY_IDLE_TIMEOUT_MS),
        )
        with router:
            base_fds = settle_fds(router.all_pids(), 0, timeout_s=0.5)
            started = time.monotonic()
            if protocol == "h2c":
                answer, elapsed = whoami(router, "stargate-0", timeout_s=20)
                assert answer == "UNAVAILABLE"
            else:
                ctx = ssl.create_default_context()
                with socket.create_connection(("127.0.0.1", router.grpc_port), timeout=20) as raw:
                    with pytest.raises((ssl.SSLError, OSError)):
                        ctx.wrap_socket(raw, server_hostname=host("stargate-0"))
                elapsed = time.monotonic() - started
            assert RELAY_IDLE_TIMEOUT_MS / 1000 - 0.05 <= elapsed < RELAY_IDLE_TIMEOUT_MS / 1000 + PROMPTLY_S
            assert len(pod.held) == 1
            pod_side = pod.held[0]
            forwarded = read_to_eof(pod_side, timeout_s=PROMPTLY_S)  # what the router forwarded, then EOF
            assert forwarded, "the pod's connection carried nothing"
            assert pod_side.recv(1) == b""
            print(f"\nblackhole {protocol}: client cut after {elapsed:.3f}s")
            assert outcome_count(router, protocol, "accepted") == 1
            assert outcome_count(router, protocol, "completed") == 1
            assert settle_fds(router.all_pids(), base_fds + FD_SLACK) <= base_fds + FD_SLACK
            assert router.stop() == 0
    finally:
        pod.close()


def test_pod_removed_from_endpoints_keeps_open_streams_and_rejects_new_ones(
    tmp_path: Path, grpc_pod: RunningPod,
) -> None:
    other = start_pod("stargate-1", "127.0.0.3")
    try:
        rows = [("stargate-0", grpc_pod.address, grpc_pod.port, 1), ("stargate-1", other.address, other.port, 1)]
        router = start_router(tmp_path, rows)
        with router:
            with h2c_channel(router, host("stargate-0")) as channel:
                outbox, replies = echo_stream(channel)
                outbox.put(b"before")
                assert next(replies) == b"before"
                write_endpoints(tmp_path / "endpoints.json", rows[1:])
                eventually_blocking(lambda: router.metric(c.READY_TARGETS) == 1, PROMPTLY_S, 0.05,
                                    what="the endpoints change read")
                for i in range(5):  # the open stream continues on its spliced connection
                    outbox.put(b"after-%d" % i)
                    assert next(replies) == b"after-%d" % i
                assert whoami(router, "stargate-0")[0] == "UNAVAILABLE"  # new connection
                assert whoami(router, "stargate-1")[0] == "stargate-1"
                outbox.put(None)
                assert list(replies) == []
            assert outcome_count(router, "h2c", "target_unavailable") == 1
            assert router.stop() == 0
    finally:
        other.stop()


# ---------------------------------------------------------------------------
# Integrity and leaks under load
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("streams", "max_bytes"),
    [(200, 2 * 1024 * 1024), pytest.param(200, 16 * 1024 * 1024, marks=pytest.mark.slow)],
    ids=["200-streams-up-to-2MiB", "200-streams-up-to-16MiB"],
)
async def test_concurrent_streams_with_half_closes_arrive_byte_exact(
    tmp_path: Path, streams: int, max_bytes: int,
) -> None:
    pods = IntegrityPods()
    await pods.start([("stargate-0", "127.0.0.2"), ("stargate-1", "127.0.0.3")])
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    router = await asyncio.to_thread(start_router, tmp_path, pods.rows)
    try:
        plans = []
        for stream_id in range(streams):
            up = rng.choice([0, rng.randint(1, 1024), rng.randint(0, max_bytes)])
            down = rng.choice([0, rng.randint(1, 1024), rng.randint(0, max_bytes)])
            plans.append((stream_id, rng.choice(["stargate-0", "stargate-1"]), up, down, rng.random() < 0.3))
        started = time.monotonic()
        outcomes = await asyncio.wait_for(asyncio.gather(*(
            integrity_client(router.grpc_port, sid, pod, host(pod), up, down, pod_first, random.Random(seed + sid))
            for sid, pod, up, down, pod_first in plans
        )), 90)
        elapsed = time.monotonic() - started
        # A client is done when its own halves are; its pod may still be reading the last bytes.
        await becomes_true(lambda: len(pods.results) >= streams, 10, 0.01)  # a pod still missing is a mismatch below
        total = sum(up + down for _, _, up, down, _ in plans)
        mismatches = []
        for plan, (_pod, sent_up, got_down) in zip(plans, outcomes, strict=True):
            sid, pod = plan[:2]
            pod_name, got_up, sent_down = pods.results.get(sid, ("missing", "", ""))
            if (pod_name, got_up, got_down) != (pod, sent_up, sent_down):
                mismatches.append((plan, pod_name, got_up == sent_up, got_down == sent_down))
        print(f"\nintegrity seed={seed}: {streams} streams, {total / 2**20:.1f} MiB in {elapsed:.2f}s, "
              f"mismatches={len(mismatches)}")
        assert mismatches == [], f"seed {seed}: streams {mismatches[:10]}"
        assert await asyncio.to_thread(outcome_count, router, "tls", "completed") == streams
        assert await asyncio.to_thread(outcome_count, router, "tls", "relay_error") == 0
    finally:
        await asyncio.to_thread(router.stop)
        pods.close()


async def _churn_one(port: int, kind: str, payload: bytes) -> bool:
    """One connection of the mix; True when it ended as that kind should."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if kind == "abort":  # connect, then RST at once
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return True
        if kind == "close":
            return True
        if kind == "routed":
            hello = client_hello([sni_extension(host("stargate-echo").encode())])
            writer.write(hello + payload)
            writer.write_eof()
            return await reader.read() == hello + payload
        if kind == "unknown-sni":
            writer.write(client_hello([sni_extension(b"nobody.example.org")]))
            return await reader.read() == tls_alert(TlsAlert.UNRECOGNIZED_NAME)
        if kind == "h2c-unknown":
            conn, request = h2c_grpc_request("nobody.example.org")
            writer.write(request)
            return grpc_status_of(conn, await reader.read()) == str(GrpcStatus.INVALID_ARGUMENT)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # garbage: closed, nothing answered
        return await reader.read() == b""
    finally:
        writer.close()


CHURN_KINDS = ("routed",) * 5 + ("unknown-sni", "unknown-sni", "h2c-unknown", "garbage", "close", "abort")


@pytest.mark.parametrize("connections", [1000, pytest.param(10_000, marks=pytest.mark.slow)])
async def test_connection_churn_leaks_no_fds_or_memory(tmp_path: Path, connections: int) -> None:
    server = await asyncio.start_server(echo_pod, "127.0.0.2", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    router = await asyncio.to_thread(start_router, tmp_path, [("stargate-echo", "127.0.0.2", port, 1)])
    rng = random.Random(7)
    limit = asyncio.Semaphore(50)

    async def all_closed() -> None:
        """Every connection of the mix over at both ends: client to router and router to pod."""
        await eventually(lambda: open_tcp_connections(router.grpc_port, port) == 0, 10, 0.05,
                         what=lambda: f"every connection closed ({open_tcp_connections(router.grpc_port, port)} open)")

    async def one(i: int) -> bool:
        async with limit:
            kind = CHURN_KINDS[i % len(CHURN_KINDS)]
            return await asyncio.wait_for(
                _churn_one(router.grpc_port, kind, os.urandom(rng.randint(1, 32 * 1024))), 15
            )

    try:
        pids = router.all_pids()
        assert all(await asyncio.gather(*(one(i) for i in range(200))))  # warm-up
        await all_closed()  # rejected connections linger (<= 1 s) until their client's close
        base_fds, base_rss = open_fds(pids), rss_kib(pids)
        started = time.monotonic()
        ok = await asyncio.gather(*(one(i) for i in range(connections)))
        elapsed = time.monotonic() - started
        await all_closed()
        after_fds = await asyncio.to_thread(settle_fds, pids, base_fds + FD_SLACK)
        after_rss, peak_rss = rss_kib(pids), peak_rss_kib(pids)
        print(f"\nchurn {connections} connections in {elapsed:.1f}s: router fds {base_fds} -> {after_fds}, "
              f"RSS {base_rss} KiB -> {after_rss} KiB ({after_rss - base_rss:+d} KiB), "
              f"peak RSS (VmHWM) {peak_rss} KiB")
        assert peak_rss < CHART_PEAK_RSS_KIB
        assert ok.count(False) == 0
        assert after_fds <= base_fds + FD_SLACK
        assert after_rss - base_rss < 16 * 1024, "RSS grew by more than 16 MiB"
    finally:
        await asyncio.to_thread(router.stop)
        server.close()


async def test_clients_that_never_read_cost_the_router_bounded_memory(tmp_path: Path) -> None:
    """A pod floods, its clients never read: flow control holds, the router's RSS does not follow."""
    connections = 50
    server = await asyncio.start_server(flooding_pod, "127.0.0.2", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    router = await asyncio.to_thread(start_router, tmp_path, [("stargate-flood", "127.0.0.2", port, 1)])
    clients: list[socket.socket] = []
    try:
        pids = router.all_pids()
        base_fds, base_rss = open_fds(pids), rss_kib(pids)
        hello = client_hello([sni_extension(host("stargate-flood").encode())])
        for _ in range(connections):
            sock = socket.create_connection(("127.0.0.1", router.grpc_port), timeout=5)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            sock.sendall(hello)
            clients.append(sock)
        # every connection relayed, then every pipe and socket buffer on the way fills up and stalls:
        # what waits for the clients stops growing
        await eventually(lambda: open_fds(pids) >= base_fds + 2 * connections, 10, what="every connection relayed")
        await steady(lambda: sum(unread(sock) for sock in clients), 0.3, 10, 0.05, what="the flood to stall")
        relayed = await asyncio.to_thread(
            router.metric, c.RELAYED_BYTES_TOTAL + "_total", protocol="tls", direction="pod_to_client"
        )
        held_fds, held_rss, peak_rss = open_fds(pids), rss_kib(pids), peak_rss_kib(pids)
        for sock in clients:
            sock.close()
        clients.clear()
        after_fds = await asyncio.to_thread(settle_fds, pids, base_fds + FD_SLACK)
        print(f"\nnon-reading clients: {connections} stalled connections, RSS {base_rss} -> {held_rss} KiB "
              f"({held_rss - base_rss:+d} KiB, {relayed / 2**20:.0f} MiB reported relayed), "
              f"fds {base_fds} -> {held_fds} -> {after_fds}, peak RSS (VmHWM) {peak_rss} KiB")
        assert peak_rss < CHART_PEAK_RSS_KIB
        assert held_fds >= base_fds + 2 * connections  # really held: client and pod socket each
        assert held_rss - base_rss < 32 * 1024, "router memory follows what its clients do not read"
        assert after_fds <= base_fds + FD_SLACK
    finally:
        for sock in clients:
            sock.close()
        await asyncio.to_thread(router.stop)
        server.close()
