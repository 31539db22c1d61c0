"""One epoll set per event loop for every relayed socket, watched by the loop as a single fd.

Why: uvloop's ``add_reader`` / ``remove_reader`` set up a libuv poll handle per fd and watch (strace: 14
system calls per relayed connection); here a watch costs one ``epoll_ctl`` and no object. Level-triggered,
one reader and one writer callback per fd, looked up at dispatch: a watch removed by an earlier callback of
the same batch is not called, and a stale event for a reused fd number only causes a harmless spurious pump.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
from collections.abc import Callable
from typing import Final, TypeVar

POLL_BATCH: Final = 256
"""Events taken per wakeup of the loop; more stay pending (level-triggered) for the next one."""

_IN: Final = select.EPOLLIN
_OUT: Final = select.EPOLLOUT
_FAULT: Final = select.EPOLLHUP | select.EPOLLERR
"""Reported whatever the mask; both callbacks run so the pump sees the error or the end."""

Callback = Callable[[], None]
T = TypeVar("T")


class PerLoop(dict[asyncio.AbstractEventLoop, T]):
    """A value per event loop (the poller, the C engine, ...), shared by its connections and reached from
    the running loop alone; read with ``get`` (hot path), kept with ``add`` (a process may run many loops)."""

    __slots__ = ("_close",)

    def __init__(self, close: Callable[[T], None] | None = None) -> None:
        """``close``: how a closed loop's value is let go (its fds), if it holds any."""
        super().__init__()
        self._close = close

    def add(self, loop: asyncio.AbstractEventLoop, value: T) -> T:
        """Keep ``value`` for ``loop`` and return it, first dropping (and closing) those of closed loops."""
        for old in [other for other in self if other.is_closed()]:
            gone = self.pop(old)
            if self._close is not None:
                self._close(gone)
        self[loop] = value
        return value


class FdPoller:
    """Readers and writers of raw fds on one epoll set, dispatched from one loop reader."""

    __slots__ = ("_ep", "_loop", "_masks", "_readers", "_writers")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._ep = select.epoll()
        self._loop = loop
        self._readers: dict[int, Callback] = {}
        self._writers: dict[int, Callback] = {}
        self._masks: dict[int, int] = {}
        loop.add_reader(self._ep.fileno(), self._dispatch)

    def add_reader(self, fd: int, callback: Callback) -> None:
        self._readers[fd] = callback
        self._watch(fd, self._masks.get(fd, 0) | _IN)

    def remove_reader(self, fd: int) -> None:
        if self._readers.pop(fd, None) is not None:
            self._watch(fd, self._masks.get(fd, 0) & ~_IN)

    def add_writer(self, fd: int, callback: Callback) -> None:
        self._writers[fd] = callback
        self._watch(fd, self._masks.get(fd, 0) | _OUT)

    def remove_writer(self, fd: int) -> None:
        if self._writers.pop(fd, None) is not None:
            self._watch(fd, self._masks.get(fd, 0) & ~_OUT)

    def _watch(self, fd: int, mask: int) -> None:
        old = self._masks.get(fd, 0)
        if mask == old:
            return
        ep = self._ep
        if not mask:
            del self._masks[fd]
            with contextlib.suppress(FileNotFoundError):  # closed already: the kernel dropped it
                ep.unregister(fd)
            return
        self._masks[fd] = mask
        if not old:
            try:
                ep.register(fd, mask)
            except FileExistsError:
                ep.modify(fd, mask)
        else:
            try:
                ep.modify(fd, mask)
            except FileNotFoundError:  # the number was closed and reused under its watch
                ep.register(fd, mask)

    def _dispatch(self) -> None:
        readers, writers = self._readers, self._writers
        for fd, events in self._ep.poll(0, POLL_BATCH):
            if events & (_IN | _FAULT):
                callback = readers.get(fd)
                if callback is not None:
                    callback()
            if events & (_OUT | _FAULT):
                callback = writers.get(fd)
                if callback is not None:
                    callback()

    async def wait(self, fd: int, *, write: bool = False) -> None:
        """Until ``fd`` is readable (or writable), by one watch on this set: cheaper than the loop's own
        (uvloop's ``sock_recv`` costs a poll handle, an ``ioctl`` and three ``epoll_ctl``)."""
        future: asyncio.Future[None] = self._loop.create_future()

        def on_ready() -> None:
            if not future.done():
                future.set_result(None)

        if write:
            self.add_writer(fd, on_ready)
        else:
            self.add_reader(fd, on_ready)
        try:
            await future
        finally:
            if write:
                self.remove_writer(fd)
            else:
                self.remove_reader(fd)

    @property
    def watched(self) -> int:
        """Fds with a reader or a writer (tests: nothing outlives its relay)."""
        return len(self._masks)

    def close(self) -> None:
        """Stop (the loop may be closed already) and drop every watch."""
        if not self._loop.is_closed():
            self._loop.remove_reader(self._ep.fileno())
        self._ep.close()
        self._readers.clear()
        self._writers.clear()
        self._masks.clear()


_POLLERS: PerLoop[FdPoller] = PerLoop(FdPoller.close)


def poller_for(loop: asyncio.AbstractEventLoop) -> FdPoller:
    """The poller of ``loop``, created on first use; those of closed loops are closed then."""
    poller = _POLLERS.get(loop)
    if poller is None:
        poller = _POLLERS.add(loop, FdPoller(loop))
    return poller


async def recv(poller: FdPoller, sock: socket.socket, size: int) -> bytes:
    """``loop.sock_recv`` through ``poller``: up to ``size`` bytes, b"" at end of stream."""
    while True:
        try:
            return sock.recv(size)
        except (BlockingIOError, InterruptedError):
            await poller.wait(sock.fileno())


async def sendall(poller: FdPoller, sock: socket.socket, data: bytes) -> None:
    """``loop.sock_sendall`` through ``poller``."""
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view):]
        except (BlockingIOError, InterruptedError):
            await poller.wait(sock.fileno(), write=True)
