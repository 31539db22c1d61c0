"""The relay's one policy (``Relay``), whichever engine (``Pump``: C ``_relay.c`` or Python ``pump``) moves bytes.

* Pipes and buffers are given back once a direction has been quiet for ``RELAY_RELEASE_QUIET_S``, so an idle
  connection holds only its two sockets.
* One timer per connection, re-armed lazily from last-activity stamps, serves both the idle timeout and that
  release; it is first armed ``RELAY_TIMER_DEFER_S`` after the start by one callback shared by the relays
  started meanwhile, so short connections never make one.
* The C engine closes both fds itself: a closed fd leaves its epoll set without an ``epoll_ctl``.
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from router.constants import RELAY_RELEASE_QUIET_S, RELAY_TIMER_DEFER_S
from router.outcomes import Termination
from router.tcp.ending import (
    RelayOutcome,
    RelayResult,
    Side,
    closed_side,
    closed_termination,
    failure_termination,
    given_up,
    side_fd,
    tcp_state,
)
from router.tcp.poller import PerLoop
from router.tcp.pump import Mode, PythonPump

if TYPE_CHECKING:
    from router.tcp._relay import Engine

try:  # on_end's "direction" when the pod's connect failed
    from router.tcp._relay import CONNECT
except ImportError:  # not built: no relay ever ends that way (the Python pump ends with code 0 or on_error)
    CONNECT = -1

log = logging.getLogger("router.relay")  # pinned: operators filter logs by this name

TIMER_SLACK_S: Final = 0.001
"""A timer firing this early counts as on time (loop clocks round)."""

RelayProbe = Callable[[], tuple[int, int, float]]
"""A live relay's ``(client_to_pod bytes, pod_to_client bytes, last activity)`` (the live view)."""


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


class Pump(Protocol):
    """A running relay's pump on either engine (``_relay.Relay``, ``pump.PythonPump``). ``abort`` stops it
    (last bytes reported); ``close_fds`` also closes both sides (the C engine its fds, Python its sockets)."""

    def abort(self) -> None: ...
    def close_fds(self, reset: bool, /) -> None: ...
    def probe(self) -> tuple[int, int, float]: ...
    def next_release(self, quiet_s: float, /) -> float: ...
    def release_quiet(self, now: float, quiet_s: float, /) -> None: ...
    def state(self) -> tuple[str, str, int, int, int, int, int]: ...
    def done(self) -> tuple[bool, bool]: ...
    def is_connecting(self) -> bool: ...


LIVE: set[Relay] = set()
"""The relays running in this process."""


def live_relays() -> tuple[RelayState, ...]:
    """Snapshots of the relays running in this process."""
    return tuple(r.state() for r in list(LIVE))


def describe(exc: BaseException) -> str:
    """A failed relay's ``error``: the errno's name (``ECONNRESET``), else the exception."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return f"{type(exc).__name__}: {exc}"


class Relay:
    """One connection's relay: its pump, its timer, its ending and its result."""

    __slots__ = ("_future", "client", "connect_timer", "engine", "final", "handle", "idle_s", "loop", "on_bytes",
                 "on_connected", "on_dial_failed", "on_result", "outcome", "pod", "splice", "timer", "timer_at")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        engine: Engine | None,
        client: socket.socket | int,
        pod: socket.socket | int,
        splice: bool,
        idle_timeout_s: float,
        on_bytes: Callable[[int, int], None] | None,
    ) -> None:
        self.loop, self.engine = loop, engine
        """``engine``: the loop's C engine, or None for the Python pump (socket objects only)."""
        self.client = client
        self.pod = pod
        """Each side: its socket, or its bare fd (the fast path), which this relay closes once, then sets to -1."""
        self.splice = splice
        self.idle_s = idle_timeout_s if idle_timeout_s > 0 and math.isfinite(idle_timeout_s) else math.inf
        self.on_bytes = on_bytes
        self._future: asyncio.Future[RelayResult] | None = None
        self.outcome: RelayResult | None = None
        """The result once over (the task-free path is told it by ``on_result``, no future)."""
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        self.handle: Pump | None = None
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

    def start(
        self,
        initial: bytes,
        client_filter: Callable[[bytes], bytes] | None = None,
        client_filter_done: Callable[[], bool] | None = None,
    ) -> Pump:
        """Hand both sides to the pump, which writes ``initial`` at once; ``client_filter`` sees
        every client->pod byte until ``client_filter_done()`` (the Python pump only)."""
        LIVE.add(self)
        report = self._report if self.on_bytes is not None else None
        engine = self.engine
        if engine is not None:
            handle: Pump = engine.start(
                side_fd(self.client), side_fd(self.pod), initial, self.splice, False, self._on_end, report,
                self.acquired, None,
            )
            self.handle = handle
        else:
            assert isinstance(self.client, socket.socket) and isinstance(self.pod, socket.socket)
            pump = PythonPump(self.loop, self.client, self.pod, self.splice, self._on_end, self.failed, report,
                              self.acquired)
            self.handle = handle = pump
            pump.start(initial, client_filter, client_filter_done)
        self._arm_first_timer()
        return handle

    def start_connecting(
        self,
        initial: bytes,
        timeout_s: float,
        on_connected: Callable[[], None],
        on_dial_failed: Callable[[int], None],
    ) -> Pump:
        """As ``start``, with the pod's connect in progress (C engine only; it holds ``initial`` meanwhile). Then
        ``on_connected``, or ``on_dial_failed(errno)`` (``ETIMEDOUT`` after ``timeout_s``) with the pod socket
        closed and the client's left open, to be answered."""
        engine = self.engine
        assert engine is not None
        LIVE.add(self)
        self.on_connected, self.on_dial_failed = on_connected, on_dial_failed
        self.connect_timer = self.loop.call_later(timeout_s, self._connect_timed_out)
        handle = self.handle = engine.start(
            side_fd(self.client), side_fd(self.pod), initial, self.splice, True, self._on_end,
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
        self._stop_timers()
        self.pod = closed_side(self.pod, reset=False)
        if self.on_dial_failed is not None:
            self.on_dial_failed(code)

    def _arm_first_timer(self) -> None:
        if self.outcome is None:
            if self.idle_s > RELAY_TIMER_DEFER_S:
                _arm_later(self)
            else:
                self.arm_timer()

    # -- endings ---------------------------------------------------------------------------
    def _on_end(self, handle: Pump, code: int, way: int, first_eof: int) -> None:
        """The pump's end of a relay: both directions done (``code`` 0) or ``way`` failed."""
        self.handle = handle
        if not code:
            self.finish(RelayOutcome.COMPLETED, None, closed_termination("client" if first_eof == 0 else "pod"))
        elif way == CONNECT:
            self._dial_failed(code)
        else:
            self.failed(handle, OSError(code, os.strerror(code)), way)

    def failed(self, handle: Pump, exc: BaseException, way: int) -> None:
        """Direction ``way`` (0: client->pod) failed with ``exc``: both peers are reset."""
        self.handle = handle
        reading: Side = "pod" if way == 1 else "client"
        writing: Side = "client" if reading == "pod" else "pod"
        both_done = all(handle.done())
        # A side that closed normally (its FIN in, ours out) says nothing about a reset.
        client = None if both_done and way != 1 else tcp_state(self.client)
        pod = None if both_done and way != 0 else tcp_state(self.pod)
        termination = failure_termination(exc, client, pod, reading, writing)
        self.finish(RelayOutcome.RELAY_ERROR, describe(exc), termination, reset=True)

    def finish(
        self, outcome: RelayOutcome, error: str | None, termination: Termination, *, reset: bool = False
    ) -> None:
        if self.outcome is not None:
            return
        self.close(reset=reset)
        handle = self.handle  # its counts are final once it let go: ``unlink`` keeps them
        self.final = up, down, _ = handle.probe() if handle is not None else self.final
        result = self.outcome = RelayResult(up, down, outcome, error, termination)
        if self.on_result is not None:
            self.on_result(result)
        if self._future is not None:
            self._future.set_result(result)

    def probe(self) -> tuple[int, int, float]:
        """Bytes delivered so far each way and the last activity (read at any time)."""
        handle = self.handle
        return handle.probe() if handle is not None else self.final

    def _stop_timers(self) -> None:
        LIVE.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.timer_at = math.inf
        if self.connect_timer is not None:
            self.connect_timer.cancel()
            self.connect_timer = None

    def close(self, *, reset: bool) -> None:
        """Idempotent teardown: the pump lets go of the fds (and reports the last bytes) first,
        then the sockets close; ``reset`` makes both peers see RST instead of FIN."""
        self._stop_timers()
        handle, client, pod = self.handle, self.client, self.pod
        if handle is not None and self.engine is None:
            handle.close_fds(reset)  # the Python pump closes its socket objects, these same two
            return
        if handle is not None and side_fd(client) >= 0 and side_fd(pod) >= 0:
            # Both still open: the C engine closes them (which takes them out of its epoll set
            # without an epoll_ctl each). The sockets' objects give their fds up first.
            self.client, self.pod = given_up(client), given_up(pod)
            handle.close_fds(reset)
            return
        if handle is not None:
            handle.abort()
        self.client, self.pod = closed_side(client, reset=reset), closed_side(pod, reset=reset)

    def take_client(self) -> int:
        """The client's bare fd, which this relay forgets (a failed dial's client, to answer)."""
        fd = side_fd(self.client)
        self.client = given_up(self.client)
        return fd

    def _report(self, up: int, down: int) -> None:
        assert self.on_bytes is not None
        try:
            self.on_bytes(up, down)
        except Exception:
            log.exception("on_bytes callback failed; relay continues")

    def unlink(self) -> None:
        """Once over, keep only the final counts: the pump (and its engine) can go, and the callbacks (bound
        methods of the relay's owner, which holds the relay) no longer make a cycle for the collector."""
        if self.handle is not None:
            if self.outcome is None:  # else ``finish`` read the final counts already
                self.final = self.handle.probe()
            self.handle = None
        self.on_result = self.on_connected = self.on_dial_failed = None

    # -- the one timer: idle timeout and giving back quiet pipes -------------------------------
    def acquired(self) -> None:
        """A pipe (or buffer) was taken: make sure the timer fires in time to give it back."""
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
            # both engines' clock is CLOCK_MONOTONIC, which is time.monotonic() and the loop's
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


_YOUNG: PerLoop[list[Relay]] = PerLoop()
"""Per loop: relays started since the last shared arming callback, whose timer is not armed yet."""


def _arm_later(state: Relay) -> None:
    """Arm ``state``'s timer ``RELAY_TIMER_DEFER_S`` from now, with the relays that start meanwhile."""
    loop = state.loop
    young = _YOUNG.get(loop)
    if young is None:
        young = _YOUNG.add(loop, [])
        loop.call_later(RELAY_TIMER_DEFER_S, _arm_young, loop)
    young.append(state)


def _arm_young(loop: asyncio.AbstractEventLoop) -> None:
    for state in _YOUNG.pop(loop, ()):
        if not state.done() and state.timer is None:
            state.arm_timer()
