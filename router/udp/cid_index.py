"""Which pod each connection ID names, shared by the ``--workers N`` processes of one router.

A client whose NAT rebinds may reach a worker that never saw its connection (docs/quic.md, across
workers). Only worker ``i`` writes region ``i`` (no lock: one writer); every worker reads them all.
An entry's sequence number is odd while it is written, so a torn read is a miss, never a wrong pod.
The hash is salted per run and a full window gives up its first entry: the index only holds hints,
and a join still needs a ready pod at that address in the current snapshot.
"""

from __future__ import annotations

import mmap
import os
import secrets
import socket
import struct
from dataclasses import dataclass

from quic.packet import MAX_CID_LENGTH
from router.constants import MAX_PORT
from router.memory_file import new_memory_file

SALT_BYTES = 16
"""The hash key: random per supervisor run, so a client cannot aim at another's entries."""
MAGIC = b"SGRCIDX1"
"""The header's first bytes; anything else is not this layout."""
_HEADER = struct.Struct(f"<8sIII{SALT_BYTES}s")
HEADER_BYTES = 64
"""The header's room; the regions start after it."""
MASK_BYTES = 8
"""A region's first bytes: the mask of connection ID lengths (bit n: length n) it holds."""
_ENTRY = struct.Struct(f"<IB{MAX_CID_LENGTH}sBH16s")
"""sequence (u32), ID length (0: empty), ID, address family (4 or 6), pod port, pod address."""
ENTRY_BYTES = 48
"""``_ENTRY`` (44 bytes) padded: an entry never straddles two cache lines."""
_SEQUENCE = struct.Struct("<I")
_MASK = struct.Struct("<I")
_FAMILIES = {4: socket.AF_INET, 6: socket.AF_INET6}
_V4_IN_V6 = bytes(12)


class CidIndexError(ValueError):
    """The shared buffer is not an index this process can use."""


@dataclass(frozen=True)
class IndexLayout:
    """The shape every worker reads from the header."""

    capacity: int
    """Entries per worker region."""
    workers: int
    window: int
    salt: bytes

    def __post_init__(self) -> None:
        if not (self.capacity >= 1 and 1 <= self.workers <= 255 and 1 <= self.window <= self.capacity):
            raise CidIndexError(f"bad index shape: {self.capacity=} {self.workers=} {self.window=}")
        if len(self.salt) != SALT_BYTES:
            raise CidIndexError(f"bad index salt: {len(self.salt)} bytes")

    @property
    def region_bytes(self) -> int:
        return MASK_BYTES + self.capacity * ENTRY_BYTES

    @property
    def file_bytes(self) -> int:
        return HEADER_BYTES + self.workers * self.region_bytes

    def header(self) -> bytes:
        return _HEADER.pack(MAGIC, self.capacity, self.workers, self.window, self.salt).ljust(HEADER_BYTES, b"\0")

    @classmethod
    def parse(cls, header: bytes | memoryview) -> IndexLayout:
        if len(header) < _HEADER.size:
            raise CidIndexError("index header cut short")
        magic, capacity, workers, window, salt = _HEADER.unpack_from(header)
        if magic != MAGIC:
            raise CidIndexError("not a connection ID index (bad magic)")
        return cls(capacity, workers, window, salt)


def pack_endpoint(address: str, port: int) -> tuple[int, bytes] | None:
    """``(family, 16 address bytes)`` of a numeric pod address; None for anything else."""
    try:
        return 4, _V4_IN_V6 + socket.inet_pton(socket.AF_INET, address)
    except OSError:
        pass
    try:
        return 6, socket.inet_pton(socket.AF_INET6, address)
    except OSError:
        return None


class CidIndex:
    """The shared buffer as this worker sees it: its own region to write, every region to read."""

    __slots__ = ("_capacity", "_multiplier", "_regions", "_view", "_window", "me")

    def __init__(self, buffer: memoryview, me: int) -> None:
        """``buffer``: the whole shared index (header first); ``me``: this worker's region."""
        layout = IndexLayout.parse(buffer[:HEADER_BYTES])
        if len(buffer) < layout.file_bytes or not 0 <= me < layout.workers:
            raise CidIndexError(f"index of {len(buffer)} bytes for {layout.workers} workers, worker {me}")
        self._view = buffer
        self._capacity, self._window = layout.capacity, layout.window
        self._multiplier = int.from_bytes(layout.salt, "little") | 1
        self._regions = tuple(HEADER_BYTES + w * layout.region_bytes for w in range(layout.workers))
        self.me = me

    def _slot(self, cid: bytes) -> int:
        """The first entry of ``cid``'s window (multiply-shift of the ID, its length folded in)."""
        key = int.from_bytes(cid, "little") | (len(cid) << 8 * MAX_CID_LENGTH)
        return ((key * self._multiplier) >> 64) % self._capacity

    def _entry(self, region: int, slot: int) -> int:
        return self._regions[region] + MASK_BYTES + (slot % self._capacity) * ENTRY_BYTES

    def clear_mine(self) -> None:
        """Forget what this worker's predecessor wrote (a worker starts with no flows)."""
        start = self._regions[self.me]
        end = start + MASK_BYTES + self._capacity * ENTRY_BYTES
        self._view[start:end] = bytes(end - start)

    def put(self, cid: bytes, address: str, port: int) -> bool:
        """Say that ``cid`` names the pod at ``address``:``port``; False for what cannot be said."""
        endpoint = pack_endpoint(address, port)
        if endpoint is None or not 1 <= len(cid) <= MAX_CID_LENGTH or not 0 < port <= MAX_PORT:
            return False
        view, first = self._view, self._slot(cid)
        target = free = None
        for step in range(self._window):
            at = self._entry(self.me, first + step)
            length = view[at + 4]
            if length == len(cid) and bytes(view[at + 5:at + 5 + length]) == cid:
                target = at
                break
            if length == 0 and free is None:
                free = at
        if target is None:  # a full window gives up its first entry: the index is a cache of hints
            target = free if free is not None else self._entry(self.me, first)
        family, packed = endpoint
        self._write(target, len(cid), cid, family, port, packed)
        mask_at = self._regions[self.me]
        _MASK.pack_into(view, mask_at, _MASK.unpack_from(view, mask_at)[0] | 1 << len(cid))
        return True

    def remove(self, cid: bytes) -> None:
        """This worker's flow that learned ``cid`` ended: forget it (another worker's entry stays)."""
        if not 1 <= len(cid) <= MAX_CID_LENGTH:
            return
        view, first = self._view, self._slot(cid)
        for step in range(self._window):
            at = self._entry(self.me, first + step)
            if view[at + 4] == len(cid) and bytes(view[at + 5:at + 5 + len(cid)]) == cid:
                self._write(at, 0, b"", 0, 0, b"")
                return

    def _write(self, at: int, length: int, cid: bytes, family: int, port: int, packed: bytes) -> None:
        """One entry of this worker's region, its sequence odd while the fields change."""
        writing = (_SEQUENCE.unpack_from(self._view, at)[0] + 1) | 1
        _SEQUENCE.pack_into(self._view, at, writing)
        _ENTRY.pack_into(self._view, at, writing, length, cid, family, port, packed)
        _SEQUENCE.pack_into(self._view, at, (writing + 1) & 0xFFFFFFFF)

    def lengths(self) -> tuple[int, ...]:
        """Every connection ID length some worker holds, shortest first."""
        mask = 0
        for start in self._regions:
            mask |= _MASK.unpack_from(self._view, start)[0]
        return tuple(n for n in range(1, MAX_CID_LENGTH + 1) if mask >> n & 1)

    def pod_of(self, cid: bytes) -> tuple[str, int] | None:
        """``(address, port)`` of the pod a worker said ``cid`` names, this worker's first; None if none."""
        if not 1 <= len(cid) <= MAX_CID_LENGTH:
            return None
        view, first = self._view, self._slot(cid)
        for region in (self.me, *(r for r in range(len(self._regions)) if r != self.me)):
            for step in range(self._window):
                at = self._entry(region, first + step)
                if view[at + 4] != len(cid):
                    continue
                entry = bytes(view[at:at + _ENTRY.size])
                sequence, length, stored, family, port, packed = _ENTRY.unpack(entry)
                if sequence & 1 or stored[:length] != cid or _SEQUENCE.unpack_from(view, at)[0] != sequence:
                    continue  # being written, or written over while read: a miss, never a wrong pod
                if family == 4:
                    return socket.inet_ntop(socket.AF_INET, packed[12:]), port
                if family == 6:
                    return socket.inet_ntop(socket.AF_INET6, packed), port
        return None


def create_index_file(workers: int, capacity: int, window: int) -> int:
    """The supervisor's shared index: a memfd (no file anywhere), sized and headed; its fd."""
    layout = IndexLayout(capacity, workers, window, secrets.token_bytes(SALT_BYTES))
    return new_memory_file("stargate-router-cid-index", layout.header(), layout.file_bytes)


def map_index(fd: int, me: int) -> CidIndex:
    """This worker's view of the shared index at ``fd`` (its own region cleared); ``CidIndexError`` or
    ``OSError`` when ``fd`` holds no usable index."""
    size = os.fstat(fd).st_size
    if size < HEADER_BYTES:
        raise CidIndexError(f"index fd {fd} holds {size} bytes")
    mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    index = CidIndex(memoryview(mapped), me)
    index.clear_mine()
    return index
