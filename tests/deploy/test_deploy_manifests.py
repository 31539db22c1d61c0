"""deploy/, Dockerfile: every manifest loads and the wiring agrees with itself and the CLI.

Ports, names and timings come from router/constants.py and the CLI's own parser, never
from this file: container ports <-> Service targetPorts <-> route backendRefs <->
ServiceMonitor port (components/monitoring), probes answered by the real health endpoint,
Deployment args parsed by ``router.config``, RBAC exactly get/list/watch on endpointslices.
The files are read as written; tests/deploy/test_deploy_settings.py shows that rendering them with the
default settings changes nothing, tests/deploy/test_deploy_schemas.py validates what renders.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from router import constants as c
from router.logging_setup import parse_log_level
from router.metrics import RouterMetrics
from tests.support.kustomize import render_overlay

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUSTOMIZATION = DEPLOY / "kustomization.yaml"
RBAC = DEPLOY / "rbac.yaml"
EXAMPLES = DEPLOY / "examples"
"""Files for users to copy (an endpoints file, a Gateway), deliberately outside the kustomization."""
COMPONENTS = DEPLOY / "components"
"""Opt-in kustomize components (not in the base); tests/deploy/test_deploy_components.py renders each."""
MONITORING = COMPONENTS / "monitoring"
"""The ServiceMonitor and PrometheusRule, wired to the base's Service: read here with the base."""
GATEWAY_GROUP = "gateway.networking.k8s.io"
LOCAL_CONFIG = "config.kubernetes.io/local-config"
"""Annotation of kustomize inputs that are never applied (deploy/settings.yaml)."""

ROUTER_PORTS = {
    "grpc": ("--listen-addr", c.DEFAULT_LISTEN_ADDR, "TCP"),
    "quic": ("--reverse-tunnel-listen-addr", c.DEFAULT_REVERSE_TUNNEL_LISTEN_ADDR, "UDP"),
    "metrics": ("--health-listen-addr", c.DEFAULT_HEALTH_LISTEN_ADDR, "TCP"),
}
"""Container/Service port name -> (CLI flag, its default address, protocol)."""

ARGS_DIFFERING_FROM_DEFAULTS = {"--log-format": "json"}
"""Deployment args allowed to differ from the CLI default, with the value they must have."""

RBAC_MISSING = "deploy/rbac.yaml is not written yet (another helper's file)"


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------
def kustomization(directory: Path = DEPLOY) -> dict[str, Any]:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())  # type: ignore[no-any-return]


def listed_resources(directory: Path = DEPLOY) -> list[Path]:
    return [directory / r for r in kustomization(directory).get("resources", [])]


def generated_files(directory: Path = DEPLOY) -> list[Path]:
    generators = kustomization(directory).get("configMapGenerator", [])
    return [directory / f for gen in generators for f in gen["files"]]


def is_local_config(doc: dict[str, Any]) -> bool:
    return doc["metadata"].get("annotations", {}).get(LOCAL_CONFIG) == "true"


def load_docs(paths: list[Path]) -> list[dict[str, Any]]:
    """The objects in ``paths`` that kustomize renders (kustomize-only inputs left out)."""
    docs: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d and not is_local_config(d))
    return docs


DOCS = load_docs(listed_resources()) + load_docs(listed_resources(MONITORING))
"""The base's objects plus the monitoring component's, as written."""


def objects(kind: str) -> list[dict[str, Any]]:
    return [d for d in DOCS if d["kind"] == kind]


def one(kind: str) -> dict[str, Any]:
    found = objects(kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def ns(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["namespace"])


def deployment() -> dict[str, Any]:
    return one("Deployment")


def pod_spec() -> dict[str, Any]:
    return deployment()["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def container() -> dict[str, Any]:
    [router] = pod_spec()["containers"]
    return router  # type: ignore[no-any-return]


def container_port(name_or_number: str | int) -> dict[str, Any]:
    ports = container()["ports"]
    key = "name" if isinstance(name_or_number, str) else "containerPort"
    [port] = [p for p in ports if p[key] == name_or_number]
    return port  # type: ignore[no-any-return]


def args() -> dict[str, str]:
    """The Deployment's ``--flag=value`` args as a mapping (every arg must use that form)."""
    out: dict[str, str] = {}
    for arg in container()["args"]:
        flag, sep, value = arg.partition("=")
        assert sep and flag.startswith("--"), f"write args as --flag=value: {arg!r}"
        assert flag not in out, f"{flag} given twice"
        out[flag] = value
    return out


def effective(flag: str, default: object) -> str:
    return args().get(flag, str(default))


def env() -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container().get("env", [])}


def service_port(name: str) -> dict[str, Any]:
    [port] = [p for p in one("Service")["spec"]["ports"] if p["name"] == name]
    return port  # type: ignore[no-any-return]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_labels() -> dict[str, str]:
    return deployment()["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------
# Kustomization and documents
# ---------------------------------------------------------------------------
def test_kustomization_lists_every_manifest_and_each_exists() -> None:
    listed = listed_resources() + generated_files()
    assert len(listed) == len(set(listed)), "a file is listed twice"
    on_disk = {
        p for p in DEPLOY.rglob("*")
        if p.is_file() and p != KUSTOMIZATION and EXAMPLES not in p.parents and COMPONENTS not in p.parents
    }
    assert on_disk - set(listed) == set(), "files under deploy/ that the kustomization omits"
    missing = [p for p in listed if not p.exists()]
    assert [p for p in missing if p != RBAC] == []
    assert RBAC in listed
    if missing:
        pytest.skip(RBAC_MISSING)


def test_the_base_lists_its_settings_which_never_render() -> None:
    docs = [d for p in listed_resources() if p.exists() for d in yaml.safe_load_all(p.read_text()) if d]
    [settings] = [d for d in docs if is_local_config(d)]
    assert (settings["kind"], settings["metadata"]["name"]) == ("ConfigMap", "stargate-router-settings")
    assert "namespace" not in settings["metadata"], "a kustomize input, never applied to a namespace"


def test_every_document_is_a_named_namespaced_object() -> None:
    assert {d["kind"] for d in DOCS} >= {
        "Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor", "TCPRoute", "UDPRoute",
        "ReferenceGrant", "PrometheusRule",
    }
    for doc in DOCS:
        assert doc["apiVersion"] and doc["metadata"]["name"], doc
        assert doc["metadata"].get("namespace"), f"{doc['kind']} {doc['metadata']['name']}: no namespace"


def test_kustomize_build_renders_every_object(tmp_path: Path) -> None:
    if not RBAC.exists():
        pytest.skip(RBAC_MISSING)
    rendered = render_overlay(tmp_path, [MONITORING.name])
    key: Callable[[dict[str, Any]], tuple[str, str, str]] = lambda d: (  # noqa: E731
        d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")
    )
    [dashboard] = [d for d in rendered if d["kind"] == "ConfigMap"]
    assert sorted(map(key, rendered)) == sorted([*map(key, DOCS), key(dashboard)])
    assert dashboard["metadata"]["namespace"] == ns(deployment())
    [(name, text)] = dashboard["data"].items()
    assert json.loads(text)["panels"], name


# ---------------------------------------------------------------------------
# Ports: container <-> Service <-> routes <-> ServiceMonitor, all = CLI defaults
# ---------------------------------------------------------------------------
def test_container_ports_are_the_listen_ports_of_the_args() -> None:
    ports = container()["ports"]
    assert {p["name"] for p in ports} == set(ROUTER_PORTS)
    for name, (flag, default, protocol) in ROUTER_PORTS.items():
        port = container_port(name)
        assert port["protocol"] == protocol, name
        assert port["containerPort"] == port_of(default), f"{name} is not the {flag} default"
        assert port["containerPort"] == port_of(effective(flag, default)), f"{name} != {flag}"


def test_service_ports_target_the_container_ports() -> None:
    service = one("Service")
    assert service["spec"]["type"] == "ClusterIP"
    assert ns(service) == ns(deployment())
    assert selects(service["spec"]["selector"], pod_labels())
    assert {p["name"] for p in service["spec"]["ports"]} == set(ROUTER_PORTS)
    for name, (_, default, protocol) in ROUTER_PORTS.items():
        port = service_port(name)
        target = container_port(port["targetPort"])
        assert (port["protocol"], target["protocol"]) == (protocol, protocol), name
        assert port["port"] == target["containerPort"] == port_of(default), name


@pytest.mark.parametrize(("kind", "port_name"), [("TCPRoute", "grpc"), ("UDPRoute", "quic")])
def test_route_sends_to_the_service_port_of_its_protocol(kind: str, port_name: str) -> None:
    route, service = one(kind), one("Service")
    assert route["apiVersion"] == f"{GATEWAY_GROUP}/v1"  # standard channel since Gateway API v1.6
    [rule] = route["spec"]["rules"]
    [backend] = rule["backendRefs"]
    assert backend.get("group", "") == "" and backend.get("kind", "Service") == "Service"
    assert backend["name"] == service["metadata"]["name"]
    assert backend.get("namespace", ns(route)) == ns(service)
    port = service_port(port_name)
    assert backend["port"] == port["port"]
    assert port["protocol"] == ("TCP" if kind == "TCPRoute" else "UDP")


@pytest.mark.parametrize("kind", ["TCPRoute", "UDPRoute"])
def test_route_parent_is_a_gateway_listener_in_the_routes_namespace(kind: str) -> None:
    route = one(kind)
    [parent] = route["spec"]["parentRefs"]
    assert parent.get("group", GATEWAY_GROUP) == GATEWAY_GROUP
    assert parent.get("kind", "Gateway") == "Gateway"
    assert parent["name"] and parent["sectionName"]
    assert parent["namespace"] == ns(route), "the route lives beside its Gateway"


def test_both_routes_share_the_gateway_but_not_the_listener() -> None:
    tcp, udp = (one(k)["spec"]["parentRefs"][0] for k in ("TCPRoute", "UDPRoute"))
    assert (tcp["name"], tcp["namespace"]) == (udp["name"], udp["namespace"])
    assert tcp["sectionName"] != udp["sectionName"]


def test_reference_grant_lets_both_routes_reach_services_by_kind_only() -> None:
    grant, service = one("ReferenceGrant"), one("Service")
    assert grant["apiVersion"] == f"{GATEWAY_GROUP}/v1beta1"
    assert ns(grant) == ns(service)
    assert sorted((f["group"], f["kind"], f["namespace"]) for f in grant["spec"]["from"]) == [
        (GATEWAY_GROUP, "TCPRoute", ns(one("TCPRoute"))),
        (GATEWAY_GROUP, "UDPRoute", ns(one("UDPRoute"))),
    ]
    assert grant["spec"]["to"] == [{"group": "", "kind": "Service"}]  # no `name` (upstream review)


def test_servicemonitor_scrapes_the_metrics_port_where_metrics_are_served() -> None:
    health = pytest.importorskip("router.health", reason="router/health.py not written yet")
    monitor, service = one("ServiceMonitor"), one("Service")
    assert ns(monitor) == ns(service)
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    [endpoint] = monitor["spec"]["endpoints"]
    assert service_port(endpoint["port"])["port"] == port_of(c.DEFAULT_HEALTH_LISTEN_ADDR)
    response = health.HealthServer(RouterMetrics(), lambda: True).respond("GET", endpoint["path"])
    assert response.startswith(b"HTTP/1.1 200 ")
    assert c.READY_TARGETS.encode() in response


# ---------------------------------------------------------------------------
# Probes, args, environment, timings
# ---------------------------------------------------------------------------
def test_probes_are_liveness_and_readiness_on_the_health_port() -> None:
    health = pytest.importorskip("router.health", reason="router/health.py not written yet")
    live, ready = container()["livenessProbe"]["httpGet"], container()["readinessProbe"]["httpGet"]
    for probe in (live, ready):
        assert container_port(probe["port"])["containerPort"] == port_of(c.DEFAULT_HEALTH_LISTEN_ADDR)

    def status(path: str, is_ready: bool) -> bytes:
        response: bytes = health.HealthServer(RouterMetrics(), lambda: is_ready).respond("GET", path)
        return response.split(b"\r\n")[0]

    # Liveness must not follow readiness (a draining router is alive); readiness must.
    assert status(live["path"], is_ready=False) == b"HTTP/1.1 200 OK"
    assert status(ready["path"], is_ready=True) == b"HTTP/1.1 200 OK"
    assert status(ready["path"], is_ready=False).startswith(b"HTTP/1.1 503")
    assert (live["path"], ready["path"]) == ("/healthz", "/readyz")


def test_deployment_args_are_cli_flags_with_default_values() -> None:
    config = pytest.importorskip("router.config", reason="router/config.py not written yet")
    parser = config.build_parser()
    actions = parser._option_string_actions  # flag -> argparse action (stable for years)
    for flag, value in args().items():
        assert flag in actions, f"{flag} is not a stargate-router flag"
        expected = ARGS_DIFFERING_FROM_DEFAULTS.get(flag, parser.get_default(actions[flag].dest))
        assert value == str(expected), f"{flag}={value}, CLI default {expected}"
    assert "--target-namespace" not in args(), "the namespace comes from POD_NAMESPACE"


def test_deployment_args_and_env_make_a_valid_config() -> None:
    config = pytest.importorskip("router.config", reason="router/config.py not written yet")
    environ = {name: str(e["value"]) for name, e in env().items() if "value" in e}
    environ[c.TARGET_NAMESPACE_ENV] = ns(deployment())
    cfg = config.config_from_args([f"{k}={v}" for k, v in args().items()], environ)
    assert cfg.target_namespace == ns(deployment())
    assert cfg.listen_addr.port == container_port("grpc")["containerPort"]
    assert cfg.reverse_tunnel_listen_addr.port == container_port("quic")["containerPort"]
    assert cfg.health_listen_addr.port == container_port("metrics")["containerPort"]
    assert pod_spec()["terminationGracePeriodSeconds"] > cfg.shutdown_delay_s + cfg.drain_timeout_s


def test_pod_namespace_comes_from_the_downward_api() -> None:
    var = env()[c.TARGET_NAMESPACE_ENV]
    assert var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_log_level_env_is_a_valid_level() -> None:
    assert c.LOG_LEVEL_ENV in env(), f"deploy/deployment.yaml does not set {c.LOG_LEVEL_ENV}"
    parse_log_level(env()[c.LOG_LEVEL_ENV]["value"])


def test_grace_period_exceeds_shutdown_delay_plus_drain_timeout() -> None:
    delay_ms = int(effective("--shutdown-delay-ms", c.DEFAULT_SHUTDOWN_DELAY_MS))
    drain_ms = int(effective("--drain-timeout-ms", c.DEFAULT_DRAIN_TIMEOUT_MS))
    assert pod_spec()["terminationGracePeriodSeconds"] * 1000 > delay_ms + drain_ms


# ---------------------------------------------------------------------------
# Availability, security, resources, image
# ---------------------------------------------------------------------------
def test_two_replicas_roll_one_at_a_time_and_a_pdb_keeps_one() -> None:
    spec = deployment()["spec"]
    assert spec["replicas"] == 2
    assert selects(spec["selector"]["matchLabels"], pod_labels())
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = one("PodDisruptionBudget")
    assert ns(pdb) == ns(deployment())
    assert pdb["spec"]["minAvailable"] == 1
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels())


def test_replicas_spread_across_nodes() -> None:
    constraints = pod_spec()["topologySpreadConstraints"]
    [by_node] = [t for t in constraints if t["topologyKey"] == "kubernetes.io/hostname"]
    assert by_node["maxSkew"] == 1
    assert selects(by_node["labelSelector"]["matchLabels"], pod_labels())


def test_pod_and_container_run_restricted() -> None:
    pod, ctr = pod_spec()["securityContext"], container()["securityContext"]
    assert pod["runAsNonRoot"] is True and ctr["runAsNonRoot"] is True
    assert pod["runAsUser"] == 10001
    assert ctr["readOnlyRootFilesystem"] is True
    assert ctr["allowPrivilegeEscalation"] is False
    assert ctr["capabilities"] == {"drop": ["ALL"]}
    assert pod["seccompProfile"] == ctr["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in ctr and not pod_spec().get("hostNetwork")


def test_container_has_requests_and_limits() -> None:
    resources = container()["resources"]
    for kind in ("requests", "limits"):
        assert set(resources[kind]) == {"cpu", "memory"}, kind


def test_image_tag_is_the_package_version() -> None:
    image = container()["image"]
    assert image.rpartition(":")[2] == importlib.metadata.version("stargate-router")


# ---------------------------------------------------------------------------
# RBAC (deploy/rbac.yaml, another helper's file)
# ---------------------------------------------------------------------------
def test_rbac_is_exactly_get_list_watch_on_endpointslices_for_the_router_account() -> None:
    if not RBAC.exists():
        pytest.skip(RBAC_MISSING)
    account_name, namespace = pod_spec()["serviceAccountName"], ns(deployment())
    [account] = [a for a in objects("ServiceAccount") if a["metadata"]["name"] == account_name]
    assert ns(account) == namespace
    assert objects("ClusterRole") == [] and objects("ClusterRoleBinding") == []
    [role], [binding] = objects("Role"), objects("RoleBinding")
    assert ns(role) == ns(binding) == namespace, "the router watches its own namespace"
    [rule] = role["rules"]
    assert rule["apiGroups"] == ["discovery.k8s.io"]
    assert rule["resources"] == ["endpointslices"]
    assert sorted(rule["verbs"]) == ["get", "list", "watch"]
    assert "resourceNames" not in rule
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account_name, "namespace": namespace}]


# ---------------------------------------------------------------------------
# Dockerfile
# ---------------------------------------------------------------------------
def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_builds_wheels_then_installs_only_them_as_uid_10001() -> None:
    steps = dockerfile_instructions()
    froms = [arg for op, arg in steps if op == "FROM"]
    assert len(froms) == 2 and froms[1] == "python:3.11-slim"
    runs = [arg for op, arg in steps if op == "RUN"]
    assert any("pip wheel -w /wheels ." in r for r in runs)
    assert any("--no-index" in r and "/wheels" in r for r in runs)
    [user] = [arg for op, arg in steps if op == "USER"]
    assert user.split(":")[0] == str(pod_spec()["securityContext"]["runAsUser"])
    [entrypoint] = [arg for op, arg in steps if op == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["stargate-router"]
    assert "stargate-router" in importlib.metadata.distribution("stargate-router").entry_points.names
    assert not any(op == "HEALTHCHECK" for op, _ in steps)
    env_line = " ".join(arg for op, arg in steps if op == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env_line


def test_dockerfile_exposes_the_container_ports() -> None:
    [exposed] = [arg for op, arg in dockerfile_instructions() if op == "EXPOSE"]
    expected = {f"{p['containerPort']}/{p['protocol'].lower()}" for p in container()["ports"]}
    assert set(exposed.split()) == expected


def test_dockerignore_admits_every_package_the_wheel_needs() -> None:
    admitted = {
        line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")
    }
    assert {"pyproject.toml", "setup.py", "router", "quic", "discovery"} <= admitted


def test_only_the_wheel_stage_has_a_c_compiler_for_the_optional_splice() -> None:
    steps = dockerfile_instructions()
    second_from = [i for i, (op, _) in enumerate(steps) if op == "FROM"][1]
    installs = [(i, arg) for i, (op, arg) in enumerate(steps) if op == "RUN" and "apt-get install" in arg]
    assert [i < second_from and "gcc" in arg.split() for i, arg in installs] == [True]
    assert "libssl-dev" in installs[0][1].split()  # OpenSSL's headers for quic/_initial_protection.c
