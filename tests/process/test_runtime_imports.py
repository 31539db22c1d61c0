"""The runtime install has no aioquic (it is in the demo and test extras): nothing outside the
demo may import it, or the image's router would fail at start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import importlib, importlib.abc, pkgutil, sys

class NoAioquic(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "aioquic" or name.startswith("aioquic."):
            raise ImportError(f"{name} is not installed at runtime")
        return None

sys.meta_path.insert(0, NoAioquic())
for package in ("router", "quic", "discovery"):
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if not info.name.startswith("router.demo") and not info.name.endswith(".__main__"):
            importlib.import_module(info.name)
print("ok")
"""


def test_runtime_modules_import_without_aioquic() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
