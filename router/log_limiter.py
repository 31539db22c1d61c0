"""Rejection logs that a flood cannot turn into a log flood.

A slowloris or an Initial flood would otherwise write one line per attempt. Lines over the rate are
counted (``dropped``) and the next line written says how many; metrics still count every event: the log
is for reading, the counters are for totals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from router import constants as c
from router.logging_setup import EVENT_FIELDS
from router.metric_families import CounterSeries


class RateLimitedLog:
    """A token bucket in front of one logger (time injectable for tests)."""

    __slots__ = ("_clock", "_dropped", "_logger", "_rate", "_stamp", "_tokens", "suppressed")

    def __init__(
        self,
        logger: logging.Logger,
        per_second: float = c.REJECTION_LOG_LINES_PER_S,
        clock: Callable[[], float] = time.monotonic,
        dropped: CounterSeries | None = None,
    ) -> None:
        self._logger = logger
        self._rate = per_second
        self._clock = clock
        self._tokens = per_second
        self._stamp = clock()
        self._dropped = dropped
        """Where every suppressed line is counted too (the next line's ``suppressed`` restarts from 0)."""
        self.suppressed = 0
        """Lines held back since the last one written."""

    def log(
        self, level: int, msg: str, *args: Any, extra: dict[str, Any] | None = None,
        exc_info: BaseException | bool | None = None,
    ) -> bool:
        """Log unless over the rate; returns whether the line was written. ``exc_info``: an exception, or
        True for the one being handled, whose traceback the line carries (only if admitted)."""
        if not self._logger.isEnabledFor(level) or not self.admit():
            return False
        self.write(level, msg, *args, extra=extra, exc_info=exc_info)
        return True

    def admit(self) -> bool:
        """Take a token, or count one more suppressed line: callers whose lines are costly to
        build ask first and ``write`` only when admitted."""
        now = self._clock()
        rate = self._rate
        tokens = self._tokens + (now - self._stamp) * rate  # (no min(): this runs once per access line)
        self._stamp = now
        if tokens > rate:
            tokens = rate
        if tokens < 1.0:
            self._tokens = tokens
            self.suppressed += 1
            if self._dropped is not None:
                self._dropped.inc()
            return False
        self._tokens = tokens - 1.0
        return True

    def write(
        self, level: int, msg: str, *args: Any, extra: dict[str, Any] | None = None,
        exc_info: BaseException | bool | None = None,
    ) -> None:
        """Write an admitted line; it carries the count of the lines suppressed since the last one."""
        if self.suppressed:
            event = (extra or {}).get(EVENT_FIELDS)
            if isinstance(event, dict):  # a line passed as one dict: the count joins its fields
                event["suppressed"] = self.suppressed
            else:
                extra = {**(extra or {}), "suppressed": self.suppressed}
            self.suppressed = 0
        self._logger.log(level, msg, *args, extra=extra, exc_info=exc_info)

    def info(self, msg: str, *args: Any, extra: dict[str, Any] | None = None) -> bool:
        return self.log(logging.INFO, msg, *args, extra=extra)
