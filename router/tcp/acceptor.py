"""The TCP listener: accept in bounded batches, and pause (not spin) when out of descriptors.

When ``accept()`` fails for lack of fds or memory the pending connection keeps the listener readable, so
retrying at once would spin the loop and flood the log: the listener pauses for
``ACCEPT_PAUSE_ON_EXHAUSTION_MS`` instead (peeks time out and relays end meanwhile, freeing fds).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from router import constants as c

NativeAccept = Callable[[int, int], tuple[list[tuple[int, str, int]], int]]
"""``router.tcp._relay.accept``: (listening fd, most) -> ([(fd, host, port)...], errno or 0)."""

log = logging.getLogger("router.tcp_router")  # pinned: operators filter logs by this name (the edge's)

_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""accept() failures that persist while the listener stays readable: pause, do not spin."""


class Acceptor:
    """One listening socket (SO_REUSEPORT, so ``--workers`` share it) feeding ``on_connection``."""

    def __init__(self, on_connection: Callable[[socket.socket | int, Any], None]) -> None:
        self._on_connection = on_connection
        self._on_batch_end: Callable[[], None] | None = None
        self._native_accept: NativeAccept | None = None
        self._listener: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resume: asyncio.TimerHandle | None = None
        self._exhausted = False

    def start(
        self, host: str, port: int, *, defer_accept_s: int = 0, native_accept: NativeAccept | None = None,
        on_batch_end: Callable[[], None] | None = None,
    ) -> tuple[str, int]:
        """Bind and listen; returns the bound ``(host, port)``. ``defer_accept_s`` > 0: ``TCP_DEFER_ACCEPT``
        (Linux, else ignored): a connection is handed over once its first bytes came, or after that many seconds.
        ``native_accept``: connections are handed over as bare fds; ``on_batch_end`` after each batch."""
        self._loop = asyncio.get_running_loop()
        self._native_accept, self._on_batch_end = native_accept, on_batch_end
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            # Accepted sockets inherit TCP_NODELAY from the listener on Linux: one setsockopt, not one
            # per connection (tests/tcp/test_tcp_socket_options.py checks the kernel still does).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if defer_accept_s > 0 and hasattr(socket, "TCP_DEFER_ACCEPT"):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, defer_accept_s)
            sock.bind((host, port))
            sock.listen(4096)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self._listener = sock
        self._loop.add_reader(sock.fileno(), self._on_acceptable)
        name = sock.getsockname()
        return name[0], name[1]

    def stop(self) -> None:
        """Close the listener (idempotent); accepted connections are not touched."""
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if self._listener is not None and self._loop is not None:
            self._loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None

    def _on_acceptable(self) -> None:
        try:
            self._accept_batch()
        finally:
            if self._on_batch_end is not None:
                self._on_batch_end()

    def _accept_batch(self) -> None:
        listener = self._listener
        if listener is None:
            return
        if self._native_accept is not None:
            self._accept_fds(listener, self._native_accept)
            return
        family = listener.family
        for _ in range(c.ACCEPT_BATCH):
            try:
                # socket.accept() minus its per-call enum conversions of family and type.
                fd, peer = listener._accept()  # type: ignore[attr-defined]  # (CPython, untyped)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # the client gave up while queued: next one
                continue
            except OSError as exc:
                self._failed(exc)
                return
            self._accepting_again()
            conn = socket.socket(family, socket.SOCK_STREAM, 0, fd)
            conn.setblocking(False)
            self._on_connection(conn, peer)

    def _accept_fds(self, listener: socket.socket, native_accept: NativeAccept) -> None:
        accepted, error = native_accept(listener.fileno(), c.ACCEPT_BATCH)
        if accepted:
            self._accepting_again()
        on_connection = self._on_connection
        for fd, host, port in accepted:
            try:
                on_connection(fd, (host, port))
            except Exception:  # a bug: the batch's other connections are handed over all the same
                log.exception("unexpected error taking connection fd %d from %s", fd, host)
        if error:
            self._failed(OSError(error, os.strerror(error)))

    def _accepting_again(self) -> None:
        if self._exhausted:
            self._exhausted = False
            log.info("accepting again")

    def _failed(self, exc: OSError) -> None:
        if exc.errno in _RESOURCE_ERRNOS:
            self._pause(exc)
        else:
            log.warning("accept failed: %s", exc)

    def _pause(self, exc: OSError) -> None:
        assert self._loop is not None and self._listener is not None
        # One warning per exhaustion episode; the retries of the same episode stay at debug.
        level = logging.DEBUG if self._exhausted else logging.WARNING
        log.log(level, "accept failed (%s): pausing accepts for %d ms", exc, c.ACCEPT_PAUSE_ON_EXHAUSTION_MS)
        self._exhausted = True
        self._loop.remove_reader(self._listener.fileno())
        self._resume = self._loop.call_later(c.ACCEPT_PAUSE_ON_EXHAUSTION_MS / 1000, self._resume_accepting)

    def _resume_accepting(self) -> None:
        self._resume = None
        if self._listener is not None and self._loop is not None:
            self._loop.add_reader(self._listener.fileno(), self._on_acceptable)
