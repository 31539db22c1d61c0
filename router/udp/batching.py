"""UDP batching: GRO on receive, GSO (``UDP_SEGMENT``) on send, and the fallback without them.

Linux can hand one ``recvmsg`` several datagrams of one peer glued together (``UDP_GRO``; a
cmsg gives the segment size, every segment that long but the last) and can take such a buffer
in one ``sendmsg`` with a ``UDP_SEGMENT`` cmsg, cutting it back into the same datagrams on the
wire. The stdlib names neither option, so the numbers of ``<linux/udp.h>`` are here.

Pod -> client: a GRO buffer from the pod leaves in one ``send_segments``. Client -> pod: the
listener stays on uvloop's C receive path, the datagrams of one flow read in one loop
iteration are collected, and ``send_datagrams`` plans them into GSO runs (``gso_runs``: equal
sizes, the last one shorter or equal) so a burst costs one ``sendmsg`` instead of one ``send``
each; the datagrams on the wire are the same ones, in the same order.

The bytes helpers are pure. ``enable_gro``, ``send_segments`` and ``send_datagrams`` touch
sockets: the first time the kernel refuses an option (no such option, a device without
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
"""Errors of a ``UDP_SEGMENT`` send meaning GSO does not work here (EIO: a device without
checksum offload): the process stops asking."""
GSO_REFUSED_ONCE = frozenset({errno.EINVAL, errno.EMSGSIZE})
"""Errors of a ``UDP_SEGMENT`` send about that send only (a segment over a path MTU that shrank):
its datagrams go one by one, and the next batch tries GSO again."""

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
    """Cut datagrams of these ``sizes`` (in order) into ``(start, stop, segment size)`` runs that
    one ``UDP_SEGMENT`` send carries unchanged: every datagram of a run as long as its first
    but the last, which may be shorter (and then ends the run); at most ``max_segments`` of them
    and ``max_bytes`` in all. A datagram longer than ``max_segment`` (the path MTU's payload) or
    empty goes alone. A run of one is a plain send."""
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
    """Pieces a socket delivered one after another (each one datagram or a GRO batch), read back
    to back into one buffer, and merged while one ``UDP_SEGMENT`` send still carries them
    unchanged: the same segment size, no short segment but the last, at most ``max_segments``
    and ``max_bytes``. ``start:stop`` is the run's region of the buffer."""

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
        """Whether a piece of ``length`` bytes in segments of ``size`` (``size == length`` for a
        single datagram), read at ``stop``, joins the run: a batch of the run's segment size, or
        one datagram no longer than it (a shorter one ends the run)."""
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
"""None until probed: a kernel before 4.18 ignores a ``UDP_SEGMENT`` cmsg and would send the
whole batch as one datagram, so GSO is only used once the socket option is known."""


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
    """Send the datagrams of ``buffer`` (``size`` bytes each) to ``addr`` through the unconnected
    ``sock``: one ``sendmsg`` with ``UDP_SEGMENT`` if the kernel takes it, else one ``sendto``
    each. Returns the bytes sent: less than all when the socket buffer is full (the caller
    queues the rest). Other errors propagate after the datagrams already sent."""
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
    """Send ``datagrams`` in order through the connected ``sock``, each run of ``gso_runs`` in one
    ``sendmsg`` with ``UDP_SEGMENT`` while the kernel takes it, else one ``send`` each. Returns
    the bytes sent: the rest is dropped, as UDP drops, when the socket buffer is full. Other
    errors (ECONNREFUSED from an earlier ICMP) propagate."""
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
