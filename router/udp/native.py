"""The optional C extensions of the QUIC edge, when they can be used.

``router/udp/_splice.c`` splices established flows; ``quic/_initial_protection.c`` opens a new
flow's first Initial. ``setup.py`` builds them when a C compiler (and, for the second, OpenSSL's
headers) is there; without them, or with ``NO_EXTENSIONS_ENV`` set, the edge runs the same flows
through its pure-Python paths (``pod_link``, ``pod_to_client``; ``cryptography`` and
``quic.clienthello``). Both paths are tested, and they differ only in cost: which datagrams reach
whom, in which order, what the flows count and which pod an Initial names are the same.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import TYPE_CHECKING

from quic import native as quic_native
from router import constants as c
from router import extensions
from router.extensions import NativeUnavailable

if TYPE_CHECKING:
    from router.udp._splice import Splicer

log = logging.getLogger("router.udp_router")


def is_built() -> bool:
    """Whether the C splice is importable (whatever ``NO_EXTENSIONS_ENV`` says)."""
    return extensions.is_built("router.udp._splice")


def splicer_type(wanted: bool | None) -> type[Splicer] | None:
    """The ``Splicer`` class to use, or None for the pure-Python path.

    ``wanted`` None: the C splice if it is built and ``NO_EXTENSIONS_ENV`` is not set; False:
    never; True: it must be built (``NativeUnavailable`` otherwise), whatever the variable says."""
    if wanted is False or (wanted is None and os.environ.get(c.NO_EXTENSIONS_ENV)):
        return None
    try:
        from router.udp._splice import Splicer as built
    except ImportError:
        if wanted:
            raise NativeUnavailable("the C splice router.udp._splice is not built (no C compiler at install)") from None
        return None
    return built


def open_splicer(splicer_type: type[Splicer], listener_fd: int, io_uring: bool | None) -> Splicer:
    """The C splice on the listener. ``io_uring`` None: its sends to many pods go in one
    ``io_uring_enter`` per batch unless ``NO_IO_URING_ENV`` is set; False: never; True: where the
    kernel allows it. A kernel or seccomp profile that refuses io_uring leaves ``sendmmsg``."""
    wanted = not os.environ.get(c.NO_IO_URING_ENV) if io_uring is None else io_uring
    splicer = splicer_type(
        listener_fd, c.QUIC_SPLICE_BATCHES_PER_CALLBACK, c.QUIC_POD_READS_PER_CALLBACK, io_uring=wanted
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


def initial_protection() -> str:
    """Open new flows' client Initials in C when ``quic._initial_protection`` is built and
    ``NO_EXTENSIONS_ENV`` is not set (process-wide); ``c`` or ``python``, for the start line."""
    return "c" if quic_native.use(not os.environ.get(c.NO_EXTENSIONS_ENV)) else "python"
