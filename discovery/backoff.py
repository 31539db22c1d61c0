"""Capped exponential backoff with jitter for API retries: never a hot loop, never a herd.

Pure: the random source is injected, and the caller does the sleeping.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable

from discovery.constants import BACKOFF_INITIAL_S, BACKOFF_MAX_S, RETRY_AFTER_JITTER, RETRY_AFTER_MIN_S


class Backoff:
    """Delays in [initial_s, max_s]: the n-th is drawn from [d/2, d] with d = initial_s * 2**n (capped).
    The floor d/2 keeps a retry from being immediate; the jitter keeps routers out of lockstep."""

    def __init__(
        self,
        initial_s: float = BACKOFF_INITIAL_S,
        max_s: float = BACKOFF_MAX_S,
        random: Callable[[], float] = _random.random,
    ) -> None:
        if not initial_s > 0:
            raise ValueError(f"Backoff initial_s must be > 0, got {initial_s!r}")
        if not max_s >= initial_s:
            raise ValueError(f"Backoff max_s must be >= initial_s ({initial_s!r}), got {max_s!r}")
        self._initial_s = float(initial_s)
        self._max_s = float(max_s)
        self._random = random
        self._attempts = 0
        self._ceiling_s = self._initial_s

    @property
    def attempts(self) -> int:
        """Delays handed out since the last reset."""
        return self._attempts

    def next_delay(self) -> float:
        """The delay before the next retry; each call doubles the ceiling up to max_s."""
        ceiling = self._ceiling_s
        r = float(self._random())
        if not 0.0 <= r <= 1.0:  # a bad random source (NaN, out of range) cannot escape the bounds
            r = 1.0
        delay = min(self._max_s, max(self._initial_s, ceiling * (0.5 + 0.5 * r)))
        self._attempts += 1
        self._ceiling_s = min(self._max_s, ceiling * 2)  # capped, so it never overflows
        return delay

    def reset(self) -> None:
        """After progress: the next failure starts again from initial_s."""
        self._attempts = 0
        self._ceiling_s = self._initial_s


def retry_after_delay(
    retry_after_s: float, max_s: float = BACKOFF_MAX_S, random: Callable[[], float] = _random.random,
) -> float:
    """What a server's ``Retry-After`` asks for, capped at ``max_s`` and stretched by up to
    RETRY_AFTER_JITTER: never earlier than asked (below the cap), never in lockstep."""
    r = float(random())
    if not 0.0 <= r <= 1.0:
        r = 1.0
    if not retry_after_s >= 0:  # NaN
        retry_after_s = 0.0
    base = min(max(retry_after_s, RETRY_AFTER_MIN_S), max_s)
    return base * (1.0 + RETRY_AFTER_JITTER * r)
