"""``--workers N``: per-client limits counted once across the workers, in a memfd they share.

The supervisor makes the table once per run and passes it to every worker, restarts included
(docs/architecture.md). Each admission and release runs under an exclusive ``lockf`` of one byte per
limit around the pure, non-blocking ``router.client_count_table``. The kernel drops a dead process's
POSIX locks and each table step is one store, so a killed worker leaves the table unlocked and
consistent; its slots come back when its replacement zeroes its column. Closing ANY fd of the file
drops all of the process's locks: a worker is one thread and keeps its fd and map open for life.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
from enum import IntEnum

from router import constants as c
from router.client_count_table import (
    HEADER_BYTES,
    SALT_BYTES,
    Admission,
    ClientCountTable,
    LayoutError,
    TableLayout,
    pack_key,
)
from router.client_limits import ClientCounts, ClientLimitTable
from router.memory_file import new_memory_file

log = logging.getLogger("router.client_limits")  # pinned: operators filter logs by this name


class CountedRegion(IntEnum):
    """Which limit a region of the shared file counts; also the byte its lock takes."""

    TCP_CONNECTIONS = 0
    QUIC_FLOWS = 1


def create_table_file(
    workers: int, capacity: int = c.CLIENT_TABLE_CAPACITY, window: int = c.CLIENT_TABLE_PROBE_WINDOW
) -> int:
    """A new shared table for ``workers`` columns; its fd (close-on-exec: pass it with ``pass_fds``)."""
    layout = TableLayout(capacity, workers, min(window, capacity), os.urandom(SALT_BYTES), len(CountedRegion))
    return new_memory_file("stargate-router-client-limits", layout.header(), layout.file_bytes)


class SharedTableFile:
    """The shared file mapped by one worker, which counts in column ``column``."""

    def __init__(self, fd: int, column: int) -> None:
        try:
            header = os.pread(fd, HEADER_BYTES, 0)
            self.layout = TableLayout.parse(header)
            if os.fstat(fd).st_size != self.layout.file_bytes:
                raise LayoutError("shared table file has the wrong size")
        except OSError as exc:
            raise LayoutError(f"shared table fd {fd}: {exc}") from None
        if not 0 <= column < self.layout.workers:
            raise LayoutError(f"worker {column} has no column in a table for {self.layout.workers}")
        self.fd, self.column = fd, column
        self._map = mmap.mmap(fd, self.layout.file_bytes)
        """Shared and writable; never closed (its own fd would drop this process's locks)."""

    def counts(self, region: CountedRegion, limit: int) -> SharedClientLimitTable:
        """The limit ``region`` counts, this worker's column zeroed (what a dead predecessor held is given back)."""
        start = self.layout.region_offset(region)
        table = ClientCountTable(memoryview(self._map)[start:start + self.layout.region_bytes], self.layout)
        shared = SharedClientLimitTable(self.fd, table, region, self.column, limit)
        shared.clear_own_column()
        return shared


class SharedClientLimitTable:
    """``ClientCounts`` over the shared table: ``limit`` holds for a client's slots in every worker."""

    __slots__ = ("_alone", "_column", "_fd", "_full_logged", "_lock_at", "_mine", "_region", "_table", "limit")

    def __init__(self, fd: int, table: ClientCountTable, region: CountedRegion, column: int, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.limit = limit
        self._fd, self._table, self._region, self._column = fd, table, region, column
        self._lock_at = int(region)
        self._mine: dict[str, tuple[bytes, int]] = {}
        """This worker's clients in the shared table: stored key, slots (a release of none touches nothing)."""
        self._alone = ClientLimitTable(limit)
        """Clients the shared table had no room for, counted by this worker alone."""
        self._full_logged = False

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def _lock(self) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_EX, 1, self._lock_at)

    def _unlock(self) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, self._lock_at)

    def clear_own_column(self) -> None:
        self._lock()
        try:
            self._table.clear_column(self._column)
        finally:
            self._unlock()

    def try_acquire(self, key: str) -> bool:
        """Take one slot for ``key`` unless its slots in every worker add up to ``limit``."""
        if not self.limit:
            return True
        packed, mine = self._mine.get(key) or (pack_key(key), 0)
        self._lock()
        try:
            admission = self._table.acquire(packed, self._column, self.limit)
        finally:
            self._unlock()
        if admission is Admission.ADMITTED:
            self._mine[key] = packed, mine + 1
            return True
        if admission is Admission.AT_LIMIT:
            return False
        if not self._full_logged:
            self._full_logged = True
            log.warning(
                "shared per-client table full (%s): clients it has no room for are counted per worker",
                self._region.name.lower(), extra={"capacity": c.CLIENT_TABLE_CAPACITY},
            )
        return self._alone.try_acquire(key)

    def release(self, key: str) -> None:
        """Give one slot of ``key`` back (one counted alone first); releasing none is a no-op."""
        if self._alone.held(key):
            self._alone.release(key)
            return
        held = self._mine.get(key)
        if held is None:
            return
        packed, mine = held
        if mine > 1:
            self._mine[key] = packed, mine - 1
        else:
            del self._mine[key]
        self._lock()
        try:
            self._table.release(packed, self._column)
        finally:
            self._unlock()

    def held(self, key: str) -> int:
        """``key``'s slots in every worker (plus those this worker counts alone)."""
        packed = pack_key(key)
        self._lock()
        try:
            total = self._table.total(packed)
        finally:
            self._unlock()
        return total + self._alone.held(key)

    def __len__(self) -> int:
        """Clients holding a slot in this worker (one held both shared and alone counts twice)."""
        return len(self._mine) + len(self._alone)


def client_counts(
    tcp_limit: int, quic_limit: int, table_fd: int | None = None, column: int = 0
) -> tuple[ClientCounts, ClientCounts]:
    """Where this process counts its two per-client limits: the supervisor's table (``table_fd``, its
    ``column``) for a limit that is on, else its own. ``LayoutError``: the fd holds no usable table."""
    if table_fd is None or not (tcp_limit or quic_limit):
        return ClientLimitTable(tcp_limit), ClientLimitTable(quic_limit)
    shared = SharedTableFile(table_fd, column)
    tcp: ClientCounts = shared.counts(CountedRegion.TCP_CONNECTIONS, tcp_limit) if tcp_limit else ClientLimitTable(0)
    quic: ClientCounts = shared.counts(CountedRegion.QUIC_FLOWS, quic_limit) if quic_limit else ClientLimitTable(0)
    return tcp, quic


def table_file_for(workers: int, tcp_limit: int, quic_limit: int) -> int | None:
    """The supervisor's shared table: made once per run when a per-client limit is on, else None."""
    return create_table_file(workers) if workers > 1 and (tcp_limit or quic_limit) else None
