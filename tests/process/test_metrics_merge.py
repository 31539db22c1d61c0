"""``merge_expositions`` on real ``RouterMetrics().render()`` outputs of differently busy workers."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from router import constants as c
from router.metrics import RouterMetrics
from router.metrics_merge import ExpositionError, combine_for, is_cumulative, merge_expositions

Values = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def values(text: str | bytes) -> Values:
    if isinstance(text, bytes):
        text = text.decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(vals: Values, name: str, **labels: str) -> float:
    return vals[(name, tuple(sorted(labels.items())))]


def worker(accepted: int, latencies: tuple[float, ...] = (), active: int = 0, pods: int = 2,
           sync_age: float = 0.5) -> RouterMetrics:
    m = RouterMetrics("1.2.3")
    for _ in range(accepted):
        m.grpc_outcome("h2c", "accepted")
    for seconds in latencies:
        m.decision_latency.labels(protocol="h2c").observe(seconds)
    m.active_connections.labels(protocol="h2c").set(active)
    m.ready_targets.set(pods)
    m.discovery_last_sync_age.set(sync_age)
    return m


ACCEPTED = f"{c.GRPC_CONNECTIONS_TOTAL}_total"
CREATED = f"{c.GRPC_CONNECTIONS_TOTAL}_created"
BUCKET = f"{c.DECISION_LATENCY_SECONDS}_bucket"


def test_one_exposition_merges_to_itself_byte_for_byte() -> None:
    text = worker(3, (0.003,), active=1).render()
    assert merge_expositions([text.decode()]) == text


def test_counters_are_summed_per_label_set() -> None:
    merged = values(merge_expositions([worker(3).render().decode(), worker(5).render().decode()]))
    assert value(merged, ACCEPTED, protocol="h2c", outcome="accepted") == 8
    assert value(merged, ACCEPTED, protocol="tls", outcome="accepted") == 0
    assert value(merged, ACCEPTED, protocol="h2c", outcome="unknown_authority") == 0


def test_histogram_buckets_sum_and_count_are_summed() -> None:
    a = worker(0, (0.003, 0.003)).render().decode()
    b = worker(0, (0.2,)).render().decode()
    merged = values(merge_expositions([a, b]))
    assert value(merged, BUCKET, protocol="h2c", le="0.005") == 2
    assert value(merged, BUCKET, protocol="h2c", le="0.25") == 3
    assert value(merged, BUCKET, protocol="h2c", le="+Inf") == 3
    assert value(merged, f"{c.DECISION_LATENCY_SECONDS}_count", protocol="h2c") == 3
    assert value(merged, f"{c.DECISION_LATENCY_SECONDS}_sum", protocol="h2c") == pytest.approx(0.206)


def test_terminations_and_connection_durations_of_workers_add_up() -> None:
    a, b = worker(0), worker(0)
    a.terminations.labels(protocol="quic", termination="idle_timeout").inc(3)
    b.terminations.labels(protocol="quic", termination="idle_timeout").inc(2)
    a.connection_duration.labels(protocol="h2c").observe(0.05)
    b.connection_duration.labels(protocol="h2c").observe(20.0)
    merged = values(merge_expositions([a.render().decode(), b.render().decode()]))
    assert value(merged, "stargate_k8s_router_terminations_total", protocol="quic", termination="idle_timeout") == 5
    assert value(merged, "stargate_k8s_router_terminations_total", protocol="tls", termination="drain") == 0
    assert value(merged, "stargate_k8s_router_connection_duration_seconds_count", protocol="h2c") == 2
    assert value(merged, "stargate_k8s_router_connection_duration_seconds_bucket", protocol="h2c", le="0.1") == 1


def test_gauges_are_summed_but_per_process_identical_ones_take_the_max() -> None:
    a = worker(0, active=2, pods=3, sync_age=0.2).render().decode()
    b = worker(0, active=5, pods=2, sync_age=0.9).render().decode()
    merged = values(merge_expositions([a, b]))
    assert value(merged, c.ACTIVE_CONNECTIONS, protocol="h2c") == 7
    assert value(merged, c.READY_TARGETS) == 3
    assert value(merged, c.DISCOVERY_LAST_SYNC_AGE_SECONDS) == pytest.approx(0.9)
    assert value(merged, c.BUILD_INFO, version="1.2.3") == 1


def test_process_series_add_up_but_limits_and_start_time_do_not() -> None:
    a, b = worker(0).render().decode(), worker(0).render().decode()
    if "process_max_fds" not in a:
        pytest.skip("RouterMetrics exports no process_* series")
    merged, one = values(merge_expositions([a, b])), values(a)
    assert value(merged, "process_max_fds") == value(one, "process_max_fds")
    assert value(merged, "process_start_time_seconds") == value(one, "process_start_time_seconds")
    assert value(merged, "process_open_fds") == 2 * value(one, "process_open_fds")


def test_created_takes_the_oldest() -> None:
    a, b = worker(1).render().decode(), worker(1).render().decode()
    older = value(values(a), CREATED, protocol="h2c", outcome="accepted")
    newer = value(values(b), CREATED, protocol="h2c", outcome="accepted")
    assert older <= newer
    merged = values(merge_expositions([b, a]))
    assert value(merged, CREATED, protocol="h2c", outcome="accepted") == older


def test_output_keeps_help_and_type_lines_and_reparses() -> None:
    out = merge_expositions([worker(1).render().decode(), worker(2).render().decode()]).decode()
    assert f"# TYPE {ACCEPTED} counter" in out
    assert f"# HELP {ACCEPTED} TCP (gRPC) connections by protocol and outcome." in out
    assert f"# TYPE {c.DECISION_LATENCY_SECONDS} histogram" in out
    families = {f.name: f.type for f in text_string_to_metric_families(out)}
    assert families[c.GRPC_CONNECTIONS_TOTAL] == "counter"
    assert families[c.READY_TARGETS] == "gauge"
    assert merge_expositions([out]).decode() == out


def test_a_label_set_seen_in_one_worker_only_is_kept() -> None:
    a = RouterMetrics("1.2.3")
    a.build_info.labels(version="9.9.9").set(1)
    merged = values(merge_expositions([a.render().decode(), worker(0).render().decode()]))
    assert value(merged, c.BUILD_INFO, version="9.9.9") == 1
    assert value(merged, c.BUILD_INFO, version="1.2.3") == 1


def test_cumulative_only_keeps_counters_histograms_and_created_but_no_gauges() -> None:
    dead = worker(4, (0.003,), active=3).render().decode()
    kept = values(merge_expositions([dead], cumulative_only=True))
    assert value(kept, ACCEPTED, protocol="h2c", outcome="accepted") == 4
    assert value(kept, BUCKET, protocol="h2c", le="+Inf") == 1
    assert (CREATED, (("outcome", "accepted"), ("protocol", "h2c"))) in kept
    names = {name for name, _ in kept}
    assert c.ACTIVE_CONNECTIONS not in names
    assert c.READY_TARGETS not in names


def test_a_restarted_worker_does_not_make_counters_go_down() -> None:
    before = [worker(4).render().decode(), worker(6).render().decode()]
    retired = merge_expositions([before[0]], cumulative_only=True).decode()
    after = [retired, worker(0).render().decode(), worker(7).render().decode()]
    merged = values(merge_expositions(after))
    assert value(merged, ACCEPTED, protocol="h2c", outcome="accepted") == 11
    assert value(merged, c.READY_TARGETS) == 2


def test_supervisor_series_merge_alongside_worker_series() -> None:
    registry = CollectorRegistry()
    Counter(c.WORKER_RESTARTS_TOTAL, "Restarts.", registry=registry).inc(2)
    own = generate_latest(registry).decode()
    merged = values(merge_expositions([own, worker(1).render().decode()]))
    assert value(merged, f"{c.WORKER_RESTARTS_TOTAL}_total") == 2


def test_nothing_merges_to_an_empty_exposition() -> None:
    assert merge_expositions([]) == b""


def test_garbage_raises_exposition_error_naming_the_input() -> None:
    with pytest.raises(ExpositionError, match="exposition 1"):
        merge_expositions([worker(0).render().decode(), "this is { not prometheus\n"])


def test_a_family_with_two_types_raises() -> None:
    gauge = "# TYPE x gauge\nx 1\n"
    counter = "# TYPE x counter\nx 1\n"
    with pytest.raises(ExpositionError, match="x is a counter"):
        merge_expositions([gauge, counter])


@pytest.mark.parametrize(
    ("family", "typ", "sample", "a", "b", "want"),
    [
        (c.GRPC_CONNECTIONS_TOTAL, "counter", ACCEPTED, 2.0, 3.0, 5.0),
        (CREATED, "gauge", CREATED, 2.0, 3.0, 2.0),
        (c.ACTIVE_CONNECTIONS, "gauge", c.ACTIVE_CONNECTIONS, 2.0, 3.0, 5.0),
        (c.READY_TARGETS, "gauge", c.READY_TARGETS, 2.0, 3.0, 3.0),
        (c.BUILD_INFO, "gauge", c.BUILD_INFO, 1.0, 1.0, 1.0),
        ("python_info", "gauge", "python_info", 1.0, 1.0, 1.0),
        ("process_max_fds", "gauge", "process_max_fds", 1024.0, 1024.0, 1024.0),
        ("process_start_time_seconds", "gauge", "process_start_time_seconds", 20.0, 10.0, 10.0),
        ("process_resident_memory_bytes", "gauge", "process_resident_memory_bytes", 2.0, 3.0, 5.0),
        ("process_cpu_seconds", "counter", "process_cpu_seconds_total", 0.5, 0.25, 0.75),
    ],
)
def test_combine_rules(family: str, typ: str, sample: str, a: float, b: float, want: float) -> None:
    assert combine_for(family, typ, sample)(a, b) == want


def test_cumulative_rules() -> None:
    assert is_cumulative(c.GRPC_CONNECTIONS_TOTAL, "counter")
    assert is_cumulative(c.DECISION_LATENCY_SECONDS, "histogram")
    assert is_cumulative(CREATED, "gauge")
    assert not is_cumulative(c.ACTIVE_CONNECTIONS, "gauge")
