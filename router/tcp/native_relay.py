"""Which engine pumps a loop's relays: the C one (``router/tcp/_relay.c``) where it is built.

Why C: the Python pump costs a readiness callback and a few objects per wake-up and direction; the C engine
pumps every ready relay of a loop in one call (0.855x a connection's CPU; bench/README.md). Only the pumping
is in C: the policy (``relay_policy.Relay``) is shared, so a connection ends alike, with the same counts, on
either. Whether to use it is ``router.extensions``' choice (``Extensions.tcp_pump``), passed down in settings.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from router.extensions import NativeUnavailable
from router.tcp.poller import PerLoop
from router.tcp.pump import engine_limits

if TYPE_CHECKING:
    from router.tcp._relay import Engine

__all__ = ["NativeUnavailable", "engine_for"]

_ENGINES: PerLoop[Engine] = PerLoop(lambda engine: engine.close())
"""Per loop: its C engine, watched by the loop as one fd."""


def engine_for(loop: asyncio.AbstractEventLoop, wanted: bool) -> Engine | None:
    """The C engine of ``loop`` (created on first use) when ``wanted`` (it must be built:
    ``NativeUnavailable`` otherwise), else None for the Python pump."""
    if not wanted:
        return None
    engine = _ENGINES.get(loop)
    if engine is None:
        engine = _ENGINES.add(loop, _make_engine(loop))
    return engine


def _make_engine(loop: asyncio.AbstractEventLoop) -> Engine:
    try:
        from router.tcp._relay import Engine
    except ImportError:
        raise NativeUnavailable("the C relay router.tcp._relay is not built (no C compiler at install)") from None
    engine = Engine(**engine_limits())
    loop.add_reader(engine.fileno(), engine.dispatch)
    return engine
