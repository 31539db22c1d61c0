"""UDP batching: GRO on receive, GSO (``UDP_SEGMENT``) on send, and the fallback without them.

Linux can hand one ``recvmsg`` several datagrams of one peer glued together (``UDP_GRO``; a
cmsg gives the segment size, every segment that long but the last) and can take such a buffer
in one ``sendmsg`` with a ``UDP_SEGMENT`` cmsg, cutting it back into the same datagrams on the
wire. The stdlib names neither option, so the numbers of ``<linux/udp.h>`` are here.

The bytes helpers are pure. ``enable_gro`` and ``send_segments`` touch sockets: the first
time the kernel refuses an option (no such option, a device without checksum offload) the
process stops asking and sends one datagram per call from then on.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator
from typing import Any

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

REFUSALS = frozenset({errno.EINVAL, errno.EIO, errno.ENOPROTOOPT})
"""Errors meaning the kernel (or the route's device) does not do GRO/GSO here."""

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


def split_segments(buffer: memoryview, size: int) -> Iterator[memoryview]:
    """The datagrams of a coalesced ``buffer``: ``size`` bytes each, the last one shorter or equal."""
    _check_size(size)
    for start in range(0, len(buffer), size):
        yield buffer[start:start + size]


_gro_usable = True
_gso_usable = True


def batching_usable() -> tuple[bool, bool]:
    """(GRO, GSO): whether this process still asks the kernel for them."""
    return _gro_usable, _gso_usable


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
    global _gso_usable
    if len(buffer) <= size:
        try:
            return sock.sendto(buffer, addr)
        except BlockingIOError:
            return 0
    if _gso_usable:
        try:
            sock.sendmsg([buffer], [segment_cmsg(size)], 0, addr)
            return len(buffer)
        except BlockingIOError:
            return 0
        except OSError as exc:
            if exc.errno not in REFUSALS:
                raise
            _gso_usable = False
    sent = 0
    for segment in split_segments(buffer, size):
        try:
            sock.sendto(segment, addr)
        except BlockingIOError:
            break
        sent += len(segment)
    return sent
