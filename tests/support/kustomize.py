"""deploy/ rendered by the real kustomize (``kubectl kustomize``), the way an operator applies it.

The base and its components use kustomize ``components`` and ``replacements``, so kubectl's
kustomize must be v5 (Debian bookworm's ``kubernetes-client`` is kubectl 1.20 with kustomize v2,
which rejects ``components``). Where a usable kubectl is missing, the tests that render skip on a
developer's machine and FAIL under CI (``CI`` set to anything but ``""``, ``0`` or ``false``; CI
runs ``.ci/run`` with ``CI=true``, and ``.ci/run`` installs kubectl), so they never skip there
unnoticed.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPONENTS = DEPLOY / "components"
SETTINGS = DEPLOY / "settings.yaml"

KUSTOMIZE_MAJOR = 5
"""The kustomize major version deploy/ is written for (components, replacements with wildcards)."""

RENDER_TIMEOUT_S = 60
"""One ``kubectl kustomize`` of deploy/ takes well under a second; this only bounds a hung one."""

_KUSTOMIZE_VERSION = re.compile(r"^Kustomize Version: v(\d+)\.", re.M)


def running_in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


@functools.cache
def _kubectl_problem() -> tuple[str | None, str]:
    """(path to kubectl, "") when usable, else (None, why not)."""
    path = shutil.which("kubectl")
    if path is None:
        return None, "kubectl (with kustomize v5) is not installed"
    result = subprocess.run([path, "version", "--client"], capture_output=True, text=True,
                            timeout=RENDER_TIMEOUT_S, check=False)
    found = _KUSTOMIZE_VERSION.search(result.stdout)
    if found is None or int(found.group(1)) < KUSTOMIZE_MAJOR:
        first_line = (result.stdout.strip().splitlines() or [""])[0]
        return None, f"{path} has no kustomize v{KUSTOMIZE_MAJOR}+ (it says {first_line!r})"
    return path, ""


def kubectl() -> str:
    """kubectl's path; skips the test without it locally, fails it under CI."""
    path, problem = _kubectl_problem()
    if path is None:
        if running_in_ci():
            pytest.fail(f"{problem}: .ci/run must install it", pytrace=False)
        pytest.skip(problem)
    return path


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize directory`` prints."""
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True,
                            timeout=RENDER_TIMEOUT_S, check=False)
    assert result.returncode == 0, f"kubectl kustomize {directory}: {result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def component_names() -> list[str]:
    return sorted(p.name for p in COMPONENTS.iterdir() if (p / "kustomization.yaml").is_file())


def render_overlay(workdir: Path, components: Iterable[str], deploy: Path = DEPLOY) -> list[dict[str, Any]]:
    """An operator's overlay in ``workdir``: ``deploy`` as the base plus the named components."""
    overlay = workdir / "overlay"
    overlay.mkdir(parents=True, exist_ok=False)
    rel = lambda p: os.path.relpath(p, overlay)  # noqa: E731
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [rel(deploy)],
        "components": [rel(deploy / "components" / name) for name in components],
    }))
    return render(overlay)


def settings(path: Path = SETTINGS) -> dict[str, str]:
    """The knobs of deploy/settings.yaml (its ConfigMap's data)."""
    return dict(yaml.safe_load(path.read_text())["data"])


def copy_with_settings(workdir: Path, changes: Mapping[str, str]) -> Path:
    """A copy of deploy/ in ``workdir`` whose settings.yaml has ``changes`` applied."""
    copy = workdir / "deploy"
    shutil.copytree(DEPLOY, copy)
    doc = yaml.safe_load((copy / "settings.yaml").read_text())
    unknown = set(changes) - set(doc["data"])
    assert not unknown, f"not knobs of settings.yaml: {sorted(unknown)}"
    doc["data"].update(changes)
    (copy / "settings.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return copy


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]
