"""The one choice between the optional C extensions and their pure-Python twins.

Decided once at start (``choose``) and passed down in each edge's settings (default ``PYTHON``); nothing
below flips a module-level switch, so tests pick a path by the ``Extensions`` they pass. Both paths behave
the same (the pure-Python one is the reference the C is tested against); they differ only in cost.
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
"""The C reading of new QUIC flows' Initials and of ClientHellos (``quic/_initial_protection.c``)."""


class NativeUnavailable(RuntimeError):
    """A C extension was asked for, but it is not built."""


def is_built(module: str) -> bool:
    """Whether the C extension ``module`` (one of the ``*_MODULE`` names) was built by this install."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Extensions:
    """Which optional C extensions this process uses (each field: C when set, Python when not)."""

    initials: InitialProtection | None = None
    """``quic/_initial_protection.c``: new QUIC flows' Initials, and ClientHellos (QUIC and TLS over TCP)."""
    splice: bool = False
    """``router/udp/_splice.c`` moves established QUIC flows' datagrams."""
    tcp_pump: bool = False
    """``router/tcp/_relay.c`` pumps relayed TCP connections' bytes (and accepts and dials in batches)."""
    io_uring: bool = False
    """The C splice sends a batch for many pods in one ``io_uring_enter`` (else one ``sendmmsg`` per flow)."""
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
