"""Rejection logs that a flood cannot turn into a log flood.

Every rejection is worth a line at info, but a slowloris or an Initial flood would then
write one line per attempt. ``RateLimitedLog`` passes ``burst`` lines per second per
logger and counts the rest; the next line that passes says how many were suppressed.
Metrics still count every event: the log is for reading, the counters are for totals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from router import constants as c
from router.logging_setup import EVENT_FIELDS


class RateLimitedLog:
    """A token bucket in front of one logger (time injectable for tests)."""

    def __init__(
        self,
        logger: logging.Logger,
        per_second: float = c.REJECTION_LOG_LINES_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._rate = per_second
        self._clock = clock
        self._tokens = per_second
        self._stamp = clock()
        self.suppressed = 0

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
        self._tokens = min(self._rate, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        if self._tokens < 1.0:
            self.suppressed += 1
            return False
        self._tokens -= 1.0
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
