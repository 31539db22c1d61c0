"""The C splice of established QUIC flows (``router/udp/_splice.c``): the C ``Datapath``.

It differs from ``python_path`` only in cost. The splice reads the public and attached pod sockets
itself (its methods are the loop's reader callbacks: no Python frame per wake-up) and hands back
through ``PathEvents``, in arrival order, what it does not move. An unconfirmed flow's pod datagrams
come back unsent: sent here (``_handed``) so the edge can watch the handshake.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from router import constants as c
from router.extensions import Extensions
from router.udp.datapath import Link, PathEvents
from router.udp.flows import Address, Flow
from router.udp.listener import SocketOut, open_socket

if TYPE_CHECKING:
    from router.udp._splice import Splicer

log = logging.getLogger("router.udp_router")


def splicer_type(extensions: Extensions) -> type[Splicer] | None:
    """The ``Splicer`` class when ``extensions`` chose the C splice (checked built by the
    settings), else None for the pure-Python path."""
    if not extensions.splice:
        return None
    from router.udp._splice import Splicer as built

    return built


def open_splicer(splicer_type: type[Splicer], listener_fd: int, io_uring: bool) -> Splicer:
    """The C splice on the listener; with ``io_uring``, a batch's sends to many pods in one system call
    where the kernel allows it (else ``sendmmsg``, logged once)."""
    splicer = splicer_type(
        listener_fd, c.QUIC_SPLICE_BATCHES_PER_CALLBACK, c.QUIC_POD_READS_PER_CALLBACK, io_uring=io_uring
    )
    if splicer.io_uring_errno:  # containerd 2's and Docker 25's default seccomp profiles refuse it
        name = errno.errorcode.get(splicer.io_uring_errno, str(splicer.io_uring_errno))
        log.info("io_uring refused (%s): the C splice sends to each pod with sendmmsg", name)
    return splicer


def datapath(splicer: Splicer | None) -> str:
    """For the start line: ``python``, ``c_splice``, or ``c_splice+io_uring``."""
    if splicer is None:
        return "python"
    return "c_splice+io_uring" if splicer.io_uring else "c_splice"


class SpliceDatapath:
    """Moves confirmed flows' datagrams in C; everything else comes back through the events."""

    def __init__(self, clock: Callable[[], float], io_uring: bool) -> None:
        self._clock = clock
        self._io_uring = io_uring
        self._loop: asyncio.AbstractEventLoop | None = None
        self._out: SocketOut | None = None
        self._splicer: Splicer | None = None
        self._events: PathEvents | None = None
        self._to_client = 0
        """Bytes of the handed datagrams this datapath sent (the splice counts its own)."""

    @property
    def name(self) -> str:
        return datapath(self._splicer)

    @property
    def splicer(self) -> Splicer | None:
        """The C splice while open (tests read its state)."""
        return self._splicer

    async def open(self, host: str, port: int, reuse_port: bool, events: PathEvents) -> tuple[str, int]:
        from router.udp._splice import Splicer as splicer_type  # built: Extensions.require checked

        self._loop = loop = asyncio.get_running_loop()
        self._events = events
        sock = open_socket(host, port, reuse_port)
        self._out = SocketOut(sock)
        self._splicer = splicer = open_splicer(splicer_type, sock.fileno(), self._io_uring)
        loop.add_reader(sock.fileno(), splicer.pump_clients, self._clock, events.client_datagram, self._failed)
        loop.add_reader(splicer.epoll_fd, splicer.pump_pods, self._clock, events.pod_cid, self._failed, self._handed)
        sockname = sock.getsockname()
        return str(sockname[0]), int(sockname[1])

    def _failed(self, flow: Flow[Link], error: int) -> None:
        if self._events is not None:
            self._events.pod_failed(flow, OSError(error, os.strerror(error)))

    def _handed(self, flow: Flow[Link], datagram: bytes) -> None:
        """An unconfirmed flow's pod datagram (its SCID was learned already): sent, then watched."""
        if flow.handle.sock is None or self._out is None or self._events is None:  # ended earlier in this batch
            return
        flow.pod_bytes += len(datagram)
        flow.last_active = self._clock()
        self._to_client += len(datagram)
        self._out.sendto(datagram, flow.address)
        self._events.pod_answered(flow, len(datagram), 1)

    def attach(self, flow: Flow[Link]) -> None:
        sock = flow.handle.sock
        if self._splicer is not None and sock is not None:
            self._splicer.attach(sock.fileno(), flow.address, flow, False)

    def confirm(self, flow: Flow[Link]) -> None:
        sock = flow.handle.sock
        if self._splicer is not None and sock is not None:
            self._splicer.confirm(sock.fileno())

    def moved(self, flow: Flow[Link]) -> None:
        sock = flow.handle.sock
        if self._splicer is not None and sock is not None:
            self._splicer.rekey(sock.fileno(), flow.address)

    def learned(self, flow: Flow[Link], cid: bytes) -> None:
        sock = flow.handle.sock
        if self._splicer is not None and sock is not None:
            self._splicer.learn(sock.fileno(), cid)

    def detach(self, flow: Flow[Link]) -> None:
        sock = flow.handle.sock
        if self._splicer is not None and sock is not None:
            self._splicer.detach(sock.fileno())

    def send_to_client(self, datagram: bytes, address: Address) -> bool:
        if self._out is None:
            return False
        self._out.sendto(datagram, address)
        return True

    def take_counts(self) -> tuple[int, int]:
        to_pod, to_client = self._splicer.take_counts() if self._splicer is not None else (0, 0)
        handed, self._to_client = self._to_client, 0
        return to_pod, to_client + handed

    def close(self) -> None:
        splicer, out = self._splicer, self._out
        if splicer is not None and out is not None and self._loop is not None:
            try:  # the loop may be closed already
                self._loop.remove_reader(out.sock.fileno())
                self._loop.remove_reader(splicer.epoll_fd)
            except RuntimeError:
                pass
        if splicer is not None:
            splicer.close()
            self._splicer = None
        if out is not None:
            out.close()
            self._out = None
