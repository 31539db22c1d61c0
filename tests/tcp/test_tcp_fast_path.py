"""The TCP edge's task-free path (``router.tcp.fast_path``) on real loopback sockets.

A TLS connection whose ClientHello comes with it is routed, dialled and relayed by the C pump
without a task; anything else goes on in the edge's task from what was read. These tests check
that the path is taken, and that it ends, counts, refuses and drains exactly as the task does:
the same outcome counters, termination causes and access lines. asyncio and uvloop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import logging
import socket
import struct
import termios
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from discovery.targets import Target, TargetSnapshot
from router.access_log import AccessLog
from router.extensions import Extensions
from router.hostname import HostnameTemplate
from router.metrics import RouterMetrics
from router.outcomes import GrpcOutcome, ProtocolLabel, Termination
from router.tcp.edge import TcpRouter, TcpRouterSettings
from router.tcp.relay_policy import Relay
from tests.support.loops import Runner
from tests.support.polling import eventually
from tests.support.tcp_peers import SynDroppingPod
from tests.support.tls import ssl_client_hello_records

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.parametrize("extensions", ["c"], indirect=True),  # the path is the C pump's
]

HELLO = ssl_client_hello_records("stargate-0.stargate.external")
TLS_ALERT = 21
"""A TLS record of content type alert: how a refused TLS client is told (``rejection``)."""


@asynccontextmanager
async def edge(
    pod_port: int, extensions: Extensions, **settings: Any
) -> AsyncIterator[tuple[TcpRouter, RouterMetrics, int]]:
    snapshot = TargetSnapshot.of([Target("stargate-0", "127.0.0.2", pod_port, 0)])
    metrics = RouterMetrics()
    router = TcpRouter(TcpRouterSettings(extensions=extensions, **settings),
                       HostnameTemplate.parse("{pod_name}.stargate.external", "default"),
                       lambda: snapshot, metrics, AccessLog(metrics))
    _, port = await router.start("127.0.0.1", 0)
    try:
        yield router, metrics, port
    finally:
        await router.close()


@asynccontextmanager
async def echo_pod() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):  # a client the router reset
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.2", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def outcome(metrics: RouterMetrics, name: GrpcOutcome) -> float:
    return metrics.grpc_connections.labels(protocol=ProtocolLabel.TLS, outcome=name).value


def ended(metrics: RouterMetrics, termination: Termination) -> float:
    return metrics.terminations.labels(protocol=ProtocolLabel.TLS, termination=termination).value


def unacked(sock: socket.socket) -> int:
    """Bytes ``sock`` sent that its peer's kernel has not acknowledged yet (``SIOCOUTQ``)."""
    return int(struct.unpack("i", fcntl.ioctl(sock, termios.TIOCOUTQ, bytes(4)))[0])


async def connect_with_hello(port: int, extra: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client whose hello (and ``extra``) is there when the router accepts it (its accept is
    deferred until bytes arrive, ``--tcp-defer-accept``)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(HELLO + extra)
    await eventually(lambda: unacked(sock) == 0, interval_s=0.005, what="the hello at the router's socket")
    return await asyncio.open_connection(sock=sock)


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    await eventually(condition, timeout_s, 0.01)


def test_a_tls_connection_is_relayed_without_a_task_and_ends_as_the_task_ends_it(
    run: Runner, extensions: Extensions
) -> None:
    async def main() -> None:
        async with echo_pod() as pod_port, edge(pod_port, extensions) as (router, metrics, port):
            reader, writer = await connect_with_hello(port, b"ping")
            assert await reader.readexactly(len(HELLO) + 4) == HELLO + b"ping"
            assert router.active_connections == 1 and not router._tasks  # on the fast path
            writer.write_eof()  # the client closes first
            assert await reader.read() == b""
            writer.close()
            await until(lambda: router.active_connections == 0)
            assert outcome(metrics, GrpcOutcome.ACCEPTED) == 1
            assert outcome(metrics, GrpcOutcome.COMPLETED) == 1
            assert ended(metrics, Termination.CLIENT_CLOSE) == 1
            assert router.series(ProtocolLabel.TLS).active.value == 0

    run(main())


def blocking_echo_pod() -> tuple[socket.socket, threading.Thread]:
    """A pod with no event loop (its objects are no garbage of the router's): echoes each
    connection in turn until its end."""
    listener = socket.create_server(("127.0.0.2", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with conn:
                    while data := conn.recv(65536):
                        conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def hello_and_close(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(HELLO)
        return recv_exactly(sock, len(HELLO))


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n and (chunk := sock.recv(n - len(data))):
        data += chunk
    return data


def test_an_accept_batch_is_dialled_together_then_relayed(
    run: Runner, extensions: Extensions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connections queued before the router's loop runs arrive in one accept batch: every dial
    of the batch goes out before the first relay starts, and each connection still reaches its
    own pod; a name no pod has is refused on its own."""
    from router.tcp import fast_path

    steps: list[str] = []
    original_dial, original_start = fast_path.FastPath._dial, Relay.start

    def dial(self: fast_path.FastPath, target: Target) -> Any:
        steps.append("dial")
        return original_dial(self, target)

    def start(self: Relay, initial: bytes) -> Any:
        steps.append("start")
        return original_start(self, initial)

    monkeypatch.setattr(fast_path.FastPath, "_dial", dial)
    monkeypatch.setattr(Relay, "start", start)

    async def main() -> None:
        async with echo_pod() as pod_port:
            snapshot = TargetSnapshot.of([Target("stargate-0", "127.0.0.2", pod_port, 0),
                                          Target("stargate-1", "127.0.0.2", pod_port, 0)])
            metrics = RouterMetrics()
            router = TcpRouter(TcpRouterSettings(extensions=extensions),
                               HostnameTemplate.parse("{pod_name}.stargate.external", "default"),
                               lambda: snapshot, metrics, AccessLog(metrics))
            _, port = await router.start("127.0.0.1", 0)
            names = ["stargate-0", "stargate-1", "stargate-9", "stargate-1", "stargate-0"]
            clients = []
            for name in names:  # the loop does not run meanwhile: all wait in the accept queue
                sock = socket.create_connection(("127.0.0.1", port))
                sent = ssl_client_hello_records(f"{name}.stargate.external") + name.encode()
                sock.sendall(sent)
                clients.append((sock, sent))
            try:
                for name, (sock, sent) in zip(names, clients, strict=True):
                    sock.setblocking(False)
                    reader, writer = await asyncio.open_connection(sock=sock)
                    answer = await asyncio.wait_for(reader.read(len(sent)), 5.0)
                    if name == "stargate-9":
                        assert answer[:1] == bytes([TLS_ALERT])
                    else:  # echoed whole: relayed to a pod
                        answer += await asyncio.wait_for(reader.readexactly(len(sent) - len(answer)), 5.0)
                        assert answer == sent
                    writer.close()
                await until(lambda: router.active_connections == 0)
            finally:
                await router.close()
            assert steps == ["dial"] * 4 + ["start"] * 4
            assert outcome(metrics, GrpcOutcome.COMPLETED) == 4

    run(main())


def test_the_fast_path_leaves_no_cyclic_garbage(run: Runner, extensions: Extensions) -> None:
    """Peers without an event loop, so that whatever the collector finds is the router's."""
    listener, pod = blocking_echo_pod()

    async def main() -> None:
        async with edge(listener.getsockname()[1], extensions) as (router, metrics, port):
            await asyncio.to_thread(hello_and_close, port)  # the loop's and the pool's own objects, once
            await until(lambda: router.active_connections == 0)
            gc.collect()
            gc.disable()
            try:
                for _ in range(20):
                    assert await asyncio.to_thread(hello_and_close, port) == HELLO
                    await until(lambda: router.active_connections == 0)
                assert gc.collect() == 0
            finally:
                gc.enable()
            assert outcome(metrics, GrpcOutcome.COMPLETED) == 21

    try:
        run(main())
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes its accept
        listener.close()
        pod.join(5)


def test_a_refused_dial_is_answered_with_an_alert(run: Runner, extensions: Extensions) -> None:
    async def main() -> None:
        with socket.create_server(("127.0.0.2", 0)) as closed:
            closed_port = closed.getsockname()[1]
        async with edge(closed_port, extensions) as (router, metrics, port):
            reader, writer = await connect_with_hello(port)
            answer = await reader.read()
            assert answer[:1] == bytes([TLS_ALERT])
            writer.close()
            await until(lambda: router.active_connections == 0)
            assert outcome(metrics, GrpcOutcome.ACCEPTED) == 0
            assert ended(metrics, Termination.DIAL_FAILED) == 1

    run(main())


def test_a_dial_still_in_progress_is_waited_for_by_the_pump(run: Runner, extensions: Extensions) -> None:
    """The pod's accept queue is full: the SYN is dropped and retransmitted (1 s later) once the
    queue has room. Meanwhile the C pump holds the hello; then it goes out and the relay runs."""

    async def main() -> None:
        pod = SynDroppingPod("127.0.0.2")
        try:
            async with edge(pod.port, extensions, connect_timeout_s=5.0) as (router, metrics, port):
                reader, writer = await connect_with_hello(port)
                await until(lambda: pod.dials_waiting() == 1)  # the dial's SYN went out and was dropped
                assert outcome(metrics, GrpcOutcome.ACCEPTED) == 0  # not connected yet
                filler, _ = await asyncio.to_thread(pod._listener.accept)  # room in the queue
                filler.close()
                pod_end, _ = await asyncio.to_thread(pod._listener.accept)
                with pod_end:
                    pod_end.settimeout(5)
                    assert await asyncio.to_thread(pod_end.recv, len(HELLO) + 1) == HELLO
                    await asyncio.to_thread(pod_end.sendall, b"welcome")
                    assert await reader.readexactly(7) == b"welcome"
                    assert outcome(metrics, GrpcOutcome.ACCEPTED) == 1
                writer.close()
                await until(lambda: router.active_connections == 0)
                assert ended(metrics, Termination.POD_CLOSE) + ended(metrics, Termination.CLIENT_CLOSE) == 1
        finally:
            pod.close()

    run(main())


def test_a_hello_in_pieces_goes_on_in_a_task(run: Runner, extensions: Extensions) -> None:
    async def main() -> None:
        async with echo_pod() as pod_port, edge(pod_port, extensions) as (router, metrics, port):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(HELLO[:10])
            await until(lambda: len(router._tasks) == 1)  # the fast path found the hello incomplete
            sock.sendall(HELLO[10:])
            reader, writer = await asyncio.open_connection(sock=sock)
            assert await reader.readexactly(len(HELLO)) == HELLO
            writer.close()
            await until(lambda: router.active_connections == 0)
            assert outcome(metrics, GrpcOutcome.COMPLETED) == 1

    run(main())


def test_client_slots_are_held_by_fast_connections_and_follow_one_into_its_task(
    run: Runner, extensions: Extensions
) -> None:
    """A per-client limit of 2 on the fast path (bare fds, the slot held by the connection's
    ``Connection``): a third connection is refused with an alert; a connection that leaves the path
    for a task (its hello in pieces) takes its slot along; every slot is back at the end."""

    async def main() -> None:
        async with echo_pod() as pod_port, \
                edge(pod_port, extensions, max_connections_per_client=2) as (router, metrics, port):
            slots = router.clients.slots
            first = await connect_with_hello(port)
            assert await first[0].readexactly(len(HELLO)) == HELLO
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(HELLO[:10])
            await until(lambda: len(router._tasks) == 1 and len(slots) == 2)  # the task holds the slot it took
            refused = await connect_with_hello(port)
            assert (await asyncio.wait_for(refused[0].read(), 5.0))[:1] == bytes([TLS_ALERT])
            refused[1].close()
            sock.sendall(HELLO[10:])
            reader, writer = await asyncio.open_connection(sock=sock)
            assert await reader.readexactly(len(HELLO)) == HELLO
            writer.close()
            first[1].close()
            await until(lambda: router.active_connections == 0)
            assert len(slots) == 0
            assert outcome(metrics, GrpcOutcome.COMPLETED) == 2
            again = await connect_with_hello(port)  # the slots are reusable
            assert await again[0].readexactly(len(HELLO)) == HELLO
            again[1].close()
            await until(lambda: router.active_connections == 0)
            assert len(slots) == 0

    run(main())


def test_the_drain_cuts_fast_connections_and_counts_them(run: Runner, extensions: Extensions) -> None:
    async def main() -> None:
        async with echo_pod() as pod_port, edge(pod_port, extensions) as (router, metrics, port):
            reader, writer = await connect_with_hello(port)
            assert await reader.readexactly(len(HELLO)) == HELLO
            await router.drain(0.2)  # the client never closes: cut when the drain runs out
            assert router.active_connections == 0
            assert ended(metrics, Termination.DRAIN) == 1
            assert outcome(metrics, GrpcOutcome.COMPLETED) == 1
            assert router.series(ProtocolLabel.TLS).active.value == 0
            with pytest.raises(ConnectionResetError):
                while await reader.read(65536):
                    pass
            writer.close()

    run(main())


def test_a_pod_that_resets_is_told_as_pod_reset_and_leaves_no_fd(run: Runner, extensions: Extensions) -> None:
    """The pod's side is a bare fd on this path (the C dial): its TCP state is still read for the
    termination cause, and it is closed once."""
    import os
    import struct

    async def reset_after_hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(len(HELLO))
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def main() -> None:
        server = await asyncio.start_server(reset_after_hello, "127.0.0.2", 0)
        try:
            async with edge(server.sockets[0].getsockname()[1], extensions) as (router, metrics, port):
                before = len(os.listdir("/proc/self/fd"))
                reader, writer = await connect_with_hello(port)
                with contextlib.suppress(ConnectionResetError):
                    assert await asyncio.wait_for(reader.read(), 5.0) == b""
                writer.close()
                await until(lambda: router.active_connections == 0)
                assert ended(metrics, Termination.POD_RESET) == 1
                assert outcome(metrics, GrpcOutcome.RELAY_ERROR) == 1
                await until(lambda: len(os.listdir("/proc/self/fd")) <= before)  # the test client's socket is gone too
        finally:
            server.close()

    run(main())


def test_a_pod_named_by_a_host_name_is_dialled_through_the_resolver(run: Runner, extensions: Extensions) -> None:
    """The C dial takes IP literals only (what EndpointSlices carry); a name still works."""

    async def echo_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readexactly(len(HELLO)))
        await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(echo_once, "127.0.0.1", 0)  # where "localhost" resolves first
        pod_port = server.sockets[0].getsockname()[1]
        snapshot = TargetSnapshot.of([Target("stargate-0", "localhost", pod_port, 0)])
        metrics = RouterMetrics()
        router = TcpRouter(TcpRouterSettings(extensions=extensions),
                           HostnameTemplate.parse("{pod_name}.stargate.external", "default"),
                           lambda: snapshot, metrics, AccessLog(metrics))
        _, port = await router.start("127.0.0.1", 0)
        try:
            reader, writer = await connect_with_hello(port)
            assert await asyncio.wait_for(reader.read(), 5.0) == HELLO  # echoed, then the pod closed
            writer.close()
            await until(lambda: router.active_connections == 0)
            assert outcome(metrics, GrpcOutcome.COMPLETED) == 1
        finally:
            await router.close()
            server.close()

    run(main())


def test_the_drain_waits_for_a_fast_connection_that_ends_in_time(run: Runner, extensions: Extensions) -> None:
    async def main() -> None:
        async with echo_pod() as pod_port, edge(pod_port, extensions) as (router, metrics, port):
            reader, writer = await connect_with_hello(port)
            assert await reader.readexactly(len(HELLO)) == HELLO

            async def close_soon() -> None:  # first runs when the drain below waits: the connection ends during it
                writer.close()

            closing = asyncio.ensure_future(close_soon())
            await router.drain(5.0)
            await closing
            assert ended(metrics, Termination.DRAIN) == 0
            assert ended(metrics, Termination.CLIENT_CLOSE) == 1

    run(main())


@pytest.mark.parametrize("failing", ["decide", "start"])
def test_a_bug_costs_one_connection_never_the_listener(
    run: Runner, extensions: Extensions, failing: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failure inside the path (before the decision, or once the relay holds both sockets):
    that connection is closed and its line ended; the next one is routed."""
    calls = {"n": 0}

    def first_fails(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("injected")
            return original(*args, **kwargs)
        return wrapper

    async def main() -> None:
        async with echo_pod() as pod_port, edge(pod_port, extensions) as (router, metrics, port):
            if failing == "decide":
                monkeypatch.setattr(router.connections, "decide", first_fails(router.connections.decide))
            else:
                monkeypatch.setattr(Relay, "start", first_fails(Relay.start))
            reader, writer = await connect_with_hello(port)
            try:  # closed unanswered: a FIN before the relay, a RST once it held both sockets
                assert await asyncio.wait_for(reader.read(), 5.0) == b""
            except ConnectionResetError:
                assert failing == "start"
            writer.close()
            await until(lambda: router.active_connections == 0)
            assert ended(metrics, Termination.ROUTER_ERROR) == 1
            assert router.series(ProtocolLabel.TLS).active.value == 0
            reader, writer = await connect_with_hello(port)  # the next one is served
            assert await reader.readexactly(len(HELLO)) == HELLO
            writer.close()
            await until(lambda: router.active_connections == 0)
            assert outcome(metrics, GrpcOutcome.COMPLETED) == 1

    with caplog.at_level(logging.ERROR, logger="router.tcp_router"):
        run(main())
    assert any("unexpected error serving" in r.getMessage() for r in caplog.records)



@pytest.mark.parametrize("failure", ["connect-timeout", "refused-later"])
def test_a_dial_that_fails_while_in_progress_is_answered_with_an_alert(
    run: Runner, extensions: Extensions, failure: str
) -> None:
    """The SYN is dropped (full accept queue): either the connect timeout ends the wait, or the pod
    goes away and the retransmitted SYN (~1 s later) meets a RST, which the pump, waiting for the
    connect, reads from SO_ERROR. Either way the client hears an alert, counted as dial_failed."""

    async def main() -> None:
        pod = SynDroppingPod("127.0.0.2")
        timeout_s = 0.3 if failure == "connect-timeout" else 10.0
        try:
            async with edge(pod.port, extensions, connect_timeout_s=timeout_s) as (router, metrics, port):
                reader, writer = await connect_with_hello(port)
                if failure == "refused-later":
                    await until(lambda: pod.dials_waiting() == 1)  # the dial's SYN went out and was dropped
                    assert outcome(metrics, GrpcOutcome.ACCEPTED) == 0  # still connecting
                    pod.close()  # the listener is gone before the SYN is sent again
                answer = await asyncio.wait_for(reader.read(), 5.0)
                assert answer[:1] == bytes([TLS_ALERT])
                writer.close()
                await until(lambda: router.active_connections == 0)
                assert ended(metrics, Termination.DIAL_FAILED) == 1
                assert outcome(metrics, GrpcOutcome.ACCEPTED) == 0
        finally:
            pod.close()

    run(main())
