"""The two readings of QUIC Initials and ClientHellos a test runs with: ``quic/_initial_protection.c``
(skipped where it is not built) and the pure-Python reference (``native=None``)."""

from __future__ import annotations

import pytest

from quic.native import EXTENSION, InitialProtection

QUIC_READINGS = [
    pytest.param(EXTENSION, id="c", marks=pytest.mark.skipif(
        EXTENSION is None, reason="quic._initial_protection is not built (no C compiler or OpenSSL headers)")),
    pytest.param(None, id="python"),
]
"""``pytest.mark.parametrize("native", QUIC_READINGS)``: pass ``native`` to the readings under test."""

Native = InitialProtection | None
"""The type of a test's ``native`` parameter."""

both_readings = pytest.mark.parametrize("native", QUIC_READINGS)
"""Decorator: run the test with each reading, passing it as ``native``."""
