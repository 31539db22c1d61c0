"""Fixtures the TCP edge's tests share."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from tests.support.loops import Runner


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner:
    """Run the test's scenario on asyncio's loop, then on uvloop's (the router's)."""
    return uvloop.run if request.param == "uvloop" else asyncio.run  # type: ignore[return-value]
