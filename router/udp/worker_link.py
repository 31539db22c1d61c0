"""The workers' channel to each other: one ``AF_UNIX`` datagram socket each, in the abstract namespace.

With ``--workers N`` each worker binds ``\\0stargate-router/<group>/<index>`` (``WORKER_GROUP_ENV``
names the supervisor's run, ``WORKER_ENV`` the worker): no file, so it works on the chart's
read-only root filesystem with no ``/tmp``, and it disappears with the process. A restarted
worker binds its name again. Abstract names are scoped to the network namespace: in a pod only
its own containers can reach them. A message is read only if it comes from another worker's name
of the same group (the kernel reports the sender's bound name, and a name is held by one socket at
a time: the group's are held by its live workers), so a stray process in the pod cannot feed it.

Records (``handoff_codec``) queued for one worker within one loop iteration leave as one message,
right after that iteration's I/O callbacks, as ``pod_link.Outboxes`` does for pods: the kernel
queues at most ``net.unix.max_dgram_qlen`` (10 by default) unread datagrams per receiving socket,
so one message per burst, not one per client datagram. A message the kernel refuses (the reader's
queue full, the worker restarting) is lost as a UDP datagram is; ``lost`` is told how many
forwarded client datagrams went with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from router import constants as c
from router.udp.handoff_codec import Handoff, HandoffError, decode_handoffs

log = logging.getLogger("router.udp_router")


@dataclass(frozen=True, slots=True)
class WorkerGroup:
    """This worker among the supervisor's: what names the sockets of the group."""

    group: str
    index: int
    count: int

    def name(self, index: int) -> bytes:
        """Worker ``index``'s abstract socket name (the leading NUL makes it abstract)."""
        return f"\0{c.QUIC_HANDOFF_SOCKET_PREFIX}/{self.group}/{index}".encode()

    @property
    def others(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.count) if i != self.index)


def worker_group(env: Mapping[str, str]) -> WorkerGroup | None:
    """The group this process is a worker of (set by the supervisor), or None: a single process,
    or a malformed environment (then nothing is shared, as with one worker)."""
    try:
        count, index = int(env.get(c.WORKER_COUNT_ENV, "")), int(env.get(c.WORKER_ENV, ""))
    except ValueError:
        return None
    group = env.get(c.WORKER_GROUP_ENV, "")
    if count < 2 or not 0 <= index < count or not group:
        return None
    return WorkerGroup(group, index, count)


class WorkerLink:
    """This worker's socket to the others: queued records out (batched), decoded records in."""

    def __init__(
        self, workers: WorkerGroup, received: Callable[[Handoff, int], None], lost: Callable[[int], None]
    ) -> None:
        self.workers = workers
        self._received = received
        self._lost = lost
        self._senders = {workers.name(i): i for i in workers.others}
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queued: dict[int, bytearray] = {}
        """Per worker: this iteration's records, one message."""
        self._forwards: dict[int, int] = {}
        """Per worker: how many of the queued records are forwarded client datagrams."""
        self._scheduled = False

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind this worker's name and read it on ``loop``; ``OSError`` if the name is taken."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
        try:
            sock.bind(self.workers.name(self.workers.index))
        except OSError:
            sock.close()
            raise
        self._sock, self._loop = sock, loop
        loop.add_reader(sock.fileno(), self._readable)

    def close(self) -> None:
        if self._sock is None:
            return
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        self._sock = None
        self._queued.clear()
        self._forwards.clear()

    def queue(self, index: int, record: bytes, forward: bool = False) -> None:
        """``record`` for worker ``index``, sent with the others queued for it in this iteration
        (``forward``: it carries a forwarded client datagram, told to ``lost`` if the message is)."""
        message = self._queued.get(index)
        if message is not None and len(message) + len(record) > c.QUIC_HANDOFF_MESSAGE_BYTES:
            self._send(index, self._queued.pop(index), self._forwards.pop(index, 0))
            message = None
        if message is None:
            message = self._queued[index] = bytearray()
        message += record
        if forward:
            self._forwards[index] = self._forwards.get(index, 0) + 1
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send what is queued, one message per worker."""
        self._scheduled = False
        queued, forwards = self._queued, self._forwards
        self._queued, self._forwards = {}, {}
        for index, message in queued.items():
            self._send(index, message, forwards.get(index, 0))

    def _send(self, index: int, message: bytearray, forwards: int) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            sock.sendto(message, self.workers.name(index))
        except OSError as exc:  # EAGAIN: its queue is full; ECONNREFUSED/ENOENT: it is restarting
            log.debug("handoff to worker %d lost: %s", index, exc)
            if forwards:
                self._lost(forwards)

    def _readable(self) -> None:
        sock = self._sock
        for _ in range(c.QUIC_HANDOFF_READS_PER_CALLBACK):
            if sock is None:
                return
            try:
                message, sender = sock.recvfrom(c.QUIC_HANDOFF_MAX_MESSAGE_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("handoff read failed: %s", exc)
                return
            index = self._senders.get(sender) if isinstance(sender, bytes) else None
            if index is None:  # not a worker of this group: not read
                continue
            try:
                records = decode_handoffs(message)
            except HandoffError as exc:
                log.debug("handoff from worker %d unreadable: %s", index, exc)
                continue
            for record in records:
                self._received(record, index)
            sock = self._sock
