"""The demo's files, kept in memory: the CA, the pods' certificate and key, the endpoints file.

aioquic and the router open files by path, so the demo hands out ``/proc/self/fd/N`` paths of anonymous
memory files (``memfd_create``): it writes nothing to disk and runs where no directory is writable (the
Rust router's chart: read-only root, no ``/tmp``). Only this process can open them, which is all it needs.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

from router.memory_file import new_memory_file

PROC_FD = Path("/proc/self/fd")
"""Where the kernel shows this process's open files as paths anyone in the process can open."""


class MemoryFiles:
    """Named memory files that exist while this object is open (a context manager)."""

    def __init__(self) -> None:
        self._fds: list[int] = []

    def write(self, name: str, data: bytes) -> Path:
        """A new file holding ``data``; the path to open it by (``name`` shows in ``/proc``)."""
        fd = new_memory_file(name, data)
        self._fds.append(fd)
        return PROC_FD / str(fd)

    def replace(self, path: Path, data: bytes) -> None:
        """Swap the file at ``path`` for one holding ``data``, atomically (``dup2`` onto its descriptor): a
        reader sees the old bytes or the new, with a new identity, as with a ConfigMap's symlink swap."""
        fd = int(path.name)
        if path.parent != PROC_FD or fd not in self._fds:
            raise ValueError(f"{path} is not one of these memory files")
        new = new_memory_file(f"{fd}", data)
        try:
            os.dup2(new, fd, inheritable=False)
        finally:
            os.close(new)

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    def __enter__(self) -> MemoryFiles:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
