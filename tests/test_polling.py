"""``tests.support.polling``: the waits the suite uses instead of fixed sleeps, and the rule that
no other test code sleeps on the clock."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from tests.support.polling import (
    becomes_true,
    becomes_true_blocking,
    eventually,
    eventually_blocking,
    holds,
    holds_blocking,
    steady,
    steady_blocking,
)


async def test_eventually_returns_once_true_and_takes_an_awaitable_check() -> None:
    calls = itertools.count()
    await eventually(lambda: next(calls) >= 3, 1.0, 0.001)

    async def scrape() -> bool:  # as a check that scrapes in a thread is awaited
        return next(calls) >= 6

    await eventually(scrape, 1.0, 0.001)


async def test_eventually_fails_naming_what_it_waited_for_with_the_last_state() -> None:
    seen = [0]
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for the count \(0\)"):
        await eventually(lambda: False, 0.05, 0.01, what=lambda: f"the count ({seen[0]})")
    assert not await becomes_true(lambda: False, 0.05, 0.01)
    with pytest.raises(AssertionError, match="the blocking one"):
        eventually_blocking(lambda: False, 0.05, 0.01, what="the blocking one")
    assert not becomes_true_blocking(lambda: False, 0.05, 0.01)


async def test_holds_polls_all_along_and_fails_at_the_first_false() -> None:
    calls = itertools.count()
    await holds(lambda: next(calls) >= 0, 0.05, 0.01)
    assert next(calls) >= 2  # checked at the start and again once the window is over
    flips = itertools.count()
    with pytest.raises(AssertionError, match="no second line stopped holding"):
        await holds(lambda: next(flips) < 2, 5.0, 0.001, what="no second line")
    with pytest.raises(AssertionError):
        holds_blocking(lambda: False, 5.0)


async def test_steady_returns_the_value_once_it_stopped_changing() -> None:
    readings = iter([1, 2, 3])
    assert await steady(lambda: next(readings, 3), 0.03, 1.0, 0.005) == 3
    readings = iter([5, 6])
    assert steady_blocking(lambda: next(readings, 6), 0.03, 1.0, 0.005) == 6
    ticks = itertools.count()
    with pytest.raises(AssertionError, match="the counter to settle"):
        await steady(lambda: next(ticks), 0.05, 0.1, 0.001, what="the counter to settle")


TESTS = Path(__file__).resolve().parent
POLLING = TESTS / "support" / "polling.py"


def test_no_test_code_but_the_polling_module_sleeps() -> None:
    """A wait is for a condition (``eventually``, ``steady``), a window in which something must not
    happen (``holds``) or time that is itself the behaviour (``deliberate_pause``, its reason in the
    call): a bare ``sleep`` says none of these, so none is left outside ``tests/support/polling.py``."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == POLLING:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name == "sleep":
                    found.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}")
    assert found == [], "sleeps outside tests/support/polling.py (wait on a condition instead): " + ", ".join(found)
