"""Layering: the lower layers import nothing from ``router/``.

``quic/`` and ``discovery/`` are libraries the router is built on; an import of
``router`` from them would make the layers a cycle, and pull sockets and process state into
sans-IO code. The scan reads the source (AST, so imports inside functions or
``if TYPE_CHECKING:`` count too) rather than importing it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UPPER_LAYER = "router"
LOWER_LAYERS = ["quic", "discovery"]
"""Packages that must not import ``router``."""


def upward_imports(source: str, filename: str, package: str) -> list[str]:
    """``file:line: statement`` for every import of UPPER_LAYER in ``source``.

    ``package`` is the module's dotted package (e.g. ``quic`` for ``quic/frames.py``), so
    relative imports are resolved too: ``from .. import router`` is caught like the absolute one.
    """
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".") if package else []
            anchor = parts[: max(len(parts) - (node.level - 1), 0)] if node.level else []
            if node.module:
                targets = [".".join([*anchor, node.module])]
            else:
                targets = [".".join([*anchor, alias.name]) for alias in node.names]
        else:
            continue
        if any(t == UPPER_LAYER or t.startswith(UPPER_LAYER + ".") for t in targets):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def _modules(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", LOWER_LAYERS)
def test_lower_layer_imports_nothing_from_router(layer: str) -> None:
    modules = _modules(layer)
    assert modules, f"no Python modules under {layer}/"
    found = []
    for path in modules:
        rel = path.relative_to(ROOT)
        package = ".".join(rel.parent.parts)
        found += upward_imports(path.read_text(encoding="utf-8"), str(rel), package)
    assert not found, f"{layer}/ imports {UPPER_LAYER}/:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import router",
        "import router.constants as c",
        "from router import constants",
        "from router.constants import MAX_PEEK_BYTES",
        "def f():\n    from router.metrics import RouterMetrics",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import router.app",
        "from .. import router",
        "from ..router import constants",
    ],
)
def test_the_scan_sees_every_form_of_upward_import(source: str) -> None:
    assert upward_imports(source, "quic/x.py", "quic")


@pytest.mark.parametrize(
    "source",
    ["import quic.packet", "from quic.packet import QuicPacketError", "from . import frames",
     "import routerish", "from discovery.targets import Target"],
)
def test_the_scan_passes_imports_that_stay_below(source: str) -> None:
    assert not upward_imports(source, "quic/x.py", "quic")
