"""The event-loop runner a scenario test is handed (asyncio's or uvloop's ``run``)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

Runner = Callable[[Coroutine[Any, Any, None]], None]
"""Runs one scenario coroutine to its end on a fresh loop."""
