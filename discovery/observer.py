"""What a discovery source reports, as a small protocol: the router adapts it to its metrics.

Sources know nothing of Prometheus or ``router/``. Every hook is cheap and must not raise.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Protocol


class RewatchCause(StrEnum):
    """Why a Kubernetes watch was re-opened (the label of the re-watch counter)."""

    ENDED = "ended"
    """The server ended the stream (its timeout); re-watched from the last resourceVersion."""
    IDLE = "idle"
    """Nothing (event or bookmark) arrived for the idle timeout: a silent stream was replaced."""
    DROPPED = "dropped"
    """The connection broke or garbage arrived mid-stream."""
    EXPIRED = "expired"
    """410 Gone: the resourceVersion was compacted, so a re-list came first."""


class DiscoveryObserver(Protocol):
    """Hooks a source calls; ``source`` is the source's label (``kubernetes`` or ``file``)."""

    def published(self, source: str, ready_targets: int) -> None:
        """A new snapshot was published."""

    def unchanged(self, source: str) -> None:
        """A sync produced the snapshot already published."""

    def error(self, source: str) -> None:
        """A sync failed; the last good snapshot keeps serving."""

    def rewatched(self, source: str, cause: RewatchCause) -> None:
        """A watch was re-opened."""

    def synced(self, source: str, sync_age_s: Callable[[], float]) -> None:
        """Called once at construction: ``sync_age_s()`` reads seconds since the last sync (-1 before)."""
