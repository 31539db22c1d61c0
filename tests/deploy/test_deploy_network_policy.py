"""deploy/components/network-policy: who may reach the router and whom it may reach, nothing more.

In: the gRPC and QUIC container ports only from the Gateway's proxy pods (Envoy Gateway's owning
labels, in settings.yaml's namespaces), the health/metrics port (where the probes and /metrics
are) only from Prometheus. Out: the Stargate pods' ports named as the router's port-name flags,
the API server and DNS. Ports are checked against the rendered Deployment and its args, never
restated here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.config import build_parser
from tests.support.kustomize import one, render_overlay, settings

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""The label every namespace carries with its own name (Kubernetes >= 1.22)."""

API_SERVER_PORTS = {443, 6443}
"""The `kubernetes` Service's port, and the port the API server listens on behind it on most clusters."""


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render_overlay(tmp_path_factory.mktemp("network-policy"), ["network-policy"])


def policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "NetworkPolicy")["spec"]  # type: ignore[no-any-return]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [router] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return router  # type: ignore[no-any-return]


def ports(rule: dict[str, Any]) -> set[tuple[str | int, str]]:
    return {(p["port"], p["protocol"]) for p in rule["ports"]}


def arg(docs: list[dict[str, Any]], flag: str) -> str:
    given = dict(a.partition("=")[::2] for a in container(docs)["args"])
    parser = build_parser()
    return given.get(flag) or str(parser.get_default(parser._option_string_actions[flag].dest))


def test_policy_isolates_the_router_pods_both_ways(docs: list[dict[str, Any]]) -> None:
    deployment, network_policy = one(docs, "Deployment"), one(docs, "NetworkPolicy")
    assert network_policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert policy(docs)["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert sorted(policy(docs)["policyTypes"]) == ["Egress", "Ingress"]
    assert all(rule.get("from") for rule in policy(docs)["ingress"]), "no ingress rule open to every source"


def test_grpc_and_quic_ports_admit_only_the_gateways_proxy_pods(docs: list[dict[str, Any]]) -> None:
    knobs, by_name = settings(), {p["name"]: p for p in container(docs)["ports"]}
    [gateway_rule] = [r for r in policy(docs)["ingress"] if ("grpc", "TCP") in ports(r)]
    assert ports(gateway_rule) == {(name, by_name[name]["protocol"]) for name in ("grpc", "quic")}
    [peer] = gateway_rule["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {NAMESPACE_NAME_LABEL: knobs["gatewayPodNamespace"]}
    assert peer["podSelector"]["matchLabels"] == {
        "gateway.envoyproxy.io/owning-gateway-name": knobs["gatewayName"],
        "gateway.envoyproxy.io/owning-gateway-namespace": knobs["gatewayNamespace"],
    }
    [tcp_parent] = one(docs, "TCPRoute")["spec"]["parentRefs"]
    assert (tcp_parent["name"], tcp_parent["namespace"]) == (knobs["gatewayName"], knobs["gatewayNamespace"])


def test_health_port_admits_only_prometheus_and_is_where_the_probes_are(docs: list[dict[str, Any]]) -> None:
    ctr = container(docs)
    [monitoring_rule] = [r for r in policy(docs)["ingress"] if ("metrics", "TCP") in ports(r)]
    assert ports(monitoring_rule) == {("metrics", "TCP")}
    [peer] = monitoring_rule["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {NAMESPACE_NAME_LABEL: settings()["monitoringNamespace"]}
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    # Kubelet probes come from the pod's own node, which NetworkPolicy always admits.
    assert {ctr["livenessProbe"]["httpGet"]["port"], ctr["readinessProbe"]["httpGet"]["port"]} == {"metrics"}
    assert len(policy(docs)["ingress"]) == 2, "gateway and prometheus rules only"


def test_egress_reaches_stargate_pods_api_server_and_dns_only(docs: list[dict[str, Any]]) -> None:
    rules = policy(docs)["egress"]
    assert len(rules) == 3
    pods, api_server, dns = rules
    assert pods["to"] == [{"podSelector": {}}], "the Stargate pods share the router's namespace"
    assert ports(pods) == {(arg(docs, "--grpc-port-name"), "TCP"), (arg(docs, "--quic-port-name"), "UDP")}
    assert "to" not in api_server and ports(api_server) == {(p, "TCP") for p in API_SERVER_PORTS}
    assert dns["to"] == [{
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }]
    assert ports(dns) == {(53, "UDP"), (53, "TCP")}


def test_policy_renders_with_the_proxy_protocol_component_it_completes(tmp_path: Path) -> None:
    docs = render_overlay(tmp_path, ["network-policy", "proxy-protocol"])
    assert one(docs, "NetworkPolicy") and one(docs, "BackendTrafficPolicy")
    assert any(a.startswith("--proxy-protocol-trusted-cidrs=") for a in container(docs)["args"])
