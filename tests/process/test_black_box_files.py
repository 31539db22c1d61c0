"""The black-box suite's list, ``tests/black_box_files.txt``: the test files whose routers run as
processes through the harness (``RouterProcess``, the QUIC-LB replicas, the chart scenario). CI runs
them again with ``STARGATE_TEST_ROUTER_WORKERS=2``, so a file missing from the list would never
meet ``--workers``; a listed file that starts no router would only cost time. And what that
variable adds to a router's args."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.router_process import SUITE_WORKERS_ENV, suite_workers_args, workers_in

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


@pytest.mark.parametrize(
    ("env", "args", "one_process", "added"),
    [
        ("", ["--log-format", "json"], "", []),
        ("2", ["--log-format", "json"], "", ["--workers", "2"]),
        ("2", ["--workers", "3"], "", []),
        ("2", ["--workers=1"], "", []),
        ("2", [], "fills one process's fd limit", []),
    ],
    ids=["unset", "set", "args-choose", "args-choose-equals", "one-process"],
)
def test_the_suite_adds_workers_only_where_the_test_leaves_the_choice(
    monkeypatch: pytest.MonkeyPatch, env: str, args: list[str], one_process: str, added: list[str]
) -> None:
    monkeypatch.setenv(SUITE_WORKERS_ENV, env)
    assert suite_workers_args(args, one_process) == added


def test_a_bad_workers_value_is_named_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SUITE_WORKERS_ENV, "two")
    with pytest.raises(ValueError, match=SUITE_WORKERS_ENV):
        suite_workers_args([])


def test_the_last_workers_flag_counts_as_argparse_keeps_it() -> None:
    assert (workers_in([]), workers_in(["--workers", "2"]), workers_in(["--workers=4", "--workers", "3"])) == (1, 2, 3)
