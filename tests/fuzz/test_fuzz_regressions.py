"""Every input the fuzzer saved in ``tests/fuzz/crashes/``, replayed; and a short fuzzer run.

A crash file is ``<target>--<signature>--<sha1>.bin``. Python crashes replay in process: the
target may raise only its parser's own error. Inputs that once killed the interpreter
(``signal-N``) or hung it replay in a child process, so a regression fails this test
instead of taking pytest down. Known, unfixed crashes are strict xfails naming the bug.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from router import constants as c
from tests.fuzz.registry import TARGETS, replay
from tests.fuzz.target import CRASHES_DIR
from tests.support.polling import becomes_true_blocking
from tests.support.router_process import RouterProcess, router_args

ROOT = Path(__file__).resolve().parents[2]
KILLER_PREFIXES = ("signal-", "hang", "exit-")
CHILD_STACK_BYTES = 8 * 1024 * 1024
REPLAY_IN_CHILD = (
    "import sys; from pathlib import Path; from tests.fuzz.registry import replay; "
    "exc = replay(sys.argv[1], Path(sys.argv[2]).read_bytes()); "
    "print(repr(exc)); sys.exit(0 if exc is None else 3)"
)
KNOWN_BUGS: dict[tuple[str, str], str] = {}
"""(target, signature) -> the unfixed bug it shows (in a module this suite may not edit)."""


def _crash_files() -> list[object]:
    params = []
    for path in sorted(CRASHES_DIR.glob("*--*--*.bin")):
        target, sig, _ = path.stem.split("--")
        marks = []
        if (target, sig) in KNOWN_BUGS:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[target, sig]))
        params.append(pytest.param(path, id=path.stem[:80], marks=marks))
    return params


def _stack_8_mib() -> None:
    """The child's main-thread stack: the common Linux default, so stack overflows replay alike."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    limit = CHILD_STACK_BYTES if hard == resource.RLIM_INFINITY else min(CHILD_STACK_BYTES, hard)
    resource.setrlimit(resource.RLIMIT_STACK, (limit, hard))


def _replay_in_child(target: str, data: bytes, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    saved = tmp_path / "input.bin"
    saved.write_bytes(data)
    return subprocess.run(
        [sys.executable, "-c", REPLAY_IN_CHILD, target, str(saved)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False, preexec_fn=_stack_8_mib,
    )


@pytest.mark.parametrize("path", _crash_files())
def test_saved_crash_input_is_handled(path: Path, tmp_path: Path) -> None:
    target, sig, _ = path.stem.split("--")
    assert target in TARGETS
    data = path.read_bytes()
    if sig.startswith(KILLER_PREFIXES):
        child = _replay_in_child(target, data, tmp_path)
        assert child.returncode == 0, f"{target} replay ended with {child.returncode}: {child.stdout}"
    else:
        assert replay(target, data) is None


# -- the known bugs, pinned by name ------------------------------------------------------
def test_a_deeply_nested_endpoints_document_is_an_error_not_a_crash(tmp_path: Path) -> None:
    for nesting in (b"[" * 30_000, b"- " * 30_000, b'{"a":' * 30_000):
        child = _replay_in_child("endpoints", nesting, tmp_path)
        assert child.returncode == 0, f"{nesting[:6]!r}... killed the parser: {child.returncode}"


def test_the_router_survives_a_deeply_nested_endpoints_file(tmp_path: Path) -> None:
    """A broken endpoints file must leave the router up and not ready, not kill it."""
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_bytes(b"[" * 300_000)  # deep enough for any stack the router may run with
    with RouterProcess(router_args(endpoints)) as router:
        try:
            router.wait_listening(timeout=10)
            becomes_true_blocking(  # the file is read in a worker thread after start; judged below
                lambda: router.proc.poll() is not None
                or router.metric(f"{c.DISCOVERY_UPDATES_TOTAL}_total", source="file", result="error") >= 1,
                20, 0.1)
        except (RuntimeError, OSError):
            pass  # it died under us: judged below
        if router.proc.poll() is not None:
            pytest.fail(f"router exited with {router.proc.returncode} on a deeply nested endpoints file")
        assert router.http_get("/healthz")[0] == 200
        assert router.http_get("/readyz")[0] == 503
        assert router.stop() == 0


# -- the fuzzer itself stays runnable ----------------------------------------------------
@pytest.mark.timeout(180)
def test_a_short_fuzz_run_finds_no_new_crash(tmp_path: Path) -> None:
    """``python -m tests.fuzz.run_fuzz --inputs 8000`` over every target: no crash beyond the
    known ones (those are counted, not saved), every target exercised. (The long runs are
    ``run_fuzz``'s own and the sanitizer run's; the bound only keeps a hung run from stalling CI.)"""
    report = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.run_fuzz", "--inputs", "8000", "--seed", "11",
         "--crashes", str(tmp_path / "crashes"), "--json", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=170, check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    results = json.loads(report.read_text())
    assert results["total_inputs"] == 8_000
    assert {r["target"] for r in results["targets"]} == set(TARGETS)
    assert all(r["inputs"] > 0 and not r["new_crashes"] for r in results["targets"])
