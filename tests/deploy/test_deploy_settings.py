"""deploy/settings.yaml: each knob is set once and reaches every field that depends on it.

With the default settings, rendering changes nothing the files say (so the files read true on
their own). With every knob changed, no field keeps an old value: every ``namespace`` field, every
namespace selector, the routes' parents, the proxy-protocol trust, the monitoring selector label
and the runbook links follow the settings, in the base and every component together.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.kustomize import (
    COMPONENTS,
    DEPLOY,
    SETTINGS,
    component_names,
    copy_with_settings,
    one,
    render_overlay,
    settings,
)

CHANGED = {
    "namespace": "llm-backends",
    "gatewayNamespace": "edge",
    "gatewayName": "workers-gw",
    "gatewayGrpcListener": "workers-grpc",
    "gatewayQuicListener": "workers-quic",
    "gatewayPodNamespace": "edge-proxies",
    "monitoringNamespace": "observability",
    "gatewayPodCIDRs": "10.64.8.0/24,fd00:64:8::/64",
    "prometheusRelease": "prom",
    "runbookBaseURL": "https://git.example.com/platform/stargate-router/-/blob/main/docs/operating.md",
}
"""A value for every knob, each unlike any default."""

NAMESPACE_LABEL = "kubernetes.io/metadata.name"
FIXED_NAMESPACES = {"kube-system"}
"""Namespaces the manifests name that are not knobs (DNS lives in kube-system everywhere)."""

_TOKEN = re.compile(r"[=,#\s]+")


def test_every_knob_gets_a_new_value_in_the_test() -> None:
    defaults = settings()
    assert set(CHANGED) == set(defaults)
    assert not set(CHANGED.values()) & set(defaults.values())


def test_settings_is_a_kustomize_input_that_never_renders(tmp_path: Path) -> None:
    doc = yaml.safe_load(SETTINGS.read_text())
    assert doc["metadata"]["annotations"] == {"config.kubernetes.io/local-config": "true"}
    docs = render_overlay(tmp_path, component_names())
    assert not [d for d in docs if d["metadata"]["name"] == doc["metadata"]["name"]]


def file_docs(directory: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    docs = [d for r in spec.get("resources", []) for d in yaml.safe_load_all((directory / r).read_text()) if d]
    return [d for d in docs if d["metadata"].get("annotations", {}).get("config.kubernetes.io/local-config") != "true"]


@pytest.mark.parametrize("component", ["", "monitoring", "network-policy", "quic-source-affinity"])
def test_default_settings_render_the_files_unchanged(tmp_path: Path, component: str) -> None:
    """Components that only add objects: what renders is what their files say (no patches)."""
    directory = COMPONENTS / component if component else DEPLOY
    rendered = render_overlay(tmp_path, [component] if component else [])
    by_id = {(d["kind"], d["metadata"]["name"]): d for d in rendered}
    for doc in file_docs(directory):
        assert by_id[(doc["kind"], doc["metadata"]["name"])] == doc, f"{doc['kind']} {doc['metadata']['name']}"


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, scalar) for every scalar under ``node``, map keys included as ``path.<key>``."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{path}[{index}]")
    else:
        yield path, node


@pytest.fixture(scope="module")
def changed(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("settings")
    return render_overlay(workdir, component_names(), deploy=copy_with_settings(workdir, CHANGED))


def test_no_rendered_field_keeps_an_old_knob_value(changed: list[dict[str, Any]]) -> None:
    # The namespace's default ("stargate") is also the part-of label and part of names: checked by key below.
    old = {value: knob for knob, value in settings().items() if knob != "namespace"}
    for doc in changed:
        for path, scalar in walk(doc):
            if isinstance(scalar, str):
                stale = [old[token] for token in _TOKEN.split(scalar) if token in old]
                assert not stale, f"{doc['kind']} {doc['metadata']['name']} {path}={scalar!r}: {stale}"


def test_every_namespace_field_and_selector_follows_the_settings(changed: list[dict[str, Any]]) -> None:
    allowed = {CHANGED["namespace"], CHANGED["gatewayNamespace"]}
    selected = set()
    for doc in changed:
        for path, scalar in walk(doc):
            if path.endswith(".namespace"):
                assert scalar in allowed, f"{doc['kind']} {path}={scalar!r}"
            if path.endswith(f".{NAMESPACE_LABEL}"):
                selected.add(scalar)
    assert selected == {CHANGED["gatewayPodNamespace"], CHANGED["monitoringNamespace"]} | FIXED_NAMESPACES
    gateway_side = {d["kind"] for d in changed if d["metadata"]["namespace"] == CHANGED["gatewayNamespace"]}
    assert gateway_side == {"TCPRoute", "UDPRoute", "BackendTrafficPolicy"}


def test_routes_attach_to_the_gateway_and_listeners_of_the_settings(changed: list[dict[str, Any]]) -> None:
    for kind, listener in (("TCPRoute", "gatewayGrpcListener"), ("UDPRoute", "gatewayQuicListener")):
        [parent] = one(changed, kind)["spec"]["parentRefs"]
        assert parent == {
            "group": "gateway.networking.k8s.io", "kind": "Gateway", "name": CHANGED["gatewayName"],
            "namespace": CHANGED["gatewayNamespace"], "sectionName": CHANGED[listener],
        }
        [backend] = one(changed, kind)["spec"]["rules"][0]["backendRefs"]
        assert backend["namespace"] == CHANGED["namespace"]


def test_proxy_protocol_trust_monitoring_label_and_runbooks_follow_the_settings(changed: list[dict[str, Any]]) -> None:
    [router] = one(changed, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert f"--proxy-protocol-trusted-cidrs={CHANGED['gatewayPodCIDRs']}" in router["args"]
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert one(changed, kind)["metadata"]["labels"]["release"] == CHANGED["prometheusRelease"]
    rules = [r for g in one(changed, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    for rule in rules:
        assert rule["annotations"]["runbook_url"] == f"{CHANGED['runbookBaseURL']}#{rule['alert'].lower()}"
