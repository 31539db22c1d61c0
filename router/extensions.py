"""The router's optional C extensions: whether one is built, and the error when one is required.

``setup.py`` builds them where a C compiler is; each edge decides whether to use its own
(``udp/native``, ``tcp/native_relay``) and falls back to its pure-Python path when it is not there.
"""

from __future__ import annotations

import importlib


class NativeUnavailable(RuntimeError):
    """``native=True`` was asked for, but the C extension is not built."""


def is_built(module: str) -> bool:
    """Whether the extension ``module`` is importable (whatever ``NO_EXTENSIONS_ENV`` says)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
