"""deploy/monitoring: the dashboard and alerts query only series the router exports.

Every PromQL expression (dashboard targets, its template queries, alert rules) is checked
against ``RouterMetrics().render()``: metric names, label names in matchers and ``by``
clauses, and label values in matchers. With ``promtool`` installed (Debian package
``prometheus``), the rules are checked and unit-tested (each alert fires on a synthetic
fault and stays silent on a healthy router), and the dashboard queries are parsed by
promtool as recording rules. The PrometheusRule's ``spec.groups`` is extracted into a
plain rules file for promtool, so deploy/monitoring/prometheus-rules.yaml stays the only
copy of the rules.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from discovery import constants as dc
from router import constants as c
from router.metrics import RouterMetrics
from router.outcomes import GrpcOutcome, QuicOutcome

MONITORING = Path(__file__).resolve().parent.parent / "deploy" / "monitoring"
RULES_FILE = MONITORING / "prometheus-rules.yaml"
DASHBOARD_FILE = MONITORING / "grafana-dashboard.json"

TARGET_LABELS = frozenset({"namespace", "job", "pod", "instance", "service", "endpoint", "container"})
"""Labels Prometheus (via the ServiceMonitor) adds to every scraped series."""

PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
     "bool", "offset", "inf", "nan"}
)
EXPECTED_ALERTS = frozenset(
    {"StargateRouterNoReadyTargets", "StargateRouterDiscoveryStale",
     "StargateRouterRejectionRatioHigh", "StargateRouterRelayErrors"}
)
SCRAPE = {"namespace": "stargate", "job": "stargate-router"}
"""Target labels of the synthetic series fed to ``promtool test rules``."""


# ---------------------------------------------------------------------------
# What the router exports
# ---------------------------------------------------------------------------
@dataclass
class SeriesInfo:
    labels: dict[str, set[str]] = field(default_factory=dict)


def exported_series() -> dict[str, SeriesInfo]:
    """Sample name (``..._total``, ``..._bucket``, gauges as is) -> its labels and values."""
    out: dict[str, SeriesInfo] = {}
    text = RouterMetrics().render().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            info = out.setdefault(sample.name, SeriesInfo())
            for key, value in sample.labels.items():
                info.labels.setdefault(key, set()).add(value)
    return out


EXPORTED = exported_series()


# ---------------------------------------------------------------------------
# A small PromQL reader: enough to find metric names, matchers and grouping labels
# ---------------------------------------------------------------------------
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_SELECTOR = re.compile(r"(?<![\w:$.])([a-zA-Z_:][\w:]*)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*?)\s*,\s*(\w+)\s*\)\s*$", re.S)
_GRAFANA_VAR = re.compile(r"\$\{?(\w+)\}?")


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]


def selectors(expr: str) -> list[Selector]:
    """Vector selectors of ``expr``: metric name plus its label matchers."""
    found: list[Selector] = []
    blanked = _RANGE.sub(" ", _GROUPING.sub(" ", expr))
    # Blank strings outside braces only; strings inside braces are matcher values.
    pos = 0
    while (m := _SELECTOR.search(blanked, pos)) is not None:
        pos = m.end()
        name, braces = m.group(1), m.group(2)
        following = blanked[m.end():].lstrip()
        if braces is None and (following.startswith("(") or name in PROMQL_KEYWORDS):
            continue  # a function or aggregation call, or an operator keyword
        found.append(Selector(name, tuple(_MATCHER.findall(braces or ""))))
    return found


def grouping_labels(expr: str) -> set[str]:
    labels: set[str] = set()
    for _, inside in _GROUPING.findall(_STRING.sub('""', expr)):
        labels.update(part.strip() for part in inside.split(",") if part.strip())
    return labels


def regex_alternatives(pattern: str) -> list[str] | None:
    """``a|b|c`` -> its literal words; None for any other regex (not checked)."""
    words = pattern.split("|")
    return words if all(re.fullmatch(r"[\w.-]+", w) for w in words) else None


def check_expr(expr: str, where: str) -> list[str]:
    """Problems with one PromQL expression; empty when it only uses exported series."""
    problems: list[str] = []
    sels = selectors(expr)
    if not sels:
        problems.append(f"{where}: no metric selector in {expr!r}")
    known_labels = set(TARGET_LABELS) | {"le"}
    for sel in sels:
        info = EXPORTED.get(sel.metric)
        if info is None:
            problems.append(f"{where}: {sel.metric!r} is not a series the router exports")
            continue
        known_labels.update(info.labels)
        for label, op, value in sel.matchers:
            if label in TARGET_LABELS or label == "__name__":
                continue
            if label not in info.labels:
                problems.append(f"{where}: {sel.metric} has no label {label!r}")
                continue
            if "$" in value:
                continue  # a Grafana variable
            values = [value] if op in ("=", "!=") else regex_alternatives(value)
            for v in values or []:
                if v not in info.labels[label]:
                    problems.append(f"{where}: {sel.metric}{{{label}}} never has the value {v!r}")
    for label in grouping_labels(expr) - known_labels:
        problems.append(f"{where}: groups by {label!r}, which none of its series has")
    return problems


# ---------------------------------------------------------------------------
# The files under test
# ---------------------------------------------------------------------------
def prometheus_rule() -> dict[str, Any]:
    [doc] = [d for d in yaml.safe_load_all(RULES_FILE.read_text()) if d]
    return doc  # type: ignore[no-any-return]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in prometheus_rule()["spec"]["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_FILE.read_text())  # type: ignore[no-any-return]


def dashboard_panels(panels: list[dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
    for panel in dashboard()["panels"] if panels is None else panels:
        yield panel
        yield from dashboard_panels(panel.get("panels", []))


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and template query of the dashboard."""
    out = [
        (f"panel {p['title']!r} target {t.get('refId')}", t["expr"])
        for p in dashboard_panels()
        for t in p.get("targets", [])
    ]
    for var in dashboard().get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = _LABEL_VALUES.match(query)
        assert m, f"template variable {var['name']}: only label_values(...) queries are checked"
        out.append((f"template variable {var['name']!r}", m.group(1)))
    return out


def as_plain_promql(expr: str) -> str:
    """Grafana's variables replaced so promtool can parse the expression."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return _GRAFANA_VAR.sub("stargate", expr)


# ---------------------------------------------------------------------------
# Tests: the reader itself
# ---------------------------------------------------------------------------
def test_reader_finds_metrics_matchers_and_grouping() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le, protocol) (rate(a_bucket{x="1", y=~"p|q"}[5m])))'
        " / on (job) b and ignoring (z) c{w!=\"$v\"} offset 5m"
    )
    assert selectors(expr) == [
        Selector("a_bucket", (("x", "=", "1"), ("y", "=~", "p|q"))),
        Selector("b", ()),
        Selector("c", (("w", "!=", "$v"),)),
    ]
    assert grouping_labels(expr) == {"le", "protocol", "job", "z"}


def test_checker_reports_unknown_metric_label_and_value() -> None:
    counter = f"{c.GRPC_CONNECTIONS_TOTAL}_total"
    assert check_expr(f'sum(rate({counter}{{outcome="accepted"}}[5m]))', "ok") == []
    assert check_expr(f"rate({c.GRPC_CONNECTIONS_TOTAL}[5m])", "x")  # counter without _total
    assert check_expr(f'rate({counter}{{colour="red"}}[5m])', "x")
    assert check_expr(f'rate({counter}{{outcome=~"accepted|acepted"}}[5m])', "x")
    assert check_expr(f"sum by (colour) (rate({counter}[5m]))", "x")


# ---------------------------------------------------------------------------
# Tests: metric names and labels
# ---------------------------------------------------------------------------
def test_every_alert_expression_uses_only_exported_series() -> None:
    problems = [p for r in alert_rules() for p in check_expr(r["expr"], f"alert {r['alert']}")]
    assert problems == []


def test_every_dashboard_query_uses_only_exported_series() -> None:
    exprs = dashboard_exprs()
    assert len(exprs) > 10
    problems = [p for where, expr in exprs for p in check_expr(expr, where)]
    assert problems == []


def test_dashboard_covers_every_family_the_router_exports() -> None:
    # the router's own families (process_* from prometheus-client's collector are optional extras)
    families = {f.name for f in RouterMetrics().registry.collect() if f.name.startswith(c.METRIC_PREFIX)}
    used = {sel.metric for _, expr in dashboard_exprs() for sel in selectors(expr)}
    used_families = {
        family for family in families
        if any(name == family or name.startswith(family + "_") for name in used)
    }
    assert families - used_families == set()


def test_dashboard_shows_rates_and_quantiles_the_brief_asks_for() -> None:
    exprs = [expr for _, expr in dashboard_exprs()]

    def uses(fragment: str) -> bool:
        return any(fragment in e for e in exprs)

    for counter in (c.GRPC_CONNECTIONS_TOTAL, c.QUIC_CONNECTIONS_TOTAL, c.RELAYED_BYTES_TOTAL):
        assert uses(f"rate({counter}_total"), f"{counter} must be shown as a rate"
        assert not any(re.search(rf"(?<!rate\(){counter}_total", e) for e in exprs), counter
    for histogram in (c.DIAL_LATENCY_SECONDS, c.DECISION_LATENCY_SECONDS):
        for q in ("0.5", "0.9", "0.99"):
            assert any(e.startswith(f"histogram_quantile({q},") and histogram in e for e in exprs)
    assert uses("sum by (protocol, outcome) (rate(" + c.GRPC_CONNECTIONS_TOTAL)
    for gauge in (c.ACTIVE_CONNECTIONS, c.READY_TARGETS, c.DISCOVERY_LAST_SYNC_AGE_SECONDS):
        assert uses(gauge)


def test_dashboard_panels_use_the_datasource_variable_and_unique_ids() -> None:
    panels = list(dashboard_panels())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["targets"], p["title"]


def test_alerts_are_the_four_expected_with_for_severity_summary_description() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} == EXPECTED_ALERTS
    for rule in rules:
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]


def test_discovery_stale_threshold_outlasts_a_quiet_watch() -> None:
    [rule] = [r for r in alert_rules() if r["alert"] == "StargateRouterDiscoveryStale"]
    [threshold] = [float(x) for x in re.findall(r">\s*([\d.]+)", rule["expr"])]
    assert threshold > dc.WATCH_TIMEOUT_S


def test_rejection_alert_counts_every_rejection_outcome() -> None:
    """Outcomes excluded from 'rejected' are exactly accepted + the post-accept ones."""
    [rule] = [r for r in alert_rules() if r["alert"] == "StargateRouterRejectionRatioHigh"]
    excluded = {
        tuple(sorted(regex_alternatives(value) or []))
        for sel in selectors(rule["expr"])
        for label, op, value in sel.matchers
        if label == "outcome" and op == "!~"
    }
    not_decisions = {"completed", "relay_error"}
    assert not_decisions <= set(GrpcOutcome) and not_decisions <= set(QuicOutcome)
    assert excluded == {tuple(sorted(not_decisions | {"accepted"})), tuple(sorted(not_decisions))}


# ---------------------------------------------------------------------------
# Tests: promtool
# ---------------------------------------------------------------------------
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`)"
)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


def _write_groups(path: Path, groups: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


@needs_promtool
def test_promtool_check_rules_accepts_the_prometheus_rule(tmp_path: Path) -> None:
    rules = _write_groups(tmp_path / "rules.yaml", prometheus_rule()["spec"]["groups"])
    result = _promtool("check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    records = [
        {"record": f"dashboard:query_{i}", "expr": as_plain_promql(expr)}
        for i, (_, expr) in enumerate(dashboard_exprs())
    ]
    rules = _write_groups(tmp_path / "dashboard.yaml", [{"name": "dashboard", "rules": records}])
    result = _promtool("check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr


def _series(metric: str, values: str, **labels: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in {**SCRAPE, "pod": "stargate-router-0", **labels}.items())
    return {"series": f"{metric}{{{body}}}", "values": values}


def _alert(name: str, eval_time: str, fires: bool) -> dict[str, Any]:
    [rule] = [r for r in alert_rules() if r["alert"] == name]
    expected: list[dict[str, Any]] = []
    if fires:
        labels = {**SCRAPE, **rule["labels"]}
        if "pod" in grouping_labels(rule["expr"]):
            labels["pod"] = "stargate-router-0"
        expected = [{"exp_labels": labels}]
    return {"eval_time": eval_time, "alertname": name, "exp_alerts": expected}


GRPC = f"{c.GRPC_CONNECTIONS_TOTAL}_total"
QUIC = f"{c.QUIC_CONNECTIONS_TOTAL}_total"


def _healthy(accepted_per_min: int = 60) -> list[dict[str, str]]:
    """A router with 3 ready pods, fresh discovery and only accepted traffic."""
    return [
        _series(c.READY_TARGETS, "3x60"),
        _series(c.DISCOVERY_LAST_SYNC_AGE_SECONDS, "5x60"),
        _series(GRPC, f"0+{accepted_per_min}x60", protocol="h2c", outcome="accepted"),
        _series(GRPC, "0x60", protocol="h2c", outcome="unknown_authority"),
        _series(GRPC, "0x60", protocol="h2c", outcome="relay_error"),
        _series(QUIC, f"0+{accepted_per_min}x60", outcome="accepted"),
        _series(QUIC, "0x60", outcome="unknown_sni"),
        _series(QUIC, "0x60", outcome="relay_error"),
    ]


def _replace(series: list[dict[str, str]], new: dict[str, str]) -> list[dict[str, str]]:
    return [s for s in series if s["series"] != new["series"]] + [new]


def _rule_tests() -> list[dict[str, Any]]:
    all_quiet = [_alert(name, "45m", fires=False) for name in sorted(EXPECTED_ALERTS)]
    return [
        {"interval": "1m", "input_series": _healthy(), "alert_rule_test": all_quiet},
        {
            "interval": "1m",
            "input_series": _replace(_healthy(), _series(c.READY_TARGETS, "0x60")),
            "alert_rule_test": [
                _alert("StargateRouterNoReadyTargets", "3m", fires=False),
                _alert("StargateRouterNoReadyTargets", "10m", fires=True),
            ],
        },
        {
            "interval": "1m",
            "input_series": _replace(_healthy(), _series(c.DISCOVERY_LAST_SYNC_AGE_SECONDS, "0+60x60")),
            "alert_rule_test": [
                _alert("StargateRouterDiscoveryStale", "15m", fires=False),  # 900 s, not yet 10m over
                _alert("StargateRouterDiscoveryStale", "25m", fires=True),
            ],
        },
        {
            "interval": "1m",
            "input_series": _replace(_healthy(), _series(c.DISCOVERY_LAST_SYNC_AGE_SECONDS, "-1x60")),
            "alert_rule_test": [_alert("StargateRouterDiscoveryStale", "15m", fires=True)],
        },
        {
            "interval": "1m",
            "input_series": _replace(
                _healthy(), _series(GRPC, "0+90x60", protocol="h2c", outcome="unknown_authority")
            ),  # 90 rejected of 90 + 60 + 60 decisions a minute: 43 %
            "alert_rule_test": [
                _alert("StargateRouterRejectionRatioHigh", "30m", fires=True),
                _alert("StargateRouterRelayErrors", "30m", fires=False),
            ],
        },
        {
            "interval": "1m",
            "input_series": _replace(_healthy(), _series(QUIC, "0+6x60", outcome="relay_error")),
            "alert_rule_test": [
                _alert("StargateRouterRelayErrors", "30m", fires=True),
                _alert("StargateRouterRejectionRatioHigh", "30m", fires=False),
            ],
        },
    ]


@needs_promtool
def test_promtool_unit_tests_each_alert_fires_on_its_fault_only(tmp_path: Path) -> None:
    groups = prometheus_rule()["spec"]["groups"]
    # Annotation templates are checked by `promtool check rules`; here only labels matter.
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    _write_groups(tmp_path / "rules.yaml", groups)
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": _rule_tests()}
    test_file = tmp_path / "rules_test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = _promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
