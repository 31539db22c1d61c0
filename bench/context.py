"""What every scenario receives: the run's size (quick or full), worker count, a scratch
directory, and an exit stack that closes the processes the scenario started."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.results import Row

T = TypeVar("T")

SNI = "stargate-0.stargate.external"
"""Every scenario routes to pod ``stargate-0`` by this name (the default template)."""
POD = "stargate-0"
POD_HOST = "127.0.0.2"
"""Pods listen on their own loopback address, like a pod IP; clients and middle boxes on 127.0.0.1."""


@dataclass
class BenchContext:
    quick: bool
    workdir: Path
    workers: int = 1
    rounds_override: int | None = None
    python_peers: bool = False
    """The UDP loads' clients and pod in Python even where bench/udp_peers.c can be built."""
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def rounds(self) -> int:
        """Interleaved rounds per scenario; each figure is the median over them."""
        if self.rounds_override is not None:
            return self.rounds_override
        return 3 if self.quick else 5

    def pick(self, quick: T, full: T) -> T:
        return quick if self.quick else full

    def own(self, thing: T) -> T:
        """Close ``thing`` (anything with ``close()``) when the scenario ends."""
        self.stack.callback(thing.close)  # type: ignore[attr-defined]
        return thing

    def log(self, message: str) -> None:
        print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


Scenario = Callable[[BenchContext], list[Row]]


def try_start(ctx: BenchContext, what: str, start: Callable[[], Any]) -> Any | None:
    """Start an optional middle box (a peer, a multi-worker router); None and a log line if
    it cannot start, so the scenario reports without it instead of failing."""
    try:
        return ctx.own(start())
    except Exception as exc:
        ctx.log(f"{what} unavailable: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        return None
