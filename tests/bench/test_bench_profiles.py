"""The profiles' ``--callbacks`` hooks still name functions of this router.

A hook whose target is missing is skipped on purpose (a profile may run against an older tree),
so a rename would silently drop a line from the split: each line must keep at least one target.
"""

from __future__ import annotations

import ast
import textwrap
from types import ModuleType

import pytest

from bench import callback_hooks, conn_profile, quic_profile


def _targets(hooks: str) -> dict[str, list[tuple[ast.expr, str]]]:
    """label -> the (owner expression, attribute name) of each ``hook(...)`` call giving it."""
    tree = ast.parse(textwrap.dedent(hooks))
    found: dict[str, list[tuple[ast.expr, str]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hook":
            owner, name, label = node.args[:3]
            assert isinstance(name, ast.Constant) and isinstance(label, ast.Constant)
            found.setdefault(label.value or "(split by kind)", []).append((owner, name.value))
    return found


def _imports(hooks: str) -> dict[str, ModuleType]:
    namespace: dict[str, ModuleType] = {}
    for node in ast.parse(textwrap.dedent(hooks)).body:
        if isinstance(node, ast.ImportFrom | ast.Import):
            exec(compile(ast.Module([node], []), "<hooks>", "exec"), namespace)  # the hooks' own import lines
    return namespace


@pytest.mark.parametrize("hooks", [conn_profile.CALLBACK_HOOKS, quic_profile.CALLBACK_HOOKS], ids=["tcp", "quic"])
def test_every_line_of_the_split_has_a_function_to_time(hooks: str) -> None:
    namespace = _imports(hooks)
    for label, targets in _targets(hooks).items():
        resolved = []
        for owner, name in targets:
            expression = compile(ast.Expression(owner), "<hooks>", "eval")
            target = eval(expression, {"getattr": getattr, **namespace})  # an owner expression of the hooks
            resolved.append(target is not None and hasattr(target, name))
        assert any(resolved), f"no function left to time for {label!r}: {targets}"


def test_the_hooks_compile_into_one_sitecustomize() -> None:
    for hooks in (conn_profile.CALLBACK_HOOKS, quic_profile.CALLBACK_HOOKS):
        compile(callback_hooks.PRELUDE + hooks, "sitecustomize.py", "exec")
