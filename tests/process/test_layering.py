"""Layering: dependencies point down, and no two modules import each other.

``wire/`` (the TCP edge's wire formats), ``quic/`` and ``discovery/`` are libraries the router is
built on: an import of ``router`` from them would make the layers a cycle and pull sockets and
process state into sans-IO code. ``quic/`` may use ``wire/`` (the ClientHello walker); ``wire/``
and ``discovery/`` stand alone. ``router/routing.py``, the one pure decision both edges call,
imports neither edge. The scan reads the source (AST, so imports inside functions or ``if
TYPE_CHECKING:`` count too) rather than importing it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("router", "wire", "quic", "discovery")
"""The product's packages: every module in them is in the import graph."""

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "wire": ("router", "quic", "discovery"),
    "quic": ("router", "discovery"),
    "discovery": ("router", "wire", "quic"),
    "router/routing.py": ("router.tcp", "router.udp"),
}
"""Source file or folder -> the modules (and everything below them) it must never import."""


def imported_names(source: str, filename: str, package: str) -> Iterator[tuple[int, str, str]]:
    """``(line, dotted target, statement)`` for every import in ``source``.

    ``package`` is the module's dotted package (``quic`` for ``quic/frames.py``), so relative
    imports resolve too. ``from X import Y`` yields ``X.Y`` (the module, when Y is one) and ``X``.
    """
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ast.unparse(node)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".") if package else []
            anchor = parts[: max(len(parts) - (node.level - 1), 0)] if node.level else []
            base = ".".join([*anchor, node.module] if node.module else anchor)
            if node.module:
                yield node.lineno, base, ast.unparse(node)
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}" if base else alias.name, ast.unparse(node)


def forbidden_imports(source: str, filename: str, package: str, forbidden: tuple[str, ...]) -> list[str]:
    """``file:line: statement`` for every import of a ``forbidden`` module (or one below it)."""
    found = []
    for line, target, text in imported_names(source, filename, package):
        if any(target == f or target.startswith(f + ".") for f in forbidden):
            found.append(f"{filename}:{line}: {text}")
    return sorted(set(found))


def _sources(place: str) -> list[Path]:
    path = ROOT / place
    return [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


@pytest.mark.parametrize("place", sorted(FORBIDDEN))
def test_each_layer_imports_only_what_lies_below_it(place: str) -> None:
    sources = _sources(place)
    assert sources, f"no Python modules at {place}"
    found = []
    for path in sources:
        rel = path.relative_to(ROOT)
        found += forbidden_imports(path.read_text(encoding="utf-8"), str(rel), ".".join(rel.parent.parts),
                                   FORBIDDEN[place])
    assert not found, f"{place} imports {', '.join(FORBIDDEN[place])}:\n" + "\n".join(found)


def import_graph() -> dict[str, set[str]]:
    """Module -> the product modules it names in an import (a package's ``__init__`` when a name
    is not a module of it). Parent packages that Python imports on the way are not arrows."""
    modules = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = {t for _, t, _ in imported_names(path.read_text(encoding="utf-8"), str(path), package)}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_modules_import_each_other() -> None:
    found = circles(import_graph())
    assert not found, "import circles (give the shared piece one home):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_circle_check_finds_a_circle_of_three() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize(
    "source",
    [
        "import router",
        "import router.constants as c",
        "from router import constants",
        "from router.constants import DEFAULT_WORKERS",
        "def f():\n    from router.metrics import RouterMetrics",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import router.app",
        "from .. import router",
        "from ..router import constants",
    ],
)
def test_the_scan_sees_every_form_of_upward_import(source: str) -> None:
    assert forbidden_imports(source, "quic/x.py", "quic", ("router",))


@pytest.mark.parametrize(
    "source",
    ["import quic.packet", "from quic.packet import QuicPacketError", "from . import frames",
     "import routerish", "from discovery.targets import Target"],
)
def test_the_scan_passes_imports_that_stay_below(source: str) -> None:
    assert not forbidden_imports(source, "quic/x.py", "quic", ("router",))


def test_the_scan_sees_an_edge_imported_by_name_from_its_package() -> None:
    assert forbidden_imports("from router.tcp import rejection", "router/routing.py", "router", ("router.tcp",))
