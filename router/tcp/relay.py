"""Byte relay between a routed client socket and its pod socket: the router's hot path.

Why it looks like this:

* Readiness callbacks (``add_reader`` / ``add_writer``) on raw fds, not streams: no transport
  buffers, no per-chunk ``bytes``, and it runs the same on asyncio and uvloop.
* Linux ``os.splice`` through one pipe per direction moves bytes without copying them into
  Python. While the h2c SETTINGS-ACK stripper needs to see client bytes, client->pod runs
  buffered and switches to splice once the filter reports done.
* Each direction pumps "write what is pending, then read more" in one callback and only
  touches the poller when it flips between waiting for its source and waiting for its sink,
  so a busy connection costs no ``epoll_ctl`` per chunk, and a slow reader holds the relay to
  one pipe / one chunk per direction (the source is simply not read meanwhile).
* Pipes and buffers are created on first use and given back once a direction has been quiet
  for ``RELAY_RELEASE_QUIET_S``, so an idle connection holds only its two sockets.
* One timer per connection, re-armed lazily from last-activity stamps, serves both the idle
  timeout and that release.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import math
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from router.constants import (
    RELAY_CHUNK_BYTES,
    RELAY_RELEASE_QUIET_S,
    RELAY_REPORT_BYTES,
    RELAY_ROUNDS_PER_WAKEUP,
    SPLICE_AFTER_BYTES,
    SPLICE_PIPE_BYTES,
)

log = logging.getLogger("router.relay")  # pinned: operators filter logs by this name

Outcome = Literal["completed", "relay_error", "idle_timeout"]
Mode = Literal["splice", "buffered"]

SPLICE_AVAILABLE: Final = hasattr(os, "splice")
"""``os.splice`` exists (Linux, Python >= 3.10): the auto mode uses it."""

_SPLICE_FLAGS: Final = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)
_F_SETPIPE_SZ: Final = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ: Final = getattr(fcntl, "F_GETPIPE_SZ", 1032)
_LINGER_RESET: Final = struct.pack("ii", 1, 0)
_EMPTY: Final = memoryview(b"")
_NONE, _READ, _WRITE = 0, 1, 2
_TIMER_SLACK_S: Final = 0.001
_SCRATCH_VIEW: Final = memoryview(bytearray(RELAY_CHUNK_BYTES))
"""The buffered path's one read buffer, shared by all relays (the event loop is single-threaded)."""


@dataclass(frozen=True, slots=True)
class RelayResult:
    """How a relay ended; byte counts are bytes delivered to each destination."""

    client_to_pod_bytes: int
    pod_to_client_bytes: int
    outcome: Outcome
    error: str | None


@dataclass(frozen=True, slots=True)
class RelayState:
    """Snapshot of a live relay, for diagnostics and tests of the memory/flow-control bounds."""

    client_to_pod_mode: Mode
    pod_to_client_mode: Mode
    client_to_pod_pending: int
    pod_to_client_pending: int
    held_bytes: int
    """Capacity of the pipes and buffers currently held (0 for an idle connection)."""
    client_to_pod_bytes: int
    pod_to_client_bytes: int


_LIVE: set[_Relay] = set()


def live_relays() -> tuple[RelayState, ...]:
    """Snapshots of the relays running in this process."""
    return tuple(r.state() for r in list(_LIVE))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return f"{type(exc).__name__}: {exc}"


class _Direction:
    """One way of the relay: reads ``src``, writes ``dst``, holds at most one pipe or chunk."""

    __slots__ = (
        "done", "dst", "dst_fd", "filter", "filter_done", "last", "loop", "out", "pending",
        "pipe_cap", "pipe_r", "pipe_w", "relay", "reported", "sent", "splice", "src", "src_fd",
        "to_splice", "want",
    )

    def __init__(
        self, relay: _Relay, src: socket.socket, dst: socket.socket, to_splice: bool, now: float
    ) -> None:
        self.relay = relay
        self.loop = relay.loop
        self.src, self.dst = src, dst
        self.src_fd, self.dst_fd = src.fileno(), dst.fileno()
        self.to_splice = to_splice  # splice once past SPLICE_AFTER_BYTES, with no filter, nothing pending
        self.splice = to_splice and SPLICE_AFTER_BYTES <= 0
        self.filter: Callable[[bytes], bytes] | None = None
        self.filter_done: Callable[[], bool] | None = None
        self.pipe_r = self.pipe_w = -1
        self.pipe_cap = 0
        self.out = _EMPTY  # buffered mode: the pending bytes
        self.pending = 0  # bytes read but not yet written (in the pipe or ``out``)
        self.sent = 0
        self.reported = 0
        self.want = _NONE
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
            self.relay.fail(exc)

    def _pump_splice(self) -> None:
        splice = os.splice
        drained = False  # the last read was short: the source is empty for now, skip an EAGAIN read
        for _ in range(RELAY_ROUNDS_PER_WAKEUP):
            if self.pending:
                try:
                    n = splice(self.pipe_r, self.dst_fd, self.pending, flags=_SPLICE_FLAGS)
                except BlockingIOError:
                    self.set_want(_WRITE)
                    return
                self.pending -= n
                self._count(n)
                if self.pending:
                    self.set_want(_WRITE)
                    return
            if drained:
                break
            if self.pipe_w < 0 and not self._open_pipe():
                self._pump_buffered()  # out of fds or memory for a pipe: copy instead
                return
            try:
                n = splice(self.src_fd, self.pipe_w, self.pipe_cap, flags=_SPLICE_FLAGS)
            except BlockingIOError:
                self.set_want(_READ)
                return
            if n == 0:
                self._eof()
                return
            self.pending = n
            drained = n < self.pipe_cap
        self.set_want(_WRITE if self.pending else _READ)

    def _pump_buffered(self) -> None:
        scratch = _SCRATCH_VIEW
        for _ in range(RELAY_ROUNDS_PER_WAKEUP):
            if self.pending:
                try:
                    n = self.dst.send(self.out)
                except BlockingIOError:
                    self.set_want(_WRITE)
                    return
                self.pending -= n
                self._count(n)
                if self.pending:
                    self.out = self.out[n:]
                    self.set_want(_WRITE)
                    return
                self.out = _EMPTY
            if self.to_splice and self.filter is None and self.sent >= SPLICE_AFTER_BYTES:
                self.splice = True
                self.release()
                self._pump_splice()
                return
            try:
                if self.filter is not None:
                    self._read_filtered()
                    if self.done:
                        return
                    continue
                n = self.src.recv_into(scratch)
            except BlockingIOError:
                self.set_want(_READ)
                return
            if n == 0:
                self._eof()
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
                self.set_want(_WRITE)
                return
            if n < len(scratch):  # a short read drained the source: wait for more, skip an EAGAIN read
                break
        self.set_want(_WRITE if self.pending else _READ)

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
        loop = self.loop
        if self.want == _READ:
            loop.remove_reader(self.src_fd)
        elif self.want == _WRITE:
            loop.remove_writer(self.dst_fd)
        if want == _READ:
            loop.add_reader(self.src_fd, self.pump)
        elif want == _WRITE:
            loop.add_writer(self.dst_fd, self.pump)
        self.want = want

    def _eof(self) -> None:
        """Source finished and nothing is pending: half-close the sink, keep the other way."""
        self.set_want(_NONE)
        self.done = True
        self.release()
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
        self.out = _EMPTY

    def close(self) -> None:
        """Stop watching the fds and drop the pipe even if bytes are stuck in it."""
        self.set_want(_NONE)
        self.pending = 0
        self.release()

    def mode(self) -> Mode:
        return "splice" if self.splice else "buffered"


class _Relay:
    """Both directions, the one timer, and the result future."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        client: socket.socket,
        pod: socket.socket,
        splice: bool,
        idle_timeout_s: float,
        on_bytes: Callable[[int, int], None] | None,
    ) -> None:
        self.loop = loop
        self.client, self.pod = client, pod
        now = loop.time()
        self.c2p = _Direction(self, client, pod, splice, now)
        self.p2c = _Direction(self, pod, client, splice, now)
        self.idle_s = idle_timeout_s if idle_timeout_s > 0 and math.isfinite(idle_timeout_s) else math.inf
        self.on_bytes = on_bytes
        self.future: asyncio.Future[RelayResult] = loop.create_future()
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf

    def start(
        self,
        initial: bytes,
        client_filter: Callable[[bytes], bytes] | None,
        client_filter_done: Callable[[], bool] | None,
    ) -> None:
        _LIVE.add(self)
        c2p = self.c2p
        c2p.filter, c2p.filter_done = client_filter, client_filter_done
        if client_filter is not None or initial:
            c2p.splice = False  # buffered until the filter is done and the peeked bytes are out
        if initial:
            c2p.set_pending(client_filter(initial) if client_filter is not None else initial)
        self._arm_timer()
        if c2p.pending:
            c2p.pump()  # usually written at once, no poller round
        elif not self.future.done():
            c2p.set_want(_READ)
        if not self.future.done():
            self.p2c.set_want(_READ)

    # -- endings ---------------------------------------------------------------------------
    def direction_done(self) -> None:
        if self.c2p.done and self.p2c.done:
            self.finish("completed", None)

    def fail(self, exc: BaseException) -> None:
        self.finish("relay_error", _describe(exc), reset=True)

    def finish(self, outcome: Outcome, error: str | None, *, reset: bool = False) -> None:
        if self.future.done():
            return
        self.close(reset=reset)
        self.report()
        self.future.set_result(self.result(outcome, error))

    def result(self, outcome: Outcome, error: str | None) -> RelayResult:
        return RelayResult(self.c2p.sent, self.p2c.sent, outcome, error)

    def close(self, *, reset: bool) -> None:
        """Idempotent teardown; ``reset`` makes both peers see RST instead of FIN."""
        _LIVE.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.timer_at = math.inf
        self.c2p.close()
        self.p2c.close()
        for sock in (self.client, self.pod):
            if sock.fileno() < 0:
                continue
            if reset:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            sock.close()

    def report(self) -> None:
        """Hand the unreported byte deltas to ``on_bytes`` (every ~1 MiB and at the end)."""
        c2p, p2c = self.c2p, self.p2c
        up, down = c2p.sent - c2p.reported, p2c.sent - p2c.reported
        c2p.reported, p2c.reported = c2p.sent, p2c.sent
        if self.on_bytes is None or not (up or down):
            return
        try:
            self.on_bytes(up, down)
        except Exception:
            log.exception("on_bytes callback failed; relay continues")

    # -- the one timer: idle timeout and giving back quiet pipes/buffers -------------------------
    def acquired(self) -> None:
        """A pipe/buffer was taken: make sure the timer fires in time to give it back."""
        if self.loop.time() + RELAY_RELEASE_QUIET_S < self.timer_at:
            self._arm_timer()

    def _arm_timer(self) -> None:
        at = max(self.c2p.last, self.p2c.last) + self.idle_s
        for d in (self.c2p, self.p2c):
            if d.held() and not d.pending:
                at = min(at, d.last + RELAY_RELEASE_QUIET_S)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.timer_at = at
        if math.isfinite(at):
            self.timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        now = self.loop.time() + _TIMER_SLACK_S
        if now - max(self.c2p.last, self.p2c.last) >= self.idle_s:
            self.finish("idle_timeout", None)
            return
        for d in (self.c2p, self.p2c):
            if not d.pending and d.held() and now - d.last >= RELAY_RELEASE_QUIET_S:
                d.release()
        self._arm_timer()

    def state(self) -> RelayState:
        c2p, p2c = self.c2p, self.p2c
        return RelayState(
            c2p.mode(), p2c.mode(), c2p.pending, p2c.pending, c2p.held() + p2c.held(), c2p.sent, p2c.sent
        )


async def relay(
    client: socket.socket,
    pod: socket.socket,
    *,
    initial_to_pod: bytes = b"",
    client_filter: Callable[[bytes], bytes] | None = None,
    client_filter_done: Callable[[], bool] | None = None,
    idle_timeout_s: float,
    on_bytes: Callable[[int, int], None] | None = None,
    use_splice: bool | None = None,
) -> RelayResult:
    """Relay bytes both ways until both sides finish, one fails, or both are idle too long.

    Owns both (connected, non-blocking) sockets from the call on and closes them before
    returning or when cancelled (then with RST, and CancelledError is re-raised).
    ``initial_to_pod`` are client bytes already read by the peek; ``client_filter`` sees every
    client->pod byte until ``client_filter_done()`` is True. ``idle_timeout_s <= 0`` disables
    the idle timeout.
    """
    loop = asyncio.get_running_loop()
    if use_splice and not SPLICE_AVAILABLE:
        client.close()
        pod.close()
        raise ValueError("use_splice=True but os.splice is not available here")
    splice = SPLICE_AVAILABLE if use_splice is None else use_splice
    state = _Relay(loop, client, pod, splice, idle_timeout_s, on_bytes)
    try:
        state.start(initial_to_pod, client_filter, client_filter_done)
        return await state.future
    except BaseException as exc:  # cancelled (drain timeout) or a bug: cut both ends with RST
        state.close(reset=True)
        state.report()
        if isinstance(exc, Exception):
            return state.result("relay_error", _describe(exc))
        raise
