"""Time from an EndpointSlice change to a routing change, through the real router process.

A loopback Kubernetes API (tests/fake_kube_api.py) serves the Stargate slice; the router
watches it with kubernetes-asyncio. Each round moves pod ``stargate-0`` to the other of
two grpcio servers (a rescheduled pod: same name, new IP), then makes fresh gRPC calls
through the router until the new server answers. Also the file source, for comparison.

    python bench/discovery_propagation.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.demo.grpc_pods import RunningPod, call_whoami, start_pod
from tests.fake_kube_api import FakeKubeApi, make_endpoint, make_slice
from tests.support.router_process import RouterProcess, write_endpoints

AUTHORITY = "stargate-0.stargate.external"
NAMESPACE = "stargate"


def _answer(port: int) -> str:
    opts = [("grpc.default_authority", AUTHORITY), ("grpc.use_local_subchannel_pool", 1)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=opts) as ch:
        try:
            return call_whoami(ch, timeout=2)
        except grpc.RpcError:
            return ""


def _wait_for(port: int, want: str, started: float, limit_s: float = 10.0) -> float:
    while time.perf_counter() - started < limit_s:
        if _answer(port) == want:
            return time.perf_counter() - started
    raise RuntimeError(f"routing never changed to {want}")


def _router(args: list[str]) -> RouterProcess:
    router = RouterProcess([
        "--listen-addr", "127.0.0.1:0", "--reverse-tunnel-listen-addr", "127.0.0.1:0",
        "--health-listen-addr", "127.0.0.1:0", "--target-namespace", NAMESPACE,
        "--shutdown-delay-ms", "0", *args,
    ])
    router.wait_ready()
    return router


async def kubernetes_rounds(pods: list[RunningPod], rounds: int, workdir: Path) -> list[float]:
    api = FakeKubeApi()
    await api.start()
    kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")

    def slice_for(pod: RunningPod) -> dict[str, object]:
        return make_slice(
            "stargate-headless-abc", [make_endpoint("stargate-0", pod.address)], grpc_port=pod.port
        )

    api.upsert(slice_for(pods[0]))
    router = await asyncio.to_thread(_router, ["--kubeconfig", str(kubeconfig)])
    try:
        times = []
        for i in range(rounds):
            pod = pods[(i + 1) % 2]
            started = time.perf_counter()
            api.upsert(slice_for(pod))
            times.append(await asyncio.to_thread(_wait_for, router.grpc_port, pod.pod_name, started))
        return times
    finally:
        await asyncio.to_thread(router.stop)
        await api.stop()


def file_rounds(pods: list[RunningPod], rounds: int, workdir: Path) -> list[float]:
    endpoints = workdir / "endpoints.json"
    write_endpoints(endpoints, [("stargate-0", pods[0].address, pods[0].port, 1)])
    router = _router(["--endpoints-file", str(endpoints)])
    try:
        times = []
        for i in range(rounds):
            pod = pods[(i + 1) % 2]
            started = time.perf_counter()
            write_endpoints(endpoints, [("stargate-0", pod.address, pod.port, 1)])
            times.append(_wait_for(router.grpc_port, pod.pod_name, started))
        return times
    finally:
        router.stop()


def _summary(name: str, times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
    return (f"{name:<22} rounds={len(ms):<3} median={statistics.median(ms):7.1f} ms  "
            f"p90={p90:7.1f} ms  max={ms[-1]:7.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    # the answering server's name tells which endpoint the router used
    pods = [start_pod("pod-a", "127.0.0.2"), start_pod("pod-b", "127.0.0.3")]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            k8s = asyncio.run(kubernetes_rounds(pods, args.rounds, Path(tmp)))
            files = file_rounds(pods, args.rounds, Path(tmp))
    finally:
        for pod in pods:
            pod.stop()
    print("EndpointSlice change -> first new connection routed to the new endpoint")
    print(_summary("kubernetes watch", k8s))
    print(_summary("endpoints file (poll)", files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
