"""deploy/components/: opt-in kustomize components render on top of the base and stay coherent.

``proxy-protocol``: Envoy Gateway's BackendTrafficPolicy sends PROXY v2 on the worker TCPRoute,
and the same component turns the router flag on; one without the other refuses every worker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.config import config_from_args

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPONENTS = DEPLOY / "components"
PROXY_PROTOCOL = COMPONENTS / "proxy-protocol"


def render(tmp_path: Path, *components: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of an overlay: the base plus ``components``."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rel = [os.path.relpath(p, overlay) for p in (DEPLOY, *components)]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": rel[:1], "components": rel[1:],
    }))
    result = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind]
    return doc


def test_every_component_is_a_kustomize_component() -> None:
    for directory in (p for p in COMPONENTS.iterdir() if p.is_dir()):
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        assert kustomization["kind"] == "Component", directory.name
        for resource in kustomization.get("resources", []):
            assert (directory / resource).is_file(), f"{directory.name}: {resource} missing"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) not installed")
def test_proxy_protocol_component_pairs_the_gateway_policy_with_the_router_flag(tmp_path: Path) -> None:
    docs = render(tmp_path, PROXY_PROTOCOL)
    route, policy = one(docs, "TCPRoute"), one(docs, "BackendTrafficPolicy")
    assert policy["apiVersion"] == "gateway.envoyproxy.io/v1alpha1"
    assert policy["metadata"]["namespace"] == route["metadata"]["namespace"], "policy attachment is local"
    assert policy["spec"]["targetRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "TCPRoute", "name": route["metadata"]["name"]}
    ]
    assert policy["spec"]["proxyProtocol"]["version"] in ("V1", "V2")
    [router] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    cfg = config_from_args(router["args"], environ={"POD_NAMESPACE": "stargate"})
    assert cfg.accept_proxy_protocol


def test_the_base_leaves_proxy_protocol_off() -> None:
    base = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert "components" not in base
    assert not any("components/" in r for r in base["resources"])
    deployment = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    [router] = deployment["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--accept-proxy-protocol") for a in router["args"])
