"""Synthetic series and expected alerts for ``promtool test rules`` of the router's alerts.

A healthy router is one scrape target (pod ``stargate-router-0`` of job ``stargate-router`` in
namespace ``stargate``) with 3 ready pods, fresh discovery, only accepted traffic, no pending QUIC
flows, few fds and little memory against kube-state-metrics' limit for its container. A test
replaces one series of it with a fault and names the alerts that must and must not fire.
"""

from __future__ import annotations

from typing import Any

from router import constants as c
from tests.support.promql import alert_rules, grouping_labels

SCRAPE = {"namespace": "stargate", "job": "stargate-router"}
"""Target labels of the synthetic series (the ServiceMonitor's job is the Service's name)."""

POD = "stargate-router-0"
CONTAINER = "router"
"""The router's container name in deploy/deployment.yaml (kube-state-metrics labels limits with it)."""

MEMORY_LIMIT_BYTES = 512 * 1024 * 1024
"""deploy/deployment.yaml's memory limit (512Mi)."""

GRPC = f"{c.GRPC_CONNECTIONS_TOTAL}_total"
QUIC = f"{c.QUIC_CONNECTIONS_TOTAL}_total"


def series(metric: str, values: str, **labels: str) -> dict[str, str]:
    """One input series of the router's target (``labels`` added or overriding)."""
    body = ",".join(f'{k}="{v}"' for k, v in {**SCRAPE, "pod": POD, **labels}.items())
    return {"series": f"{metric}{{{body}}}", "values": values}


def memory_limit(values: str) -> dict[str, str]:
    """kube-state-metrics' memory limit of the router's container (its own job, the pod's labels)."""
    return series("kube_pod_container_resource_limits", values, job="kube-state-metrics",
                  container=CONTAINER, resource="memory", unit="byte")


def alert(name: str, eval_time: str, fires: bool, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """An ``alert_rule_test`` entry; when it fires, its labels are the target's unless given."""
    [rule] = [r for r in alert_rules() if r["alert"] == name]
    expected: list[dict[str, Any]] = []
    if fires:
        if labels is None:
            labels = dict(SCRAPE)
            if "pod" in grouping_labels(rule["expr"]):
                labels["pod"] = POD
        expected = [{"exp_labels": {**labels, **rule["labels"]}}]
    return {"eval_time": eval_time, "alertname": name, "exp_alerts": expected}


def healthy(accepted_per_min: int = 60) -> list[dict[str, str]]:
    """A router every alert leaves alone."""
    return [
        series("up", "1x60"),
        series(c.READY_TARGETS, "3x60"),
        series(c.DISCOVERY_LAST_SYNC_AGE_SECONDS, "5x60"),
        series(GRPC, f"0+{accepted_per_min}x60", protocol="h2c", outcome="accepted"),
        series(GRPC, "0x60", protocol="h2c", outcome="unknown_authority"),
        series(GRPC, "0x60", protocol="h2c", outcome="relay_error"),
        series(QUIC, f"0+{accepted_per_min}x60", outcome="accepted"),
        series(QUIC, "0x60", outcome="unknown_sni"),
        series(QUIC, "0x60", outcome="relay_error"),
        series(c.PENDING_FLOWS, "0x60"),
        series("process_open_fds", "40x60"),
        series("process_max_fds", "1048576x60"),
        series("process_resident_memory_bytes", f"{100 * 1024 * 1024}x60"),
        memory_limit(f"{MEMORY_LIMIT_BYTES}x60"),
    ]


def replace(base: list[dict[str, str]], *new: dict[str, str]) -> list[dict[str, str]]:
    """``base`` with each series of ``new`` in place of the one with its name and labels."""
    names = {s["series"] for s in new}
    return [s for s in base if s["series"] not in names] + list(new)


def without(base: list[dict[str, str]], metric: str) -> list[dict[str, str]]:
    return [s for s in base if not s["series"].startswith(metric + "{")]
