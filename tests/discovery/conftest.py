"""Fixtures the discovery sources' tests share."""

from __future__ import annotations

import pytest

from router.metrics import RouterMetrics
from tests.support.snapshot_recorder import SnapshotRecorder


@pytest.fixture
def recorder() -> SnapshotRecorder:
    """The source's ``publish`` callback: what it published."""
    return SnapshotRecorder()


@pytest.fixture
def metrics() -> RouterMetrics:
    return RouterMetrics()
