"""UDP batching: GRO on receive, GSO (``UDP_SEGMENT``) on send, and the fallback without them.

A GRO buffer is one peer's datagrams glued together, each the cmsg's segment size but the last; a
``UDP_SEGMENT`` send cuts such a buffer back into the same datagrams, in the same order, so batching
never changes what is on the wire. The stdlib names neither option: the numbers of ``<linux/udp.h>``
are here. The first time the kernel refuses an option for good (no such option, a device without
checksum offload) the process stops asking and sends one datagram per call from then on.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator, Sequence
from typing import Any

from router import constants as c

SOL_UDP = 17
UDP_SEGMENT = 103
"""Send: a u16 segment size; the kernel cuts the payload into datagrams that long."""
UDP_GRO = 104
"""Receive: a socket option turning coalescing on; each batch carries an int cmsg of its segment size."""

_GRO_SIZE = struct.Struct("=i")
_SEGMENT_SIZE = struct.Struct("=H")
GRO_CMSG_SPACE = socket.CMSG_SPACE(_GRO_SIZE.size)
"""``ancbufsize`` for ``recvmsg`` on a GRO socket."""
MAX_SEGMENT_BYTES = 0xFFFF
IP_MTU = 14
"""``<linux/in.h>``: the path MTU of a connected IPv4 socket (the stdlib lacks the name)."""
IPV6_MTU = 24
"""``<linux/in6.h>``: the path MTU of a connected IPv6 socket."""

REFUSALS = frozenset({errno.EINVAL, errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP})
"""Errors of ``setsockopt(UDP_GRO)`` meaning the kernel does not do GRO."""
GSO_UNSUPPORTED = frozenset({errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP})
"""Errors of a ``UDP_SEGMENT`` send meaning GSO cannot work here (EIO: no checksum offload): stop asking."""
GSO_REFUSED_ONCE = frozenset({errno.EINVAL, errno.EMSGSIZE})
"""Errors about one ``UDP_SEGMENT`` send only (a path MTU that shrank): sent one by one, GSO stays on."""

Address = tuple[Any, ...]


class BatchingError(ValueError):
    """A segment size that no datagram can have."""


def _check_size(size: int) -> int:
    if not 1 <= size <= MAX_SEGMENT_BYTES:
        raise BatchingError(f"segment size must be 1..{MAX_SEGMENT_BYTES}, got {size}")
    return size


def gro_segment_size(ancdata: list[tuple[int, int, bytes]], length: int) -> int:
    """Segment size of a received buffer of ``length`` bytes: the ``UDP_GRO`` cmsg's, or the
    whole buffer (one datagram) when there is none or it is unusable."""
    for level, kind, data in ancdata:
        if level == SOL_UDP and kind == UDP_GRO and len(data) >= _GRO_SIZE.size:
            size: int = _GRO_SIZE.unpack_from(data)[0]
            if 0 < size < length:
                return size
    return length


def segment_cmsg(size: int) -> tuple[int, int, bytes]:
    """The ``sendmsg`` ancillary item asking the kernel to send datagrams of ``size`` bytes."""
    return SOL_UDP, UDP_SEGMENT, _SEGMENT_SIZE.pack(_check_size(size))


def gso_runs(
    sizes: Sequence[int],
    max_segment: int,
    max_segments: int = c.QUIC_GSO_MAX_SEGMENTS,
    max_bytes: int = c.QUIC_GSO_MAX_BYTES,
) -> list[tuple[int, int, int]]:
    """``(start, stop, segment size)`` runs of these ``sizes``, each one ``UDP_SEGMENT`` send carries
    unchanged (equal sizes, only the last shorter, within the caps). A datagram empty or over
    ``max_segment`` (the path MTU's payload) goes alone; a run of one is a plain send."""
    runs: list[tuple[int, int, int]] = []
    start, count = 0, len(sizes)
    while start < count:
        size = sizes[start]
        stop, total = start + 1, size
        if 0 < size <= max_segment:
            while stop < count and stop - start < max_segments:
                following = sizes[stop]
                if not 0 < following <= size or total + following > max_bytes:
                    break
                total += following
                stop += 1
                if following < size:
                    break
        runs.append((start, stop, size))
        start = stop
    return runs


class SegmentRun:
    """Reads (each one datagram or a GRO batch) back to back in one buffer at ``start:stop``, merged
    while one ``UDP_SEGMENT`` send still carries them unchanged (as ``gso_runs``)."""

    __slots__ = ("closed", "count", "max_bytes", "max_segments", "size", "start", "stop")

    def __init__(self, max_segments: int = c.QUIC_GSO_MAX_SEGMENTS, max_bytes: int = c.QUIC_GSO_MAX_BYTES) -> None:
        self.max_segments, self.max_bytes = max_segments, max_bytes
        self.start = self.stop = self.size = self.count = 0
        self.closed = False

    def restart(self, at: int) -> None:
        """An empty run whose next piece is read at offset ``at``."""
        self.start = self.stop = at
        self.size = self.count = 0
        self.closed = False

    def joins(self, length: int, size: int) -> bool:
        """Whether a piece of ``length`` bytes in segments of ``size`` (``size == length``: one datagram)
        read at ``stop`` joins the run; a datagram shorter than the run's segments ends it."""
        if not self.count:
            return True
        if self.closed or size > self.size or (size < self.size and length > size):
            return False
        return (self.count + -(-length // self.size) <= self.max_segments
                and self.stop - self.start + length <= self.max_bytes)

    def add(self, length: int, size: int) -> None:
        """The piece read at ``stop`` (``length`` > 0 bytes, segments of ``size``) is now the run's tail."""
        if not self.count:
            self.size = size
        self.stop += length
        self.count += -(-length // self.size)
        self.closed = length % self.size != 0


def path_segment_limit(sock: socket.socket) -> int:
    """Largest datagram a GSO send on the connected ``sock`` may cut: the route's MTU less the IP
    and UDP headers (the kernel refuses a larger segment size with EINVAL); 0 if unknown."""
    try:
        if sock.family == socket.AF_INET6:
            return max(0, sock.getsockopt(socket.IPPROTO_IPV6, IPV6_MTU) - 48)
        return max(0, sock.getsockopt(socket.IPPROTO_IP, IP_MTU) - 28)
    except OSError:
        return 0


def split_segments(buffer: memoryview, size: int) -> Iterator[memoryview]:
    """The datagrams of a coalesced ``buffer``: ``size`` bytes each, the last one shorter or equal."""
    _check_size(size)
    for start in range(0, len(buffer), size):
        yield buffer[start:start + size]


_gro_usable = True
_gso_usable: bool | None = None
"""None until probed: a kernel before 4.18 ignores a ``UDP_SEGMENT`` cmsg and sends the batch as one datagram."""


def gso_usable() -> bool:
    """Whether this process sends with ``UDP_SEGMENT``: probed once (the kernel knows the socket
    option), then False for good after a send fails with ``GSO_UNSUPPORTED``."""
    global _gso_usable
    if _gso_usable is None:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.getsockopt(SOL_UDP, UDP_SEGMENT)
        except OSError:
            _gso_usable = False
        else:
            _gso_usable = True
    return _gso_usable


def batching_usable() -> tuple[bool, bool]:
    """(GRO, GSO): whether this process still asks the kernel for them."""
    return _gro_usable, gso_usable()


def enable_gro(sock: socket.socket) -> bool:
    """Turn on receive coalescing for ``sock``; False (and never again) if the kernel refuses."""
    global _gro_usable
    if not _gro_usable:
        return False
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
    except OSError as exc:
        if exc.errno not in REFUSALS:
            raise
        _gro_usable = False
        return False
    return True


def send_segments(sock: socket.socket, buffer: memoryview, size: int, addr: Address) -> int:
    """Send the datagrams of ``buffer`` (``size`` bytes each) to ``addr`` through the unconnected ``sock``.
    Returns the bytes sent: less than all when the socket buffer is full (the caller queues the rest).
    Other errors propagate after the datagrams already sent."""
    if len(buffer) <= size:
        try:
            return sock.sendto(buffer, addr)
        except BlockingIOError:
            return 0
    if gso_usable():
        try:
            sock.sendmsg([buffer], [segment_cmsg(size)], 0, addr)
            return len(buffer)
        except BlockingIOError:
            return 0
        except OSError as exc:
            _gso_failed(exc)
    sent = 0
    for segment in split_segments(buffer, size):
        try:
            sock.sendto(segment, addr)
        except BlockingIOError:
            break
        sent += len(segment)
    return sent


def send_datagrams(sock: socket.socket, datagrams: list[bytes], max_segment: int) -> int:
    """Send ``datagrams`` in order through the connected ``sock``, in GSO runs where it can. Returns the
    bytes sent: the rest is dropped, as UDP drops, on a full socket buffer. Other errors (ECONNREFUSED
    from an earlier ICMP) propagate."""
    if len(datagrams) == 1 or not max_segment or not gso_usable():
        return _send_each(sock, datagrams)
    sent = 0
    for start, stop, size in gso_runs([len(d) for d in datagrams], max_segment):
        run = datagrams[start:stop]
        if len(run) > 1 and _gso_usable:
            try:
                sock.sendmsg(run, [segment_cmsg(size)])
            except BlockingIOError:
                return sent
            except OSError as exc:
                _gso_failed(exc)
            else:
                sent += sum(len(d) for d in run)
                continue
        run_sent = _send_each(sock, run)
        sent += run_sent
        if run_sent < sum(len(d) for d in run):
            return sent
    return sent


def _gso_failed(exc: OSError) -> None:
    """A ``UDP_SEGMENT`` send failed: stop using GSO if it cannot work here, re-raise what is not
    about GSO; the caller then sends the batch one datagram at a time."""
    global _gso_usable
    if exc.errno in GSO_UNSUPPORTED:
        _gso_usable = False
    elif exc.errno not in GSO_REFUSED_ONCE:
        raise exc


def _send_each(sock: socket.socket, datagrams: Sequence[bytes]) -> int:
    """One ``send`` per datagram until the socket buffer is full; the bytes sent."""
    sent = 0
    for datagram in datagrams:
        try:
            sock.send(datagram)
        except BlockingIOError:
            break
        sent += len(datagram)
    return sent
