"""What both relay pumps share: how a relay ends, its snapshots, and the deferred timer arming.

The relay (``relay``) runs on the Python pump (``relay._Relay``) or the C one
(``native_relay.NativeRelay``); callers see the same results, live view and snapshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal, Protocol

from router.constants import RELAY_TIMER_DEFER_S
from router.outcomes import Termination

Mode = Literal["splice", "buffered"]


class RelayOutcome(StrEnum):
    """How a relay ended."""

    COMPLETED = "completed"
    """Both directions reached end of stream."""
    RELAY_ERROR = "relay_error"
    """A socket failed (or the relay was cancelled): both peers were reset."""
    IDLE_TIMEOUT = "idle_timeout"
    """Neither side sent anything for the idle timeout."""


LINGER_RESET: Final = struct.pack("ii", 1, 0)
"""``SO_LINGER`` on, 0 s: closing sends RST instead of FIN."""
TIMER_SLACK_S: Final = 0.001
"""A timer firing this early counts as on time (loop clocks round)."""


@dataclass(frozen=True, slots=True)
class RelayResult:
    """How a relay ended; byte counts are bytes delivered to each destination."""

    client_to_pod_bytes: int
    pod_to_client_bytes: int
    outcome: RelayOutcome
    error: str | None
    termination: Termination
    """Who ended it and how (``router.tcp.ending``): first FIN, whose reset, or the idle timer."""


RelayProbe = Callable[[], tuple[int, int, float]]
"""A live relay's ``(client_to_pod bytes, pod_to_client bytes, last activity)`` (the live view)."""


@dataclass(frozen=True, slots=True)
class RelayState:
    """Snapshot of a live relay, for diagnostics and tests of the memory/flow-control bounds."""

    client_to_pod_mode: Mode
    pod_to_client_mode: Mode
    client_to_pod_pending: int
    pod_to_client_pending: int
    held_bytes: int
    """Capacity of the pipes and buffers currently held (0 for an idle connection)."""
    client_to_pod_bytes: int
    pod_to_client_bytes: int


def close_sockets(*socks: socket.socket, reset: bool) -> None:
    """Close a relay's sockets (idempotent); ``reset`` makes the peers see RST, not FIN."""
    for sock in socks:
        if sock.fileno() < 0:
            continue
        if reset:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        sock.close()


def close_fd(fd: int, *, reset: bool) -> None:
    """``close_sockets`` for a bare socket fd (closed exactly once: the caller forgets it)."""
    if reset:
        with contextlib.suppress(OSError):  # else closed without the RST
            close_sockets(socket.socket(fileno=fd), reset=True)
            return
    os.close(fd)


class RunningRelay(Protocol):
    """What the shared bookkeeping needs of a relay on either pump."""

    loop: asyncio.AbstractEventLoop
    timer: asyncio.TimerHandle | None

    def arm_timer(self) -> None: ...
    def state(self) -> RelayState: ...
    def done(self) -> bool: ...


LIVE: set[RunningRelay] = set()
"""The relays running in this process (either pump)."""


def live_relays() -> tuple[RelayState, ...]:
    """Snapshots of the relays running in this process."""
    return tuple(r.state() for r in list(LIVE))


_YOUNG: dict[asyncio.AbstractEventLoop, list[RunningRelay]] = {}
"""Per loop: relays started since the last shared arming callback, whose timer is not armed yet."""


def arm_later(state: RunningRelay) -> None:
    """Arm ``state``'s timer ``RELAY_TIMER_DEFER_S`` from now, with the relays that start meanwhile."""
    loop = state.loop
    young = _YOUNG.get(loop)
    if young is None:
        for old in [other for other in _YOUNG if other.is_closed()]:
            del _YOUNG[old]
        young = _YOUNG[loop] = []
        loop.call_later(RELAY_TIMER_DEFER_S, _arm_young, loop)
    young.append(state)


def _arm_young(loop: asyncio.AbstractEventLoop) -> None:
    for state in _YOUNG.pop(loop, ()):
        if not state.done() and state.timer is None:
            state.arm_timer()
