"""router.tcp.relay on real loopback sockets: splice and buffered modes, asyncio and uvloop.

The peers are blocking sockets driven from threads (with socket timeouts), so a relay bug
shows up as a failed assertion or a timeout, never a hang. No test asserts on speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import random
import resource
import socket
import struct
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import router.tcp.native_relay as native_relay_module
import router.tcp.pump as pump_module
import router.tcp.relay as relay_module
import router.tcp.relay_policy as relay_policy
from router.constants import RELAY_CHUNK_BYTES, RELAY_REPORT_BYTES, SPLICE_PIPE_BYTES
from router.extensions import Extensions
from router.outcomes import Termination
from router.tcp.relay import SPLICE_AVAILABLE, RelayResult, live_relays, relay
from tests.support.loops import Runner
from tests.support.polling import deliberate_pause, eventually, steady

pytestmark = pytest.mark.timeout(60)

MIB = 1024 * 1024
PEER_TIMEOUT_S = 20.0


@pytest.fixture(params=["splice", "buffered"])
def use_splice(request: pytest.FixtureRequest) -> bool:
    if request.param == "splice" and not SPLICE_AVAILABLE:
        pytest.skip("os.splice not available")
    return bool(request.param == "splice")


@pytest.fixture(autouse=True)
def no_relay_outlives_its_test() -> Iterator[None]:
    yield
    assert not live_relays(), "a relay outlived its test"


@pytest.fixture(scope="module")
def payloads() -> tuple[bytes, bytes]:
    return random.Random(1).randbytes(64 * MIB), random.Random(2).randbytes(64 * MIB)


def tcp_pair(bufsize: int | None = None) -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection (optionally with small fixed kernel buffers)."""
    with socket.socket() as listener:
        if bufsize:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, bufsize)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, bufsize)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        a = socket.socket()
        if bufsize:
            a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, bufsize)
            a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, bufsize)
        a.connect(listener.getsockname())
        b, _ = listener.accept()
    return a, b


class Link:
    """client_peer <-tcp-> [relay] <-tcp-> pod_peer; the relay's two sockets are non-blocking, its
    pump the one ``extensions`` chose (every test runs on both: the ``extensions`` fixture)."""

    def __init__(self, extensions: Extensions, bufsize: int | None = None) -> None:
        self.native = extensions.tcp_pump
        self.client_peer, self.relay_client = tcp_pair(bufsize)
        self.relay_pod, self.pod_peer = tcp_pair(bufsize)
        for sock in (self.relay_client, self.relay_pod):
            sock.setblocking(False)
        for sock in (self.client_peer, self.pod_peer):
            sock.settimeout(PEER_TIMEOUT_S)

    def start(self, **kwargs: Any) -> asyncio.Task[RelayResult]:
        kwargs.setdefault("idle_timeout_s", 30.0)
        kwargs.setdefault("native", self.native)
        return asyncio.ensure_future(relay(self.relay_client, self.relay_pod, **kwargs))

    def close_peers(self) -> None:
        self.client_peer.close()
        self.pod_peer.close()


def recv_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(MIB):
        chunks.append(chunk)
    return b"".join(chunks)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"EOF after {len(data)} of {n} bytes"
        data += chunk
    return data


def hash_until_eof(sock: socket.socket) -> tuple[int, str]:
    digest, total, buf = hashlib.sha256(), 0, bytearray(MIB)
    while n := sock.recv_into(buf):
        digest.update(memoryview(buf)[:n])
        total += n
    return total, digest.hexdigest()


def send_and_shut(sock: socket.socket, data: bytes) -> None:
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


def eof_or_reset(sock: socket.socket) -> str:
    try:
        return "eof" if sock.recv(MIB) == b"" else "data"
    except ConnectionResetError:
        return "reset"


def thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    return asyncio.ensure_future(asyncio.to_thread(fn, *args))


async def finished(task: asyncio.Task[RelayResult]) -> RelayResult:
    return await asyncio.wait_for(task, PEER_TIMEOUT_S)


def only_state() -> relay_module.RelayState:
    states = live_relays()
    assert len(states) == 1
    return states[0]


# ---------------------------------------------------------------------------------------------
def test_echo_with_peeked_bytes(extensions: Extensions, run: Runner, use_splice: bool) -> None:
    async def scenario() -> None:
        link = Link(extensions)
        task = link.start(initial_to_pod=b"peeked:", use_splice=use_splice)

        def echo() -> None:  # the pod echoes everything until the client's EOF, then closes
            while data := link.pod_peer.recv(65536):
                link.pod_peer.sendall(data)
            link.pod_peer.shutdown(socket.SHUT_WR)

        pod = thread(echo)
        await thread(link.client_peer.sendall, b"hello")
        assert await thread(recv_exactly, link.client_peer, 12) == b"peeked:hello"
        await thread(link.client_peer.shutdown, socket.SHUT_WR)
        assert await thread(recv_all, link.client_peer) == b""
        await pod
        assert await finished(task) == RelayResult(12, 12, "completed", None, Termination.CLIENT_CLOSE)
        assert link.relay_client.fileno() == -1 and link.relay_pod.fileno() == -1
        link.close_peers()

    run(scenario())


def test_64_mib_each_way_concurrently(
    extensions: Extensions, run: Runner, use_splice: bool, payloads: tuple[bytes, bytes]
) -> None:
    up, down = payloads
    reports: list[tuple[int, int]] = []

    async def scenario() -> None:
        link = Link(extensions)
        task = link.start(use_splice=use_splice, on_bytes=lambda a, b: reports.append((a, b)))
        senders = [thread(send_and_shut, link.client_peer, up), thread(send_and_shut, link.pod_peer, down)]
        at_pod, at_client = await asyncio.gather(
            thread(hash_until_eof, link.pod_peer), thread(hash_until_eof, link.client_peer)
        )
        await asyncio.gather(*senders)
        assert at_pod == (len(up), hashlib.sha256(up).hexdigest())
        assert at_client == (len(down), hashlib.sha256(down).hexdigest())
        result = await finished(task)  # both sides end at once: either may have been first
        assert result in [RelayResult(len(up), len(down), "completed", None, first)
                          for first in (Termination.CLIENT_CLOSE, Termination.POD_CLOSE)]
        link.close_peers()

    run(scenario())
    assert (sum(r[0] for r in reports), sum(r[1] for r in reports)) == (len(up), len(down))
    assert len(reports) <= (len(up) + len(down)) // RELAY_REPORT_BYTES + 1  # batched, not per chunk


def test_client_half_close_then_pod_keeps_sending(extensions: Extensions, run: Runner, use_splice: bool) -> None:
    async def scenario() -> None:
        link = Link(extensions)
        task = link.start(use_splice=use_splice)
        await thread(send_and_shut, link.client_peer, b"request")
        assert await thread(recv_all, link.pod_peer) == b"request"  # EOF reached the pod
        response = random.Random(3).randbytes(3 * MIB)
        for part in (response[: MIB // 2], response[MIB // 2 :]):  # after the client's EOF
            await thread(link.pod_peer.sendall, part)
        link.pod_peer.close()
        assert await thread(recv_all, link.client_peer) == response
        assert await finished(task) == RelayResult(7, len(response), "completed", None, Termination.CLIENT_CLOSE)
        link.client_peer.close()

    run(scenario())


def test_pod_half_close_then_client_keeps_sending(extensions: Extensions, run: Runner, use_splice: bool) -> None:
    async def scenario() -> None:
        link = Link(extensions)
        task = link.start(use_splice=use_splice)
        await thread(send_and_shut, link.pod_peer, b"greeting")
        assert await thread(recv_all, link.client_peer) == b"greeting"
        upload = random.Random(4).randbytes(3 * MIB)
        got = thread(recv_all, link.pod_peer)
        await thread(send_and_shut, link.client_peer, upload)
        assert await got == upload
        link.pod_peer.close()
        assert await finished(task) == RelayResult(len(upload), 8, "completed", None, Termination.POD_CLOSE)
        link.client_peer.close()

    run(scenario())


def test_slow_reader_bounds_what_the_relay_holds(extensions: Extensions, run: Runner, use_splice: bool) -> None:
    payload = random.Random(5).randbytes(32 * MIB)
    limit = SPLICE_PIPE_BYTES if use_splice else RELAY_CHUNK_BYTES

    async def scenario() -> None:
        link = Link(extensions, bufsize=64 * 1024)
        task = link.start(use_splice=use_splice)
        sent = [0]

        def sender() -> None:
            view = memoryview(payload)
            while sent[0] < len(payload):
                sent[0] += link.client_peer.send(view[sent[0] : sent[0] + 65536])
            link.client_peer.shutdown(socket.SHUT_WR)

        sending = thread(sender)
        await eventually(lambda: sent[0] > 0, 10.0, what="the sender's first bytes")
        # the pod reads nothing until the sender stalls: no progress for 0.2 s is the stall
        await steady(lambda: sent[0], 0.2, 10.0, 0.05, what="the sender to stall")
        assert 0 < sent[0] < len(payload), "the sender should be stalled by flow control"
        state = only_state()
        assert 0 < state.client_to_pod_pending <= limit
        assert state.held_bytes <= limit and state.pod_to_client_pending == 0
        assert await thread(hash_until_eof, link.pod_peer) == (
            len(payload), hashlib.sha256(payload).hexdigest()
        )
        await sending
        link.pod_peer.shutdown(socket.SHUT_WR)
        assert await finished(task) == RelayResult(len(payload), 0, "completed", None, Termination.CLIENT_CLOSE)
        link.close_peers()

    run(scenario())


def test_quiet_connection_gives_back_pipes_and_buffers(
    extensions: Extensions, run: Runner, use_splice: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relay_policy, "RELAY_RELEASE_QUIET_S", 0.05)  # the policy reads it, for both pumps
    monkeypatch.setattr(pump_module, "SPLICE_AFTER_BYTES", 0)  # pipes from the first byte on, both pumps

    async def scenario() -> None:
        link = Link(extensions)
        task = link.start(use_splice=use_splice)
        for round_trip in range(2):  # the second round re-creates what the first gave back
            await thread(link.client_peer.sendall, b"ping")
            assert await thread(recv_exactly, link.pod_peer, 4) == b"ping"
            await thread(link.pod_peer.sendall, b"pong")
            assert await thread(recv_exactly, link.client_peer, 4) == b"pong"
            if round_trip == 0 and use_splice:  # the buffered path holds nothing once written
                assert only_state().held_bytes > 0
            await eventually(lambda: only_state().held_bytes == 0, 4.0, what="pipes and buffers given back")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        link.close_peers()

    run(scenario())


def test_idle_timeout_closes_both(extensions: Extensions, run: Runner, use_splice: bool) -> None:
    async def scenario() -> None:
        link = Link(extensions)
        task = link.start(use_splice=use_splice, idle_timeout_s=0.2)
        await thread(link.client_peer.sendall, b"x")
        assert await thread(recv_exactly, link.pod_peer, 1) == b"x"
        assert await finished(task) == RelayResult(1, 0, "idle_timeout", None, Termination.IDLE_TIMEOUT)
        assert await thread(eof_or_reset, link.client_peer) == "eof"
        assert await thread(eof_or_reset, link.pod_peer) == "eof"
        link.close_peers()

    run(scenario())


def test_traffic_keeps_an_idle_timeout_away(extensions: Extensions) -> None:
    async def scenario() -> None:
        link = Link(extensions)
        task = link.start(idle_timeout_s=0.5)
        for _ in range(16):  # 0.8 s of pings every 0.05 s: well inside the 0.5 s timeout
            await thread(link.client_peer.sendall, b".")
            await deliberate_pause(0.05, "the gap between pings, a tenth of the idle timeout")
        assert not task.done()
        assert await thread(recv_exactly, link.pod_peer, 16) == b"." * 16
        assert (await finished(task)).outcome == "idle_timeout"
        link.close_peers()

    asyncio.run(scenario())


@pytest.mark.parametrize("resetting", ["pod", "client"])
def test_reset_is_propagated(extensions: Extensions, run: Runner, use_splice: bool, resetting: str) -> None:
    async def scenario() -> None:
        link = Link(extensions)
        task = link.start(use_splice=use_splice)
        await thread(link.client_peer.sendall, b"hi")
        assert await thread(recv_exactly, link.pod_peer, 2) == b"hi"
        victim, other = (
            (link.pod_peer, link.client_peer) if resetting == "pod" else (link.client_peer, link.pod_peer)
        )
        victim.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        victim.close()
        result = await finished(task)
        assert result.outcome == "relay_error" and result.error in ("ECONNRESET", "EPIPE")
        assert result.termination == f"{resetting}_reset"
        assert await thread(eof_or_reset, other) == "reset"
        other.close()

    run(scenario())


def test_cancellation_closes_both_and_reraises(extensions: Extensions, run: Runner, use_splice: bool) -> None:
    async def scenario() -> None:
        link = Link(extensions)
        task = link.start(use_splice=use_splice)
        await thread(link.client_peer.sendall, b"partial")
        assert await thread(recv_exactly, link.pod_peer, 7) == b"partial"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert link.relay_client.fileno() == -1 and link.relay_pod.fileno() == -1
        assert await thread(eof_or_reset, link.client_peer) in ("eof", "reset")
        assert await thread(eof_or_reset, link.pod_peer) in ("eof", "reset")
        link.close_peers()

    run(scenario())


class DropFirstMarker:
    """Drops the first b"<X>" it sees (like the SETTINGS-ACK stripper drops one frame)."""

    def __init__(self) -> None:
        self.done = False
        self.seen: list[bytes] = []

    def feed(self, data: bytes) -> bytes:
        self.seen.append(data)
        if b"<X>" in data:
            self.done = True
            return data.replace(b"<X>", b"", 1)
        return data


def test_client_filter_sees_peeked_and_later_bytes_then_steps_aside(
    extensions: Extensions, run: Runner, use_splice: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pump_module, "SPLICE_AFTER_BYTES", 0)  # splice as soon as the filter is done

    async def scenario() -> None:
        link = Link(extensions)
        marker = DropFirstMarker()
        task = link.start(
            initial_to_pod=b"head-",
            client_filter=marker.feed,
            client_filter_done=lambda: marker.done,
            use_splice=use_splice,
        )
        assert await thread(recv_exactly, link.pod_peer, 5) == b"head-"
        await thread(link.client_peer.sendall, b"a<X>b")
        assert await thread(recv_exactly, link.pod_peer, 2) == b"ab"
        await thread(link.client_peer.sendall, b"c<X>d")
        assert await thread(recv_exactly, link.pod_peer, 5) == b"c<X>d"
        assert only_state().client_to_pod_mode == ("splice" if use_splice else "buffered")
        assert marker.seen == [b"head-", b"a<X>b"]
        await thread(link.client_peer.shutdown, socket.SHUT_WR)
        assert await thread(recv_all, link.pod_peer) == b""  # the client's EOF went first
        await thread(link.pod_peer.shutdown, socket.SHUT_WR)
        assert await finished(task) == RelayResult(12, 0, "completed", None, Termination.CLIENT_CLOSE)
        link.close_peers()

    run(scenario())


def test_failing_filter_is_a_relay_error(extensions: Extensions, run: Runner) -> None:
    def explode(data: bytes) -> bytes:
        raise ValueError("bad frame")

    async def scenario() -> None:
        link = Link(extensions)
        task = link.start(client_filter=explode, client_filter_done=lambda: False)
        await thread(link.client_peer.sendall, b"boom")
        result = await finished(task)
        assert result.outcome == "relay_error" and result.error == "ValueError: bad frame"
        assert result.termination is Termination.ROUTER_ERROR
        assert await thread(eof_or_reset, link.pod_peer) in ("eof", "reset")
        link.close_peers()

    run(scenario())


def test_on_bytes_totals_match_small_transfers(extensions: Extensions, run: Runner, use_splice: bool) -> None:
    reports: list[tuple[int, int]] = []

    async def scenario() -> None:
        link = Link(extensions)
        task = link.start(
            initial_to_pod=b"12345", use_splice=use_splice, on_bytes=lambda a, b: reports.append((a, b))
        )
        await thread(send_and_shut, link.client_peer, b"6789")
        assert await thread(recv_all, link.pod_peer) == b"123456789"
        await thread(send_and_shut, link.pod_peer, b"ok")
        assert await thread(recv_all, link.client_peer) == b"ok"
        assert await finished(task) == RelayResult(9, 2, "completed", None, Termination.CLIENT_CLOSE)
        link.close_peers()

    run(scenario())
    assert reports == [(9, 2)]  # small flows are reported once, at close



@pytest.mark.skipif(not SPLICE_AVAILABLE, reason="os.splice not available")
def test_no_fds_for_pipes_falls_back_to_copying(
    extensions: Extensions, run: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pump_module, "SPLICE_AFTER_BYTES", 0)

    def no_pipes(flags: int) -> tuple[int, int]:
        raise OSError(errno.EMFILE, "Too many open files")

    async def scenario() -> None:
        link = Link(extensions)
        task = link.start()  # auto: splice wanted
        await eventually(live_relays, what="the relay started: the pump's own fds (the C engine's epoll set) exist")
        with contextlib.ExitStack() as stack:
            if extensions.tcp_pump:  # the C pump calls pipe2(2) itself: take every free fd number away
                stack.enter_context(no_free_fds())
            else:
                monkeypatch.setattr(os, "pipe2", no_pipes)
            await thread(send_and_shut, link.client_peer, b"up")
            assert await thread(recv_all, link.pod_peer) == b"up"
            assert only_state().client_to_pod_mode == "buffered"
        await thread(send_and_shut, link.pod_peer, b"down")
        assert await thread(recv_all, link.client_peer) == b"down"
        assert await finished(task) == RelayResult(2, 4, "completed", None, Termination.CLIENT_CLOSE)
        link.close_peers()

    run(scenario())


@pytest.mark.skipif(not SPLICE_AVAILABLE, reason="os.splice not available")
@contextlib.contextmanager
def no_free_fds() -> Iterator[None]:
    """Until the end of the block, opening any fd fails with EMFILE (a lowered soft limit, the
    numbers below it taken by /dev/null)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    taken: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(map(int, os.listdir("/proc/self/fd"))) + 16, hard))
    try:
        while True:
            try:
                taken.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        yield
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_short_exchanges_never_take_a_pipe_and_bulk_switches_to_splice(extensions: Extensions, run: Runner) -> None:
    async def scenario() -> None:
        link = Link(extensions)
        task = link.start()  # auto: splice wanted
        for _ in range(20):  # a unary gRPC-like exchange: small both ways
            await thread(link.client_peer.sendall, b"request")
            assert await thread(recv_exactly, link.pod_peer, 7) == b"request"
            await thread(link.pod_peer.sendall, b"reply")
            assert await thread(recv_exactly, link.client_peer, 5) == b"reply"
            state = only_state()
            assert (state.client_to_pod_mode, state.pod_to_client_mode) == ("buffered", "buffered")
            assert state.held_bytes == 0
        bulk = os.urandom(pump_module.SPLICE_AFTER_BYTES * 4)
        sending = asyncio.ensure_future(thread(link.client_peer.sendall, bulk))
        assert await thread(recv_exactly, link.pod_peer, len(bulk)) == bulk
        await sending
        assert only_state().client_to_pod_mode == "splice"
        assert only_state().pod_to_client_mode == "buffered"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        link.close_peers()

    run(scenario())


def test_the_pump_is_the_one_asked_for(extensions: Extensions, run: Runner) -> None:
    """``native`` (the edge passes its settings' ``Extensions.tcp_pump``) alone decides: the C pump's
    relays run on the loop's engine, which counts them; the Python pump's on no engine."""

    async def scenario() -> None:
        link = Link(extensions)
        task = link.start()
        await thread(link.client_peer.sendall, b"ping")
        assert await thread(recv_exactly, link.pod_peer, 4) == b"ping"
        running = list(relay_policy.LIVE)
        assert len(running) == 1
        engine = native_relay_module.engine_for(asyncio.get_running_loop(), extensions.tcp_pump)
        assert running[0].engine is engine
        assert engine is None or engine.live == 1
        link.close_peers()
        assert (await finished(task)).outcome == "completed"
        assert engine is None or engine.live == 0

    run(scenario())


def test_an_engine_that_cannot_watch_a_socket_ends_the_relay(extensions: Extensions, run: Runner) -> None:
    """A socket the C engine cannot watch (here: its fd is not a socket epoll accepts) ends the
    relay as the router's error at once, instead of a relay that waits forever."""
    if not extensions.tcp_pump:
        pytest.skip("the C engine's own failure")

    async def scenario() -> None:
        link = Link(extensions)
        with open(os.devnull, "rb") as regular:  # epoll_ctl(2) refuses a regular file: EPERM
            os.dup2(regular.fileno(), link.relay_pod.fileno())
        task = asyncio.ensure_future(relay(link.relay_client, link.relay_pod, idle_timeout_s=30.0, native=True))
        result = await finished(task)
        assert (result.outcome, result.error) == ("relay_error", "EPERM")
        assert result.termination is Termination.ROUTER_ERROR
        assert link.relay_client.fileno() == link.relay_pod.fileno() == -1  # both closed
        link.close_peers()

    run(scenario())


@pytest.mark.parametrize("ending", ["completed", "cancelled"])
def test_the_engine_closes_an_ended_relays_sockets_and_its_epoll_set_is_empty(
    extensions: Extensions, run: Runner, ending: str
) -> None:
    """On the C engine the sockets of a relay that ends are closed by the engine (``close_fds``:
    their close takes them out of its epoll set, no ``epoll_ctl``). The kernel's view of the set
    (``/proc/self/fdinfo``) must be empty after, and each socket closed exactly once."""
    if not extensions.tcp_pump:
        pytest.skip("the C engine's own closing")

    def in_epoll_set(epfd: int) -> list[str]:
        with open(f"/proc/self/fdinfo/{epfd}") as info:
            return [line for line in info if line.startswith("tfd:")]

    async def scenario() -> None:
        engine = native_relay_module.engine_for(asyncio.get_running_loop(), True)
        assert engine is not None
        link = Link(extensions)
        fds = (link.relay_client.fileno(), link.relay_pod.fileno())
        task = link.start()
        await thread(link.client_peer.sendall, b"ping")
        assert await thread(recv_exactly, link.pod_peer, 4) == b"ping"
        assert len(in_epoll_set(engine.fileno())) == 2
        if ending == "completed":
            await thread(link.client_peer.shutdown, socket.SHUT_WR)
            await thread(link.pod_peer.shutdown, socket.SHUT_WR)
            assert (await finished(task)).outcome == "completed"
        else:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert in_epoll_set(engine.fileno()) == [] and engine.watched == 0
        assert link.relay_client.fileno() == link.relay_pod.fileno() == -1
        for fd in fds:  # closed (nothing in this test opened an fd since)
            with pytest.raises(OSError) as raised:
                os.fstat(fd)
            assert raised.value.errno == errno.EBADF
        link.close_peers()

    run(scenario())


def test_an_engine_dispatch_pumps_every_ready_relay_before_any_end_is_told(extensions: Extensions) -> None:
    """The accounting of a relay that ends (its ``on_end``: Python, tens of microseconds) waits
    until the dispatch has pumped the other ready relays: their bytes are not held up by it.
    Relay A's two ends become ready before relay B's bytes; when A's end is told, B's bytes have
    reached B's pod already. The engine is driven by hand, on real sockets."""
    if not extensions.tcp_pump:
        pytest.skip("the C engine's dispatch")
    from router.tcp._relay import Engine

    engine = Engine(chunk_bytes=RELAY_CHUNK_BYTES, splice_after_bytes=1 << 20, pipe_bytes=SPLICE_PIPE_BYTES,
                    report_bytes=RELAY_REPORT_BYTES, rounds=4, events_per_dispatch=64)
    a, b = Link(extensions), Link(extensions)
    told: list[bytes] = []

    def a_ended(_relay: object, code: int, *_flags: int) -> None:
        assert code == 0
        b.pod_peer.setblocking(False)
        try:
            told.append(b.pod_peer.recv(64))
        except BlockingIOError:
            told.append(b"")

    try:
        relays = [
            engine.start(a.relay_client.fileno(), a.relay_pod.fileno(), b"", False, False, a_ended, None, None, None),
            engine.start(b.relay_client.fileno(), b.relay_pod.fileno(), b"", False, False, lambda *_: None, None,
                         None, None),
        ]
        a.client_peer.shutdown(socket.SHUT_WR)
        a.pod_peer.shutdown(socket.SHUT_WR)
        b.client_peer.sendall(b"bytes of B")
        engine.dispatch()
        assert told == [b"bytes of B"]
        for relay in relays:
            relay.abort()
    finally:
        engine.close()
        for link in (a, b):
            link.relay_client.close()
            link.relay_pod.close()
            link.close_peers()
