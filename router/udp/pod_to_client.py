"""Pod -> client: a flow's pod socket is read and what it says leaves through the listener.

The client must only ever see the router's public address. Each readiness callback reads a pod
socket (GRO on) a bounded number of times back to back into one buffer, merging reads while one
``UDP_SEGMENT`` send carries them unchanged (``SegmentRun``): a burst costs one ``sendmsg`` whether
the pod sends GSO batches (quinn) or one datagram per call (aioquic).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any, Protocol

from quic.packet import long_header_scid
from router import constants as c
from router.udp.batching import GRO_CMSG_SPACE, SegmentRun, gro_segment_size, send_segments, split_segments
from router.udp.datapath import PathEvents
from router.udp.pod_link import PodLink

MSG_TRUNC = int(socket.MSG_TRUNC)
"""A plain int: ``flags & socket.MSG_TRUNC`` would build an ``IntFlag`` on every read."""


class ListenerState(Protocol):
    """What the replies need of the listener's protocol: its flow control and its error log."""

    paused: bool

    def error_received(self, exc: Exception) -> None: ...


class ClientReplies:
    """Reads pod sockets (one callback per readable socket) and sends to the flows' clients."""

    def __init__(self, events: PathEvents, clock: Callable[[], float]) -> None:
        self._events = events
        """Told each new SCID of the pods' long headers, each read of an unconfirmed flow, each error."""
        self._clock = clock
        self._buffer = memoryview(bytearray(c.QUIC_POD_RECEIVE_BUFFER_BYTES))
        self._run = SegmentRun()
        self._transport: asyncio.DatagramTransport | None = None
        self._listener: ListenerState | None = None
        self._sock: socket.socket | None = None
        """A duplicate of the listener's descriptor for ``sendmsg`` (the transport offers none)."""
        self.sent_bytes = 0
        """Bytes sent to clients since the owner last took them (for ``relayed_bytes``)."""

    def attach(self, transport: asyncio.DatagramTransport, listener: ListenerState) -> None:
        sock = transport.get_extra_info("socket")
        self._transport, self._listener = transport, listener
        self._sock = socket.fromfd(sock.fileno(), sock.family, sock.type)
        self._sock.setblocking(False)

    def detach(self) -> None:
        self._transport = self._listener = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def readable(self, link: PodLink[Any]) -> None:
        """The pod socket of ``link`` has something: read it and pass it on, batched."""
        buffer, run = self._buffer, self._run
        run.restart(0)
        for _ in range(c.QUIC_POD_READS_PER_CALLBACK):
            flow = link.flow
            if link.sock is None or flow is None:
                return
            if len(buffer) - run.stop < c.QUIC_MAX_UDP_PAYLOAD_BYTES:  # no room for one more read
                self._send(flow, buffer[run.start:run.stop], run.size)
                run.restart(0)
            try:
                length, ancdata, flags, _ = link.sock.recvmsg_into([buffer[run.stop:]], GRO_CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._events.pod_failed(flow, exc)
                return
            flow.last_active = self._clock()
            if flags & MSG_TRUNC or not length:
                continue
            size = gro_segment_size(ancdata, length)
            if buffer[run.stop] & 0x80:  # a long header: handshake packets are never GRO-batched
                scid = long_header_scid(bytes(buffer[run.stop:run.stop + size]))
                if scid is not None:
                    self._events.pod_cid(flow, scid)
            if flow.handshake is not None:  # unconfirmed: watched (router.udp.handshake_watch)
                self._events.pod_answered(flow, size, -(-length // size))
            if not run.joins(length, size):
                self._send(flow, buffer[run.start:run.stop], run.size)
                run.restart(run.stop)
            run.add(length, size)
        if run.count and link.flow is not None:
            self._send(link.flow, buffer[run.start:run.stop], run.size)

    def _send(self, flow: Any, data: memoryview, segment_size: int) -> None:
        """``data``: datagrams of ``segment_size`` bytes (the last shorter or equal) to the client."""
        listener, transport = self._listener, self._transport
        if transport is None or listener is None or listener.paused or not data:
            return
        self.sent_bytes += len(data)
        flow.pod_bytes += len(data)
        sent = 0
        if self._sock is not None and not _queued_bytes(transport):
            try:
                sent = send_segments(self._sock, data, segment_size, flow.address)
            except OSError as exc:  # as the transport would: logged, the rest of the batch dropped
                listener.error_received(exc)
                return
        for datagram in split_segments(data[sent:], segment_size):  # queued behind a full buffer
            transport.sendto(bytes(datagram), flow.address)


def _queued_bytes(transport: asyncio.DatagramTransport) -> int:
    """What the listener transport holds back for a full socket buffer: sends must queue behind it."""
    size: int = getattr(transport, "get_write_buffer_size", lambda: 0)()
    return size
