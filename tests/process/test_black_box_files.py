"""The black-box suite's list, ``tests/black_box_files.txt``: the test files whose routers run as
processes through the harness (``RouterProcess``, the QUIC-LB replicas, the chart scenario). CI runs
them again with ``STARGATE_TEST_ROUTER_WORKERS=2``, so a file missing from the list would never
meet ``--workers``; a listed file that starts no router would only cost time."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIST = ROOT / "tests" / "black_box_files.txt"
STARTS_THE_ROUTER = re.compile(r"\b(RouterProcess|quic_lb_replicas|chart_scenario)\b")
"""What a test file names when its router runs as a process started by the harness."""


def test_the_list_is_exactly_the_test_files_that_start_the_router() -> None:
    listed = LIST.read_text().split()
    found = sorted(
        path.relative_to(ROOT).as_posix() for path in (ROOT / "tests").rglob("test_*.py")
        if path != Path(__file__).resolve() and STARTS_THE_ROUTER.search(path.read_text())
    )
    assert listed == found
