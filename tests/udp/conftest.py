"""Fixtures the QUIC edge's tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import quinn_client


@pytest.fixture(scope="module")
def quinn_peer() -> Path:
    """The quinn test peer's binary, built once per module (skipped where it cannot be built)."""
    binary, why_not = quinn_client.build()
    if binary is None:
        pytest.skip(f"the quinn peer cannot be built here: {why_not}")
    return binary
