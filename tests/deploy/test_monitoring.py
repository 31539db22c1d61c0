"""deploy/components/monitoring: the dashboard and alerts query only series the router exports.

Every PromQL expression (dashboard targets, its template queries, alert rules) is checked
against ``RouterMetrics().render()`` (tests/support/promql.py): metric names, label names in
matchers and ``by`` clauses, and label values in matchers; the few series of other exporters
the alerts read are declared there. With ``promtool`` (Debian package ``prometheus``), the
rules are checked and the dashboard queries are parsed as recording rules. The PrometheusRule's
``spec.groups`` is extracted into a plain rules file for promtool, so
deploy/components/monitoring/prometheus-rules.yaml stays the only copy of the rules; what each
alert means and when it fires is tests/deploy/test_alerts.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from router import constants as c
from router.metrics import RouterMetrics
from tests.support.promql import (
    RULES_FILE,
    Selector,
    alert_rules,
    check_expr,
    grouping_labels,
    prometheus_rule,
    run_promtool,
    selectors,
    write_rule_groups,
)

DASHBOARD_FILE = RULES_FILE.parent / "grafana-dashboard.json"

_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*?)\s*,\s*(\w+)\s*\)\s*$", re.S)
_GRAFANA_VAR = re.compile(r"\$\{?(\w+)\}?")


# ---------------------------------------------------------------------------
# The files under test
# ---------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------
# Tests: promtool
# ---------------------------------------------------------------------------
def test_promtool_check_rules_accepts_the_prometheus_rule(tmp_path: Path) -> None:
    rules = write_rule_groups(tmp_path / "rules.yaml", prometheus_rule()["spec"]["groups"])
    result = run_promtool("check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    records = [
        {"record": f"dashboard:query_{i}", "expr": as_plain_promql(expr)}
        for i, (_, expr) in enumerate(dashboard_exprs())
    ]
    rules = write_rule_groups(tmp_path / "dashboard.yaml", [{"name": "dashboard", "rules": records}])
    result = run_promtool("check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
