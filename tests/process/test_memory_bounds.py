"""The QUIC tables' bounds sized to the cgroup's memory limit: the pure rule, the read of
``memory.max``, and the router that applies them and says so at start."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from router import constants as c
from router.app import RouterApp
from router.config import config_from_args
from router.memory_bounds import (
    PENDING_FLOW_WORST_BYTES,
    MemoryBounds,
    MemoryLimitError,
    bounds_at_start,
    bounds_for,
    parse_memory_max,
    read_memory_limit,
)
from tests.support.router_process import write_endpoints

MIB = 1024 * 1024
CHART_LIMIT = 256 * MIB
"""The Rust router's chart: ``resources.limits.memory: 256Mi``."""


def worst_case(bounds: MemoryBounds) -> int:
    """Bytes one process may hold with both tables full: the baseline plus every flow at its worst."""
    return (c.MEMORY_BASELINE_BYTES + bounds.max_pending_flows * PENDING_FLOW_WORST_BYTES
            + bounds.max_flows * c.QUIC_FLOW_WORST_BYTES)


def test_no_limit_keeps_the_defaults() -> None:
    bounds = bounds_for(None)
    assert (bounds.max_pending_flows, bounds.max_flows) == (c.QUIC_MAX_PENDING_FLOWS, c.QUIC_MAX_FLOWS)
    assert worst_case(bounds) > 200 * MIB  # why the limit matters: the defaults do not fit the chart


def test_under_the_charts_256_mib_both_tables_full_stay_under_200_mib() -> None:
    bounds = bounds_for(CHART_LIMIT)
    assert bounds.max_pending_flows < c.QUIC_MAX_PENDING_FLOWS and bounds.max_flows < c.QUIC_MAX_FLOWS
    assert worst_case(bounds) <= c.MEMORY_USABLE_FRACTION * CHART_LIMIT < 200 * MIB
    assert bounds.max_pending_flows >= 512 and bounds.max_flows >= 8192  # still room for a real fleet


def test_workers_share_the_limit() -> None:
    alone, shared = bounds_for(CHART_LIMIT), bounds_for(CHART_LIMIT, workers=2)
    assert shared.max_flows < alone.max_flows and shared.workers == 2
    assert 2 * worst_case(shared) <= c.MEMORY_USABLE_FRACTION * CHART_LIMIT


def test_a_tiny_limit_still_routes_a_few_and_a_huge_one_never_raises_a_default() -> None:
    tiny = bounds_for(16 * MIB)
    assert (tiny.max_pending_flows, tiny.max_flows) == (c.MIN_QUIC_PENDING_FLOWS, c.MIN_QUIC_FLOWS)
    huge = bounds_for(1 << 40)
    assert (huge.max_pending_flows, huge.max_flows) == (c.QUIC_MAX_PENDING_FLOWS, c.QUIC_MAX_FLOWS)


@given(st.integers(min_value=1, max_value=1 << 42), st.integers(min_value=1, max_value=64))
@example(936_891_734, 10)  # the pending table at its floor, the flows above theirs: the flows pay for it
def test_the_worst_case_fits_the_usable_share_unless_only_the_floors_are_left(limit: int, workers: int) -> None:
    bounds = bounds_for(limit, workers)
    floors = (bounds.max_pending_flows, bounds.max_flows) == (c.MIN_QUIC_PENDING_FLOWS, c.MIN_QUIC_FLOWS)
    assert floors or workers * worst_case(bounds) <= c.MEMORY_USABLE_FRACTION * limit + workers
    assert bounds_for(limit * 2, workers).max_flows >= bounds.max_flows  # more memory, never fewer


@pytest.mark.parametrize(("text", "limit"), [("max\n", None), ("268435456\n", CHART_LIMIT), (" 4096 ", 4096)])
def test_memory_max_is_max_or_bytes(text: str, limit: int | None) -> None:
    assert parse_memory_max(text) == limit


@pytest.mark.parametrize("text", ["", "0", "-1", "256Mi", "max max", "1e9"])
def test_malformed_memory_max_is_our_error(text: str) -> None:
    with pytest.raises(MemoryLimitError):
        parse_memory_max(text)


def test_an_absent_memory_max_is_no_limit(tmp_path: Path) -> None:
    assert read_memory_limit(str(tmp_path / "memory.max")) is None


def limit_file(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "memory.max"
    path.write_text(text)
    return {c.CGROUP_MEMORY_MAX_PATH_ENV: str(path)}


def test_the_start_line_says_what_was_chosen_from_which_file(tmp_path: Path) -> None:
    env = limit_file(tmp_path, "268435456\n")
    bounds, line = bounds_at_start(1, env)
    assert bounds == bounds_for(CHART_LIMIT)
    assert line == (f"memory limit: 256 MiB ({env[c.CGROUP_MEMORY_MAX_PATH_ENV]}); "
                    f"QUIC pending flows <= {bounds.max_pending_flows}, QUIC flows <= {bounds.max_flows}")
    bounds, line = bounds_at_start(2, env)
    assert bounds == bounds_for(CHART_LIMIT, 2) and line.endswith("per worker of 2")


def test_max_or_an_unreadable_limit_keeps_the_defaults_and_says_so(tmp_path: Path) -> None:
    bounds, line = bounds_at_start(1, limit_file(tmp_path, "max\n"))
    assert bounds == MemoryBounds() and line.startswith("memory limit: none (") and "(the defaults)" in line
    bounds, line = bounds_at_start(1, limit_file(tmp_path, "lots\n"))
    assert bounds == MemoryBounds() and "expected 'max' or a number of bytes" in line and "kept" in line


def test_the_router_sizes_its_quic_tables_to_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in limit_file(tmp_path, "268435456\n").items():
        monkeypatch.setenv(name, value)
    endpoints = tmp_path / "endpoints.json"
    write_endpoints(endpoints, [])
    app = RouterApp(config_from_args(["--endpoints-file", str(endpoints)], environ={"POD_NAMESPACE": "x"}))
    expected = bounds_for(CHART_LIMIT)
    assert app.memory == expected
    limits = app.udp.settings.limits
    assert (limits.max_pending_flows, limits.max_flows) == (expected.max_pending_flows, expected.max_flows)
