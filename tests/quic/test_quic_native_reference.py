"""The differential checks hold the C to Python: a bug in the C alone makes every one of them fail.

Each case swaps ``quic._initial_protection`` for a copy with one C-only divergence (the same bug in
every C entry point that shares the code, as a real bug in the shared ClientHello walk would be)
and runs the comparisons the differential tests and the native fuzz targets use. Were any of them
comparing C with C (a reference that itself went through the C), the divergence would pass unseen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from quic import native as quic_native
from quic.initial_keys import client_initial_keys
from quic.packet import parse_long_header, read_long_header
from tests.fuzz.registry import TARGETS
from tests.support.initial_reference import (
    CDivergence,
    c_handshake_agrees,
    c_hello_agrees,
    c_keys_agree,
    c_long_header_agrees,
    c_opening_agrees,
    c_sniffer_agrees,
)
from tests.support.quic_frames import crypto_frame
from tests.support.quic_vectors import RFC_CLIENT_HELLO, V1_CLIENT_INITIAL, V2_CLIENT_INITIAL

pytestmark = pytest.mark.skipif(quic_native.EXTENSION is None, reason="quic._initial_protection is not built")

PAYLOAD = crypto_frame(0, RFC_CLIENT_HELLO)
"""A usual first payload: the whole RFC 9001 ClientHello in one CRYPTO frame (example.com)."""


def _renamed(facts: Any) -> Any:
    return None if facts is None else (f"c-{facts[0]}", facts[1])


class Divergent:
    """``quic._initial_protection`` with one C-only bug; everything else passes through."""

    def __init__(self, real: Any, bug: str) -> None:
        self._real, self._bug = real, bug

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def client_hello_facts(self, *args: Any) -> Any:
        facts = self._real.client_hello_facts(*args)
        return _renamed(facts) if self._bug == "hello" else facts

    def sniff_initial(self, *args: Any) -> Any:
        facts = self._real.sniff_initial(*args)
        return _renamed(facts) if self._bug == "hello" else facts

    def sniff_first(self, *args: Any) -> Any:
        sniffed = self._real.sniff_first(*args)
        if sniffed is None:
            return None
        packet_number, facts, opened = sniffed
        if self._bug == "hello":
            facts = _renamed(facts)
        if self._bug == "packet number":
            packet_number += 1
        return packet_number, facts, opened

    def long_header(self, *args: Any) -> Any:
        fields = self._real.long_header(*args)
        if fields is None or self._bug != "long header":
            return fields
        return (*fields[:5], fields[5] + 1, fields[6])

    def initial_keys(self, *args: Any) -> Any:
        key, iv, hp = self._real.initial_keys(*args)
        return (bytes((key[0] ^ 1,)) + key[1:], iv, hp) if self._bug == "keys" else (key, iv, hp)

    def open_initial(self, *args: Any) -> Any:
        opened = self._real.open_initial(*args)
        if opened is None or self._bug != "opening":
            return opened
        return opened[0], opened[1][:-1] + bytes((opened[1][-1] ^ 1,))


@pytest.fixture
def diverge(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Swap in a ``Divergent`` extension as ``quic.native.EXTENSION``, the C the comparisons call."""

    def swap(bug: str) -> None:
        divergent = Divergent(quic_native.EXTENSION, bug)
        monkeypatch.setattr(quic_native, "EXTENSION", divergent)

    yield swap


def _rfc_opening() -> None:
    header = read_long_header(V1_CLIENT_INITIAL)
    c_opening_agrees(V1_CLIENT_INITIAL, header, client_initial_keys(header.version, header.dcid))


CHECKS: dict[str, list[Callable[[], object]]] = {
    "hello": [
        lambda: c_hello_agrees(PAYLOAD),
        lambda: c_handshake_agrees(RFC_CLIENT_HELLO),
        lambda: c_sniffer_agrees([V1_CLIENT_INITIAL]),
        lambda: TARGETS["initial_native"].run(PAYLOAD),
        lambda: TARGETS["clienthello"].run(RFC_CLIENT_HELLO),
        lambda: TARGETS["first_initial_native"].run(b"\x00" + PAYLOAD),
    ],
    "long header": [
        lambda: c_long_header_agrees(V1_CLIENT_INITIAL),
        lambda: c_long_header_agrees(V2_CLIENT_INITIAL),
        lambda: TARGETS["long_header_native"].run(V1_CLIENT_INITIAL),
    ],
    "keys": [
        lambda: c_keys_agree(parse_long_header(V1_CLIENT_INITIAL).version, parse_long_header(V1_CLIENT_INITIAL).dcid),
    ],
    "opening": [_rfc_opening],
    "packet number": [
        lambda: c_sniffer_agrees([V2_CLIENT_INITIAL]),
        lambda: TARGETS["first_initial_native"].run(b"\x01" + PAYLOAD),
    ],
}
CASES = [pytest.param(bug, i, id=f"{bug}-{i}") for bug, checks in CHECKS.items() for i in range(len(checks))]


@pytest.mark.parametrize(("bug", "check"), CASES)
def test_a_c_only_divergence_fails_the_comparison(diverge: Callable[[str], None], bug: str, check: int) -> None:
    diverge(bug)
    with pytest.raises(CDivergence):
        CHECKS[bug][check]()


@pytest.mark.parametrize(("bug", "check"), CASES)
def test_the_real_extension_passes_the_same_comparison(bug: str, check: int) -> None:
    CHECKS[bug][check]()
