"""The QUIC tables' bounds, sized at start to the container's memory limit (cgroup v2 ``memory.max``).

Filled at their defaults the tables would outgrow a small container and the kernel would kill the
router, so each bound is lowered until the baseline plus both tables' worst case fit
``MEMORY_USABLE_FRACTION`` of the limit, split over ``--workers N``. No limit, or no cgroup v2, keeps
the defaults; a bound is never raised above its default (docs/operating.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from quic.frames import QUIC_MAX_CRYPTO_BYTES
from router import constants as c

PENDING_FLOW_WORST_BYTES = (
    c.QUIC_MAX_PENDING_BYTES_PER_FLOW + QUIC_MAX_CRYPTO_BYTES + c.QUIC_PENDING_FLOW_OVERHEAD_BYTES
)
"""A pending flow at its worst: its held datagrams, its CRYPTO reassembly, its objects (~52 KiB)."""

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class MemoryBounds:
    """The bounds chosen for one router process, and the limit they were sized to."""

    max_pending_flows: int = c.QUIC_MAX_PENDING_FLOWS
    max_flows: int = c.QUIC_MAX_FLOWS
    limit_bytes: int | None = None
    """The cgroup's ``memory.max``; None: no limit (the defaults)."""
    workers: int = 1
    """Router processes sharing the limit."""

    def describe(self, source: str) -> str:
        """The start line saying what was chosen and why (``source``: where the limit was read)."""
        bounds = f"QUIC pending flows <= {self.max_pending_flows}, QUIC flows <= {self.max_flows}"
        if self.limit_bytes is None:
            return f"memory limit: none ({source}); {bounds} (the defaults)"
        share = f" per worker of {self.workers}" if self.workers > 1 else ""
        return f"memory limit: {self.limit_bytes / MIB:.0f} MiB ({source}); {bounds}{share}"


def bounds_for(limit_bytes: int | None, workers: int = 1) -> MemoryBounds:
    """The bounds for ``limit_bytes`` split over ``workers`` (the module's rule); no limit: the defaults."""
    if limit_bytes is None:
        return MemoryBounds(workers=workers)
    per_worker = limit_bytes * c.MEMORY_USABLE_FRACTION / max(1, workers)
    above_baseline = max(0.0, per_worker - c.MEMORY_BASELINE_BYTES)
    pending = int(above_baseline * c.MEMORY_PENDING_SHARE) // PENDING_FLOW_WORST_BYTES
    pending = min(c.QUIC_MAX_PENDING_FLOWS, max(c.MIN_QUIC_PENDING_FLOWS, pending))
    # Established flows get what the pending table, as sized (its floor included), leaves.
    flows = int(max(0.0, above_baseline - pending * PENDING_FLOW_WORST_BYTES)) // c.QUIC_FLOW_WORST_BYTES
    return MemoryBounds(
        max_pending_flows=pending,
        max_flows=min(c.QUIC_MAX_FLOWS, max(c.MIN_QUIC_FLOWS, flows)),
        limit_bytes=limit_bytes,
        workers=workers,
    )


class MemoryLimitError(ValueError):
    """``memory.max`` held something other than ``max`` or a number of bytes."""


def parse_memory_max(text: str) -> int | None:
    """cgroup v2's ``memory.max``: ``max`` (None: no limit) or a positive number of bytes."""
    value = text.strip()
    if value == "max":
        return None
    if not value.isdigit() or int(value) == 0:
        raise MemoryLimitError(f"expected 'max' or a number of bytes, got {value[:40]!r}")
    return int(value)


def memory_max_path(environ: Mapping[str, str] | None = None) -> str:
    """The file to read: ``CGROUP_MEMORY_MAX_PATH_ENV`` when set, else the container's cgroup's."""
    env = os.environ if environ is None else environ
    return env.get(c.CGROUP_MEMORY_MAX_PATH_ENV) or c.CGROUP_MEMORY_MAX_PATH


def read_memory_limit(path: str) -> int | None:
    """The limit in ``path``; None when the file is absent (cgroup v1, no cgroup namespace).
    Raises ``MemoryLimitError`` for unreadable or malformed contents."""
    try:
        with open(path, encoding="ascii") as file:
            text = file.read(64)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise MemoryLimitError(f"cannot read {path}: {exc}") from None
    return parse_memory_max(text)


def bounds_at_start(workers: int = 1, environ: Mapping[str, str] | None = None) -> tuple[MemoryBounds, str]:
    """This process's bounds (one of ``workers`` sharing the limit) and its start line; an unreadable
    limit keeps the defaults."""
    env = os.environ if environ is None else environ
    path = memory_max_path(env)
    try:
        limit = read_memory_limit(path)
    except MemoryLimitError as exc:
        bounds = MemoryBounds(workers=workers)
        return bounds, bounds.describe(f"{exc}; kept")
    bounds = bounds_for(limit, workers)
    return bounds, bounds.describe(path if os.path.exists(path) else f"no {path}")
