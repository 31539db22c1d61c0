"""The C relay engine (``router/tcp/_relay.c``) called directly, the ways a careless caller or
callback may call it: nothing it does after a relay ended may touch that relay's fds (they may
already be another connection's), nothing of a freed relay may stay in its epoll set, and every
entry point refuses arguments that lie. Real AF_UNIX stream pairs stand in for the two TCP sides:
the engine only reads, writes, splices and shuts them down.
"""

from __future__ import annotations

import gc
import os
import select
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import pytest

from router.extensions import TCP_PUMP_MODULE, is_built

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(not is_built(TCP_PUMP_MODULE), reason="the C relay router.tcp._relay is not built"),
]

MiB = 1 << 20
SECRET = b"another connection's bytes"


def engine(**sizes: int) -> Any:
    from router.tcp._relay import Engine

    chosen = {"chunk_bytes": 16384, "splice_after_bytes": 1 << 40, "pipe_bytes": 65536, "report_bytes": 1,
              "rounds": 8, "events_per_dispatch": 64} | sizes
    return Engine(**chosen)


def pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def drain(sock: socket.socket) -> int:
    got = 0
    while True:
        try:
            data = sock.recv(MiB)
        except BlockingIOError:
            return got
        if not data:
            return got
        got += len(data)


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


@dataclass
class Hijack:
    """An ``on_bytes`` that ends its relay (``close_fds``) once a flush has emptied what it held,
    then puts another connection's sockets on the freed fd numbers, as the kernel would for the
    next accepted connection: whatever the engine still did with those numbers would be theirs."""

    relay: Any = None
    fds: tuple[int, int] = (-1, -1)
    innocent: tuple[socket.socket, socket.socket] | None = None
    fired: bool = False
    reports: list[tuple[int, int]] = field(default_factory=list)

    def __call__(self, up: int, down: int) -> None:
        self.reports.append((up, down))
        if self.fired or self.relay is None or self.relay.state()[2]:  # still holding bytes for the pod
            return
        self.fired = True
        self.relay.close_fds(False)
        assert self.innocent is not None
        os.dup2(self.innocent[0].fileno(), self.fds[0])
        os.dup2(self.innocent[1].fileno(), self.fds[1])


@contextmanager
def hijacked_relay(splice: bool) -> Iterator[tuple[Any, Hijack, socket.socket, socket.socket, socket.socket,
                                                      Callable[[], None]]]:
    """A relay between (client, pod) whose on_bytes is a ``Hijack``; the innocent connection's reader
    side already holds SECRET."""
    client, client_relay = pair()
    pod_relay, pod = pair()
    innocent_a, innocent_peer_a = pair()  # innocent_a lands on the client's fd number: SECRET waits in it
    innocent_b, innocent_peer_b = pair()  # innocent_b on the pod's: whatever is sent to it reaches peer_b
    innocent_peer_a.send(SECRET)
    e = engine(splice_after_bytes=0 if splice else 1 << 40)
    hijack = Hijack(innocent=(innocent_a, innocent_b))
    fds = (client_relay.detach(), pod_relay.detach())
    hijack.fds = fds
    sockets = [client, pod, innocent_a, innocent_peer_a, innocent_b, innocent_peer_b]

    def cleanup() -> None:
        for fd in fds:
            with suppress(OSError):
                os.close(fd)
        for sock in sockets:
            sock.close()
        e.close()

    try:
        yield e, hijack, client, pod, innocent_peer_b, cleanup
    finally:
        cleanup()


def test_a_callback_that_ends_the_relay_mid_round_stops_the_buffered_pump_there() -> None:
    """on_bytes ends the relay when a flush of held bytes completes: before, the round went on to
    ``recv`` the client's fd number and ``send`` to the pod's, which were another connection's."""
    with hijacked_relay(splice=False) as (e, hijack, _client, pod, innocent_peer_b, _cleanup):
        relay = e.start(*hijack.fds, b"p" * (4 * MiB), False, False, lambda *end: None, hijack, None, None)
        assert relay.state()[2] > 0, "the pod took 4 MiB at once: no bytes held, nothing to flush later"
        hijack.relay = relay
        for _ in range(1000):
            if hijack.fired:
                break
            drain(pod)
            e.dispatch()
        assert hijack.fired
        assert hijack.innocent is not None
        assert hijack.innocent[0].recv(100) == SECRET, "the ended relay read another connection's bytes"
        assert drain(innocent_peer_b) == 0, "the ended relay wrote to another connection"
        assert e.live == 0


def test_a_callback_that_ends_the_relay_mid_round_stops_the_splice_pump_there() -> None:
    """The same through splice(2): before, a flush that emptied the pipe was followed by a new pipe
    and a splice from the client's fd number, taking another connection's bytes into it."""
    with hijacked_relay(splice=True) as (e, hijack, client, pod, innocent_peer_b, _cleanup):
        relay = e.start(*hijack.fds, b"", True, False, lambda *end: None, hijack, None, None)
        hijack.relay = relay
        sent = 0
        for _ in range(1000):
            if hijack.fired:
                break
            with suppress(BlockingIOError):
                sent += client.send(b"c" * (256 * 1024))
            e.dispatch()
            drain(pod)
        assert hijack.fired and sent > 0
        assert hijack.innocent is not None
        assert hijack.innocent[0].recv(100) == SECRET, "the ended relay spliced another connection's bytes"
        assert drain(innocent_peer_b) == 0
        assert e.live == 0


def test_close_fds_takes_a_duplicated_fd_out_of_the_epoll_set() -> None:
    """``close`` drops an epoll registration only with the last fd of its file: with a ``dup`` (or a
    forked child) alive, the registration, naming the freed relay, stayed and fired."""
    e = engine()
    client, client_relay = pair()
    pod_relay, pod = pair()
    fds = (client_relay.detach(), pod_relay.detach())
    duplicate = os.dup(fds[0])
    try:
        relay = e.start(*fds, b"", False, False, lambda *end: None, None, None, None)
        assert e.watched == 2
        relay.close_fds(False)
        del relay
        gc.collect()
        assert e.watched == 0
        client.send(b"wake the stale registration")  # the duplicate's file is readable now
        assert not readable(e.fileno()), "a closed relay's registration is still in the epoll set"
        e.dispatch()  # nothing to do (and, under ASan, nothing freed to read)
    finally:
        os.close(duplicate)
        for sock in (client, pod):
            sock.close()
        e.close()


def test_an_end_closes_a_relay_whose_fds_have_duplicates_cleanly() -> None:
    """The usual end (both directions done, on_end calls close_fds) with duplicated fds leaves the
    epoll set empty too."""
    e = engine()
    client, client_relay = pair()
    pod_relay, pod = pair()
    fds = (client_relay.detach(), pod_relay.detach())
    duplicates = [os.dup(fd) for fd in fds]
    ended: list[tuple[int, ...]] = []

    def on_end(relay: Any, *how: int) -> None:
        ended.append(how)
        relay.close_fds(False)

    try:
        e.start(*fds, b"", False, False, on_end, None, None, None)
        client.shutdown(socket.SHUT_WR)
        pod.shutdown(socket.SHUT_WR)
        for _ in range(100):
            if ended:
                break
            e.dispatch()
        assert ended and ended[0][0] == 0
        assert e.watched == 0 and e.live == 0
        assert not readable(e.fileno()), "an end left a registration (the duplicates' EOF is readable)"
    finally:
        for fd in duplicates:
            os.close(fd)
        for sock in (client, pod):
            sock.close()
        e.close()


@pytest.mark.parametrize("sizes", [
    {"chunk_bytes": 0}, {"chunk_bytes": -1}, {"splice_after_bytes": -1}, {"pipe_bytes": 0},
    {"pipe_bytes": 1 << 31}, {"report_bytes": 0}, {"rounds": 0}, {"events_per_dispatch": 0},
    {"chunk_bytes": 1 << 40},
])
def test_engine_sizes_out_of_range_are_a_value_error(sizes: dict[str, int]) -> None:
    with pytest.raises((ValueError, OverflowError)):
        engine(**sizes)


@pytest.mark.parametrize(("client_fd", "pod_fd"), [(-1, 5), (5, -1), (7, 7), (-(2**31), 3)])
def test_start_refuses_fds_that_cannot_be_a_relays(client_fd: int, pod_fd: int) -> None:
    e = engine()
    try:
        with pytest.raises(ValueError):
            e.start(client_fd, pod_fd, b"", False, False, lambda *end: None, None, None, None)
        assert e.live == 0 and e.watched == 0
    finally:
        e.close()


def test_start_on_an_fd_that_is_not_open_ends_the_relay_with_ebadf() -> None:
    e = engine()
    client, client_relay = pair()
    closed = os.dup(client.fileno())
    os.close(closed)
    ended: list[tuple[int, ...]] = []
    fd = client_relay.detach()
    try:
        e.start(fd, closed, b"", False, False, lambda relay, *how: ended.append(how), None, None, None)
        import errno

        assert ended and ended[0][0] == errno.EBADF and e.live == 0
    finally:
        os.close(fd)
        client.close()
        e.close()


def test_accept_refuses_a_negative_batch() -> None:
    from router.tcp._relay import accept

    with pytest.raises(ValueError):
        accept(0, -1)
