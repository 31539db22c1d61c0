"""The optional C extension of ``quic/`` (``quic/_initial_protection.c``), and the switch that uses it.

It parses v1/v2 long headers, derives client Initial keys, opens client Initials, and reads the
ClientHello facts of a whole handshake message or of a usual first Initial payload, over OpenSSL's
libcrypto. ``setup.py`` builds it when a C compiler and OpenSSL's headers are there. Each caller
asks ``active()`` and falls back to its own Python reading (``quic.packet``, ``cryptography`` and
``hashlib``, ``quic.frames``, ``quic.clienthello``), which is also what names whatever is wrong: the
C path only ever answers what that reading would answer, or declines
(tests/test_quic_initial_native.py, the fuzzer's ``initial_native`` and ``long_header_native``
targets).
"""

from __future__ import annotations

from typing import Protocol


class InitialProtection(Protocol):
    """What ``quic._initial_protection`` offers (``_initial_protection.pyi`` has the details)."""

    def initial_keys(self, salt: bytes, dcid: bytes, secret_info: bytes, key_info: bytes, iv_info: bytes,
                     hp_info: bytes) -> tuple[bytes, bytes, bytes]: ...
    def open_initial(self, datagram: bytes, key: bytes, iv: bytes, hp: bytes, offset: int, pn_offset: int,
                     end: int, largest_pn: int) -> tuple[int, bytes] | None: ...
    def sniff_initial(self, payload: bytes, max_crypto: int,
                      max_hello: int) -> tuple[str | None, tuple[str, ...]] | None: ...
    def sniff_first(self, datagram: bytes, salt: bytes, secret_info: bytes, key_info: bytes, iv_info: bytes,
                    hp_info: bytes, dcid: bytes, pn_offset: int, end: int, max_crypto: int, max_hello: int
                    ) -> tuple[int, tuple[str | None, tuple[str, ...]] | None,
                               tuple[bytes, bytes, bytes, bytes] | None] | None: ...
    def client_hello_facts(self, handshake: bytes, max_hello: int) -> tuple[str | None, tuple[str, ...]] | None: ...
    def long_header(self, datagram: bytes, offset: int) -> tuple[int, int, bytes, bytes, bytes, int, int] | None: ...


try:
    from quic import _initial_protection as _built

    _extension: InitialProtection | None = _built
except ImportError:  # not built (no compiler or OpenSSL headers at install): the Python readings alone
    _extension = None

_active = _extension
"""The extension while ``use`` allows it, else None."""


def use(enabled: bool) -> bool:
    """Use the C extension (when built) if ``enabled``, else the Python readings, process-wide;
    returns whether C is used from now on."""
    global _active
    _active = _extension if enabled else None
    return _active is not None


def built() -> bool:
    """Whether ``quic._initial_protection`` is importable."""
    return _extension is not None


def active() -> InitialProtection | None:
    """The extension, if it is built and ``use`` allows it."""
    return _active
