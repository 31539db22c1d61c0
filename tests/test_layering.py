"""Lower layers import nothing from ``router/``: the tree shows the layering, a test keeps it.

An AST scan (not a grep) so ``import router.x``, ``from router import x`` and imports nested
in functions are all caught, and a mention in a docstring is not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOWER_LAYERS = ["quic", "discovery"]
"""Packages that sit below ``router/``: they may be imported by it, never the other way round."""


def upward_imports(package: str) -> list[str]:
    """``file:line module`` for every import of ``router`` (or a submodule) under ``package``."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                if module == "router" or module.startswith("router."):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {module}")
    return found


@pytest.mark.parametrize("package", LOWER_LAYERS)
def test_lower_layer_imports_nothing_from_router(package: str) -> None:
    assert (ROOT / package).is_dir()
    assert upward_imports(package) == []


def test_the_scan_sees_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lower").mkdir()
    (tmp_path / "lower" / "m.py").write_text(
        '"""import router in a docstring is fine."""\n'
        "def f():\n    from router.constants import X\n    import router.metrics\n"
    )
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert upward_imports("lower") == ["lower/m.py:3 router.constants", "lower/m.py:4 router.metrics"]
