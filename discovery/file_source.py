"""Discovery from a file of EndpointSlices (YAML or JSON), re-read whenever it changes.

For clusters without API access, and tests. Polled (a ConfigMap mount swaps a symlink, which
inotify-style watching misses), reloaded when its identity (inode, size, mtime, ctime) changes. An
unusable file keeps the last good snapshot serving: a bad edit must not empty the routing table.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from discovery.constants import ENDPOINTS_FILE_MAX_BYTES, ENDPOINTS_FILE_POLL_INTERVAL_S
from discovery.endpoint_slices import EndpointSliceError, parse_endpoints_document, targets_from_slices
from discovery.observer import DiscoveryObserver
from discovery.settings import DiscoverySettings
from discovery.targets import TargetSnapshot

logger = logging.getLogger("discovery.file_source")  # pinned: operators filter logs by this name

SOURCE_LABEL = "file"


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What tells one version of the file from the next without reading it."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True, slots=True)
class FileLoad:
    """One read of the file: its identity (None if it could not be opened) and the result."""

    identity: FileIdentity | None
    snapshot: TargetSnapshot | None
    error: str | None = None


def stat_identity(path: Path) -> FileIdentity | None:
    """The identity of the file now (following symlinks), or None if it cannot be stat'ed."""
    try:
        return FileIdentity.of(os.stat(path))
    except (OSError, ValueError):
        return None


def load_endpoints_file(path: Path, settings: DiscoverySettings) -> FileLoad:
    """Read, parse and derive; never raises for a missing, oversized or malformed file."""
    identity: FileIdentity | None = None
    try:
        with open(path, "rb") as file:
            identity = FileIdentity.of(os.fstat(file.fileno()))  # of the bytes actually read
            if identity.size > ENDPOINTS_FILE_MAX_BYTES:
                return FileLoad(identity, None, f"larger than {ENDPOINTS_FILE_MAX_BYTES} bytes")
            data = file.read(ENDPOINTS_FILE_MAX_BYTES + 1)
        if len(data) > ENDPOINTS_FILE_MAX_BYTES:
            return FileLoad(identity, None, f"larger than {ENDPOINTS_FILE_MAX_BYTES} bytes")
        slices = parse_endpoints_document(data.decode("utf-8-sig"))
    except (OSError, ValueError) as exc:  # ValueError covers EndpointSliceError and UnicodeDecodeError
        reason = str(exc) if isinstance(exc, EndpointSliceError) else f"{type(exc).__name__}: {exc}"
        return FileLoad(identity, None, " ".join(reason.split()))
    return FileLoad(identity, targets_from_slices(slices, settings))


class EndpointsFileSource:
    """Publishes the file's snapshot at start and after every change that alters the targets.

    ``last_sync_monotonic``: when the snapshot was last confirmed to match the file (a good load, or an
    unchanged poll since one), so the sync-age gauge grows only while the file is missing or broken."""

    def __init__(
        self,
        settings: DiscoverySettings,
        publish: Callable[[TargetSnapshot], None],
        observer: DiscoveryObserver | None = None,
        *,
        path: Path,
        poll_interval_s: float = ENDPOINTS_FILE_POLL_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not poll_interval_s > 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s!r}")
        self._settings = settings
        self._publish = publish
        self._observer = observer
        self._path = Path(path)
        self._poll_interval_s = poll_interval_s
        self._clock = clock
        self.synced = asyncio.Event()
        self.last_sync_monotonic: float | None = None
        self._published: TargetSnapshot | None = None
        self._attempted = False
        self._attempted_identity: FileIdentity | None = None
        self._last_ok = False
        if observer is not None:
            observer.synced(SOURCE_LABEL, self.sync_age_s)

    def sync_age_s(self) -> float:
        """Seconds since the last confirmed sync, -1 before the first."""
        if self.last_sync_monotonic is None:
            return -1.0
        return max(0.0, self._clock() - self.last_sync_monotonic)

    def load_once(self) -> bool:
        """Read and publish now (synchronously); True if the file was usable."""
        return self._commit(load_endpoints_file(self._path, self._settings))

    async def run(self) -> None:
        """Poll until cancelled; reads happen in a worker thread so a big file never stalls routing."""
        while True:
            identity = stat_identity(self._path)
            if self._attempted and identity == self._attempted_identity:
                if self._last_ok:
                    self.last_sync_monotonic = self._clock()
            else:
                self._commit(await asyncio.to_thread(load_endpoints_file, self._path, self._settings))
            await asyncio.sleep(self._poll_interval_s)

    def _commit(self, load: FileLoad) -> bool:
        recovered = self._attempted and not self._last_ok
        self._attempted = True
        self._attempted_identity = load.identity
        if load.snapshot is None:
            self._last_ok = False
            if self._observer is not None:
                self._observer.error(SOURCE_LABEL)
            # One line per unusable version of the file (a version is retried only when it changes).
            logger.warning(
                "endpoints file %s unusable (%s); keeping the last good snapshot (%s targets)",
                self._path, load.error,
                len(self._published) if self._published is not None else "no",
            )
            return False
        if recovered:
            logger.info("endpoints file %s usable again", self._path)
        self._last_ok = True
        self.last_sync_monotonic = self._clock()
        if load.snapshot != self._published:
            self._published = load.snapshot
            self._publish(load.snapshot)
            if self._observer is not None:
                self._observer.published(SOURCE_LABEL, len(load.snapshot))
            logger.info("endpoints file %s: %d targets", self._path, len(load.snapshot))
        elif self._observer is not None:
            self._observer.unchanged(SOURCE_LABEL)
        self.synced.set()
        return True
