"""The relay with its byte pump in C (``router/tcp/_relay.c``), when that extension is built.

Why: on a short connection the Python pump (``pump``, ``poller``) costs a readiness callback and
a few objects per wake-up and direction; the C engine pumps every ready relay of a loop in one
call (a connection's CPU 0.855x on the bench, ~15 us less; bench/README). Only the pumping
moved: this module keeps the relay's policy exactly as ``relay._Relay`` has it (the idle timer
armed late and lazily, quiet pipes given back, who ended the connection, when to close the
sockets, ``on_bytes``, the live view), so a connection ends the same way, with the same counts,
on either path. The engine does the closing itself when told (``close_fds``: a closed fd leaves
its epoll set without an ``epoll_ctl``), and each side may be a socket object or a bare fd.
``relay.relay`` chooses: C when it is built, ``NO_EXTENSIONS_ENV`` is unset and no client
filter is asked for (h2c's SETTINGS-ACK stripper needs to see bytes, so h2c stays on the
Python pump).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from router import extensions
from router.constants import (
    NO_EXTENSIONS_ENV,
    RELAY_CHUNK_BYTES,
    RELAY_RELEASE_QUIET_S,
    RELAY_REPORT_BYTES,
    RELAY_ROUNDS_PER_WAKEUP,
    RELAY_TIMER_DEFER_S,
    SPLICE_AFTER_BYTES,
    SPLICE_PIPE_BYTES,
)
from router.extensions import NativeUnavailable
from router.outcomes import Termination
from router.tcp.ending import Side, closed_termination, failure_termination, tcp_state
from router.tcp.poller import POLL_BATCH
from router.tcp.relay_common import (
    LIVE,
    TIMER_SLACK_S,
    RelayOutcome,
    RelayResult,
    RelayState,
    arm_later,
    close_fd,
    close_sockets,
)

if TYPE_CHECKING:
    from router.tcp._relay import Engine, Relay

try:  # on_end's "direction" when the pod's connect failed
    from router.tcp._relay import CONNECT
except ImportError:  # not built: no relay ever ends that way
    CONNECT = -1

log = logging.getLogger("router.relay")  # pinned: operators filter logs by this name


def is_built() -> bool:
    """Whether the C relay is importable (whatever ``NO_EXTENSIONS_ENV`` says)."""
    return extensions.is_built("router.tcp._relay")


_ENGINES: dict[asyncio.AbstractEventLoop, Engine] = {}
"""Per loop: its C engine, watched by the loop as one fd."""
_BY_DEFAULT: dict[asyncio.AbstractEventLoop, bool] = {}
"""Per loop: whether its relays use the engine unless told (built, ``NO_EXTENSIONS_ENV`` unset)."""


def engine_for(loop: asyncio.AbstractEventLoop, wanted: bool | None) -> Engine | None:
    """The C engine of ``loop`` (created on first use), or None for the Python pump.

    ``wanted`` None: the engine if it is built and ``NO_EXTENSIONS_ENV`` is unset (decided once
    per loop); False: never; True: it must be built (``NativeUnavailable`` otherwise)."""
    if wanted is None:
        use = _BY_DEFAULT.get(loop)
        if use is None:
            _forget_closed_loops()
            use = _BY_DEFAULT[loop] = is_built() and not os.environ.get(NO_EXTENSIONS_ENV)
        if not use:
            return None
    elif not wanted:
        return None
    engine = _ENGINES.get(loop)
    if engine is None:
        _forget_closed_loops()
        engine = _ENGINES[loop] = _make_engine(loop)
    return engine


def _forget_closed_loops() -> None:
    for old in [loop for loop in _BY_DEFAULT if loop.is_closed()]:
        del _BY_DEFAULT[old]
    for old in [loop for loop in _ENGINES if loop.is_closed()]:
        _ENGINES.pop(old).close()


def _make_engine(loop: asyncio.AbstractEventLoop) -> Engine:
    try:
        from router.tcp._relay import Engine
    except ImportError:
        raise NativeUnavailable("the C relay router.tcp._relay is not built (no C compiler at install)") from None
    engine = Engine(
        chunk_bytes=RELAY_CHUNK_BYTES, splice_after_bytes=SPLICE_AFTER_BYTES, pipe_bytes=SPLICE_PIPE_BYTES,
        report_bytes=RELAY_REPORT_BYTES, rounds=RELAY_ROUNDS_PER_WAKEUP, events_per_dispatch=POLL_BATCH,
    )
    loop.add_reader(engine.fileno(), engine.dispatch)
    return engine


def _fd(side: socket.socket | int) -> int:
    """A relay side's fd: a bare fd, or its socket's (-1 once closed either way)."""
    return side if isinstance(side, int) else side.fileno()


def _given_up(side: socket.socket | int) -> socket.socket | int:
    """The side once its fd is someone else's to close (a socket object detached, a bare fd -1)."""
    if isinstance(side, int):
        return -1
    side.detach()
    return side


def _closed(side: socket.socket | int, *, reset: bool) -> socket.socket | int:
    """The side once closed (idempotent; a bare fd is closed once, then -1)."""
    if isinstance(side, int):
        if side >= 0:
            close_fd(side, reset=reset)
        return -1
    close_sockets(side, reset=reset)
    return side


def _describe(code: int) -> str:
    return errno.errorcode.get(code, str(code))


class NativeRelay:
    """One connection relayed by the C engine: its timer, its ending and its result future."""

    __slots__ = ("_future", "client", "connect_timer", "engine", "final", "handle", "idle_s", "loop", "on_bytes",
                 "on_connected", "on_dial_failed", "on_result", "outcome", "pod", "splice", "timer", "timer_at")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        engine: Engine,
        client: socket.socket | int,
        pod: socket.socket | int,
        splice: bool,
        idle_timeout_s: float,
        on_bytes: Callable[[int, int], None] | None,
    ) -> None:
        self.loop, self.engine = loop, engine
        self.client = client
        self.pod = pod
        """Each side: its socket, or its bare fd (the fast path: C accept and dial), which this
        relay closes once and then sets to -1."""
        self.splice = splice
        self.idle_s = idle_timeout_s if idle_timeout_s > 0 and math.isfinite(idle_timeout_s) else math.inf
        self.on_bytes = on_bytes
        self._future: asyncio.Future[RelayResult] | None = None
        self.outcome: RelayResult | None = None
        """The result once over (the task-free path is told it by ``on_result``, no future)."""
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        self.handle: Relay | None = None
        self.final = (0, 0, 0.0)
        self.on_result: Callable[[RelayResult], None] | None = None
        """Told the result as the relay ends (before the future is): saves a loop round."""
        self.on_connected: Callable[[], None] | None = None
        self.on_dial_failed: Callable[[int], None] | None = None
        self.connect_timer: asyncio.TimerHandle | None = None

    @property
    def future(self) -> asyncio.Future[RelayResult]:
        """The result, to await (made on first use: the task-free path never awaits it)."""
        if self._future is None:
            self._future = self.loop.create_future()
            if self.outcome is not None:
                self._future.set_result(self.outcome)
        return self._future

    def done(self) -> bool:
        return self.outcome is not None

    def start(self, initial: bytes) -> Relay:
        """Hand both sockets to the engine (it writes ``initial`` at once); the live handle."""
        LIVE.add(self)
        handle = self.handle = self.engine.start(
            _fd(self.client), _fd(self.pod), initial, self.splice, False, self._on_end,
            self._report if self.on_bytes is not None else None, self.acquired, None,
        )
        self._arm_first_timer()
        return handle

    def start_connecting(
        self,
        initial: bytes,
        timeout_s: float,
        on_connected: Callable[[], None],
        on_dial_failed: Callable[[int], None],
    ) -> Relay:
        """As ``start``, with the pod's connect still in progress: the engine waits for it and
        holds ``initial`` meanwhile. ``on_connected`` once it succeeds; else ``on_dial_failed(errno)``
        (``ETIMEDOUT`` after ``timeout_s``) with the pod socket closed and the client's left open,
        to be answered."""
        LIVE.add(self)
        self.on_connected, self.on_dial_failed = on_connected, on_dial_failed
        self.connect_timer = self.loop.call_later(timeout_s, self._connect_timed_out)
        handle = self.handle = self.engine.start(
            _fd(self.client), _fd(self.pod), initial, self.splice, True, self._on_end,
            self._report if self.on_bytes is not None else None, self.acquired, self._connected,
        )
        self._arm_first_timer()
        return handle

    def _connected(self) -> None:
        if self.connect_timer is not None:
            self.connect_timer.cancel()
            self.connect_timer = None
        if self.on_connected is not None:
            self.on_connected()

    def _connect_timed_out(self) -> None:
        self.connect_timer = None
        if self.handle is not None and self.handle.is_connecting():
            self.handle.abort()
            self._dial_failed(errno.ETIMEDOUT)

    def _dial_failed(self, code: int) -> None:
        """The pod was not reached: only its socket closes (the client is to be answered)."""
        LIVE.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.connect_timer is not None:
            self.connect_timer.cancel()
            self.connect_timer = None
        self.timer_at = math.inf
        self.pod = _closed(self.pod, reset=False)
        if self.on_dial_failed is not None:
            self.on_dial_failed(code)

    def _arm_first_timer(self) -> None:
        if self.outcome is None:
            if self.idle_s > RELAY_TIMER_DEFER_S:
                arm_later(self)
            else:
                self.arm_timer()

    # -- endings ---------------------------------------------------------------------------
    def _on_end(self, handle: Relay, code: int, way: int, first_eof: int, up_done: int, down_done: int) -> None:
        """The engine's end of a relay: both directions done (``code`` 0) or ``way`` failed."""
        self.handle = handle
        if way == CONNECT:
            self._dial_failed(code)
            return
        if not code:
            first: Side = "client" if first_eof == 0 else "pod"
            self.finish(RelayOutcome.COMPLETED, None, closed_termination(first))
            return
        reading: Side = "pod" if way == 1 else "client"
        writing: Side = "client" if reading == "pod" else "pod"
        both_done = up_done and down_done
        # A side that closed normally (its FIN in, ours out) says nothing about a reset.
        client = None if both_done and way != 1 else tcp_state(self.client)
        pod = None if both_done and way != 0 else tcp_state(self.pod)
        termination = failure_termination(OSError(code, os.strerror(code)), client, pod, reading, writing)
        self.finish(RelayOutcome.RELAY_ERROR, _describe(code), termination, reset=True)

    def finish(
        self, outcome: RelayOutcome, error: str | None, termination: Termination, *, reset: bool = False
    ) -> None:
        if self.outcome is not None:
            return
        self.close(reset=reset)
        self.final = up, down, _ = self.probe()  # final once the engine let go: ``unlink`` keeps them
        result = self.outcome = RelayResult(up, down, outcome, error, termination)
        if self.on_result is not None:
            self.on_result(result)
        if self._future is not None:
            self._future.set_result(result)

    def result(
        self, outcome: RelayOutcome, error: str | None, termination: Termination = Termination.ROUTER_ERROR
    ) -> RelayResult:
        up, down, _ = self.probe()
        return RelayResult(up, down, outcome, error, termination)

    def probe(self) -> tuple[int, int, float]:
        """Bytes delivered so far each way and the last activity (read at any time)."""
        handle = self.handle
        return handle.probe() if handle is not None else self.final

    def close(self, *, reset: bool) -> None:
        """Idempotent teardown: the engine lets go of the fds (and reports the last bytes) first,
        then the sockets close; ``reset`` makes both peers see RST instead of FIN."""
        LIVE.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.timer_at = math.inf
        if self.connect_timer is not None:
            self.connect_timer.cancel()
            self.connect_timer = None
        handle, client, pod = self.handle, self.client, self.pod
        if handle is not None and _fd(client) >= 0 and _fd(pod) >= 0:
            # Both still open: the engine closes them, which takes them out of its epoll set
            # without an epoll_ctl each. The sockets' objects give their fds up first.
            self.client, self.pod = _given_up(client), _given_up(pod)
            handle.close_fds(reset)
            return
        if handle is not None:
            handle.abort()
        self.client, self.pod = _closed(client, reset=reset), _closed(pod, reset=reset)

    def take_client(self) -> int:
        """The client's bare fd, which this relay forgets (a failed dial's client, to answer)."""
        fd = _fd(self.client)
        self.client = _given_up(self.client)
        return fd

    def report(self) -> None:
        """The engine reports the last bytes when it stops (``close``): nothing is left here."""

    def _report(self, up: int, down: int) -> None:
        assert self.on_bytes is not None
        try:
            self.on_bytes(up, down)
        except Exception:
            log.exception("on_bytes callback failed; relay continues")

    def unlink(self) -> None:
        """Once over, keep only the final counts: the handle (and its engine) can go, and the
        callbacks (bound methods of the relay's owner, which holds the relay) no longer make a
        cycle for the collector to find."""
        if self.handle is not None:
            if self.outcome is None:  # else ``finish`` read the final counts already
                self.final = self.handle.probe()
            self.handle = None
        self.on_result = self.on_connected = self.on_dial_failed = None

    # -- the one timer: idle timeout and giving back quiet pipes -------------------------------
    def acquired(self) -> None:
        """A pipe was taken: make sure the timer fires in time to give it back."""
        if time.monotonic() + RELAY_RELEASE_QUIET_S < self.timer_at:
            self.arm_timer()

    def arm_timer(self) -> None:
        handle = self.handle
        if handle is None or self.outcome is not None:
            return
        at = min(handle.probe()[2] + self.idle_s, handle.next_release(RELAY_RELEASE_QUIET_S))
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.timer_at = at
        if math.isfinite(at):
            # the engine's clock is CLOCK_MONOTONIC, which is time.monotonic() and the loop's
            self.timer = self.loop.call_at(at + (self.loop.time() - time.monotonic()), self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        handle = self.handle
        if handle is None:
            return
        now = time.monotonic() + TIMER_SLACK_S
        if now - handle.probe()[2] >= self.idle_s:
            self.finish(RelayOutcome.IDLE_TIMEOUT, None, Termination.IDLE_TIMEOUT)
            return
        handle.release_quiet(now, RELAY_RELEASE_QUIET_S)
        self.arm_timer()

    def state(self) -> RelayState:
        handle = self.handle
        if handle is None:
            up, down, _ = self.final
            return RelayState("buffered", "buffered", 0, 0, 0, up, down)
        up_mode, down_mode, up_pending, down_pending, held, up_sent, down_sent = handle.state()
        return RelayState(
            "splice" if up_mode == "splice" else "buffered", "splice" if down_mode == "splice" else "buffered",
            up_pending, down_pending, held, up_sent, down_sent,
        )
