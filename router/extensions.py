"""The one choice between the optional C extensions and their pure-Python twins.

``setup.py`` builds the C extensions where a C compiler (and, for the Initial protection, OpenSSL's
headers) is there; ``is_built`` says which. Which ones the router uses is decided once, at start,
by ``choose`` (what is built, minus what ``NO_EXTENSIONS_ENV`` / ``NO_IO_URING_ENV`` rule out),
called by ``router.runtime`` alone, and the resulting ``Extensions`` is passed down in each edge's
settings (which default to ``PYTHON``); nothing below flips a module-level switch. Both paths
behave the same (the pure-Python one is the reference the C is tested against); they differ only
in cost. Tests choose a path by the ``Extensions`` they pass (the suite's ``extensions`` fixture).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from quic import native as quic_native
from quic.native import InitialProtection
from router.constants import NO_EXTENSIONS_ENV, NO_IO_URING_ENV
from wire.client_hello import ClientHelloInfo

SPLICE_MODULE: Final = "router.udp._splice"
"""The C splice of established QUIC flows (``router/udp/_splice.c``)."""

TCP_PUMP_MODULE: Final = "router.tcp._relay"
"""The C byte pump of relayed TCP connections (``router/tcp/_relay.c``)."""

INITIALS_MODULE: Final = "quic._initial_protection"
"""The C reading of new QUIC flows' Initials and of ClientHellos (``quic/_initial_protection.c``;
``quic.native.EXTENSION`` when built)."""


class NativeUnavailable(RuntimeError):
    """A C extension was asked for, but it is not built."""


def is_built(module: str) -> bool:
    """Whether the extension ``module`` (``SPLICE_MODULE``, ``TCP_PUMP_MODULE``, ``INITIALS_MODULE``)
    is importable: the one question of what this install built."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Extensions:
    """Which optional C extensions this process uses (each field: C when set, Python when not)."""

    initials: InitialProtection | None = None
    """``quic/_initial_protection.c``: a new QUIC flow's long header, Initial keys and opening, and
    the ClientHello facts of QUIC Initials and of TLS over TCP."""
    splice: bool = False
    """``router/udp/_splice.c`` moves established QUIC flows' datagrams."""
    tcp_pump: bool = False
    """``router/tcp/_relay.c`` pumps relayed TCP connections' bytes (and accepts and dials in batches)."""
    io_uring: bool = False
    """The C splice sends a batch's datagrams for many pods in one ``io_uring_enter`` where the
    kernel allows it (else one ``sendmmsg`` per flow)."""
    parse_client_hello: Callable[[bytes], ClientHelloInfo] = field(init=False, repr=False, compare=False)
    """The ClientHello reading that goes with ``initials`` (``quic.native.client_hello_parser``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "parse_client_hello", quic_native.client_hello_parser(self.initials))

    def start_fields(self) -> dict[str, str]:
        """What the start line says of the Initial reading and the TCP pump (``c`` or ``python``)."""
        return {
            "quic_initials": "c" if self.initials is not None else "python",
            "tcp_pump": "c" if self.tcp_pump else "python",
        }

    def require(self) -> Extensions:
        """This choice, checked: ``NativeUnavailable`` names the first extension asked for but not built."""
        if self.splice and not is_built(SPLICE_MODULE):
            raise NativeUnavailable(f"the C splice {SPLICE_MODULE} is not built (no C compiler at install)")
        if self.tcp_pump and not is_built(TCP_PUMP_MODULE):
            raise NativeUnavailable(f"the C relay {TCP_PUMP_MODULE} is not built (no C compiler at install)")
        return self

    def with_splice(self, splice: bool, io_uring: bool | None = None) -> Extensions:
        """This choice with the QUIC splice (and its io_uring sends) set as asked; checked."""
        return replace(self, splice=splice, io_uring=self.io_uring if io_uring is None else io_uring).require()


PYTHON: Final = Extensions()
"""Every path in pure Python: the reference."""


def choose(environ: Mapping[str, str] | None = None) -> Extensions:
    """What this process uses: every extension that is built, unless ``NO_EXTENSIONS_ENV`` is set
    (then none); the splice's io_uring sends unless ``NO_IO_URING_ENV`` is set."""
    env = os.environ if environ is None else environ
    if env.get(NO_EXTENSIONS_ENV):
        return PYTHON
    return Extensions(
        initials=quic_native.EXTENSION,
        splice=is_built(SPLICE_MODULE),
        tcp_pump=is_built(TCP_PUMP_MODULE),
        io_uring=not env.get(NO_IO_URING_ENV),
    )
