"""SliceStore: the Rust router's event semantics over the pure snapshot function."""

from __future__ import annotations

import pytest

from discovery.endpoint_slices import EndpointSliceError
from discovery.settings import DiscoverySettings
from discovery.slice_store import SliceStore
from discovery.targets import EMPTY_SNAPSHOT, Target
from tests.support.fake_kube_api import make_endpoint, make_slice

SETTINGS = DiscoverySettings("stargate", "stargate-headless", "grpc", "quic")


def test_empty_store_has_empty_snapshot() -> None:
    assert SliceStore(SETTINGS).snapshot() == EMPTY_SNAPSHOT


def test_applied_slice_becomes_most_recently_observed_and_wins() -> None:
    store = SliceStore(SETTINGS)
    store.apply(make_slice("a", [make_endpoint("p", "10.0.0.1")]))
    store.apply(make_slice("b", [make_endpoint("p", "10.0.0.2")]))
    assert store.snapshot().get("p") == Target("p", "10.0.0.2", 50051, 50052)
    store.apply(make_slice("a", [make_endpoint("p", "10.0.0.3")]))  # MODIFIED: now the newest
    assert store.snapshot().get("p") == Target("p", "10.0.0.3", 50051, 50052)


def test_modified_slice_replaces_its_previous_version() -> None:
    store = SliceStore(SETTINGS)
    store.apply(make_slice("a", [make_endpoint("p0", "10.0.0.1"), make_endpoint("p1", "10.0.0.2")]))
    store.apply(make_slice("a", [make_endpoint("p1", "10.0.0.2")]))
    assert [t.pod_name for t in store.snapshot()] == ["p1"]


def test_delete_removes_the_slice_and_its_pods() -> None:
    store = SliceStore(SETTINGS)
    store.apply(make_slice("a", [make_endpoint("p0", "10.0.0.1")]))
    store.apply(make_slice("b", [make_endpoint("p1", "10.0.0.2")]))
    store.delete(make_slice("a", []))
    assert [t.pod_name for t in store.snapshot()] == ["p1"]


def test_deleting_an_unknown_slice_changes_nothing() -> None:
    store = SliceStore(SETTINGS)
    store.apply(make_slice("a", [make_endpoint("p0", "10.0.0.1")]))
    before = store.snapshot()
    store.delete(make_slice("never-seen", []))
    assert store.snapshot() is before
    assert len(store) == 1


def test_replace_all_swaps_the_whole_set() -> None:
    store = SliceStore(SETTINGS)
    store.apply(make_slice("a", [make_endpoint("old", "10.0.0.1")]))
    store.replace_all([make_slice("b", [make_endpoint("new", "10.0.0.2")])])
    assert [t.pod_name for t in store.snapshot()] == ["new"]
    assert len(store) == 1


def test_replace_all_keeps_list_order_and_a_repeated_name_counts_as_observed_again() -> None:
    store = SliceStore(SETTINGS)
    store.replace_all([
        make_slice("a", [make_endpoint("p", "10.0.0.1")]),
        make_slice("b", [make_endpoint("p", "10.0.0.2")]),
        make_slice("a", [make_endpoint("p", "10.0.0.3")]),
    ])
    assert store.snapshot().get("p") == Target("p", "10.0.0.3", 50051, 50052)


def test_replace_all_with_a_nameless_slice_leaves_the_store_untouched() -> None:
    store = SliceStore(SETTINGS)
    store.apply(make_slice("a", [make_endpoint("p", "10.0.0.1")]))
    nameless = make_slice("x", [make_endpoint("q", "10.0.0.2")])
    del nameless["metadata"]["name"]
    with pytest.raises(EndpointSliceError):
        store.replace_all([make_slice("b", []), nameless])
    assert [t.pod_name for t in store.snapshot()] == ["p"]


def test_events_without_a_name_raise_endpoint_slice_error() -> None:
    store = SliceStore(SETTINGS)
    with pytest.raises(EndpointSliceError):
        store.apply({"metadata": {}})
    with pytest.raises(EndpointSliceError):
        store.delete({})
