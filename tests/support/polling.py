"""Waiting for a condition in async tests, bounded: convergence is asserted, never slept on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

EVENTUALLY_TIMEOUT_S = 5.0
"""Default bound: far under pytest's timeout, far over any in-process convergence on loopback."""
EVENTUALLY_INTERVAL_S = 0.02
"""Poll period: short enough not to slow a test, long enough to leave the loop to the code under test."""


def _misses(check: Callable[[], object], timeout_s: float, what: str) -> Iterator[None]:
    """Yield once per false ``check`` (the caller sleeps, as its world allows); fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        yield


async def eventually(
    check: Callable[[], object],
    timeout_s: float = EVENTUALLY_TIMEOUT_S,
    interval_s: float = EVENTUALLY_INTERVAL_S,
    *,
    what: str = "the condition",
) -> None:
    """Poll ``check`` (cheap, in-process) until it is true; fail naming ``what`` after ``timeout_s``."""
    for _ in _misses(check, timeout_s, what):
        await asyncio.sleep(interval_s)


def eventually_blocking(
    check: Callable[[], object],
    timeout_s: float = EVENTUALLY_TIMEOUT_S,
    interval_s: float = EVENTUALLY_INTERVAL_S,
    *,
    what: str = "the condition",
) -> None:
    """``eventually`` for synchronous tests (a router process, grpcio's blocking calls)."""
    for _ in _misses(check, timeout_s, what):
        time.sleep(interval_s)
