"""Per-client counts that N worker processes share, laid out in one buffer: the pure part.

A client must count once across ``--workers N`` (docs/architecture.md). Each worker changes only its own
column of counts, so a dead worker is forgotten by zeroing its column. Linear probing within ``window``
entries of a salted hash (a client cannot aim at another's entries). Invariants: a key stays in its entry
(reusable once all its columns are 0); keys are written only at or before the first never-used (all-zero)
entry of their window, so a lookup stops there; an entry becomes never-used again only when the next one
is. A full window is ``FULL``: the caller counts that client alone. The caller holds the table's lock
around every call; nothing here is atomic.
"""

from __future__ import annotations

import hashlib
import socket
import struct
from dataclasses import dataclass
from enum import StrEnum

KEY_BYTES = 16
"""A client key's stored size: a tag byte, then an IPv4 address, an IPv6 /64 or a digest."""
COUNT_BYTES = 4
"""One count: an unsigned 32-bit integer (a limit is at most 1,000,000)."""
SALT_BYTES = 16
"""The hash key: random per supervisor run, so the probe windows cannot be predicted."""
MAGIC = b"SGRCLIM1"
"""The header's first bytes; anything else is not this layout."""
_HEADER = struct.Struct(f"<8sIII{SALT_BYTES}s")
HEADER_BYTES = 64
"""The header's room (``_HEADER`` plus padding); the regions start after it."""
_EMPTY_KEY = bytes(KEY_BYTES)
_MASK_128 = (1 << 128) - 1
_IPV4_TAG, _IPV6_TAG, _OTHER_TAG = b"\x04", b"\x06", b"\x01"
"""A stored key's first byte: never 0, so a stored key is never the never-used marker."""


class LayoutError(ValueError):
    """The shared buffer's header is not a table this process can use."""


class Admission(StrEnum):
    """What ``ClientCountTable.acquire`` did."""

    ADMITTED = "admitted"
    """One slot taken in the caller's column."""
    AT_LIMIT = "at_limit"
    """The client's count over every column is already the limit: nothing taken."""
    FULL = "full"
    """No entry of the client's window is free: nothing taken (the caller counts it alone)."""


@dataclass(frozen=True)
class TableLayout:
    """The shape every worker reads from the header: entries, columns, probe window, hash salt."""

    capacity: int
    workers: int
    window: int
    salt: bytes
    regions: int = 2
    """One per limit: TCP connections, QUIC flows."""

    def __post_init__(self) -> None:
        if not (self.capacity >= 1 and self.workers >= 1 and 1 <= self.window <= self.capacity):
            raise LayoutError(f"bad shared table shape: {self.capacity=} {self.workers=} {self.window=}")
        if len(self.salt) != SALT_BYTES:
            raise LayoutError(f"bad shared table salt: {len(self.salt)} bytes")

    @property
    def region_bytes(self) -> int:
        return self.capacity * (KEY_BYTES + COUNT_BYTES * self.workers)

    @property
    def file_bytes(self) -> int:
        return HEADER_BYTES + self.regions * self.region_bytes

    def region_offset(self, region: int) -> int:
        return HEADER_BYTES + region * self.region_bytes

    def header(self) -> bytes:
        packed = _HEADER.pack(MAGIC, self.capacity, self.workers, self.window, self.salt)
        return packed.ljust(HEADER_BYTES, b"\0")

    @classmethod
    def parse(cls, header: bytes | memoryview) -> TableLayout:
        """The layout a header describes; ``LayoutError`` for anything else."""
        if len(header) < _HEADER.size:
            raise LayoutError("shared table header cut short")
        magic, capacity, workers, window, salt = _HEADER.unpack_from(header)
        if magic != MAGIC:
            raise LayoutError("not a shared client table (bad magic)")
        return cls(capacity, workers, window, salt)


def pack_key(key: str) -> bytes:
    """The 16 stored bytes of a ``client_key``: an IPv4 address, an IPv6 /64 prefix, or (for a
    key that is neither, which no socket produces) a digest of it; never raises."""
    try:  # inet_pton: a C call, as this runs twice per connection or flow with --workers N
        if key.endswith("/64"):
            return _IPV6_TAG + socket.inet_pton(socket.AF_INET6, key[:-3])[:8] + bytes(7)
        return _IPV4_TAG + socket.inet_pton(socket.AF_INET, key) + bytes(11)
    except (OSError, ValueError):
        return _OTHER_TAG + hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=15).digest()


class ClientCountTable:
    """One region of the shared buffer: per-client counts in one column per worker."""

    __slots__ = ("_capacity", "_counts", "_keys", "_multiplier", "_placed", "_window")

    def __init__(self, region: memoryview, layout: TableLayout) -> None:
        """``region``: ``layout.region_bytes`` writable bytes, shared by every worker."""
        if len(region) != layout.region_bytes:
            raise LayoutError(f"region of {len(region)} bytes, layout needs {layout.region_bytes}")
        keys_end = layout.capacity * KEY_BYTES
        self._keys = region[:keys_end]
        self._counts = region[keys_end:].cast("I")
        self._capacity, self._window = layout.capacity, layout.window
        self._multiplier = int.from_bytes(layout.salt, "little") | 1
        self._placed: dict[tuple[int, bytes], int] = {}
        """``(column, key) -> entry`` for the slots this process holds: such an entry never moves (it is
        not free while its count is above 0), so a release or a repeat needs no probe."""

    # -- the calls a worker makes (under the lock) --------------------------------------
    def acquire(self, key: bytes, column: int, limit: int) -> Admission:
        """Take one slot for ``key`` in ``column`` unless its count over all columns is ``limit``."""
        placed = self._placed.get((column, key))
        if placed is not None:
            entry = placed
            if self.total_at(entry) >= limit:
                return Admission.AT_LIMIT
        else:
            found, free = self._find(key)
            if found is None:
                if free is None:
                    return Admission.FULL
                self._keys[free * KEY_BYTES:(free + 1) * KEY_BYTES] = key  # a free entry's columns are all 0
                entry = free
            elif self.total_at(found) >= limit:
                return Admission.AT_LIMIT
            else:
                entry = found
            self._placed[column, key] = entry
        self._counts[column * self._capacity + entry] += 1
        return Admission.ADMITTED

    def release(self, key: bytes, column: int) -> bool:
        """Give back one of ``key``'s slots in ``column``; False (nothing changed) if it held none.
        Only the process that took a column's slots gives them back (or clears the column)."""
        entry = self._placed.get((column, key))
        if entry is None:
            return False
        at = column * self._capacity + entry
        self._counts[at] -= 1
        if not self._counts[at]:
            del self._placed[column, key]
            if not self.total_at(entry):
                self._forget_from(entry)
        return True

    def clear_column(self, column: int) -> None:
        """Zero ``column`` (a new worker in that place holds nothing yet)."""
        self._placed = {placed: entry for placed, entry in self._placed.items() if placed[0] != column}
        start = column * self._capacity
        self._counts[start:start + self._capacity] = memoryview(bytes(COUNT_BYTES * self._capacity)).cast("I")

    # -- reading ----------------------------------------------------------------------------
    def total(self, key: bytes) -> int:
        """``key``'s slots over every column."""
        entry, _free = self._find(key)
        return 0 if entry is None else self.total_at(entry)

    def held(self, key: bytes, column: int) -> int:
        """``key``'s slots in ``column``."""
        entry, _free = self._find(key)
        return 0 if entry is None else self._counts[column * self._capacity + entry]

    def live_entries(self) -> int:
        """Clients holding at least one slot in any column (a scan: for tests and debugging)."""
        return sum(1 for entry in range(self._capacity) if self.total_at(entry))

    def total_at(self, entry: int) -> int:
        """The count of ``entry`` in every column: one strided slice, summed in C."""
        return sum(self._counts[entry::self._capacity])

    # -- probing ------------------------------------------------------------------------------
    def _home(self, key: bytes) -> int:
        """Multiply-shift by the salt (odd): a universal hash, cheap enough to run per connection."""
        product = (int.from_bytes(key, "little") * self._multiplier) & _MASK_128
        return (product >> 64) % self._capacity

    def _find(self, key: bytes) -> tuple[int | None, int | None]:
        """``(key's entry or None, the first free entry of its window or None)``."""
        keys, capacity = self._keys, self._capacity
        entry = self._home(key)
        free: int | None = None
        for _ in range(self._window):
            stored = keys[entry * KEY_BYTES:(entry + 1) * KEY_BYTES]
            if stored == _EMPTY_KEY:
                return None, entry if free is None else free
            if stored == key:
                return entry, None
            if free is None and not self.total_at(entry):
                free = entry
            entry = entry + 1 if entry + 1 < capacity else 0
        return None, free

    def _never_used(self, entry: int) -> bool:
        return self._keys[entry * KEY_BYTES] == 0

    def _forget_from(self, entry: int) -> None:
        """``entry`` fell to 0: if the next entry was never used, no probe passes ``entry``, so it and
        the free entries before it become never used (stopping at a held one, or a full circle)."""
        capacity = self._capacity
        if not self._never_used(entry + 1 if entry + 1 < capacity else 0):
            return
        for _ in range(capacity):
            if self._never_used(entry) or self.total_at(entry):
                return
            self._keys[entry * KEY_BYTES:(entry + 1) * KEY_BYTES] = _EMPTY_KEY
            entry = entry - 1 if entry else capacity - 1
