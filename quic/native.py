"""The optional C extension of ``quic/`` (``quic/_initial_protection.c``, over libcrypto): whether it is built.

Nothing here decides whether it is used: each reading takes ``native`` (``EXTENSION``, or None for the
Python reading, the reference) from its caller; the router chooses once at start (``router.extensions``).
The C only ever answers what the Python would, or declines, and then Python answers and names whatever
is wrong (tests/quic/test_quic_initial_native.py and the fuzzer compare the two).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

from wire.client_hello import MAX_TLS_CLIENT_HELLO_BYTES, ClientHelloInfo, parse_client_hello


class InitialProtection(Protocol):
    """What ``quic._initial_protection`` offers (``_initial_protection.pyi`` has the details)."""

    def __hash__(self) -> int: ...

    def initial_keys(self, salt: bytes, dcid: bytes, secret_info: bytes, key_info: bytes, iv_info: bytes,
                     hp_info: bytes) -> tuple[bytes, bytes, bytes]: ...
    def open_initial(self, datagram: bytes, key: bytes, iv: bytes, hp: bytes, offset: int, pn_offset: int,
                     end: int, largest_pn: int) -> tuple[int, bytes] | None: ...
    def sniff_initial(self, payload: bytes, max_crypto: int,
                      max_hello: int) -> tuple[str | None, tuple[str, ...], int] | None: ...
    def sniff_first(self, datagram: bytes, salt: bytes, secret_info: bytes, key_info: bytes, iv_info: bytes,
                    hp_info: bytes, dcid: bytes, pn_offset: int, end: int, max_crypto: int, max_hello: int
                    ) -> tuple[int, tuple[str | None, tuple[str, ...], int] | None,
                               tuple[bytes, bytes, bytes, bytes] | None] | None: ...
    def client_hello_facts(
        self, handshake: bytes, max_hello: int
    ) -> tuple[str | None, tuple[str, ...], int] | None: ...
    def long_header(self, datagram: bytes, offset: int) -> tuple[int, int, bytes, bytes, bytes, int, int] | None: ...


try:
    from quic import _initial_protection as _built

    EXTENSION: InitialProtection | None = _built
    """The built extension, or None: a fact of the install, not a switch (``router.extensions`` decides)."""
except ImportError:
    EXTENSION = None


@functools.cache
def client_hello_parser(native: InitialProtection | None) -> Callable[[bytes], ClientHelloInfo]:
    """``wire.client_hello.parse_client_hello``, C first with ``native``: what C declines is walked (and
    named) in Python. Made once per ``native``."""
    if native is None:
        return parse_client_hello
    facts = native.client_hello_facts

    def parse(handshake: bytes) -> ClientHelloInfo:
        found = facts(handshake, MAX_TLS_CLIENT_HELLO_BYTES)
        return ClientHelloInfo(*found) if found is not None else parse_client_hello(handshake)

    return parse
