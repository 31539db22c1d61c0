"""``python -m bench`` output paths: checked before the first scenario, never losing a run after.

A fake one-row scenario stands in for the real ones (``bench.cli._scenarios`` is replaced), so
these take seconds; the bad-path cases go through the real command, which exits before any
scenario starts.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from bench import cli
from bench.context import BenchContext
from bench.results import Row

REPO = Path(__file__).resolve().parents[2]
FAKE_ROW = Row("fake_figure", "rate", "ops/s", 42.0, direct=50.0)


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", "--only", "discovery", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def fake_scenario(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Callable[[], None]]:
    """Replace every scenario by one that returns ``FAKE_ROW`` after running the hooks the test
    appends (things to check or break mid-run); scratch files go under ``tmp_path``."""
    hooks: list[Callable[[], None]] = []

    def fake(ctx: BenchContext) -> list[Row]:
        for hook in hooks:
            hook()
        return [FAKE_ROW]

    monkeypatch.setattr(cli, "_scenarios", lambda: {"fake": fake})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return hooks


@pytest.mark.parametrize(("option", "bad_path"), [
    ("--markdown", "/dev/null/plots/table.md"),
    ("--json", "/dev/null/bench.json"),
    ("--json", "/"),
    ("--plot", "/dev/null"),
])
def test_a_bad_output_path_is_one_line_naming_the_option_before_any_scenario(option: str, bad_path: str) -> None:
    proc = run_bench(option, bad_path)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"python -m bench: {option}: ")
    assert proc.stdout == ""


def test_missing_output_directories_exist_before_the_first_scenario(
    tmp_path: Path, fake_scenario: list[Callable[[], None]], capsys: pytest.CaptureFixture[str],
) -> None:
    json_out, markdown_out, plots = tmp_path / "a" / "bench.json", tmp_path / "b" / "c" / "table.md", tmp_path / "p"
    seen: list[bool] = []
    fake_scenario.append(lambda: seen.append(json_out.parent.is_dir() and markdown_out.parent.is_dir()
                                             and plots.is_dir()))
    status = cli.main(["--json", str(json_out), "--markdown", str(markdown_out), "--plot", str(plots)])
    assert status == 0, capsys.readouterr().err
    assert seen == [True]
    assert json.loads(json_out.read_text())["scenarios"][0]["name"] == "fake_figure"
    assert "fake_figure" in markdown_out.read_text()
    assert (plots / "fake_figure.png").stat().st_size > 0


def test_an_output_that_fails_after_the_run_goes_to_a_scratch_file_named_on_stderr(
    tmp_path: Path, fake_scenario: list[Callable[[], None]], capsys: pytest.CaptureFixture[str],
) -> None:
    json_out, markdown_dir = tmp_path / "bench.json", tmp_path / "md"
    markdown_out = markdown_dir / "table.md"

    def break_markdown_path() -> None:  # the directory vanishes mid-run; a file takes its name
        markdown_dir.rmdir()
        markdown_dir.write_text("not a directory")

    fake_scenario.append(break_markdown_path)
    status = cli.main(["--json", str(json_out), "--markdown", str(markdown_out)])
    err = capsys.readouterr().err
    assert status == 1
    assert json.loads(json_out.read_text())["scenarios"][0]["router"] == 42.0  # the other output is written
    found = re.search(r"bench: --markdown: could not write (\S+) \(.*\); wrote it to (\S+) instead", err)
    assert found, err
    assert found[1] == str(markdown_out)
    scratch = Path(found[2])
    assert scratch.parent == tmp_path and "fake_figure" in scratch.read_text()
    assert f"bench: --json: wrote {json_out}" in err
