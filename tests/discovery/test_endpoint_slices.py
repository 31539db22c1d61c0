"""The pure EndpointSlices -> TargetSnapshot rules (the Rust router's semantics) and the document parser."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from discovery.endpoint_slices import (
    EndpointSliceError,
    parse_endpoints_document,
    slice_key,
    targets_from_slices,
)
from discovery.settings import DiscoverySettings
from discovery.targets import Target
from tests.support.fake_kube_api import make_endpoint, make_slice

SETTINGS = DiscoverySettings("stargate", "stargate-headless", "grpc", "quic")


def pods(slices: list[dict[str, Any]], s: DiscoverySettings = SETTINGS) -> list[str]:
    return [t.pod_name for t in targets_from_slices(slices, s)]


def test_snapshot_contains_ready_pods_with_grpc_and_quic_ports() -> None:
    snapshot = targets_from_slices(
        [make_slice("s1", [
            make_endpoint("stargate-0", "10.0.0.1"), make_endpoint("stargate-1", "10.0.0.2"),
        ])],
        SETTINGS,
    )
    assert snapshot.get("stargate-0") == Target("stargate-0", "10.0.0.1", 50051, 50052)
    assert snapshot.get("stargate-1") == Target("stargate-1", "10.0.0.2", 50051, 50052)
    assert len(snapshot) == 2


def test_snapshot_excludes_unready_serving_false_and_terminating_endpoints() -> None:
    endpoints = [
        make_endpoint("ok", "10.0.0.1"),
        make_endpoint("unready", "10.0.0.2", ready=False),
        make_endpoint("not-serving", "10.0.0.3", serving=False),
        make_endpoint("terminating", "10.0.0.4", terminating=True),
        make_endpoint("terminating-but-serving", "10.0.0.5", ready=False, serving=True, terminating=True),
    ]
    assert pods([make_slice("s", endpoints)]) == ["ok"]


def test_absent_conditions_take_the_kubernetes_defaults_ready_serving_not_terminating() -> None:
    bare = make_endpoint("bare", "10.0.0.1", ready=None, serving=None, terminating=None)
    no_conditions = make_endpoint("no-conditions", "10.0.0.2")
    del no_conditions["conditions"]
    null_conditions = make_endpoint("null-conditions", "10.0.0.3")
    null_conditions["conditions"] = None
    assert pods([make_slice("s", [bare, no_conditions, null_conditions])]) == [
        "bare", "no-conditions", "null-conditions",
    ]


def test_pod_name_comes_from_target_ref_never_hostname() -> None:
    endpoint = make_endpoint("stargate-0", "10.0.0.1")
    endpoint["hostname"] = "something-else"
    hostname_only = make_endpoint(None, "10.0.0.2")
    hostname_only["hostname"] = "stargate-1"
    assert pods([make_slice("s", [endpoint, hostname_only])]) == ["stargate-0"]


def test_endpoint_needs_a_pod_target_ref_with_a_name() -> None:
    node_ref = make_endpoint("node-a", "10.0.0.1", kind="Node")
    kindless = make_endpoint("kindless", "10.0.0.2", kind=None)
    nameless = make_endpoint("x", "10.0.0.3")
    del nameless["targetRef"]["name"]
    empty_name = make_endpoint("", "10.0.0.4")
    assert pods([make_slice("s", [node_ref, kindless, nameless, empty_name])]) == ["kindless"]


def test_slice_of_another_service_or_without_the_label_is_ignored() -> None:
    other = make_slice("other", [make_endpoint("a", "10.0.0.1")], service="other-svc")
    unlabelled = make_slice("unlabelled", [make_endpoint("b", "10.0.0.2")])
    del unlabelled["metadata"]["labels"]
    mine = make_slice("mine", [make_endpoint("c", "10.0.0.3")])
    assert pods([other, unlabelled, mine]) == ["c"]


@pytest.mark.parametrize(
    "ports",
    [
        pytest.param([{"name": "quic", "port": 2, "protocol": "UDP"}], id="no-grpc-port"),
        pytest.param([{"name": "grpc", "port": 1, "protocol": "TCP"}], id="no-quic-port"),
        pytest.param([{"name": "grpc", "port": 1, "protocol": "UDP"},
                      {"name": "quic", "port": 2, "protocol": "UDP"}], id="grpc-is-udp"),
        pytest.param([{"name": "grpc", "port": 1, "protocol": "TCP"},
                      {"name": "quic", "port": 2, "protocol": "TCP"}], id="quic-is-tcp"),
        pytest.param([{"name": "grpc", "port": 1}, {"name": "quic", "port": 2}], id="quic-defaults-to-tcp"),
        pytest.param([{"name": "grpc", "port": 0, "protocol": "TCP"},
                      {"name": "quic", "port": 2, "protocol": "UDP"}], id="port-zero"),
        pytest.param([{"name": "grpc", "port": 65536, "protocol": "TCP"},
                      {"name": "quic", "port": 2, "protocol": "UDP"}], id="port-too-big"),
        pytest.param([{"name": "grpc", "port": True, "protocol": "TCP"},
                      {"name": "quic", "port": 2, "protocol": "UDP"}], id="port-is-bool"),
        pytest.param([{"name": "grpc", "port": "50051", "protocol": "TCP"},
                      {"name": "quic", "port": 2, "protocol": "UDP"}], id="port-is-string"),
        pytest.param(None, id="ports-null"),
    ],
)
def test_slice_needs_grpc_tcp_and_quic_udp_ports(ports: list[dict[str, Any]] | None) -> None:
    slice_ = make_slice("s", [make_endpoint("a", "10.0.0.1")])
    slice_["ports"] = ports
    assert pods([slice_]) == []


def test_absent_grpc_protocol_means_tcp() -> None:
    ports = [{"name": "grpc", "port": 7000}, {"name": "quic", "port": 7001, "protocol": "UDP"}]
    snapshot = targets_from_slices([make_slice("s", [make_endpoint("a", "10.0.0.1")], ports=ports)], SETTINGS)
    assert snapshot.get("a") == Target("a", "10.0.0.1", 7000, 7001)


def test_port_names_come_from_the_settings() -> None:
    custom = DiscoverySettings(namespace="ns", service_name="svc", grpc_port_name="rpc", quic_port_name="tun")
    ports = [{"name": "rpc", "port": 1, "protocol": "TCP"}, {"name": "tun", "port": 2, "protocol": "UDP"}]
    slice_ = make_slice("s", [make_endpoint("a", "10.0.0.1")], service="svc", ports=ports)
    assert targets_from_slices([slice_], custom).get("a") == Target("a", "10.0.0.1", 1, 2)
    assert pods([slice_]) == []


def test_later_slice_wins_for_a_pod_in_two_slices() -> None:
    old = make_slice("old", [make_endpoint("a", "10.0.0.1")], grpc_port=1)
    new = make_slice("new", [make_endpoint("a", "10.0.0.9")], grpc_port=2)
    assert targets_from_slices([old, new], SETTINGS).get("a") == Target("a", "10.0.0.9", 2, 50052)
    assert targets_from_slices([new, old], SETTINGS).get("a") == Target("a", "10.0.0.1", 1, 50052)


def test_unready_copy_in_a_later_slice_does_not_hide_a_ready_copy() -> None:
    ready = make_slice("a", [make_endpoint("p", "10.0.0.1")])
    unready = make_slice("b", [make_endpoint("p", "10.0.0.2", ready=False)])
    assert targets_from_slices([ready, unready], SETTINGS).get("p") == Target("p", "10.0.0.1", 50051, 50052)


def test_ipv6_address_is_kept_and_rendered_with_brackets() -> None:
    snapshot = targets_from_slices([make_slice("s", [make_endpoint("a", "fd00::1")])], SETTINGS)
    target = snapshot.get("a")
    assert target is not None
    assert target.address == "fd00::1"
    assert target.grpc_endpoint == "[fd00::1]:50051"


def test_first_address_is_used() -> None:
    endpoint = make_endpoint("a", "10.0.0.1")
    endpoint["addresses"] = ["10.0.0.7", "10.0.0.8"]
    target = targets_from_slices([make_slice("s", [endpoint])], SETTINGS).get("a")
    assert target is not None and target.address == "10.0.0.7"


def test_endpoint_without_an_ip_literal_address_is_skipped() -> None:
    fqdn = make_endpoint("fqdn", "pod.example.com")
    empty = make_endpoint("empty", "10.0.0.1")
    empty["addresses"] = []
    assert pods([make_slice("s", [fqdn, empty, make_endpoint("ok", "10.0.0.2")])]) == ["ok"]


def test_malformed_slices_and_endpoints_are_skipped_not_fatal() -> None:
    good = make_slice("good", [
        "not-a-mapping",
        {"addresses": "10.0.0.1", "targetRef": {"name": "x"}},
        make_endpoint("weird-conditions", "10.0.0.2") | {"conditions": {"ready": "yes"}},
        make_endpoint("ok", "10.0.0.3"),
    ])
    garbage: list[Any] = [None, 42, "slice", [], {"metadata": "x"}, {"endpoints": {"a": 1}}]
    assert pods([*garbage, good]) == ["ok"]


def test_snapshot_is_sorted_by_pod_name() -> None:
    endpoints = [make_endpoint(name, f"10.0.0.{i}") for i, name in enumerate(["c", "a", "b"], start=1)]
    assert pods([make_slice("s", endpoints)]) == ["a", "b", "c"]


def test_slice_key_is_metadata_name() -> None:
    assert slice_key(make_slice("stargate-headless-abcde", [])) == "stargate-headless-abcde"
    nameless_objects: list[dict[str, Any]] = [
        {}, {"metadata": {}}, {"metadata": {"name": ""}}, {"metadata": {"name": 3}}, {"metadata": []},
    ]
    for nameless in nameless_objects:
        with pytest.raises(EndpointSliceError):
            slice_key(nameless)


# ---------------------------------------------------------------------------
# parse_endpoints_document
# ---------------------------------------------------------------------------
def test_document_may_be_one_slice_in_yaml() -> None:
    slice_ = make_slice("s", [make_endpoint("a", "10.0.0.1")])
    assert parse_endpoints_document(yaml.safe_dump(slice_)) == [slice_]


def test_document_may_be_a_kubectl_list_in_json() -> None:
    slices = [make_slice("s1", []), make_slice("s2", [])]
    for kind in ("List", "EndpointSliceList"):
        text = json.dumps({"apiVersion": "v1", "kind": kind, "items": slices, "metadata": {}})
        assert parse_endpoints_document(text) == slices


def test_document_may_be_a_multi_document_stream_in_order() -> None:
    s1, s2, s3 = (make_slice(f"s{i}", []) for i in range(3))
    text = yaml.safe_dump_all([s1, {"kind": "List", "items": [s2]}, None, s3])
    assert parse_endpoints_document(text) == [s1, s2, s3]


def test_empty_document_has_no_slices() -> None:
    assert parse_endpoints_document("") == []
    assert parse_endpoints_document("---\n---\n") == []
    assert parse_endpoints_document("kind: List\nitems: null\n") == []


def test_documents_of_other_kinds_are_skipped() -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "stargate-headless"}}
    slice_ = make_slice("s", [])
    assert parse_endpoints_document(yaml.safe_dump_all([service, slice_])) == [slice_]
    assert parse_endpoints_document(json.dumps({"kind": "List", "items": [service, slice_]})) == [slice_]


@pytest.mark.parametrize(
    "text",
    [
        "key: [unclosed",
        "\t- tab",
        "just a string",
        "42",
        "- a\n- b\n",
        "kind: List\nitems: 3\n",
        "kind: List\nitems: [1, 2]\n",
        "? [a, b]\n: 1\n",  # a mapping key that is a list
        "1: 2\n",  # non-string field names
        "!!python/object:os.system {}",  # no unsafe tags
        "a: !!binary a",
        "a: !!int x",
        "!!timestamp ",
        "a: [&x 1, *y]",
        "d: 2001-02-30",  # an impossible date
        "[" * 10_000,
        "\x00",
    ],
)
def test_malformed_document_raises_endpoint_slice_error_only(text: str) -> None:
    with pytest.raises(EndpointSliceError):
        parse_endpoints_document(text)


# ---------------------------------------------------------------------------
# Fuzz: only EndpointSliceError may escape; targets_from_slices never raises
# ---------------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=40,
)

FIELDS = ["metadata", "labels", "ports", "endpoints", "conditions", "targetRef", "addresses", "name", "port",
          "protocol", "ready", "serving", "terminating", "kind", "items"]


@st.composite
def mutated_slices(draw: st.DrawFn) -> dict[str, Any]:
    """A valid slice with a few values replaced by arbitrary JSON values, to reach the deep checks."""
    slice_ = copy.deepcopy(make_slice("s", [make_endpoint("a", "10.0.0.1"), make_endpoint("b", "fd00::2")]))
    for _ in range(draw(st.integers(0, 4))):
        node: Any = slice_
        while True:
            keys: list[Any] = list(node) if isinstance(node, dict) else list(range(len(node)))
            if not keys:
                break
            key = draw(st.sampled_from(keys))
            if draw(st.booleans()) or not isinstance(node[key], dict | list):
                node[key] = draw(json_values | st.sampled_from(FIELDS))
                break
            node = node[key]
    return slice_


@settings(deadline=None, max_examples=300)
@given(st.lists(json_values | mutated_slices(), max_size=6))
def test_fuzz_targets_from_slices_never_raises(slices: list[Any]) -> None:
    snapshot = targets_from_slices(slices, SETTINGS)
    for target in snapshot:
        assert isinstance(target.pod_name, str) and target.pod_name
        assert 1 <= target.grpc_port <= 65535 and 1 <= target.quic_port <= 65535


YAML_TOKENS = [
    "!!binary ", "!!int ", "!!float ", "!!timestamp ", "!!set ", "!!omap ", "!!pairs ", "!!str ", "!!map ",
    "!!seq ", "!x ", "? ", ": ", "- ", "[", "]", "{", "}", ", ", "\n", "  ", "\t", "a", "1", "&x ", "*x",
    "---\n", "...\n", "'", '"', "2001-02-30", "kind: List\n", "items:", "<<: ", "%YAML 1.1\n", "\\", "#",
    "|", ">", "\x85", "\ufeff",
]


@settings(deadline=None, max_examples=300)
@given(st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(YAML_TOKENS), max_size=30).map("".join),
    json_values.map(json.dumps),
    json_values.map(lambda v: yaml.safe_dump(v, allow_unicode=True)),
    st.lists(mutated_slices(), max_size=3).map(yaml.safe_dump_all),
))
def test_fuzz_parse_endpoints_document_raises_only_endpoint_slice_error(text: str) -> None:
    try:
        slices = parse_endpoints_document(text)
    except EndpointSliceError:
        return
    assert all(isinstance(s, dict) and all(isinstance(k, str) for k in s) for s in slices)
    targets_from_slices(slices, SETTINGS)
