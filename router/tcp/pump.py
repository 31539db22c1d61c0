"""One direction of the relay: the pump that reads one socket and writes the other.

Why it looks like this (see ``relay`` for the whole): each direction pumps "write what is
pending, then read more" in one readiness callback and only touches the poller when it flips
between waiting for its source and waiting for its sink; it holds at most one pipe (splice
mode) or one chunk (buffered mode), created on first use and given back when quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Callable
from typing import Final, Protocol

from router.constants import (
    RELAY_CHUNK_BYTES,
    RELAY_REPORT_BYTES,
    RELAY_ROUNDS_PER_WAKEUP,
    SPLICE_AFTER_BYTES,
    SPLICE_PIPE_BYTES,
)
from router.tcp.poller import FdPoller
from router.tcp.relay_common import Mode

_SPLICE_FLAGS: Final = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)
_F_SETPIPE_SZ: Final = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ: Final = getattr(fcntl, "F_GETPIPE_SZ", 1032)
EMPTY: Final = memoryview(b"")
NONE, READ, WRITE = 0, 1, 2
_SCRATCH_VIEW: Final = memoryview(bytearray(RELAY_CHUNK_BYTES))
"""The buffered path's one read buffer, shared by all relays (the event loop is single-threaded)."""


class RelayOwner(Protocol):
    """What a direction tells the relay that owns it."""

    loop: asyncio.AbstractEventLoop
    poller: FdPoller

    def fail(self, exc: BaseException, direction: Direction | None = None) -> None: ...
    def report(self) -> None: ...
    def direction_done(self) -> None: ...
    def other_done(self, direction: Direction) -> bool: ...
    def acquired(self) -> None: ...


class Direction:
    """One way of the relay: reads ``src``, writes ``dst``, holds at most one pipe or chunk."""

    __slots__ = (
        "done", "dst", "dst_fd", "filter", "filter_done", "last", "loop", "out", "pending",
        "pipe_cap", "pipe_r", "pipe_w", "poller", "relay", "reported", "sent", "splice", "src", "src_fd",
        "to_splice", "want",
    )

    def __init__(
        self, relay: RelayOwner, src: socket.socket, dst: socket.socket, to_splice: bool, now: float
    ) -> None:
        self.relay = relay
        self.loop = relay.loop
        self.poller = relay.poller
        self.src, self.dst = src, dst
        self.src_fd, self.dst_fd = src.fileno(), dst.fileno()
        self.to_splice = to_splice  # splice once past SPLICE_AFTER_BYTES, with no filter, nothing pending
        self.splice = to_splice and SPLICE_AFTER_BYTES <= 0
        self.filter: Callable[[bytes], bytes] | None = None
        self.filter_done: Callable[[], bool] | None = None
        self.pipe_r = self.pipe_w = -1
        self.pipe_cap = 0
        self.out = EMPTY  # buffered mode: the pending bytes
        self.pending = 0  # bytes read but not yet written (in the pipe or ``out``)
        self.sent = 0
        self.reported = 0
        self.want = NONE
        self.done = False
        self.last = now

    # -- the pump (readiness callback) ---------------------------------------------------
    def pump(self) -> None:
        """Move bytes until the source is empty or the sink is full, then wait for that."""
        self.last = self.loop.time()
        try:
            if self.splice:
                self._pump_splice()
            else:
                self._pump_buffered()
        except Exception as exc:  # any failure ends this connection, never the event loop
            self.relay.fail(exc, self)

    def write_initial(self) -> None:
        """Write the bytes the peek read, then wait for more (no read now: they came together)."""
        self.last = self.loop.time()
        try:
            if self._flush():
                self.set_want(READ)
        except Exception as exc:  # any failure ends this connection, never the event loop
            self.relay.fail(exc, self)

    def _pump_splice(self) -> None:
        drained = False  # the last read was short: the source is empty for now, skip an EAGAIN read
        for _ in range(RELAY_ROUNDS_PER_WAKEUP):
            if self.pending and not self._flush():
                return
            if drained:
                break
            if self.pipe_w < 0 and not self._open_pipe():
                self._pump_buffered()  # out of fds or memory for a pipe: copy instead
                return
            n = self._read()
            if not n:
                return
            self.pending = n
            drained = n < self.pipe_cap
        self.set_want(WRITE if self.pending else READ)

    def _pump_buffered(self) -> None:
        scratch = _SCRATCH_VIEW
        for _ in range(RELAY_ROUNDS_PER_WAKEUP):
            if self.pending and not self._flush():
                return
            if self.to_splice and self.filter is None and self.sent >= SPLICE_AFTER_BYTES:
                self.splice = True
                self.release()
                self._pump_splice()
                return
            if self.filter is not None:
                try:
                    self._read_filtered()
                except BlockingIOError:
                    self.set_want(READ)
                    return
                if self.done:
                    return
                continue
            n = self._read()
            if not n:
                return
            # The scratch buffer is shared by every relay of this process: write it out now and
            # copy only what the sink could not take (then stop reading until it drains).
            try:
                sent = self.dst.send(scratch[:n])
            except BlockingIOError:
                sent = 0
            self._count(sent)
            if sent < n:
                self.out = memoryview(bytes(scratch[sent:n]))
                self.pending = n - sent
                self.set_want(WRITE)
                return
            if n < len(scratch):  # a short read drained the source: wait for more, skip an EAGAIN read
                break
        self.set_want(WRITE if self.pending else READ)

    def _read(self) -> int:
        """Read from the source into the pipe (splice) or the shared scratch buffer; 0 when there
        is nothing to do now (would block: waiting for the source; or end of stream: handled)."""
        try:
            if self.splice:
                n = os.splice(self.src_fd, self.pipe_w, self.pipe_cap, flags=_SPLICE_FLAGS)
            else:
                n = self.src.recv_into(_SCRATCH_VIEW)
        except BlockingIOError:
            self.set_want(READ)
            return 0
        if n == 0:
            self._eof()
        return n

    def _flush(self) -> bool:
        """Write what is pending (from the pipe or ``out``); False when the sink is full (then
        waiting for it to drain)."""
        try:
            if self.splice:
                n = os.splice(self.pipe_r, self.dst_fd, self.pending, flags=_SPLICE_FLAGS)
            else:
                n = self.dst.send(self.out)
        except BlockingIOError:
            self.set_want(WRITE)
            return False
        self.pending -= n
        self._count(n)
        if self.pending:
            if not self.splice:
                self.out = self.out[n:]
            self.set_want(WRITE)
            return False
        self.out = EMPTY
        return True

    def _read_filtered(self) -> None:
        """Filter phase (a few frames at most): plain ``recv`` since the filter wants bytes."""
        assert self.filter is not None
        data = self.src.recv(RELAY_CHUNK_BYTES)
        if not data:
            self._eof()
            return
        self.set_pending(self.filter(data))

    def set_pending(self, data: bytes) -> None:
        """Queue bytes for ``dst``; drop the filter once it says it is done (never without a check)."""
        self.out = memoryview(data)
        self.pending = len(data)
        if self.filter_done is not None and self.filter_done():
            self.filter = self.filter_done = None

    # -- helpers --------------------------------------------------------------------------
    def _count(self, n: int) -> None:
        self.sent += n
        if self.sent - self.reported >= RELAY_REPORT_BYTES:
            self.relay.report()

    def set_want(self, want: int) -> None:
        if want == self.want:
            return
        poller = self.poller
        if self.want == READ:
            poller.remove_reader(self.src_fd)
        elif self.want == WRITE:
            poller.remove_writer(self.dst_fd)
        if want == READ:
            poller.add_reader(self.src_fd, self.pump)
        elif want == WRITE:
            poller.add_writer(self.dst_fd, self.pump)
        self.want = want

    def _eof(self) -> None:
        """Source finished and nothing is pending: half-close the sink, keep the other way."""
        self.set_want(NONE)
        self.done = True
        self.release()
        if not self.relay.other_done(self):  # else both sockets are closed now, which sends the FIN
            self.dst.shutdown(socket.SHUT_WR)
        self.relay.direction_done()

    def _open_pipe(self) -> bool:
        """Create this direction's pipe; on EMFILE/ENFILE/ENOMEM fall back to buffered for good."""
        try:
            self.pipe_r, self.pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                raise
            self.splice = self.to_splice = False
            return False
        # EPERM: over /proc/sys/fs/pipe-user-pages-soft, so the default size it is.
        with contextlib.suppress(PermissionError):
            fcntl.fcntl(self.pipe_w, _F_SETPIPE_SZ, SPLICE_PIPE_BYTES)
        self.pipe_cap = fcntl.fcntl(self.pipe_w, _F_GETPIPE_SZ)
        self.relay.acquired()
        return True

    def held(self) -> int:
        return self.pipe_cap + (len(self.out) if not self.splice else 0)

    def release(self) -> None:
        """Give back the pipe / buffer; only called with nothing pending in them."""
        if self.pipe_r >= 0:
            os.close(self.pipe_r)
            os.close(self.pipe_w)
            self.pipe_r = self.pipe_w = -1
            self.pipe_cap = 0
        self.out = EMPTY

    def close(self) -> None:
        """Stop watching the fds and drop the pipe even if bytes are stuck in it."""
        self.set_want(NONE)
        self.pending = 0
        self.release()

    def mode(self) -> Mode:
        return "splice" if self.splice else "buffered"
