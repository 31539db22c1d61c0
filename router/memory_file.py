"""Anonymous memory files (``memfd_create``): what the supervisor shares with its workers (the
per-client table, the connection-ID index) and the demo's files. No path anyone could name or open
from outside; close-on-exec, so a child gets one only when it is passed (``pass_fds``)."""

from __future__ import annotations

import os


def new_memory_file(name: str, head: bytes, size: int = 0) -> int:
    """A new memory file of ``max(size, len(head))`` bytes that starts with ``head`` (the rest zero,
    its pages made only when written); its fd. ``name`` shows in ``/proc/<pid>/fd`` only."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(size, len(head)))
        view, at = memoryview(head), 0
        while at < len(view):
            at += os.pwrite(fd, view[at:], at)
    except BaseException:
        os.close(fd)
        raise
    return fd
