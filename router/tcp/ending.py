"""Who ended a spliced TCP connection, and how: the relay's facts turned into a ``Termination``.

A failure's errno does not say whose socket it was (``ECONNRESET`` comes from a read of the reset socket but
also from a write to it), so the TCP state decides first: a socket that received a RST is in ``TCP_CLOSE``
while its peer is still established. Only when the states cannot tell (both closed, or no ``TCP_INFO``) do
the errno and the failing operation decide.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

from router.outcomes import Termination

Side = Literal["client", "pod"]

LINGER_RESET: Final = struct.pack("ii", 1, 0)
"""``SO_LINGER`` on, 0 s: closing sends RST instead of FIN."""
TCP_CLOSE: Final = 7
"""``tcpi_state`` of a socket that was reset (or fully closed): ``TCP_CLOSE`` in linux/tcp_states.h."""

PEER_FAILURE_ERRNOS: Final = frozenset({
    errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH,
    errno.ENETUNREACH, errno.ECONNREFUSED, errno.ENOTCONN,
})
"""Errors a peer (or its path) causes, else the router's own (``ENOTCONN``: half-closing a socket its peer reset)."""


class RelayOutcome(StrEnum):
    """How a relay ended."""

    COMPLETED = "completed"
    """Both directions reached end of stream."""
    RELAY_ERROR = "relay_error"
    """A socket failed (or the relay was cancelled): both peers were reset."""
    IDLE_TIMEOUT = "idle_timeout"
    """Neither side sent anything for the idle timeout."""


@dataclass(frozen=True, slots=True)
class RelayResult:
    """How a relay ended; byte counts are bytes delivered to each destination."""

    client_to_pod_bytes: int
    pod_to_client_bytes: int
    outcome: RelayOutcome
    error: str | None
    termination: Termination
    """Who ended it and how: first FIN, whose reset, or the idle timer."""


_RESET: Final = {"client": Termination.CLIENT_RESET, "pod": Termination.POD_RESET}
_CLOSE: Final = {"client": Termination.CLIENT_CLOSE, "pod": Termination.POD_CLOSE}


def tcp_state(sock: socket.socket | int) -> int | None:
    """The kernel's TCP state of a socket or bare fd (first byte of ``TCP_INFO``); None if unavailable."""
    if isinstance(sock, int):
        if sock < 0:
            return None
        try:
            borrowed = socket.socket(fileno=sock)  # read through a socket object that never closes it
        except OSError:
            return None
        try:
            return tcp_state(borrowed)
        finally:
            borrowed.detach()
    if not hasattr(socket, "TCP_INFO") or sock.fileno() < 0:
        return None
    with contextlib.suppress(OSError):
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    return None


def closed_termination(first_eof: Side) -> Termination:
    """Both directions finished: the side whose end of stream came first closed the connection."""
    return _CLOSE[first_eof]


def failure_termination(
    exc: BaseException, client_state: int | None, pod_state: int | None, reading: Side, writing: Side,
) -> Termination:
    """A socket operation of the relay failed while reading ``reading`` and writing ``writing``."""
    code = exc.errno if isinstance(exc, OSError) else None
    if code not in PEER_FAILURE_ERRNOS:
        return Termination.ROUTER_ERROR
    client_closed, pod_closed = client_state == TCP_CLOSE, pod_state == TCP_CLOSE
    if client_closed != pod_closed:
        return Termination.CLIENT_RESET if client_closed else Termination.POD_RESET
    return _RESET[writing] if code == errno.EPIPE else _RESET[reading]


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


def side_fd(side: socket.socket | int) -> int:
    """A relay side's fd: a bare fd, or its socket's (-1 once closed either way)."""
    return side if isinstance(side, int) else side.fileno()


def given_up(side: socket.socket | int) -> socket.socket | int:
    """The side once its fd is the engine's to close (a socket object detached, a bare fd -1)."""
    if isinstance(side, int):
        return -1
    side.detach()
    return side


def closed_side(side: socket.socket | int, *, reset: bool) -> socket.socket | int:
    """The side once closed (idempotent; a bare fd is closed once, then -1)."""
    if isinstance(side, int):
        if side >= 0:
            close_fd(side, reset=reset)
        return -1
    close_sockets(side, reset=reset)
    return side
