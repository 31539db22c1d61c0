"""The upstream chart's backend-router container, run as the kubelet would, in a network namespace.

Run as ``python -m tests.support.chart_scenario`` INSIDE a fresh network namespace (``unshare
--net``, loopback up: ``tests/process/test_upstream_chart.py`` starts it), because the chart's args bind
0.0.0.0:50071/50072/8080 and must run unchanged. In that namespace: the loopback fake Kubernetes
API serving EndpointSlices of the chart's Service (``--target-service-name``) in its namespace,
two pods (real grpcio h2c servers and aioquic servers on 127.0.0.2 and 127.0.0.3, ports named
as the chart's ``--grpc-port-name`` / ``--quic-port-name``), a kubeconfig found through
``KUBECONFIG``, a ``memory.max`` of the chart's limit, and the chart's command (our installed
console script of that name) with every arg of the chart. Then the kubelet's probes (paths and
ports from the chart), an h2c call and a QUIC call per pod named by the chart's hostname
template, and SIGTERM. Prints one JSON object of what it saw; the test asserts on it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc

from router import constants as c
from router.demo.grpc_pods import RunningPod, call_whoami, start_pod
from router.demo.pki import make_pki
from router.demo.quic_pods import bound_port, quic_whoami, start_quic_pod
from tests.support.fake_kube_api import FakeKubeApi, make_endpoint, make_slice
from tests.support.polling import becomes_true
from tests.support.router_process import suite_workers_args
from tests.support.upstream_chart import ChartContainer, chart_arg, chart_container

PODS = (("stargate-0", "127.0.0.2"), ("stargate-1", "127.0.0.3"))
START_TIMEOUT_S = 30.0
"""Bound on the router's start and its first sync (as a readiness probe's failure threshold would be)."""
STOP_PROBE_S = 5.0
"""After SIGTERM, bound on /readyz turning 503. The drain that follows (the default shutdown delay
and drain timeout: QUIC flows end only by idle timeout) is not waited for: the router is killed,
as the kubelet does at the end of the grace period."""
MEMORY_LIMITS = {"Mi": 1024**2, "Gi": 1024**3}


def memory_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity of the chart (``256Mi``) in bytes."""
    for suffix, factor in MEMORY_LIMITS.items():
        if quantity.endswith(suffix):
            return int(quantity.removesuffix(suffix)) * factor
    return int(quantity)


def installed_command(chart: ChartContainer) -> str:
    """The chart's command resolved to our installed console script of the same name."""
    name = Path(chart.command[0]).name
    beside = Path(sys.executable).parent / name  # a venv's, else the one on PATH (pip's scripts dir)
    script = str(beside) if beside.exists() else shutil.which(name)
    if script is None:
        raise SystemExit(f"chart_scenario: no {name} installed (pip install -e . installs it)")
    return script


def probe(port: int, path: str) -> int:
    """One kubelet httpGet probe: the status code, 0 when nothing answered."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def h2c_whoami(port: int, authority: str) -> str:
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.default_authority", authority)]) as channel:
        try:
            return call_whoami(channel)
        except grpc.RpcError as err:
            return f"error {err.code().name}: {err.details()}"


async def scenario(workdir: Path) -> dict[str, Any]:
    chart = chart_container()
    namespace = chart_arg(chart.args, "--target-namespace")
    service = chart_arg(chart.args, "--target-service-name")
    template = chart_arg(chart.args, "--advertised-hostname-template")
    grpc_port = int(chart_arg(chart.args, "--listen-addr").rpartition(":")[2])
    quic_port = int(chart_arg(chart.args, "--reverse-tunnel-listen-addr").rpartition(":")[2])
    pki = make_pki(workdir / "pki", dns_names=(template.replace("{pod_name}", "*"),))  # the pods' certificate
    api = FakeKubeApi()
    await api.start()
    grpc_pods: list[RunningPod] = []
    quic_pods = []
    router: subprocess.Popen[str] | None = None
    reader: threading.Thread | None = None
    lines: list[str] = []
    args = [*chart.args, *suite_workers_args(chart.args)]  # STARGATE_TEST_ROUTER_WORKERS, when set
    facts: dict[str, Any] = {"command": chart.command, "args": args}
    try:
        for pod, address in PODS:
            grpc_pods.append(start_pod(pod, address))
            quic_pods.append(await start_quic_pod(pod, address, 0, pki.cert_path, pki.key_path))
            ports = [
                {"name": chart_arg(chart.args, "--grpc-port-name"), "port": grpc_pods[-1].port, "protocol": "TCP"},
                {"name": chart_arg(chart.args, "--quic-port-name"), "port": bound_port(quic_pods[-1]),
                 "protocol": "UDP"},
            ]
            api.upsert(make_slice(f"{service}-{pod}", [make_endpoint(pod, address)], service=service,
                                  ports=ports, namespace=namespace))
        memory_max = workdir / "memory.max"
        memory_max.write_text(f"{memory_bytes(chart.memory_limit)}\n")
        env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", c.TARGET_NAMESPACE_ENV)}
        env |= {"KUBECONFIG": str(api.write_kubeconfig(workdir / "kubeconfig")),
                c.CGROUP_MEMORY_MAX_PATH_ENV: str(memory_max)}
        router = subprocess.Popen([installed_command(chart), *args], env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        reader = threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in router.stderr or ()),
                                  daemon=True)
        reader.start()
        await becomes_true(lambda: router.poll() is not None  # exited: judged from the facts
                           or probe(chart.readiness.port, chart.readiness.path) == 200, START_TIMEOUT_S, 0.1)
        facts["readiness"] = probe(chart.readiness.port, chart.readiness.path)
        facts["liveness"] = probe(chart.liveness.port, chart.liveness.path)
        facts["h2c"], facts["quic"] = {}, {}
        for pod, _address in PODS:
            name = template.replace("{pod_name}", pod)
            facts["h2c"][pod] = await asyncio.to_thread(h2c_whoami, grpc_port, name)
            try:
                facts["quic"][pod] = await quic_whoami("127.0.0.1", quic_port, name, pki.ca_path)
            except (ConnectionError, TimeoutError) as exc:
                facts["quic"][pod] = f"error {exc}"
        router.send_signal(signal.SIGTERM)  # as the kubelet stops a pod: readiness fails at once
        await becomes_true(lambda: probe(chart.readiness.port, chart.readiness.path) != 200, STOP_PROBE_S, 0.05)
        facts["readiness_after_sigterm"] = probe(chart.readiness.port, chart.readiness.path)
        facts["liveness_after_sigterm"] = probe(chart.liveness.port, chart.liveness.path)
    finally:
        if router is not None and router.poll() is None:
            router.kill()
            router.wait(5)
        if reader is not None:
            reader.join(5)
        for quic_pod in quic_pods:
            quic_pod.close()
        for grpc_pod in grpc_pods:
            grpc_pod.stop()
        await api.stop()
    facts["lines"] = lines
    return facts


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="chart-scenario-") as tmp:
        print(json.dumps(asyncio.run(scenario(Path(tmp)))))


if __name__ == "__main__":
    main()
