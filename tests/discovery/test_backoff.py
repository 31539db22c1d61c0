"""Backoff: capped, doubling, jittered, never zero; resets after progress."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from discovery.backoff import Backoff
from discovery.constants import BACKOFF_INITIAL_S, BACKOFF_MAX_S


def test_delay_doubles_up_to_the_cap_with_no_jitter_at_the_top_of_the_range() -> None:
    backoff = Backoff(initial_s=1.0, max_s=8.0, random=lambda: 1.0)
    assert [backoff.next_delay() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert backoff.attempts == 6


def test_jitter_takes_at_most_half_the_delay_and_never_goes_below_initial() -> None:
    backoff = Backoff(initial_s=1.0, max_s=8.0, random=lambda: 0.0)
    assert [backoff.next_delay() for _ in range(5)] == [1.0, 1.0, 2.0, 4.0, 4.0]


def test_reset_starts_again_from_initial() -> None:
    backoff = Backoff(initial_s=0.5, max_s=30.0, random=lambda: 1.0)
    for _ in range(10):
        backoff.next_delay()
    backoff.reset()
    assert backoff.attempts == 0
    assert backoff.next_delay() == 0.5


def test_defaults_are_the_pinned_constants() -> None:
    backoff = Backoff(random=lambda: 1.0)
    assert backoff.next_delay() == BACKOFF_INITIAL_S
    for _ in range(100):
        delay = backoff.next_delay()
    assert delay == BACKOFF_MAX_S


@pytest.mark.parametrize("initial_s, max_s", [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0), (float("nan"), 1.0)])
def test_invalid_bounds_are_refused(initial_s: float, max_s: float) -> None:
    with pytest.raises(ValueError):
        Backoff(initial_s=initial_s, max_s=max_s)


@settings(deadline=None, max_examples=200)
@given(
    st.floats(min_value=0.001, max_value=10.0),
    st.floats(min_value=1.0, max_value=100.0),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=3000),
)
def test_delays_stay_within_initial_and_max_for_any_random_source(
    initial_s: float, factor: float, randoms: list[float],
) -> None:
    values = iter(randoms)
    backoff = Backoff(initial_s=initial_s, max_s=initial_s * factor, random=lambda: next(values))
    for _ in randoms:
        delay = backoff.next_delay()
        assert initial_s <= delay <= initial_s * factor
