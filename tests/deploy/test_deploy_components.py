"""deploy/components/: opt-in kustomize components render on top of the base and stay coherent.

``proxy-protocol``: Envoy Gateway's BackendTrafficPolicy sends PROXY v2 on the worker TCPRoute,
and the same component turns the router flag on; one without the other refuses every worker.
The router believes the headers only from the Gateway's pods (settings.yaml gatewayPodCIDRs).
``monitoring``: every prometheus-operator kind lives here, none in the base.
``gateway-api-v1alpha2``: the same routes under the older API version.
``quic-source-affinity``: Envoy Gateway hashes the UDPRoute's flows on the source address.
``network-policy``: tests/deploy/test_deploy_network_policy.py.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.config import config_from_args
from router.flag_values import ConfigError
from tests.support.kustomize import (
    COMPONENTS,
    DEPLOY,
    component_names,
    copy_with_settings,
    one,
    render_overlay,
    settings,
)

PROXY_PROTOCOL = COMPONENTS / "proxy-protocol"
PROMETHEUS_OPERATOR_GROUP = "monitoring.coreos.com"
GATEWAY_GROUP = "gateway.networking.k8s.io"
ROUTES = (("TCPRoute", "stargate-router-grpc"), ("UDPRoute", "stargate-router-quic"))


def kustomization(directory: Path) -> dict[str, Any]:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())  # type: ignore[no-any-return]


def router_args(docs: list[dict[str, Any]]) -> list[str]:
    [router] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return router["args"]  # type: ignore[no-any-return]


def test_every_component_is_a_kustomize_component() -> None:
    assert component_names() == sorted(p.name for p in COMPONENTS.iterdir() if p.is_dir())
    for directory in (p for p in COMPONENTS.iterdir() if p.is_dir()):
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        assert kustomization["kind"] == "Component", directory.name
        for resource in kustomization.get("resources", []):
            assert (directory / resource).is_file(), f"{directory.name}: {resource} missing"


def test_every_file_of_a_component_is_used_by_it() -> None:
    for name in component_names():
        directory = COMPONENTS / name
        spec = kustomization(directory)
        used = {directory / "kustomization.yaml"} | {directory / r for r in spec.get("resources", [])}
        used |= {directory / f for gen in spec.get("configMapGenerator", []) for f in gen["files"]}
        assert {p for p in directory.rglob("*") if p.is_file()} == used, name


def test_the_base_leaves_every_component_off() -> None:
    base = kustomization(DEPLOY)
    assert "components" not in base
    assert not any("components/" in r for r in base["resources"])
    deployment = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    [router] = deployment["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--accept-proxy-protocol") for a in router["args"])


# ---------------------------------------------------------------------------
# proxy-protocol
# ---------------------------------------------------------------------------
def test_proxy_protocol_component_pairs_the_gateway_policy_with_the_router_flag(tmp_path: Path) -> None:
    docs = render_overlay(tmp_path, [PROXY_PROTOCOL.name])
    route, policy = one(docs, "TCPRoute"), one(docs, "BackendTrafficPolicy")
    assert policy["apiVersion"] == "gateway.envoyproxy.io/v1alpha1"
    assert policy["metadata"]["namespace"] == route["metadata"]["namespace"], "policy attachment is local"
    assert policy["spec"]["targetRefs"] == [
        {"group": GATEWAY_GROUP, "kind": "TCPRoute", "name": route["metadata"]["name"]}
    ]
    assert policy["spec"]["proxyProtocol"]["version"] in ("V1", "V2")
    cfg = config_from_args(router_args(docs), environ={"POD_NAMESPACE": "stargate"})
    assert cfg.accept_proxy_protocol


def test_proxy_protocol_trusts_only_the_gateway_pod_cidrs_of_the_settings(tmp_path: Path) -> None:
    docs = render_overlay(tmp_path, [PROXY_PROTOCOL.name])
    cfg = config_from_args(router_args(docs), environ={"POD_NAMESPACE": "stargate"})
    knob = [ipaddress.ip_network(c) for c in settings()["gatewayPodCIDRs"].split(",")]
    assert list(cfg.proxy_protocol_trusted_cidrs) == knob
    assert all(net.prefixlen > 0 for net in cfg.proxy_protocol_trusted_cidrs), "never every source"
    # The default trusts no real source: documentation ranges (RFC 5737, RFC 3849) only.
    documentation = [ipaddress.ip_network("192.0.2.0/24"), ipaddress.ip_network("2001:db8::/32")]
    assert all(any(net.subnet_of(doc) for doc in documentation if doc.version == net.version) for net in knob)


@pytest.mark.parametrize("components", [[PROXY_PROTOCOL.name], component_names()], ids=["alone", "all"])
def test_every_rendering_that_turns_proxy_on_names_its_trusted_sources(tmp_path: Path, components: list[str]) -> None:
    """The router refuses PROXY on without trusted CIDRs (it trusts no source by default): the
    component adds both flags in one patch, so no rendering has one without the other."""
    args = router_args(render_overlay(tmp_path, components))
    assert len([a for a in args if a.startswith("--proxy-protocol-trusted-cidrs=")]) == 1
    cfg = config_from_args(args, environ={"POD_NAMESPACE": "stargate"})
    assert cfg.accept_proxy_protocol and cfg.proxy_protocol_trusted_cidrs


@pytest.mark.parametrize("cidrs", ["", " ", ","], ids=["empty", "blank", "comma"])
def test_a_blank_gateway_pod_cidrs_knob_is_refused_by_the_router_never_read_as_every_source(
    tmp_path: Path, cidrs: str
) -> None:
    """kustomize renders a blank knob as it is; the router then exits 2 with one line naming the flag."""
    deploy = copy_with_settings(tmp_path, {"gatewayPodCIDRs": cidrs})
    args = router_args(render_overlay(tmp_path, [PROXY_PROTOCOL.name], deploy=deploy))
    with pytest.raises(ConfigError, match=r"^--proxy-protocol-trusted-cidrs: expected at least one CIDR"):
        config_from_args(args, environ={"POD_NAMESPACE": "stargate"})


# ---------------------------------------------------------------------------
# monitoring
# ---------------------------------------------------------------------------
def test_the_base_renders_no_prometheus_operator_kind(tmp_path: Path) -> None:
    docs = render_overlay(tmp_path, [])
    assert [d["kind"] for d in docs if d["apiVersion"].startswith(PROMETHEUS_OPERATOR_GROUP + "/")] == []
    assert not [d for d in docs if d["kind"] == "ConfigMap"], "the dashboard comes with monitoring"


def test_monitoring_component_brings_scrape_rules_and_dashboard_labelled_for_its_prometheus(
    tmp_path: Path,
) -> None:
    docs = render_overlay(tmp_path, ["monitoring"])
    release = settings()["prometheusRelease"]
    router_namespace = one(docs, "Deployment")["metadata"]["namespace"]
    for kind in ("ServiceMonitor", "PrometheusRule"):
        obj = one(docs, kind)
        assert obj["apiVersion"] == f"{PROMETHEUS_OPERATOR_GROUP}/v1"
        assert obj["metadata"]["labels"]["release"] == release, f"{kind}: kube-prometheus-stack selects on it"
        assert obj["metadata"]["namespace"] == router_namespace
    dashboard = one(docs, "ConfigMap", "stargate-router-dashboard")
    assert dashboard["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert dashboard["metadata"]["namespace"] == router_namespace


# ---------------------------------------------------------------------------
# gateway-api-v1alpha2
# ---------------------------------------------------------------------------
def test_v1alpha2_component_changes_only_the_routes_api_version(tmp_path: Path) -> None:
    base = render_overlay(tmp_path / "base", [])
    old = render_overlay(tmp_path / "old", ["gateway-api-v1alpha2"])
    assert len(base) == len(old)
    for kind, name in ROUTES:
        new_route, old_route = one(base, kind, name), one(old, kind, name)
        assert new_route["apiVersion"] == f"{GATEWAY_GROUP}/v1"
        assert old_route == {**new_route, "apiVersion": f"{GATEWAY_GROUP}/v1alpha2"}
    unchanged = lambda docs: [d for d in docs if d["kind"] not in dict(ROUTES)]  # noqa: E731
    assert unchanged(base) == unchanged(old)


# ---------------------------------------------------------------------------
# quic-source-affinity
# ---------------------------------------------------------------------------
def test_quic_source_affinity_hashes_the_udp_route_on_the_source_address(tmp_path: Path) -> None:
    docs = render_overlay(tmp_path, ["quic-source-affinity"])
    route, policy = one(docs, "UDPRoute"), one(docs, "BackendTrafficPolicy")
    assert policy["apiVersion"] == "gateway.envoyproxy.io/v1alpha1"
    assert policy["metadata"]["namespace"] == route["metadata"]["namespace"], "policy attachment is local"
    assert policy["spec"]["targetRefs"] == [
        {"group": GATEWAY_GROUP, "kind": "UDPRoute", "name": route["metadata"]["name"]}
    ]
    assert policy["spec"]["loadBalancer"] == {"type": "ConsistentHash", "consistentHash": {"type": "SourceIP"}}


def test_both_envoy_gateway_policies_render_together_each_on_its_route(tmp_path: Path) -> None:
    docs = render_overlay(tmp_path, ["proxy-protocol", "quic-source-affinity"])
    policies = {d["metadata"]["name"]: d["spec"]["targetRefs"] for d in docs if d["kind"] == "BackendTrafficPolicy"}
    assert sorted(ref["kind"] for refs in policies.values() for ref in refs) == ["TCPRoute", "UDPRoute"]
