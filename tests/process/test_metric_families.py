"""The router's lock-free families expose exactly what prometheus_client's own would.

The reference is prometheus_client itself: the same events go to its Counter, Gauge and
Histogram on one registry and to ``router.metric_families`` on another, and the two
expositions must be the same text (the ``_created`` timestamps aside, which differ by the
microseconds between the two creations).
"""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from router import constants as c
from router.metric_families import CounterFamily, GaugeFamily, HistogramFamily
from router.metrics import RouterMetrics
from router.outcomes import QuicOutcome, WebTransportOutcome
from tests.support.markdown import DOCS, table_rows

_CREATED = re.compile(r"^(\S+_created(?:\{[^}]*\})?) \S+$", re.M)


def _text(registry: CollectorRegistry) -> str:
    return _CREATED.sub(r"\1 <created>", generate_latest(registry).decode())


def _registries() -> tuple[CollectorRegistry, CollectorRegistry]:
    return CollectorRegistry(auto_describe=True), CollectorRegistry(auto_describe=True)


@pytest.mark.parametrize("name", ["demo_events_total", "demo_events"])
def test_counter_matches_prometheus_client(name: str) -> None:
    ref_reg, ours_reg = _registries()
    ref = Counter(name, "Events.", ["kind", "side"], registry=ref_reg)
    ours = CounterFamily(name, "Events.", ["kind", "side"], registry=ours_reg)
    for family in (ref, ours):
        family.labels("a", "x")
        family.labels(kind="b", side="y").inc()
        family.labels("a", "x").inc(2.5)
        family.labels("c", "z").inc(0)
    assert _text(ours_reg) == _text(ref_reg)


def test_unlabelled_gauge_and_function_match_prometheus_client() -> None:
    ref_reg, ours_reg = _registries()
    for reg, gauge in ((ref_reg, Gauge), (ours_reg, GaugeFamily)):
        gauge("demo_level", "Level.", registry=reg).set(-1)
        gauge("demo_read", "Read at scrape.", registry=reg).set_function(lambda: 7)
        labelled = gauge("demo_open", "Open.", ["protocol"], registry=reg)
        labelled.labels("tls").inc()
        labelled.labels("tls").inc(3)
        labelled.labels("quic").dec()
    assert _text(ours_reg) == _text(ref_reg)


_BUCKETS = (0.001, 0.01, 0.1, 1.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=20, allow_nan=False)
                | st.sampled_from([*_BUCKETS, 0.0, math.inf]), max_size=30))
def test_histogram_matches_prometheus_client(observations: list[float]) -> None:
    """Bucket edges included: a value equal to a bound falls in that bound's bucket."""
    ref_reg, ours_reg = _registries()
    ref = Histogram("demo_seconds", "Durations.", ["protocol"], buckets=_BUCKETS, registry=ref_reg)
    ours = HistogramFamily("demo_seconds", "Durations.", ["protocol"], buckets=_BUCKETS, registry=ours_reg)
    for family in (ref, ours):
        family.labels("idle")
        for i, value in enumerate(observations):
            family.labels("tls" if i % 2 else "quic").observe(value)
    assert _text(ours_reg) == _text(ref_reg)


def test_router_metrics_expose_the_families_prometheus_client_did() -> None:
    """Every family, name, type, help text and zero series of the router, against the same
    declarations made with prometheus_client's classes."""
    ours = RouterMetrics(version="9.9.9")
    ref_reg = CollectorRegistry(auto_describe=True)
    ref_families = {}
    for family in vars(ours).values():
        if isinstance(family, (CounterFamily, GaugeFamily, HistogramFamily)):
            kind = {CounterFamily: Counter, GaugeFamily: Gauge, HistogramFamily: Histogram}[type(family)]
            extra = {"buckets": family.bounds} if isinstance(family, HistogramFamily) else {}
            ref_families[family.name] = ref = kind(family.name, family.documentation, family.labelnames,
                                                   registry=ref_reg, **extra)
            for values in family.label_values():  # the zero series it declared
                if values:
                    ref.labels(*values)
    ref_families[c.BUILD_INFO].labels("9.9.9").set(1)
    ref_families[c.DISCOVERY_LAST_SYNC_AGE_SECONDS].set(-1)
    process = ("process_", "# HELP process_", "# TYPE process_")
    ours_text = "\n".join(line for line in _text(ours.registry).splitlines() if not line.startswith(process))
    assert ours_text.strip() == _text(ref_reg).strip()


@pytest.mark.parametrize("webtransport", [False, True], ids=["raw-quic", "webtransport"])
def test_both_quic_families_are_exported_with_every_outcome_at_zero_in_either_tunnel_mode(webtransport: bool) -> None:
    text = generate_latest(RouterMetrics(webtransport=webtransport).registry).decode()
    for outcome in QuicOutcome:
        assert f'{c.QUIC_CONNECTIONS_TOTAL}_total{{outcome="{outcome}"}} 0.0' in text, outcome
    for session_outcome in WebTransportOutcome:
        assert f'{c.WEBTRANSPORT_SESSIONS_TOTAL}_total{{outcome="{session_outcome}"}} 0.0' in text, session_outcome


def test_every_quic_outcome_is_a_webtransport_outcome_of_the_same_name() -> None:
    """So a flow counts alike in either family; the session family adds what only it has."""
    assert {o.value for o in QuicOutcome} <= {o.value for o in WebTransportOutcome}


@pytest.mark.parametrize("webtransport", [False, True], ids=["raw-quic", "webtransport"])
def test_a_quic_flow_counts_in_the_family_its_tunnel_protocol_picks(webtransport: bool) -> None:
    metrics = RouterMetrics(webtransport=webtransport)
    metrics.quic_flow_series(QuicOutcome.ACCEPTED).inc()
    metrics.quic_outcome(QuicOutcome.COMPLETED)
    counted, idle = (
        (metrics.webtransport_sessions, metrics.quic_connections) if webtransport
        else (metrics.quic_connections, metrics.webtransport_sessions)
    )
    counts = {values[0]: counted.labels(*values).value for values in counted.label_values()}
    assert {outcome: n for outcome, n in counts.items() if n} == {"accepted": 1.0, "completed": 1.0}
    assert all(idle.labels(*values).value == 0 for values in idle.label_values())
    if webtransport:
        metrics.quic_outcome(WebTransportOutcome.UPSTREAM_CONNECT_ERROR)
        assert metrics.webtransport_sessions.labels(outcome="upstream_connect_error").value == 1


def test_labels_by_name_must_name_every_label() -> None:
    family = CounterFamily("demo_total", "Events.", ["kind", "side"], registry=CollectorRegistry())
    with pytest.raises(ValueError, match="demo"):
        family.labels(kind="a")
    with pytest.raises(ValueError, match="demo"):
        family.labels("a")
    assert family.labels(side="y", kind="a") is family.labels("a", "y")


SUPERVISOR_FAMILIES = {c.WORKER_RESTARTS_TOTAL: "counter"}
"""Families only the ``--workers`` supervisor exports (``router.supervisor``), label-less."""

FREE_LABELS = frozenset({"version"})
"""Labels whose values are not an enumeration (the build's version): the table lists none."""

PROCESS_ROW = "process_*"
"""prometheus-client's process collector, one row for all its families."""

_KINDS = ((CounterFamily, "counter"), (GaugeFamily, "gauge"), (HistogramFamily, "histogram"))


def exported_families() -> dict[str, tuple[str, dict[str, set[str]]]]:
    """Every family the router exports under its prefix, by exposed name: its type and, per label in
    order, the values its series take (``RouterMetrics`` creates every one from the enums of
    ``router/outcomes.py`` before any traffic)."""
    families: dict[str, tuple[str, dict[str, set[str]]]] = {}
    for family in vars(RouterMetrics()).values():
        kind = next((k for cls, k in _KINDS if isinstance(family, cls)), None)
        if kind is None:
            continue
        values = family.label_values()
        labels = {label: {v[i] for v in values} for i, label in enumerate(family.labelnames)}
        families[family.name + ("_total" if kind == "counter" else "")] = (kind, labels)
    for name, kind in SUPERVISOR_FAMILIES.items():
        families[name + ("_total" if kind == "counter" else "")] = (kind, {})
    return families


def documented_labels(cell: str) -> dict[str, set[str]]:
    """A labels cell (each label in code, then its values in code: ``protocol: h2c, tls; outcome: ...``)
    -> each label's listed values, in order."""
    labels: dict[str, set[str]] = {}
    for part in filter(None, (p.strip() for p in cell.split(";"))):
        name, _, values = part.partition(":")
        assert re.fullmatch(r"`\w+`", name.strip()), part
        labels[name.strip().strip("`")] = set(re.findall(r"`([^`]+)`", values))
    return labels


def test_the_metrics_page_lists_exactly_the_exported_families_types_labels_and_values() -> None:
    """docs/metrics.md's table against the families, both ways: every family the router exports is
    one row and every row a family (its name a metric constant of ``router/constants.py``), with its
    type, its labels in order and, for each label, exactly the values its series take."""
    names = {v for v in vars(c).values() if isinstance(v, str) and v.startswith(f"{c.METRIC_PREFIX}_")}
    exported = exported_families()
    assert {n.removesuffix("_total") for n in exported if exported[n][0] == "counter"} | {
        n for n in exported if exported[n][0] != "counter"} == names
    rows = table_rows((DOCS / "metrics.md").read_text(), "metric")
    listed = [row[0].strip("`") for row in rows]
    assert len(listed) == len(set(listed)), sorted(n for n in listed if listed.count(n) > 1)
    assert set(listed) == set(exported) | {PROCESS_ROW}, (
        sorted(set(exported) - set(listed)), sorted(set(listed) - set(exported) - {PROCESS_ROW}))
    assert b"\nprocess_" in RouterMetrics().render()  # the process collector is registered
    for name, kind, cell, meaning in rows:
        assert meaning, name
        if name == f"`{PROCESS_ROW}`":
            continue
        exported_kind, labels = exported[name.strip("`")]
        assert kind == exported_kind, name
        documented = documented_labels(cell)
        assert list(documented) == list(labels), name
        for label, values in labels.items():
            assert documented[label] == (set() if label in FREE_LABELS else values), (name, label)
