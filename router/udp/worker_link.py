"""The workers' channel to each other: unnamed ``AF_UNIX`` datagram sockets the supervisor made.

With ``--workers N`` the supervisor makes one socket pair per worker before starting any
(``router.worker_seat``) and keeps them across restarts: worker ``i`` reads its inbox, the others
write to it through its outbox. No name reaches them (no path, no abstract name), so only the
router's own processes hold them: while a worker is dead its inbox waits for its successor, which
drops what queued meanwhile. Each message starts with its sender's index, trusted because only
the supervisor's workers hold an outbox.

Records (``handoff_codec``) queued for one worker within one loop iteration leave as one message,
right after that iteration's I/O callbacks, as ``pod_link.Outboxes`` does for pods: one message per
burst, not one per client datagram. A message the kernel refuses (the reader's queue full) is lost
as a UDP datagram is; ``lost`` is told how many forwarded client datagrams went with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from router import constants as c
from router.udp.handoff_codec import Handoff, HandoffError, decode_message, encode_message_head

log = logging.getLogger("router.udp_router")


@dataclass(frozen=True, slots=True)
class WorkerPeers:
    """This worker among the supervisor's: its index, its inbox and every other worker's outbox."""

    index: int
    count: int
    inbox_fd: int
    outbox_fds: tuple[int, ...]
    """Worker ``i``'s inbox is written through ``outbox_fds[i]`` (this worker's own entry unused)."""

    @property
    def others(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.count) if i != self.index)


class WorkerLink:
    """This worker's sockets to the others: queued records out (batched), decoded records in."""

    def __init__(
        self, workers: WorkerPeers, received: Callable[[Handoff, int], None], lost: Callable[[int], None]
    ) -> None:
        self.workers = workers
        self._received = received
        self._lost = lost
        self._head = encode_message_head(workers.index)
        self._inbox: socket.socket | None = None
        self._outboxes: dict[int, socket.socket] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queued: dict[int, bytearray] = {}
        """Per worker: this iteration's records, one message."""
        self._forwards: dict[int, int] = {}
        """Per worker: how many of the queued records are forwarded client datagrams."""
        self._scheduled = False

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the inbox on ``loop`` (what queued while no worker read it is dropped first: asks
        and forwards for a predecessor's flows); ``OSError`` if a descriptor is not a socket."""
        sockets: list[socket.socket] = []
        try:
            for fd in (self.workers.inbox_fd, *(self.workers.outbox_fds[i] for i in self.workers.others)):
                sockets.append(socket.socket(fileno=os.dup(fd)))
            if any(s.family != socket.AF_UNIX or s.type != socket.SOCK_DGRAM for s in sockets):
                raise OSError(f"worker channels are not AF_UNIX datagram sockets: {sockets!r}")
        except OSError:
            for sock in sockets:
                sock.close()
            raise
        inbox, outboxes = sockets[0], sockets[1:]
        for sock in sockets:
            sock.setblocking(False)
        with contextlib.suppress(OSError):
            while inbox.recv(c.QUIC_HANDOFF_MAX_MESSAGE_BYTES):
                pass
        self._inbox, self._loop = inbox, loop
        self._outboxes = dict(zip(self.workers.others, outboxes, strict=True))
        loop.add_reader(inbox.fileno(), self._readable)

    def close(self) -> None:
        if self._inbox is None:
            return
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.remove_reader(self._inbox.fileno())
        for sock in (self._inbox, *self._outboxes.values()):
            sock.close()
        self._inbox = None
        self._outboxes = {}
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
            message = self._queued[index] = bytearray(self._head)
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
        outbox = self._outboxes.get(index)
        if outbox is None:
            return
        try:
            outbox.send(message)
        except OSError as exc:  # EAGAIN: its inbox is full (a worker restarting reads it later)
            log.debug("handoff to worker %d lost: %s", index, exc)
            if forwards:
                self._lost(forwards)

    def _readable(self) -> None:
        inbox = self._inbox
        for _ in range(c.QUIC_HANDOFF_READS_PER_CALLBACK):
            if inbox is None:
                return
            try:
                message = inbox.recv(c.QUIC_HANDOFF_MAX_MESSAGE_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("handoff read failed: %s", exc)
                return
            try:
                sender, records = decode_message(message, self.workers.count)
            except HandoffError as exc:
                log.debug("handoff message unreadable: %s", exc)
                continue
            if sender == self.workers.index:
                continue
            for record in records:
                self._received(record, sender)
            inbox = self._inbox
