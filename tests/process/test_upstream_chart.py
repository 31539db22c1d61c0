"""The Rust router's own Helm chart runs our router unchanged: its command, every arg, its probes.

``tests/support/chart_scenario.py`` runs the chart's backend-router container (our installed
``stargate-k8s-router`` with the chart's args) against the loopback fake Kubernetes API found
through ``KUBECONFIG``, with real grpcio and aioquic pods, inside a fresh network namespace: the
chart binds 0.0.0.0:50071/50072/8080, which must not meet anything on the host. Creating the
namespace needs root; CI runs as root, so there a missing ``unshare`` fails the test loudly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from router.memory_bounds import bounds_for
from tests.support.chart_scenario import PODS, memory_bytes
from tests.support.router_process import suite_workers_args, workers_in
from tests.support.upstream_chart import chart_arg, chart_container

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_TIMEOUT_S = 120


def run_in_network_namespace() -> dict[str, Any]:
    """The scenario's facts; fails (never skips) when root cannot make the namespace."""
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare (util-linux) is needed to run the chart's args unchanged"
    command = [unshare, "--net", "--", "sh", "-c", 'ip link set lo up && exec "$0" -m tests.support.chart_scenario',
               sys.executable]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S, check=False)
    assert proc.returncode == 0, f"chart scenario failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    facts: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return facts


@pytest.fixture(scope="module")
def chart_run() -> dict[str, Any]:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI must run as root: the chart's args need their own network namespace (unshare --net)")
        pytest.skip("needs root for a network namespace (unshare --net) to bind the chart's 0.0.0.0 ports; CI runs it")
    return run_in_network_namespace()


def test_the_chart_runs_our_installed_router_with_its_command_and_args_unchanged(chart_run: dict[str, Any]) -> None:
    chart = chart_container()
    assert chart.command == ["/usr/local/bin/stargate-k8s-router"] == chart_run["command"]
    assert chart_run["args"] == [*chart.args, *suite_workers_args(chart.args)]  # nothing but the suite's workers


def test_sigterm_fails_readiness_at_once_while_liveness_holds(chart_run: dict[str, Any]) -> None:
    assert (chart_run["readiness_after_sigterm"], chart_run["liveness_after_sigterm"]) == (503, 200)


def test_the_charts_readiness_and_liveness_probes_answer_200(chart_run: dict[str, Any]) -> None:
    chart = chart_container()
    assert (chart.readiness.path, chart.liveness.path) == ("/readyz", "/livez")
    assert (chart_run["readiness"], chart_run["liveness"]) == (200, 200)


def test_the_pods_come_from_the_kubernetes_api_found_through_kubeconfig(chart_run: dict[str, Any]) -> None:
    listed = [line for line in chart_run["lines"] if "discovery.kubernetes_source" in line and "(list)" in line]
    assert listed and f"{len(PODS)} ready targets" in listed[0]


def test_h2c_and_quic_calls_named_by_the_charts_template_reach_their_pods(chart_run: dict[str, Any]) -> None:
    assert chart_run["h2c"] == {pod: pod for pod, _address in PODS}
    assert chart_run["quic"] == {pod: pod for pod, _address in PODS}


def test_the_start_output_names_each_flag_without_effect(chart_run: dict[str, Any]) -> None:
    warnings = [line for line in chart_run["lines"] if "no effect at L4" in line]
    assert len(warnings) == 1, chart_run["lines"]
    for flag in ("--tls-cert-path", "--tls-key-path", "--quic-insecure"):
        assert flag in warnings[0]
    assert "TLS and QUIC end at the pod" in warnings[0]


def test_the_start_output_sizes_the_quic_tables_to_the_charts_memory_limit(chart_run: dict[str, Any]) -> None:
    chart = chart_container()
    bounds = bounds_for(memory_bytes(chart.memory_limit), workers_in(chart_run["args"]))  # the limit is shared
    line = next(line for line in chart_run["lines"] if "memory limit:" in line)
    assert f"memory limit: {memory_bytes(chart.memory_limit) // 2**20} MiB" in line
    assert f"QUIC pending flows <= {bounds.max_pending_flows}, QUIC flows <= {bounds.max_flows}" in line
    assert chart_arg(chart.args, "--health-listen-addr") == "0.0.0.0:8080"  # the probes' port, bound as given
