"""What the C extensions read and write on Python objects by name is declared once, and exists.

Each C file names those attributes in one table and exports it as ``ATTRIBUTES``: (owner, name)
pairs, the owner a module or a class. A rename on the Python side would break the C at run time,
unseen by mypy; here it fails at once. Every C file of the project is an extension listed here, so
a new one must declare its table too.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTENSIONS = {
    "quic/_initial_protection.c": "quic._initial_protection",
    "router/tcp/_relay.c": "router.tcp._relay",
    "router/udp/_splice.c": "router.udp._splice",
}
"""Every C source of the project, and the extension module setup.py builds from it."""


def owner_of(path: str) -> object:
    """The module or class ``path`` names (``package.module`` or ``package.module.Class``)."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(module), name)


def missing(attributes: tuple[tuple[str, str], ...]) -> list[str]:
    """The (owner, name) pairs whose owner lacks the name: a module's attribute, a dataclass's field,
    or a class's attribute."""
    gone = []
    for owner_path, name in attributes:
        owner = owner_of(owner_path)
        if isinstance(owner, ModuleType):
            present = hasattr(owner, name)
        elif dataclasses.is_dataclass(owner):
            present = name in {f.name for f in dataclasses.fields(owner)}
        else:
            present = hasattr(owner, name)
        if not present:
            gone.append(f"{owner_path}.{name}")
    return gone


def extension(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        pytest.skip(f"{module} is not built")


def test_every_c_file_is_an_extension_with_a_declared_table() -> None:
    sources = {str(p.relative_to(ROOT)) for d in ("quic", "router") for p in (ROOT / d).rglob("*.c")}
    assert sources == set(EXTENSIONS)


@pytest.mark.parametrize("module", sorted(EXTENSIONS.values()))
def test_every_attribute_the_c_uses_by_name_exists_on_its_owner(module: str) -> None:
    attributes = extension(module).ATTRIBUTES
    assert isinstance(attributes, tuple)
    assert missing(attributes) == []


def test_the_splice_writes_the_router_flows_counts_and_times() -> None:
    """The splice's table names the fields the edge reads back (access lines, idle sweep)."""
    splice = extension("router.udp._splice")
    assert set(splice.ATTRIBUTES) == {("router.udp.flows.Flow", name)
                                      for name in ("last_active", "client_bytes", "pod_bytes")}


def test_the_initial_protection_raises_the_quic_layers_error() -> None:
    assert extension("quic._initial_protection").ATTRIBUTES == (("quic.packet", "QuicPacketError"),)


def test_a_renamed_field_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: a flow class that renamed ``pod_bytes``, a module that lost its error type."""

    @dataclasses.dataclass
    class RenamedFlow:
        last_active: float
        client_bytes: int
        pod_bytes_total: int

    module = ModuleType("renamed_flow_module")
    module.Flow = RenamedFlow  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert missing((("renamed_flow_module.Flow", "last_active"), ("renamed_flow_module.Flow", "pod_bytes"))) == [
        "renamed_flow_module.Flow.pod_bytes"
    ]
    assert missing((("quic.packet", "QuicPacketErrorRenamed"),)) == ["quic.packet.QuicPacketErrorRenamed"]
    assert missing((("router.udp.flows.Flow", "pod_bytes"),)) == []
