"""A small PromQL reader, what the router exports, and promtool: enough to check dashboards and alerts.

``check_expr`` finds an expression's metric names, label matchers and grouping labels and checks
each against ``RouterMetrics().render()`` (the router's own exposition), plus the few series of
other exporters the alerts read (``EXTERNAL_SERIES``). ``promtool()`` is Debian's (package
``prometheus``): tests that need it skip without it locally and fail under CI, which installs it.
Used by tests/deploy/test_monitoring.py and tests/deploy/test_alerts.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from router.metrics import RouterMetrics
from tests.support.kustomize import running_in_ci

RULES_FILE = Path(__file__).resolve().parents[2] / "deploy" / "components" / "monitoring" / "prometheus-rules.yaml"
"""The PrometheusRule: the only copy of the alert rules."""

PROMTOOL_TIMEOUT_S = 60
"""promtool checks or unit-tests these rules in about a second; this only bounds a hung one."""

TARGET_LABELS = frozenset({"namespace", "job", "pod", "instance", "service", "endpoint", "container"})
"""Labels Prometheus (via the ServiceMonitor) adds to every scraped series."""

PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
     "bool", "offset", "inf", "nan"}
)


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


EXTERNAL_SERIES: dict[str, dict[str, set[str]]] = {
    "up": {},
    "kube_pod_container_resource_limits": {
        "resource": {"cpu", "memory", "ephemeral_storage", "storage"},
        "unit": {"core", "byte", "integer"},
        "node": set(), "uid": set(),
    },
}
"""Series the alerts read that the router does not export -> their own labels and values (besides the
target's). ``up`` is Prometheus' own, per scrape target. kube-state-metrics (which kube-prometheus-stack
installs) exports each container's limits: the router cannot report its container's memory limit."""


def _with_external(exported: dict[str, SeriesInfo]) -> dict[str, SeriesInfo]:
    return {**exported, **{name: SeriesInfo(labels) for name, labels in EXTERNAL_SERIES.items()}}


EXPORTED = _with_external(exported_series())


# ---------------------------------------------------------------------------
# A small PromQL reader: enough to find metric names, matchers and grouping labels
# ---------------------------------------------------------------------------
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_SELECTOR = re.compile(r"(?<![\w:$.])([a-zA-Z_:][\w:]*)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")


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


def prometheus_rule() -> dict[str, Any]:
    [doc] = [d for d in yaml.safe_load_all(RULES_FILE.read_text()) if d]
    return doc  # type: ignore[no-any-return]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in prometheus_rule()["spec"]["groups"] for rule in group["rules"]]


# ---------------------------------------------------------------------------
# promtool
# ---------------------------------------------------------------------------
def promtool() -> str:
    """promtool's path; skips the test without it locally, fails it under CI."""
    path = shutil.which("promtool")
    if path is None:
        if running_in_ci():
            pytest.fail("promtool is not installed: .ci/run must install Debian's prometheus", pytrace=False)
        pytest.skip("promtool not installed (Debian package `prometheus`)")
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S,
                          check=False)


def write_rule_groups(path: Path, groups: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path
