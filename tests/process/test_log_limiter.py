"""The rejection log limiter: a burst passes, a flood is counted, the count is reported."""

from __future__ import annotations

import logging

import pytest

from router.log_limiter import RateLimitedLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_is_cut_to_the_rate_and_the_next_line_reports_what_was_suppressed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    limiter = RateLimitedLog(logging.getLogger("limited"), per_second=5, clock=clock)
    with caplog.at_level(logging.INFO, logger="limited"):
        written = sum(limiter.info("rejected %d", i) for i in range(1000))
        assert written == 5
        assert limiter.suppressed == 995
        clock.now += 1.0
        assert limiter.info("rejected again")
    assert len(caplog.records) == 6
    assert caplog.records[-1].suppressed == 995  # type: ignore[attr-defined]
    assert limiter.suppressed == 0


def test_nothing_is_counted_when_the_level_is_disabled() -> None:
    logger = logging.getLogger("quiet")
    logger.setLevel(logging.WARNING)
    limiter = RateLimitedLog(logger, per_second=1, clock=Clock())
    assert not limiter.info("x")
    assert limiter.suppressed == 0


def test_an_admitted_line_carries_the_traceback_being_handled_and_a_suppressed_one_costs_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    limiter = RateLimitedLog(logging.getLogger("bugs"), per_second=1, clock=clock)
    with caplog.at_level(logging.ERROR, logger="bugs"):
        for n in range(3):
            try:
                raise ValueError(f"bug {n}")
            except ValueError:
                limiter.log(logging.ERROR, "unexpected error %d", n, exc_info=True)
    assert [(r.getMessage(), str(r.exc_info[1]) if r.exc_info else None) for r in caplog.records] == [
        ("unexpected error 0", "bug 0")
    ]
    assert limiter.suppressed == 2
