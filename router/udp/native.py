"""The C splice of established QUIC flows (``router/udp/_splice.c``), when the router uses it.

``setup.py`` builds it when a C compiler is there; ``router.extensions`` decides once whether the
edge uses it (``Extensions.splice``, and ``Extensions.io_uring`` for its sends to many pods in one
``io_uring_enter``). Without it the edge runs the same flows through its pure-Python path
(``pod_link``, ``pod_to_client``); both paths are tested, and they differ only in cost: which
datagrams reach whom, in which order, and what the flows count are the same.
"""

from __future__ import annotations

import errno
import logging
from typing import TYPE_CHECKING

from router import constants as c
from router.extensions import SPLICE_MODULE, Extensions
from router.extensions import is_built as _is_built

if TYPE_CHECKING:
    from router.udp._splice import Splicer

log = logging.getLogger("router.udp_router")


def is_built() -> bool:
    """Whether the C splice is importable."""
    return _is_built(SPLICE_MODULE)


def splicer_type(extensions: Extensions) -> type[Splicer] | None:
    """The ``Splicer`` class when ``extensions`` chose the C splice (checked built by the
    settings), else None for the pure-Python path."""
    if not extensions.splice:
        return None
    from router.udp._splice import Splicer as built

    return built


def open_splicer(splicer_type: type[Splicer], listener_fd: int, io_uring: bool) -> Splicer:
    """The C splice on the listener; with ``io_uring`` its sends to many pods go in one
    ``io_uring_enter`` per batch where the kernel allows it. A kernel or seccomp profile that
    refuses io_uring leaves ``sendmmsg``, and says so."""
    splicer = splicer_type(
        listener_fd, c.QUIC_SPLICE_BATCHES_PER_CALLBACK, c.QUIC_POD_READS_PER_CALLBACK, io_uring=io_uring
    )
    if splicer.io_uring_errno:  # containerd 2's and Docker 25's default seccomp profiles refuse it
        name = errno.errorcode.get(splicer.io_uring_errno, str(splicer.io_uring_errno))
        log.info("io_uring refused (%s): the C splice sends to each pod with sendmmsg", name)
    return splicer


def datapath(splicer: Splicer | None) -> str:
    """What moves established flows' datagrams, for the start line: ``python``, ``c_splice``, or
    ``c_splice+io_uring`` (a batch's sends to many pods in one system call)."""
    if splicer is None:
        return "python"
    return "c_splice+io_uring" if splicer.io_uring else "c_splice"
