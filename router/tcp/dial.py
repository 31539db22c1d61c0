"""The TCP edge's dial: a non-blocking connect to the chosen pod, bounded in time.

Driven by hand on the raw fd: uvloop's ``sock_connect`` resolves even an IP literal through getaddrinfo in a
thread pool (a quarter of the router's CPU per connection). A same-host pod has usually answered by the time
``connect`` returns, so one ``TCP_INFO`` read checks that before a writability wait (a poller round, a task switch).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from typing import Final

from discovery.targets import Target
from router.tcp.poller import poller_for

_TCP_ESTABLISHED: Final = 1
"""``tcpi_state`` of a connected socket (``TCP_ESTABLISHED`` in linux/tcp_states.h)."""
_HAS_TCP_INFO: Final = hasattr(socket, "TCP_INFO")
_NONBLOCKING: Final = getattr(socket, "SOCK_NONBLOCK", 0)
"""Created non-blocking (Linux): no separate ioctl per dial."""


class DialError(Exception):
    """The pod could not be reached; the message says how (``dial ip:port timed out``)."""


def _established(sock: socket.socket) -> bool:
    """The handshake already completed (no error is possible then)."""
    if not _HAS_TCP_INFO:
        return False
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == _TCP_ESTABLISHED
    except OSError:
        return False


def dial_error(target: Target, code: int) -> DialError:
    """How a dial that failed with ``code`` (an errno; ``ETIMEDOUT``: the connect timeout) is told."""
    if code == errno.ETIMEDOUT:
        return DialError(f"dial {target.grpc_endpoint} timed out")
    return DialError(f"dial {target.grpc_endpoint}: {os.strerror(code)}")


def start_dial(target: Target) -> tuple[socket.socket, bool]:
    """A non-blocking TCP_NODELAY socket connecting to ``target``'s gRPC port, and whether it is
    connected already; DialError if the connect failed at once."""
    family = socket.AF_INET6 if ":" in target.address else socket.AF_INET
    try:
        pod = socket.socket(family, socket.SOCK_STREAM | _NONBLOCKING)
    except OSError as exc:  # EMFILE under a connection flood: the client hears UNAVAILABLE
        raise dial_error(target, exc.errno or errno.EIO) from None
    try:
        if not _NONBLOCKING:
            pod.setblocking(False)
        pod.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = pod.connect_ex((target.address, target.grpc_port))
    except OSError as exc:
        pod.close()
        raise dial_error(target, exc.errno or errno.EIO) from None
    if not err or (err == errno.EINPROGRESS and _established(pod)):
        return pod, True
    if err in (errno.EINPROGRESS, errno.EAGAIN):
        return pod, False
    pod.close()
    raise dial_error(target, err or errno.EIO)


async def dial(target: Target, timeout_s: float) -> socket.socket:
    """A connected, non-blocking TCP_NODELAY socket to ``target``'s gRPC port, or DialError; only a
    connect still in progress waits (and arms the timeout)."""
    pod, connected = start_dial(target)
    if connected:
        return pod
    try:
        async with asyncio.timeout(timeout_s):
            await poller_for(asyncio.get_running_loop()).wait(pod.fileno(), write=True)
        err = pod.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    except TimeoutError:
        pod.close()
        raise dial_error(target, errno.ETIMEDOUT) from None
    except OSError as exc:
        pod.close()
        raise dial_error(target, exc.errno or errno.EIO) from None
    except BaseException:
        pod.close()
        raise
    if err:
        pod.close()
        raise dial_error(target, err)
    return pod
