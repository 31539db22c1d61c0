"""Who ended a spliced TCP connection, and how: the relay's facts turned into a ``Termination``.

A relay ends in one of three ways: both directions reached end of stream (the side whose FIN
came first closed it), a socket failed, or the idle timer fired. For a failure the errno alone
does not say whose socket it was: ``ECONNRESET`` is raised by a read of the reset socket but
also by a write to it, so the TCP state decides first. A socket that received a RST is in
``TCP_CLOSE`` while its peer is still established; only when the states cannot tell (both
closed, or no ``TCP_INFO``) does the errno and the failing operation decide.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from typing import Final, Literal

from router.outcomes import Termination

Side = Literal["client", "pod"]

TCP_CLOSE: Final = 7
"""``tcpi_state`` of a socket that was reset (or fully closed): ``TCP_CLOSE`` in linux/tcp_states.h."""

PEER_FAILURE_ERRNOS: Final = frozenset({
    errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH,
    errno.ENETUNREACH, errno.ECONNREFUSED, errno.ENOTCONN,
})
"""Errors a peer (or the path to it) causes; anything else is the router's own failure (``ENOTCONN``:
a half-close of a socket whose peer already reset it)."""

_RESET: Final = {"client": Termination.CLIENT_RESET, "pod": Termination.POD_RESET}
_CLOSE: Final = {"client": Termination.CLIENT_CLOSE, "pod": Termination.POD_CLOSE}


def tcp_state(sock: socket.socket | int) -> int | None:
    """The kernel's TCP state of ``sock`` (a socket or its bare fd; first byte of ``TCP_INFO``),
    None if unavailable."""
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
