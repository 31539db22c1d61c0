"""The C splice's io_uring send ring (``router/udp/_send_ring.h``) never sends a datagram twice.

When the wait for completions fails after the kernel took the entries (any error but EINTR), the
entries' results are unknown; the ring must report them as taken, not as never submitted, or the
splice sends them again. ``tests/support/send_ring_faults.c`` makes io_uring_enter fail that way
around the real kernel's ring and real loopback UDP sockets.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "support" / "send_ring_faults.c"
COMPILER = shutil.which("cc") or shutil.which("gcc")

pytestmark = pytest.mark.skipif(sys.platform != "linux" or COMPILER is None, reason="needs Linux and a C compiler")


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    binary = tmp_path_factory.mktemp("send_ring") / "send_ring_faults"
    assert COMPILER is not None
    built = subprocess.run([COMPILER, "-O1", "-Wall", "-Wextra", "-Werror", "-I", str(ROOT / "router" / "udp"), "-o",
                            str(binary), str(HARNESS)], check=False, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return binary


@pytest.mark.parametrize("messages", [1, 3, 40])
def test_a_failed_wait_for_completions_never_sends_a_taken_entry_again(harness: Path, messages: int) -> None:
    run = subprocess.run([str(harness), str(messages)], capture_output=True, text=True, timeout=30, check=False)
    if run.returncode == 77:
        pytest.skip(run.stdout.strip())
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == f"queued {messages} received {messages} broken 1"
