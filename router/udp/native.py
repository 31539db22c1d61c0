"""The optional C extensions of the QUIC edge, when they can be used.

``router/udp/_splice.c`` splices established flows; ``quic/_initial_protection.c`` opens a new
flow's first Initial. ``setup.py`` builds them when a C compiler (and, for the second, OpenSSL's
headers) is there; without them, or with ``NO_EXTENSIONS_ENV`` set, the edge runs the same flows
through its pure-Python paths (``pod_link``, ``pod_to_client``; ``cryptography`` and
``quic.clienthello``). Both paths are tested, and they differ only in cost: which datagrams reach
whom, in which order, what the flows count and which pod an Initial names are the same.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from quic import native as quic_native
from router import constants as c
from router import extensions
from router.extensions import NativeUnavailable

if TYPE_CHECKING:
    from router.udp._splice import Splicer


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


def initial_protection() -> str:
    """Open new flows' client Initials in C when ``quic._initial_protection`` is built and
    ``NO_EXTENSIONS_ENV`` is not set (process-wide); ``c`` or ``python``, for the start line."""
    return "c" if quic_native.use(not os.environ.get(c.NO_EXTENSIONS_ENV)) else "python"
