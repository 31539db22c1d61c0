"""One worker process of ``--workers N`` as the supervisor sees it: how it is started, watched, ended and replaced."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from router import constants as c
from router.config import RouterConfig
from router.flag_values import SocketAddress
from router.worker_scrape import HostPort


def worker_argv(argv: Sequence[str], grpc: SocketAddress, quic: SocketAddress) -> list[str]:
    """The supervisor's argv with overrides appended: argparse keeps a flag's last value, so they win over
    any spelling (``--workers=4``, abbreviations). The health port comes from the seat instead."""
    return [
        *argv,
        "--workers", "1",
        "--listen-addr", str(grpc),
        "--reverse-tunnel-listen-addr", str(quic),
    ]


def private_health_socket() -> socket.socket:
    """A worker's private ``/readyz`` and ``/metrics`` port, bound by the supervisor so no worker has to name it."""
    return socket.create_server((c.WORKER_HEALTH_HOST, 0))


class LineSplitter:
    """Cuts a byte stream into newline-terminated lines; an over-long line comes out in pieces."""

    def __init__(self, max_line_bytes: int = c.WORKER_LOG_LINE_MAX_BYTES) -> None:
        self._buffer = bytearray()
        self._max = max_line_bytes

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        lines: list[bytes] = []
        while (end := self._buffer.find(b"\n")) >= 0:
            lines.append(bytes(self._buffer[: end + 1]))
            del self._buffer[: end + 1]
        while len(self._buffer) >= self._max:
            lines.append(bytes(self._buffer[: self._max]))
            del self._buffer[: self._max]
        return lines

    def flush(self) -> list[bytes]:
        """What is left at end of stream (a last line without newline)."""
        rest, self._buffer = bytes(self._buffer), bytearray()
        return [rest] if rest else []


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "unknown status"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-returncode).name}"
        return f"signal {-returncode}"
    return f"status {returncode}"


def stop_budget_s(config: RouterConfig) -> float:
    """How long a SIGTERMed worker may take: its own shutdown delay and drain, plus grace."""
    return config.shutdown_delay_s + config.drain_timeout_s + c.WORKER_STOP_GRACE_S


def parent_death_signal() -> Callable[[], None] | None:
    """A preexec hook asking Linux to SIGTERM the worker if the supervisor dies (even by SIGKILL),
    so no orphan keeps serving the port; resolved before fork, as the hook must not allocate much."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before the hook ran
            os._exit(1)

    return hook


@dataclass
class WorkerSlot:
    """One of the N worker positions; its process is replaced when it dies."""

    index: int
    process: asyncio.subprocess.Process | None = None
    generation: int = 0
    private_health: HostPort | None = None
    """The loopback port the supervisor bound for this generation."""
    health: HostPort | None = None
    """``private_health`` once the worker said it has bound its listeners (it serves it then)."""
    exposition: str | None = None
    """The last ``/metrics`` text of this generation, reused if a scrape of it fails."""
    first_bound: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None
