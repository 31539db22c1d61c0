"""The TCP edge's dial: a non-blocking connect to the chosen pod, bounded in time.

``loop.sock_connect`` on uvloop resolves the address through getaddrinfo in a thread pool
even when it is an IP literal: that cost a quarter of the router's CPU per connection, so
the connect is driven by hand on the raw fd.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket

from discovery.targets import Target


class DialError(Exception):
    """The pod could not be reached; the message says how (``dial ip:port timed out``)."""


async def _connect(loop: asyncio.AbstractEventLoop, sock: socket.socket, address: tuple[str, int]) -> None:
    """Non-blocking connect to a numeric address."""
    err = sock.connect_ex(address)
    if err in (errno.EINPROGRESS, errno.EAGAIN):
        writable: asyncio.Future[None] = loop.create_future()
        fd = sock.fileno()

        def on_writable() -> None:
            if not writable.done():
                writable.set_result(None)

        loop.add_writer(fd, on_writable)
        try:
            await writable
        finally:
            loop.remove_writer(fd)
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err:
        raise OSError(err, os.strerror(err))


async def dial(target: Target, timeout_s: float) -> socket.socket:
    """A connected, non-blocking TCP_NODELAY socket to ``target``'s gRPC port, or DialError."""
    loop = asyncio.get_running_loop()
    family = socket.AF_INET6 if ":" in target.address else socket.AF_INET
    try:
        pod = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:  # EMFILE under a connection flood: the client hears UNAVAILABLE
        raise DialError(f"dial {target.grpc_endpoint}: {exc.strerror}") from None
    pod.setblocking(False)
    pod.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        async with asyncio.timeout(timeout_s):
            await _connect(loop, pod, (target.address, target.grpc_port))
    except TimeoutError:
        pod.close()
        raise DialError(f"dial {target.grpc_endpoint} timed out") from None
    except OSError as exc:
        pod.close()
        raise DialError(f"dial {target.grpc_endpoint}: {exc.strerror}") from None
    except BaseException:
        pod.close()
        raise
    return pod
