"""The live view on its own: newest first, bounded, current byte counts, limits, the targets
answer, and the supervisor's merges of its workers' answers."""

from __future__ import annotations

import pytest

from discovery.targets import Target
from router.access_record import AccessRecord
from router.live_view import (
    LIMIT_DEFAULT,
    LIMIT_MAX,
    LIMIT_MAX_DIGITS,
    LimitError,
    LiveConnections,
    is_connections_view,
    is_targets_view,
    merge_connections,
    merge_targets,
    parse_limit,
    targets_view,
)


def test_connections_are_listed_newest_first_with_their_current_bytes() -> None:
    live = LiveConnections()
    old = AccessRecord("h2c", "127.0.0.1:1", started=1.0, hostname="a", pod="sg-0")
    pending = AccessRecord("quic", "127.0.0.1:2", started=2.0, hostname=None, pod=None)
    live.add(old)
    live.add(pending)
    counts = [10, 20]
    old.probe = lambda: (counts[0], counts[1], 3.0)
    view = live.view(limit=100, now=5.0)
    assert view["total"] == 2
    assert [e["client"] for e in view["connections"]] == ["127.0.0.1:2", "127.0.0.1:1"]
    first, second = view["connections"]
    assert first["pod"] is None and first["protocol"] == "quic"
    assert second == {
        "protocol": "h2c", "client": "127.0.0.1:1", "hostname": "a", "pod": "sg-0", "age_s": 4.0,
        "idle_s": 2.0, "bytes_client_to_pod": 10, "bytes_pod_to_client": 20,
    }
    counts[:] = [1000, 2000]  # the relay moved more: the next view shows it
    assert live.view(limit=100, now=5.0)["connections"][1]["bytes_pod_to_client"] == 2000
    assert len(live.view(limit=1, now=5.0)["connections"]) == 1
    live.discard(pending)
    assert live.total == 1 and live.records() == (old,)


def test_past_its_bound_the_view_counts_without_listing() -> None:
    live = LiveConnections(max_entries=2)
    records = [AccessRecord("tls", f"127.0.0.1:{i}", started=float(i)) for i in range(5)]
    for record in records:
        live.add(record)
    assert live.total == 5 and len(live.records()) == 2
    for record in records:
        live.discard(record)
    assert live.total == 0 and live.records() == ()


@pytest.mark.parametrize(("query", "limit"), [("", 100), ("limit=5", 5), ("x=1&limit=10000", 10_000)])
def test_limit_defaults_to_100_and_accepts_up_to_10000(query: str, limit: int) -> None:
    assert parse_limit(query) == limit
    assert (LIMIT_DEFAULT, LIMIT_MAX, LIMIT_MAX_DIGITS) == (100, 10_000, 5)


@pytest.mark.parametrize(
    "query",
    ["limit=0", "limit=10001", "limit=-1", "limit=abc", "limit=", "limit=1e3", "limit=%2B5", "limit=+5",
     "limit=5%20", "limit=%C2%B2", "limit=%E0%A5%A7", "limit=000001", "limit=" + "1" * 4301, "limit=%FF"],
)
def test_a_bad_limit_is_refused(query: str) -> None:
    with pytest.raises(LimitError, match=r"^limit: "):
        parse_limit(query)


def test_targets_are_sorted_by_pod_and_a_missing_port_is_null() -> None:
    view = targets_view(
        [Target("sg-1", "10.0.0.2", 50051, 0), Target("sg-0", "fd00::1", 50051, 50052)],
        "file", True, 0.25,
    )
    assert view == {
        "source": "file", "ready": True, "last_sync_age_s": 0.25,
        "targets": [
            {"pod": "sg-0", "address": "fd00::1", "grpc_port": 50051, "quic_port": 50052},
            {"pod": "sg-1", "address": "10.0.0.2", "grpc_port": 50051, "quic_port": None},
        ],
    }
    assert targets_view([], "kubernetes", False, None)["last_sync_age_s"] is None


def test_workers_answers_merge_into_one() -> None:
    a = {"total": 3, "connections": [{"client": "a1", "age_s": 1.0}, {"client": "a2", "age_s": 9.0}]}
    b = {"total": 1, "connections": [{"client": "b1", "age_s": 0.5}]}
    merged = merge_connections([a, b], limit=2)
    assert merged == {"total": 4, "connections": [{"client": "b1", "age_s": 0.5}, {"client": "a1", "age_s": 1.0}]}

    t0 = targets_view([Target("sg-0", "10.0.0.1", 1, 2)], "file", True, 0.1)
    t1 = targets_view([Target("sg-0", "10.0.0.1", 1, 2), Target("sg-1", "10.0.0.2", 1, 2)], "file", False, 0.7)
    merged_targets = merge_targets([t0, t1])
    assert merged_targets["ready"] is False
    assert merged_targets["last_sync_age_s"] == 0.7
    assert [t["pod"] for t in merged_targets["targets"]] == ["sg-0", "sg-1"]
    assert merge_targets([t0, targets_view([], "file", False, None)])["last_sync_age_s"] is None


MALFORMED_CONNECTIONS = [
    [], {"total": "3", "connections": []}, {"total": 1, "connections": 5},
    {"total": 1, "connections": [{"age_s": "x"}]}, {"total": 1, "connections": [["age_s", 1]]},
    {"total": 1, "connections": [{"age_s": True}]}, {"connections": []},
]
MALFORMED_TARGETS = [
    [], {"targets": [{"address": "x"}]}, {"targets": [{"pod": 1}]}, {"targets": {}},
    {"targets": [], "last_sync_age_s": "1"}, {"targets": ["sg-0"]},
]


def test_a_worker_answer_the_merge_cannot_read_is_left_out_not_raised_on() -> None:
    good = {"total": 1, "connections": [{"client": "a", "age_s": 1.0}]}
    assert is_connections_view(good) and is_targets_view(targets_view([], "file", True, 0.1))
    assert not any(is_connections_view(bad) for bad in MALFORMED_CONNECTIONS)
    assert not any(is_targets_view(bad) for bad in MALFORMED_TARGETS)
