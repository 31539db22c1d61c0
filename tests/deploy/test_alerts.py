"""The router's alerts: what each watches, its runbook, and promtool making each fire and stay quiet.

Every alert has a severity, a summary, a description and a ``runbook_url`` to its own section of
docs/operating.md. Thresholds tied to the router are read from its code (the pending-flow bound, the
watch timeout, the outcome enums), the scrape job and container from deploy/. ``promtool test
rules`` (Debian's ``prometheus``) runs each alert on synthetic series: it fires on its fault
(the router-down alert both on ``up == 0`` and on absent series) and stays quiet on data near it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from discovery import constants as dc
from router import constants as c
from router.outcomes import GrpcOutcome, QuicOutcome
from tests.support import alert_series as a
from tests.support.kustomize import DEPLOY, settings
from tests.support.markdown import github_anchor, headings
from tests.support.promql import (
    alert_rules,
    prometheus_rule,
    regex_alternatives,
    run_promtool,
    selectors,
    write_rule_groups,
)

RUNBOOKS = DEPLOY.parent / "docs" / "operating.md"
"""The page the alerts' runbook links lead to (settings.yaml ``runbookBaseURL``)."""
EXPECTED_ALERTS = frozenset({
    "StargateRouterDown", "StargateRouterNoReadyTargets", "StargateRouterDiscoveryStale",
    "StargateRouterRejectionRatioHigh", "StargateRouterRelayErrors", "StargateRouterQuicPendingFlowsNearBound",
    "StargateRouterFileDescriptorsNearLimit", "StargateRouterMemoryNearLimit",
})
PROCESS_SERIES = ("up", "process_open_fds", "process_max_fds", "process_resident_memory_bytes")
"""Series every scrape target has: alerts on them must select the router's job."""


def rule(name: str) -> dict[str, Any]:
    [found] = [r for r in alert_rules() if r["alert"] == name]
    return found


def test_alerts_are_the_expected_with_for_severity_summary_description_runbook() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} == EXPECTED_ALERTS
    for r in rules:
        assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]
        assert r["labels"]["severity"] in ("critical", "warning"), r["alert"]
        assert r["annotations"]["summary"].strip(), r["alert"]
        assert r["annotations"]["description"].strip(), r["alert"]
        assert r["annotations"]["runbook_url"] == f"{settings()['runbookBaseURL']}#{r['alert'].lower()}"


def test_every_runbook_url_names_a_section_of_its_alert_in_the_runbooks() -> None:
    assert settings()["runbookBaseURL"].endswith("/docs/operating.md")
    anchors = {github_anchor(h): h for h in headings(RUNBOOKS.read_text())}
    for r in alert_rules():
        fragment = r["annotations"]["runbook_url"].partition("#")[2]
        assert anchors.get(fragment) == r["alert"], f"docs/operating.md has no section `### {r['alert']}`"


def test_discovery_stale_threshold_outlasts_a_quiet_watch() -> None:
    [threshold] = [float(x) for x in re.findall(r">\s*([\d.]+)", rule("StargateRouterDiscoveryStale")["expr"])]
    assert threshold > dc.WATCH_TIMEOUT_S


def test_rejection_alert_counts_every_rejection_outcome() -> None:
    """Outcomes excluded from 'rejected' are exactly accepted + the post-accept ones."""
    excluded = {
        tuple(sorted(regex_alternatives(value) or []))
        for sel in selectors(rule("StargateRouterRejectionRatioHigh")["expr"])
        for label, op, value in sel.matchers
        if label == "outcome" and op == "!~"
    }
    not_decisions = {"completed", "relay_error"}
    assert not_decisions <= set(GrpcOutcome) and not_decisions <= set(QuicOutcome)
    assert excluded == {tuple(sorted(not_decisions | {"accepted"})), tuple(sorted(not_decisions))}


def test_pending_flows_alert_bound_is_the_routers_own() -> None:
    [(ratio, bound)] = re.findall(r">\s*([\d.]+)\s*\*\s*(\d+)", rule("StargateRouterQuicPendingFlowsNearBound")["expr"])
    assert int(bound) == c.QUIC_MAX_PENDING_FLOWS
    assert 0.5 <= float(ratio) < 1


def test_alerts_on_every_targets_series_select_the_routers_job() -> None:
    service = yaml.safe_load((DEPLOY / "service.yaml").read_text())
    monitor = yaml.safe_load((DEPLOY / "components" / "monitoring" / "servicemonitor.yaml").read_text())
    assert "jobLabel" not in monitor["spec"], "Prometheus then names the job after the Service"
    for r in alert_rules():
        for sel in selectors(r["expr"]):
            if sel.metric in PROCESS_SERIES:
                assert ("job", "=", service["metadata"]["name"]) in sel.matchers, f"{r['alert']}: {sel.metric}"


def test_memory_alert_reads_the_limit_of_the_routers_container() -> None:
    deployment = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    [limit] = [s for s in selectors(rule("StargateRouterMemoryNearLimit")["expr"])
               if s.metric == "kube_pod_container_resource_limits"]
    assert set(limit.matchers) == {("resource", "=", "memory"), ("container", "=", container["name"])}
    assert container["name"] == a.CONTAINER
    assert container["resources"]["limits"]["memory"] == "512Mi" and a.MEMORY_LIMIT_BYTES == 512 * 1024 * 1024


# ---------------------------------------------------------------------------
# promtool test rules
# ---------------------------------------------------------------------------
MIB = 1024 * 1024


def one_fault(fault: list[dict[str, str]], *checks: dict[str, Any]) -> dict[str, Any]:
    return {"interval": "1m", "input_series": fault, "alert_rule_test": list(checks)}


def rule_tests() -> list[dict[str, Any]]:
    healthy, down = a.healthy(), "StargateRouterDown"
    return [
        one_fault(healthy, *[a.alert(name, "45m", fires=False) for name in sorted(EXPECTED_ALERTS)]),
        # The router's targets: all down, all gone, or one of two down.
        one_fault(a.replace(healthy, a.series("up", "0x60")),
                  a.alert(down, "3m", fires=False), a.alert(down, "10m", fires=True)),
        one_fault(a.without(healthy, "up"),
                  a.alert(down, "3m", fires=False),
                  a.alert(down, "10m", fires=True, labels={"job": a.SCRAPE["job"]})),
        one_fault([*a.replace(healthy, a.series("up", "0x60")), a.series("up", "1x60", pod="stargate-router-1")],
                  a.alert(down, "30m", fires=False)),
        one_fault(a.replace(healthy, a.series(c.READY_TARGETS, "0x60")),
                  a.alert("StargateRouterNoReadyTargets", "3m", fires=False),
                  a.alert("StargateRouterNoReadyTargets", "10m", fires=True)),
        one_fault(a.replace(healthy, a.series(c.DISCOVERY_LAST_SYNC_AGE_SECONDS, "0+60x60")),
                  a.alert("StargateRouterDiscoveryStale", "15m", fires=False),  # 900 s, not yet 10m over
                  a.alert("StargateRouterDiscoveryStale", "25m", fires=True)),
        one_fault(a.replace(healthy, a.series(c.DISCOVERY_LAST_SYNC_AGE_SECONDS, "-1x60")),
                  a.alert("StargateRouterDiscoveryStale", "15m", fires=True)),
        # 90 rejected of 90 + 60 + 60 decisions a minute: 43 %.
        one_fault(a.replace(healthy, a.series(a.GRPC, "0+90x60", protocol="h2c", outcome="unknown_authority")),
                  a.alert("StargateRouterRejectionRatioHigh", "30m", fires=True),
                  a.alert("StargateRouterRelayErrors", "30m", fires=False)),
        one_fault(a.replace(healthy, a.series(a.QUIC, "0+6x60", outcome="relay_error")),
                  a.alert("StargateRouterRelayErrors", "30m", fires=True),
                  a.alert("StargateRouterRejectionRatioHigh", "30m", fires=False)),
        # Saturation: just over the threshold fires, just under stays quiet.
        one_fault(a.replace(healthy, a.series(c.PENDING_FLOWS, "3500x60")),
                  a.alert("StargateRouterQuicPendingFlowsNearBound", "3m", fires=False),
                  a.alert("StargateRouterQuicPendingFlowsNearBound", "10m", fires=True)),
        one_fault(a.replace(healthy, a.series(c.PENDING_FLOWS, "3000x60")),
                  a.alert("StargateRouterQuicPendingFlowsNearBound", "30m", fires=False)),
        one_fault(a.replace(healthy, a.series("process_open_fds", "900x60"), a.series("process_max_fds", "1000x60")),
                  a.alert("StargateRouterFileDescriptorsNearLimit", "3m", fires=False),
                  a.alert("StargateRouterFileDescriptorsNearLimit", "10m", fires=True)),
        one_fault(a.replace(healthy, a.series("process_open_fds", "700x60"), a.series("process_max_fds", "1000x60")),
                  a.alert("StargateRouterFileDescriptorsNearLimit", "30m", fires=False)),
        one_fault(a.replace(healthy, a.series("process_resident_memory_bytes", f"{500 * MIB}x60")),
                  a.alert("StargateRouterMemoryNearLimit", "3m", fires=False),
                  a.alert("StargateRouterMemoryNearLimit", "10m", fires=True)),
        one_fault(a.replace(healthy, a.series("process_resident_memory_bytes", f"{400 * MIB}x60")),
                  a.alert("StargateRouterMemoryNearLimit", "30m", fires=False)),
    ]


def test_every_alert_has_a_test_that_fires_it_and_one_near_its_fault_that_keeps_it_quiet() -> None:
    tests = rule_tests()
    faults = tests[1:]  # tests[0] is the healthy router, where all stay quiet
    fired = {t["alertname"] for case in faults for t in case["alert_rule_test"] if t["exp_alerts"]}
    quiet = {t["alertname"] for case in faults for t in case["alert_rule_test"] if not t["exp_alerts"]}
    assert fired == quiet == EXPECTED_ALERTS


def test_promtool_unit_tests_each_alert_fires_on_its_fault_only(tmp_path: Path) -> None:
    groups = prometheus_rule()["spec"]["groups"]
    # Annotation templates are checked by `promtool check rules`; here only labels matter.
    for group in groups:
        for r in group["rules"]:
            r.pop("annotations", None)
    write_rule_groups(tmp_path / "rules.yaml", groups)
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": rule_tests()}
    test_file = tmp_path / "rules_test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = run_promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
