"""Every object deploy/ renders validates strictly against its own schema.

The base alone and with every combination of its components is rendered by the real kustomize;
core kinds are checked against Kubernetes' schemas (kubernetes-validate, strict), custom kinds
against their own CRDs' OpenAPI schemas (tests/support/crds: Gateway API v1.6.1 standard and
v1.4.0 experimental, Envoy Gateway v1.9.0, prometheus-operator v0.93.0), with fields the
schema does not declare refused. The example Gateway is checked the same way.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import manifest_schemas as schemas
from tests.support.kustomize import DEPLOY, component_names, one, render_overlay, settings

COMBINATIONS = [
    combo for size in range(len(component_names()) + 1) for combo in itertools.combinations(component_names(), size)
]
"""The base alone, each component, and every set of them together."""

EXAMPLE_GATEWAY = DEPLOY / "examples" / "gateway.yaml"
GATEWAY_API = "gateway.networking.k8s.io"


def tcproute(**spec_changes: Any) -> dict[str, Any]:
    route = yaml.safe_load((DEPLOY / "tcproute.yaml").read_text())
    route["spec"].update(spec_changes)
    return route  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------
# The checker itself
# ---------------------------------------------------------------------------
def test_checker_accepts_the_route_and_refuses_unknown_fields_wrong_types_and_missing_ones() -> None:
    assert schemas.problems(tcproute()) == []
    [backend] = tcproute()["spec"]["rules"][0]["backendRefs"]
    misspelt = tcproute(rules=[{"backendRefs": [{**backend, "prot": 50071}]}])
    assert any("'prot' was unexpected" in p for p in schemas.problems(misspelt))
    wrong_type = tcproute(rules=[{"backendRefs": [{**backend, "port": "grpc"}]}])
    assert any("is not of type 'integer'" in p for p in schemas.problems(wrong_type))
    assert any("'backendRefs' is a required property" in p for p in schemas.problems(tcproute(rules=[{}])))
    top_level = {**tcproute(), "specs": {}}
    assert any("'specs' was unexpected" in p for p in schemas.problems(top_level))


def test_checker_checks_a_custom_objects_metadata_as_object_meta() -> None:
    route = tcproute()
    route["metadata"]["labelz"] = {"a": "b"}
    assert any("metadata" in p and "'labelz' was unexpected" in p for p in schemas.problems(route))


def test_checker_picks_the_crd_version_the_api_version_names() -> None:
    route = tcproute()
    assert [c.source for c in schemas.crds_serving(route["apiVersion"], "TCPRoute")] == [
        "gateway-api-v1.6.1-standard/tcproutes.yaml"
    ]
    assert [c.source for c in schemas.crds_serving(f"{GATEWAY_API}/v1alpha2", "TCPRoute")] == [
        "gateway-api-v1.4.0-experimental/tcproutes.yaml"  # v1.6.1 standard no longer serves it
    ]
    unknown = {**route, "apiVersion": f"{GATEWAY_API}/v9"}
    assert any("no core schema and no vendored CRD" in p for p in schemas.problems(unknown))


def test_checker_refuses_unknown_fields_of_core_kinds() -> None:
    service = yaml.safe_load((DEPLOY / "service.yaml").read_text())
    assert schemas.problems(service) == []
    service["spec"]["selectr"] = {}
    assert any("'selectr' was unexpected" in p for p in schemas.problems(service))


def test_checker_leaves_open_what_the_schema_preserves_and_combinator_branches() -> None:
    preserved = {"type": "object", "properties": {"a": {"type": "string"}}, schemas.PRESERVE_UNKNOWN: True}
    assert "additionalProperties" not in schemas.strict(preserved)
    branchy = {"type": "object", "properties": {"t": {"type": "string"}, "v": {"type": "string"}},
               "oneOf": [{"properties": {"t": {"enum": ["x"]}}}, {"properties": {"t": {"not": {"enum": ["x"]}}}}]}
    strict = schemas.strict(branchy)
    assert strict["additionalProperties"] is False
    assert all("additionalProperties" not in branch for branch in strict["oneOf"])


# ---------------------------------------------------------------------------
# What deploy/ renders
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("components", COMBINATIONS, ids=lambda combo: "+".join(combo) or "base")
def test_every_rendered_object_validates_strictly(tmp_path: Path, components: tuple[str, ...]) -> None:
    docs = render_overlay(tmp_path, components)
    assert docs
    assert [p for doc in docs for p in schemas.problems(doc)] == []


def test_the_custom_kinds_are_checked_against_crds_and_the_rest_as_core_kinds(tmp_path: Path) -> None:
    docs = render_overlay(tmp_path, component_names())
    custom = {d["kind"] for d in docs if schemas.crds_serving(d["apiVersion"], d["kind"])}
    assert custom == {
        "TCPRoute", "UDPRoute", "ReferenceGrant", "BackendTrafficPolicy", "ServiceMonitor", "PrometheusRule",
    }
    core = {d["kind"] for d in docs} - custom
    assert core == {
        "ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "PodDisruptionBudget", "ConfigMap",
        "NetworkPolicy",
    }


# ---------------------------------------------------------------------------
# The example Gateway
# ---------------------------------------------------------------------------
def test_example_gateway_validates_against_the_v1_6_1_standard_crd() -> None:
    gateway = yaml.safe_load(EXAMPLE_GATEWAY.read_text())
    assert [c.source for c in schemas.crds_serving(gateway["apiVersion"], "Gateway")] == [
        "gateway-api-v1.6.1-standard/gateways.yaml"
    ]
    assert schemas.problems(gateway) == []


def test_example_gateway_has_the_two_listeners_the_routes_attach_to(tmp_path: Path) -> None:
    gateway = yaml.safe_load(EXAMPLE_GATEWAY.read_text())
    knobs = settings()
    assert (gateway["metadata"]["name"], gateway["metadata"]["namespace"]) == (
        knobs["gatewayName"], knobs["gatewayNamespace"]
    )
    listeners = {listener["name"]: listener for listener in gateway["spec"]["listeners"]}
    docs = render_overlay(tmp_path, [])
    service_ports = {p["name"]: p for p in one(docs, "Service")["spec"]["ports"]}
    for kind, protocol, port_name in (("TCPRoute", "TCP", "grpc"), ("UDPRoute", "UDP", "quic")):
        [parent] = one(docs, kind)["spec"]["parentRefs"]
        assert (parent["name"], parent["namespace"]) == (gateway["metadata"]["name"], gateway["metadata"]["namespace"])
        listener = listeners[parent["sectionName"]]
        assert listener["protocol"] == protocol == service_ports[port_name]["protocol"]
        assert listener["port"] == service_ports[port_name]["port"], "workers dial the router's own port numbers"
        assert listener["allowedRoutes"]["kinds"] == [{"group": GATEWAY_API, "kind": kind}]
        assert listener["allowedRoutes"]["namespaces"]["from"] == "Same"
    assert sorted(listener["port"] for listener in listeners.values()) == [50071, 50072]
