"""One worker process of ``--workers N``, as the supervisor sees it: the argv it starts with, its
stderr lines (the startup line re-emitted without public addresses), how it ended, how long it may
take to stop, the hook that ends it with the supervisor, and the slot it fills.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from router import constants as c
from router.config import RouterConfig
from router.flag_values import SocketAddress
from router.worker_scrape import HostPort

_WORKER_LISTENING = re.compile(
    rb"listening (grpc=\S+ quic=\S+) health=(\[[0-9A-Fa-f:.]+\]|[0-9A-Za-z.:-]+):(\d+)"
)
"""A worker's startup line (``RouterApp.start``); the address regex stops before JSON quotes."""


def worker_argv(argv: Sequence[str], grpc: SocketAddress, quic: SocketAddress) -> list[str]:
    """The supervisor's argv with the overrides appended: argparse keeps the last value of a flag,
    so this wins over any spelling (``--workers=4``, abbreviations) without rewriting argv."""
    return [
        *argv,
        "--workers", "1",
        "--listen-addr", str(grpc),
        "--reverse-tunnel-listen-addr", str(quic),
        "--health-listen-addr", f"{c.WORKER_HEALTH_HOST}:0",
    ]


def rewrite_listening_line(line: bytes, index: int) -> tuple[bytes, HostPort | None]:
    """``(line to re-emit, private health address)``; lines other than the startup line pass unchanged."""
    match = _WORKER_LISTENING.search(line)
    if match is None:
        return line, None
    host = match[2].decode("ascii").strip("[]")
    replacement = b"worker %d bound %s private-health=%s:%s" % (index, match[1], match[2], match[3])
    return line[: match.start()] + replacement + line[match.end():], (host, int(match[3]))


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
    health: HostPort | None = None
    exposition: str | None = None
    """The last ``/metrics`` text of this generation, reused if a scrape of it fails."""
    first_bound: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None
