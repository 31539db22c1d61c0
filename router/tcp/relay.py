"""Byte relay between a routed client socket and its pod socket: the router's hot path.

``relay`` runs one connection for a task under the one policy (``relay_policy.Relay``) on the engine its
caller asks for; the task-free path (``fast_path``) drives a ``Relay`` itself.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from typing import Final

from router.outcomes import Termination
from router.tcp.ending import RelayOutcome, RelayResult
from router.tcp.native_relay import engine_for
from router.tcp.relay_policy import Relay, RelayProbe, RelayState, describe, live_relays

__all__ = [
    "SPLICE_AVAILABLE", "Relay", "RelayOutcome", "RelayProbe", "RelayResult", "RelayState", "live_relays", "relay",
]

SPLICE_AVAILABLE: Final = hasattr(os, "splice")
"""``os.splice`` exists (Linux, Python >= 3.10): the auto mode uses it."""


async def relay(
    client: socket.socket,
    pod: socket.socket,
    *,
    initial_to_pod: bytes = b"",
    client_filter: Callable[[bytes], bytes] | None = None,
    client_filter_done: Callable[[], bool] | None = None,
    idle_timeout_s: float,
    on_bytes: Callable[[int, int], None] | None = None,
    use_splice: bool | None = None,
    on_start: Callable[[RelayProbe], None] | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
    native: bool,
) -> RelayResult:
    """Relay bytes both ways until both sides finish, one fails, or both are idle too long.

    Owns both (connected, non-blocking) sockets from the call on and closes them before returning or when
    cancelled (then with RST, and CancelledError is re-raised). ``native``: pump in C (it must be built); a
    ``client_filter`` (sees client->pod bytes until ``client_filter_done()``) forces the Python pump.
    ``idle_timeout_s <= 0``: no idle timeout. ``loop``, if at hand, saves a ``getpid`` system call.
    """
    if loop is None:
        loop = asyncio.get_running_loop()
    if use_splice and not SPLICE_AVAILABLE:
        client.close()
        pod.close()
        raise ValueError("use_splice=True but os.splice is not available here")
    splice = SPLICE_AVAILABLE if use_splice is None else use_splice
    engine = engine_for(loop, native) if client_filter is None else None
    state = Relay(loop, engine, client, pod, splice, idle_timeout_s, on_bytes)
    try:
        state.start(initial_to_pod, client_filter, client_filter_done)
        if on_start is not None:
            on_start(state.probe)
        return await state.future
    except BaseException as exc:  # cancelled (drain timeout) or a bug: cut both ends with RST
        state.close(reset=True)
        if isinstance(exc, Exception):
            up, down, _ = state.probe()
            return RelayResult(up, down, RelayOutcome.RELAY_ERROR, describe(exc), Termination.ROUTER_ERROR)
        raise
    finally:
        state.unlink()
