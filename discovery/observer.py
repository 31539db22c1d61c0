"""What a discovery source reports, as a small protocol: the router adapts it to its metrics.

The sources know nothing of Prometheus or of ``router/``; ``router/app.py`` passes an
adapter. Every hook is cheap and must not raise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class DiscoveryObserver(Protocol):
    """Hooks a source calls; ``source`` is the source's label (``kubernetes`` or ``file``)."""

    def published(self, source: str, ready_targets: int) -> None:
        """A new snapshot was published."""

    def unchanged(self, source: str) -> None:
        """A sync produced the snapshot already published."""

    def error(self, source: str) -> None:
        """A sync failed; the last good snapshot keeps serving."""

    def synced(self, source: str, sync_age_s: Callable[[], float]) -> None:
        """Called once at construction: ``sync_age_s()`` reads seconds since the last sync (-1 before)."""
