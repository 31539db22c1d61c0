"""router.tcp.poller (the relay's one epoll set per loop) and what a finished relay leaves behind.

Real loopback sockets on asyncio and uvloop; nothing here asserts on speed.
"""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from router.extensions import Extensions
from router.tcp import native_relay
from router.tcp.poller import FdPoller, PerLoop, poller_for, recv, sendall
from router.tcp.relay import RelayOutcome, RelayProbe, relay
from tests.support.loops import Runner
from tests.support.polling import eventually

pytestmark = pytest.mark.timeout(30)



@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=5)
        server, _ = listener.accept()
    client.setblocking(False)
    server.setblocking(False)
    return client, server


async def until(condition: Callable[[], bool]) -> None:
    await eventually(condition, 5.0, 0.005)


async def a_later_dispatch(poller: FdPoller) -> None:
    """Until the poller has dispatched an event made ready after everything before this call: a
    callback still watched for a readiness already there would have run by then (level-triggered,
    in that batch or an earlier one)."""
    x, y = socket.socketpair()
    fired: list[bytes] = []
    poller.add_reader(x.fileno(), lambda: fired.append(x.recv(1)))
    y.send(b"!")
    await until(lambda: fired == [b"!"])
    poller.remove_reader(x.fileno())
    x.close()
    y.close()


def test_reader_and_writer_callbacks_follow_their_watches(
    run: Runner, pair: tuple[socket.socket, socket.socket]
) -> None:
    a, b = pair

    async def main() -> None:
        poller = poller_for(asyncio.get_running_loop())
        reads: list[bytes] = []
        writable: list[int] = []
        poller.add_reader(a.fileno(), lambda: reads.append(a.recv(100)))
        b.send(b"one")
        await until(lambda: reads == [b"one"])
        poller.add_writer(a.fileno(), lambda: writable.append(1))
        await until(lambda: len(writable) >= 2)  # level-triggered: it keeps firing
        poller.remove_writer(a.fileno())
        assert poller.watched == 1
        writable.clear()
        b.send(b"two")
        await until(lambda: reads == [b"one", b"two"])
        assert not writable
        poller.remove_reader(a.fileno())
        poller.remove_reader(a.fileno())  # idempotent
        assert poller.watched == 0
        b.send(b"three")
        await a_later_dispatch(poller)
        assert reads == [b"one", b"two"]
        assert a.recv(100) == b"three"

    run(main())


def test_a_watch_removed_by_an_earlier_callback_of_the_batch_is_not_called(run: Runner) -> None:
    async def main() -> None:
        poller = poller_for(asyncio.get_running_loop())
        (a1, b1), (a2, b2) = socket.socketpair(), socket.socketpair()
        called: list[str] = []

        def first() -> None:
            called.append("first")
            poller.remove_reader(a1.fileno())
            poller.remove_reader(a2.fileno())

        def second() -> None:
            called.append("second")
            poller.remove_reader(a1.fileno())
            poller.remove_reader(a2.fileno())

        poller.add_reader(a1.fileno(), first)
        poller.add_reader(a2.fileno(), second)
        b1.send(b"x")
        b2.send(b"x")
        await until(lambda: bool(called))
        await a_later_dispatch(poller)
        assert len(called) == 1
        for s in (a1, b1, a2, b2):
            s.close()

    run(main())


def test_a_closed_and_reused_fd_number_can_be_watched_again(run: Runner) -> None:
    async def main() -> None:
        poller = poller_for(asyncio.get_running_loop())
        a, b = socket.socketpair()
        fd = a.fileno()
        poller.add_reader(fd, lambda: None)
        a.close()  # closed under its watch: the kernel drops it from the epoll set
        b.close()
        c, d = socket.socketpair()
        got: list[bytes] = []
        if c.fileno() != fd:
            c, d = d, c
        poller.remove_reader(fd)  # a stale entry goes quietly
        poller.add_reader(c.fileno(), lambda: got.append(c.recv(10)))
        d.send(b"again")
        await until(lambda: got == [b"again"])
        poller.remove_reader(c.fileno())
        c.close()
        d.close()

    run(main())


def test_recv_and_sendall_wait_through_the_poller_and_leave_no_watch(run: Runner) -> None:
    """The peek's and the dial's waits: bytes that come later, a send bigger than the socket
    buffer, a wait cut by a timeout; none leaves its fd watched."""

    async def main() -> None:
        client, server = tcp_pair()
        poller = poller_for(asyncio.get_running_loop())
        try:
            receiving = asyncio.ensure_future(recv(poller, server, 100))
            await until(lambda: poller.watched == 1)  # waiting on the epoll set for bytes that come later
            client.send(b"hello")
            assert await receiving == b"hello"
            assert poller.watched == 0
            big = bytes(range(256)) * 16384  # 4 MiB: more than both socket buffers hold
            got = bytearray()

            async def drain() -> None:
                while len(got) < len(big):
                    got.extend(await recv(poller, client, 65536))

            await asyncio.gather(sendall(poller, server, big), drain())
            assert got == big
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await recv(poller, server, 100)
            assert poller.watched == 0
            client.shutdown(socket.SHUT_WR)
            assert await recv(poller, server, 100) == b""
        finally:
            client.close()
            server.close()

    run(main())


def test_one_poller_per_loop_and_a_closed_loops_poller_is_closed() -> None:
    seen: list[FdPoller] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen.append(poller_for(loop))
        assert poller_for(loop) is seen[-1]

    asyncio.run(main())
    asyncio.run(main())
    assert seen[0] is not seen[1]
    with pytest.raises(ValueError):  # the first loop closed: its epoll set was closed
        seen[0]._ep.fileno()


def test_what_a_closed_loop_left_is_dropped_and_closed_once_another_loop_adds_its_own() -> None:
    """``PerLoop``, the one home of the poller's, the C engine's and the young relays' per-loop values."""
    closed: list[str] = []
    values: PerLoop[str] = PerLoop(closed.append)
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        assert values.add(first, "first") == "first" and values.get(first) == "first"
        first.close()
        assert values.get(first) == "first" and closed == []  # kept until another loop adds its own
        values.add(second, "second")
        assert dict(values) == {second: "second"} and closed == ["first"]
    finally:
        second.close()


def test_a_finished_relay_unwatches_its_fds_and_leaves_no_cyclic_garbage(run: Runner, extensions: Extensions) -> None:
    native = extensions.tcp_pump

    async def main() -> None:
        loop = asyncio.get_running_loop()
        engine = native_relay.engine_for(loop, native)
        poller: Any = engine if engine is not None else poller_for(loop)
        gc.collect()
        gc.disable()
        try:
            for _ in range(20):
                client, client_end = tcp_pair()
                pod, pod_end = tcp_pair()
                probes: list[RelayProbe] = []
                task = loop.create_task(relay(client_end, pod, initial_to_pod=b"hello", idle_timeout_s=10,
                                              on_start=probes.append, native=native))
                await until(lambda: poller.watched == 2)
                client.shutdown(socket.SHUT_WR)
                pod_end.shutdown(socket.SHUT_WR)
                result = await task
                assert result.outcome is RelayOutcome.COMPLETED
                assert result.client_to_pod_bytes == 5
                assert poller.watched == 0
                assert probes[0]()[:2] == (5, 0)  # the live view's probe still answers, with the final counts
                assert pod_end.recv(10) == b"hello"
                for s in (client, pod_end):
                    s.close()
                del task, probes
            assert gc.collect() == 0
        finally:
            gc.enable()

    run(main())
