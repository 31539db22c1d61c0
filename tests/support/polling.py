"""Waiting in tests, bounded: convergence is asserted, never slept on.

The only module that sleeps on the clock for a test. What each helper is for:

* ``eventually`` / ``eventually_blocking``: wait until a condition is true, fail after a bound;
* ``becomes_true`` / ``becomes_true_blocking``: the same wait for a caller that judges the
  outcome itself (a harness that records it, raises its own error, or reads a count after);
* ``steady`` / ``steady_blocking``: wait until a reading stops changing (a stalled sender, a
  drained queue) when nothing but its standing still tells the state;
* ``holds`` / ``holds_blocking``: a deliberate window in which something must NOT happen
  (no second line, no re-watch, no sweep): the condition is polled all along and fails at once;
* ``deliberate_pause`` / ``deliberate_pause_blocking``: a sleep that IS the behaviour under test
  (an outage, a slow client's gap, a flood's pacing), with its reason in the call.

The async helpers take a ``check`` that returns a value or an awaitable (a scrape run in a
thread); ``what`` names the condition in a failure, as a string or a function that describes
the last state seen.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

EVENTUALLY_TIMEOUT_S = 5.0
"""Default bound: far under pytest's timeout, far over any in-process convergence on loopback."""
EVENTUALLY_INTERVAL_S = 0.02
"""Poll period: short enough not to slow a test, long enough to leave the loop to the code under test."""

Check = Callable[[], object]
What = str | Callable[[], str]


def _describe(what: What) -> str:
    return what() if callable(what) else what


async def _value(check: Callable[[], object]) -> object:
    result = check()
    if inspect.isawaitable(result):
        result = await result
    return result


async def becomes_true(
    check: Check, timeout_s: float = EVENTUALLY_TIMEOUT_S, interval_s: float = EVENTUALLY_INTERVAL_S,
) -> bool:
    """Poll ``check`` until it is true (True) or ``timeout_s`` has passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not await _value(check):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval_s)
    return True


def becomes_true_blocking(
    check: Check, timeout_s: float = EVENTUALLY_TIMEOUT_S, interval_s: float = EVENTUALLY_INTERVAL_S,
) -> bool:
    """``becomes_true`` for synchronous code (a router process, grpcio's blocking calls)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


async def eventually(
    check: Check,
    timeout_s: float = EVENTUALLY_TIMEOUT_S,
    interval_s: float = EVENTUALLY_INTERVAL_S,
    *,
    what: What = "the condition",
) -> None:
    """Poll ``check`` (cheap, in-process, or awaitable) until it is true; fail naming ``what`` after ``timeout_s``."""
    if not await becomes_true(check, timeout_s, interval_s):
        raise AssertionError(f"timed out after {timeout_s} s waiting for {_describe(what)}")


def eventually_blocking(
    check: Check,
    timeout_s: float = EVENTUALLY_TIMEOUT_S,
    interval_s: float = EVENTUALLY_INTERVAL_S,
    *,
    what: What = "the condition",
) -> None:
    """``eventually`` for synchronous tests (a router process, grpcio's blocking calls)."""
    if not becomes_true_blocking(check, timeout_s, interval_s):
        raise AssertionError(f"timed out after {timeout_s} s waiting for {_describe(what)}")


class _Settling(Generic[T]):
    """A reading watched until it has stood still for ``quiet_s``: the state both ``steady`` loops share."""

    def __init__(self, first: T, quiet_s: float, timeout_s: float, what: What) -> None:
        self.last, self.since = first, time.monotonic()
        self._quiet_s, self._timeout_s, self._deadline, self._what = quiet_s, timeout_s, self.since + timeout_s, what

    def settled(self) -> bool:
        """True once the reading stood still for ``quiet_s``; fails once ``timeout_s`` has passed."""
        if time.monotonic() - self.since >= self._quiet_s:
            return True
        if time.monotonic() > self._deadline:
            raise AssertionError(
                f"timed out after {self._timeout_s} s waiting for {_describe(self._what)} (last {self.last!r})")
        return False

    def saw(self, value: T) -> None:
        if value != self.last:
            self.last, self.since = value, time.monotonic()


async def steady(
    read: Callable[[], T],
    quiet_s: float,
    timeout_s: float = EVENTUALLY_TIMEOUT_S,
    interval_s: float = EVENTUALLY_INTERVAL_S,
    *,
    what: What = "the reading to settle",
) -> T:
    """The value of ``read()`` once it has stayed the same for ``quiet_s``; fail after ``timeout_s``."""
    settling = _Settling(read(), quiet_s, timeout_s, what)
    while not settling.settled():
        await asyncio.sleep(interval_s)
        settling.saw(read())
    return settling.last


def steady_blocking(
    read: Callable[[], T],
    quiet_s: float,
    timeout_s: float = EVENTUALLY_TIMEOUT_S,
    interval_s: float = EVENTUALLY_INTERVAL_S,
    *,
    what: What = "the reading to settle",
) -> T:
    """``steady`` for synchronous tests."""
    settling = _Settling(read(), quiet_s, timeout_s, what)
    while not settling.settled():
        time.sleep(interval_s)
        settling.saw(read())
    return settling.last


async def holds(
    check: Check, for_s: float, interval_s: float = EVENTUALLY_INTERVAL_S, *, what: What = "the condition",
) -> None:
    """A deliberate wait of ``for_s`` in which ``check`` must stay true (what must not happen gets
    its chance to); checked all along, it fails at the first false."""
    started = time.monotonic()
    while True:
        if not await _value(check):
            raise AssertionError(f"{_describe(what)} stopped holding after {time.monotonic() - started:.2f} s")
        left = started + for_s - time.monotonic()
        if left < 0:
            return
        await asyncio.sleep(min(interval_s, left))


def holds_blocking(
    check: Check, for_s: float, interval_s: float = EVENTUALLY_INTERVAL_S, *, what: What = "the condition",
) -> None:
    """``holds`` for synchronous tests."""
    started = time.monotonic()
    while True:
        if not check():
            raise AssertionError(f"{_describe(what)} stopped holding after {time.monotonic() - started:.2f} s")
        left = started + for_s - time.monotonic()
        if left < 0:
            return
        time.sleep(min(interval_s, left))


async def deliberate_pause(seconds: float, why: str) -> None:
    """Let ``seconds`` pass on purpose: the passing time is the behaviour under test, ``why`` says how."""
    del why  # for the reader of the call
    await asyncio.sleep(seconds)


def deliberate_pause_blocking(seconds: float, why: str) -> None:
    """``deliberate_pause`` for synchronous tests."""
    del why
    time.sleep(seconds)
