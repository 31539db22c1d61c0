"""Byte relay between a routed client socket and its pod socket: the router's hot path.

Why it looks like this:

* Readiness callbacks on raw fds, not streams: no transport buffers, no per-chunk ``bytes``,
  and it runs the same on asyncio and uvloop. The fds are watched through one epoll set per
  loop (``poller``), which costs a watch one ``epoll_ctl`` instead of uvloop's handle set-up.
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
  timeout and that release; it is first armed ``RELAY_TIMER_DEFER_S`` after the start by one
  callback shared by the relays that started meanwhile, so short connections never make one.
* When the optional C extension is built, the same pump runs in C (``native_relay``; one call
  per wake-up for every ready relay) and only the policy above stays here; h2c, whose client
  bytes the SETTINGS-ACK stripper must see first, keeps this Python pump.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import os
import socket
from collections.abc import Callable
from typing import Final

from router.constants import RELAY_RELEASE_QUIET_S, RELAY_TIMER_DEFER_S
from router.outcomes import Termination
from router.tcp.ending import Side, closed_termination, failure_termination, tcp_state
from router.tcp.native_relay import NativeRelay, engine_for
from router.tcp.poller import poller_for
from router.tcp.pump import READ, Direction
from router.tcp.relay_common import (
    LIVE,
    TIMER_SLACK_S,
    RelayOutcome,
    RelayProbe,
    RelayResult,
    RelayState,
    arm_later,
    close_sockets,
    live_relays,
)

__all__ = [
    "SPLICE_AVAILABLE", "RelayOutcome", "RelayProbe", "RelayResult", "RelayState", "live_relays", "relay",
]

log = logging.getLogger("router.relay")  # pinned: operators filter logs by this name

SPLICE_AVAILABLE: Final = hasattr(os, "splice")
"""``os.splice`` exists (Linux, Python >= 3.10): the auto mode uses it."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return f"{type(exc).__name__}: {exc}"


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
        self.poller = poller_for(loop)
        self.client, self.pod = client, pod
        now = loop.time()
        self.c2p = Direction(self, client, pod, splice, now)
        self.p2c = Direction(self, pod, client, splice, now)
        self.idle_s = idle_timeout_s if idle_timeout_s > 0 and math.isfinite(idle_timeout_s) else math.inf
        self.on_bytes = on_bytes
        self.future: asyncio.Future[RelayResult] = loop.create_future()
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        self.first_eof: Side | None = None
        self.termination = Termination.ROUTER_ERROR
        self.final: tuple[int, int, float] | None = None
        """The probe's answer once the relay is over (``unlink``)."""

    def start(
        self,
        initial: bytes,
        client_filter: Callable[[bytes], bytes] | None,
        client_filter_done: Callable[[], bool] | None,
    ) -> None:
        LIVE.add(self)
        c2p = self.c2p
        c2p.filter, c2p.filter_done = client_filter, client_filter_done
        if client_filter is not None or initial:
            c2p.splice = False  # buffered until the filter is done and the peeked bytes are out
        if initial:
            c2p.set_pending(client_filter(initial) if client_filter is not None else initial)
        if self.idle_s > RELAY_TIMER_DEFER_S:
            arm_later(self)
        else:
            self.arm_timer()
        if c2p.pending:
            c2p.write_initial()  # usually written at once, no poller round
        elif not self.future.done():
            c2p.set_want(READ)
        if not self.future.done():
            self.p2c.set_want(READ)

    # -- endings ---------------------------------------------------------------------------
    def other_done(self, direction: Direction) -> bool:
        return (self.p2c if direction is self.c2p else self.c2p).done

    def direction_done(self) -> None:
        if self.first_eof is None:
            self.first_eof = "client" if self.c2p.done else "pod"
        if self.c2p.done and self.p2c.done:
            self.finish(RelayOutcome.COMPLETED, None, closed_termination(self.first_eof))

    def fail(self, exc: BaseException, direction: Direction | None = None) -> None:
        reading: Side = "pod" if direction is self.p2c else "client"
        writing: Side = "client" if reading == "pod" else "pod"
        client = self._state_if_open(self.client, self.c2p, self.p2c, direction)
        pod = self._state_if_open(self.pod, self.p2c, self.c2p, direction)
        termination = failure_termination(exc, client, pod, reading, writing)
        self.finish(RelayOutcome.RELAY_ERROR, _describe(exc), termination, reset=True)

    @staticmethod
    def _state_if_open(
        sock: socket.socket, incoming: Direction, outgoing: Direction, failing: Direction | None
    ) -> int | None:
        """A side's TCP state, or None once it closed normally (its FIN in, ours out): then its
        ``TCP_CLOSE`` says nothing about a reset."""
        if incoming.done and outgoing.done and outgoing is not failing:
            return None
        return tcp_state(sock)

    def finish(
        self, outcome: RelayOutcome, error: str | None, termination: Termination, *, reset: bool = False
    ) -> None:
        if self.future.done():
            return
        self.termination = termination
        self.close(reset=reset)
        self.report()
        self.future.set_result(self.result(outcome, error))

    def unlink(self) -> None:
        """Once over, break the relay <-> direction cycle: the connection's objects (sockets
        included) are freed at once by reference counting instead of by a GC pass. The probe
        keeps answering with the final counts."""
        self.final = self.probe()
        del self.c2p, self.p2c

    def result(self, outcome: RelayOutcome, error: str | None) -> RelayResult:
        return RelayResult(self.c2p.sent, self.p2c.sent, outcome, error, self.termination)

    def probe(self) -> tuple[int, int, float]:
        """Bytes delivered so far each way and the last activity (read at any time)."""
        if self.final is not None:
            return self.final
        c2p, p2c = self.c2p, self.p2c
        return c2p.sent, p2c.sent, max(c2p.last, p2c.last)

    def close(self, *, reset: bool) -> None:
        """Idempotent teardown; ``reset`` makes both peers see RST instead of FIN."""
        LIVE.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.timer_at = math.inf
        self.c2p.close()
        self.p2c.close()
        close_sockets(self.client, self.pod, reset=reset)

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
            self.arm_timer()

    def arm_timer(self) -> None:
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
        now = self.loop.time() + TIMER_SLACK_S
        if now - max(self.c2p.last, self.p2c.last) >= self.idle_s:
            self.finish(RelayOutcome.IDLE_TIMEOUT, None, Termination.IDLE_TIMEOUT)
            return
        for d in (self.c2p, self.p2c):
            if not d.pending and d.held() and now - d.last >= RELAY_RELEASE_QUIET_S:
                d.release()
        self.arm_timer()

    def done(self) -> bool:
        return self.future.done()

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
    on_start: Callable[[RelayProbe], None] | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
    native: bool | None = None,
) -> RelayResult:
    """Relay bytes both ways until both sides finish, one fails, or both are idle too long.

    Owns both (connected, non-blocking) sockets from the call on and closes them before
    returning or when cancelled (then with RST, and CancelledError is re-raised).
    ``initial_to_pod`` are client bytes already read by the peek; ``client_filter`` sees every
    client->pod byte until ``client_filter_done()`` is True. ``idle_timeout_s <= 0`` disables
    the idle timeout. ``on_start`` gets the relay's live byte counts (``RelayProbe``) as it starts
    (before it is awaited). ``loop`` is the running loop, if the caller has it at hand (saves a ``getpid``
    system call). ``native``: pump in C (``native_relay``; None: when it is built and
    ``NO_EXTENSIONS_ENV`` is unset, True: it must be, False: never); a client filter always
    runs on the Python pump.
    """
    if loop is None:
        loop = asyncio.get_running_loop()
    if use_splice and not SPLICE_AVAILABLE:
        client.close()
        pod.close()
        raise ValueError("use_splice=True but os.splice is not available here")
    splice = SPLICE_AVAILABLE if use_splice is None else use_splice
    engine = engine_for(loop, native) if client_filter is None else None
    state: _Relay | NativeRelay
    if engine is not None:
        state = NativeRelay(loop, engine, client, pod, splice, idle_timeout_s, on_bytes)
    else:
        state = _Relay(loop, client, pod, splice, idle_timeout_s, on_bytes)
        if on_start is not None:
            on_start(state.probe)
    try:
        if isinstance(state, NativeRelay):
            handle = state.start(initial_to_pod)
            if on_start is not None:
                on_start(handle.probe)
        else:
            state.start(initial_to_pod, client_filter, client_filter_done)
        return await state.future
    except BaseException as exc:  # cancelled (drain timeout) or a bug: cut both ends with RST
        state.close(reset=True)
        state.report()
        if isinstance(exc, Exception):
            return state.result(RelayOutcome.RELAY_ERROR, _describe(exc))
        raise
    finally:
        state.unlink()
