"""Time from an EndpointSlice change to a routing change, through the real router process.

A loopback Kubernetes API (tests/support/fake_kube_api.py) serves the Stargate slice; the router
watches it with kubernetes-asyncio. Each round moves pod ``stargate-0`` to the other of
two grpcio servers (a rescheduled pod: same name, new IP), then makes fresh gRPC calls
through the router until the new server answers. Also the file source, for comparison.

The outage scenario (issue 15) takes the API down for N seconds; meanwhile the pod moves
and the history is compacted, so the router's resourceVersion is gone. It measures the
time from the API's return (listening again) to the first call routed to the new server.

    python bench/discovery_propagation.py [--rounds 20] [--outage-s 5 30] [--outage-rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.demo.grpc_pods import RunningPod, call_whoami, start_pod
from tests.support.fake_kube_api import FakeKubeApi, make_endpoint, make_slice
from tests.support.router_process import RouterProcess, write_endpoints

AUTHORITY = "stargate-0.stargate.external"
SETTLE_S = 6.0
"""Before each outage the watch stays open this long (past the 5 s after which a watch counts as
healthy), as it would between real outages: no round inherits the backoff of the previous one."""
NAMESPACE = "stargate"


def _answer(port: int) -> str:
    opts = [("grpc.default_authority", AUTHORITY), ("grpc.use_local_subchannel_pool", 1)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=opts) as ch:
        try:
            return call_whoami(ch, timeout=2)
        except grpc.RpcError:
            return ""


def _wait_for(port: int, want: str, started: float, limit_s: float = 60.0) -> float:
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


def _slice_for(pod: RunningPod) -> dict[str, object]:
    """The Stargate slice with ``stargate-0`` on ``pod``: moving it is a rescheduled pod."""
    return make_slice("stargate-headless-abc", [make_endpoint("stargate-0", pod.address)], grpc_port=pod.port)


@contextlib.asynccontextmanager
async def _watching_router(first: RunningPod, workdir: Path) -> AsyncIterator[tuple[FakeKubeApi, RouterProcess]]:
    """A loopback API serving ``first`` and a router process watching it; both stopped on exit."""
    api = FakeKubeApi()
    await api.start()
    try:
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        api.upsert(_slice_for(first))
        router = await asyncio.to_thread(_router, ["--kubeconfig", str(kubeconfig)])
        try:
            yield api, router
        finally:
            await asyncio.to_thread(router.stop)
    finally:
        await api.stop()


async def kubernetes_rounds(pods: list[RunningPod], rounds: int, workdir: Path) -> list[float]:
    async with _watching_router(pods[0], workdir) as (api, router):
        times = []
        for i in range(rounds):
            pod = pods[(i + 1) % 2]
            started = time.perf_counter()
            api.upsert(_slice_for(pod))
            times.append(await asyncio.to_thread(_wait_for, router.grpc_port, pod.pod_name, started))
        return times


async def outage_rounds(pods: list[RunningPod], outage_s: float, rounds: int, workdir: Path) -> list[float]:
    """API down ``outage_s``, pod moved and history compacted meanwhile; seconds from return to routing."""
    async with _watching_router(pods[0], workdir) as (api, router):
        times = []
        for i in range(rounds):
            while api.open_watches < 1:  # each outage starts from an established, healthy watch
                await asyncio.sleep(0.05)
            await asyncio.sleep(SETTLE_S)
            pod = pods[(i + 1) % 2]
            await api.stop()
            api.upsert(_slice_for(pod))  # the world changes while the router cannot see it
            api.compact()  # and the resourceVersion it holds is compacted away
            await asyncio.sleep(outage_s)
            await api.start()
            started = time.perf_counter()
            times.append(await asyncio.to_thread(_wait_for, router.grpc_port, pod.pod_name, started))
        return times


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


def _percentile(sorted_ms: list[float], q: float) -> float:
    """Nearest rank: with fewer than 100 samples, p99 is the maximum."""
    return sorted_ms[min(len(sorted_ms) - 1, max(0, round(q * len(sorted_ms) + 0.5) - 1))]


def _outage_summary(outage_s: float, times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    return (f"API down {outage_s:>4.0f} s, compacted   rounds={len(ms):<3} p50={_percentile(ms, 0.5):7.1f} ms  "
            f"p99={_percentile(ms, 0.99):7.1f} ms  max={ms[-1]:7.1f} ms")


def _summary(name: str, times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
    return (f"{name:<22} rounds={len(ms):<3} median={statistics.median(ms):7.1f} ms  "
            f"p90={p90:7.1f} ms  max={ms[-1]:7.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--outage-s", type=float, nargs="*", default=[5.0, 30.0],
                        help="API outage lengths to measure (none: skip the outage scenario)")
    parser.add_argument("--outage-rounds", type=int, default=10)
    args = parser.parse_args()
    # the answering server's name tells which endpoint the router used
    pods = [start_pod("pod-a", "127.0.0.2"), start_pod("pod-b", "127.0.0.3")]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            k8s = asyncio.run(kubernetes_rounds(pods, args.rounds, Path(tmp)))
            files = file_rounds(pods, args.rounds, Path(tmp))
            outages = {n: asyncio.run(outage_rounds(pods, n, args.outage_rounds, Path(tmp))) for n in args.outage_s}
    finally:
        for pod in pods:
            pod.stop()
    print("EndpointSlice change -> first new connection routed to the new endpoint")
    print(_summary("kubernetes watch", k8s))
    print(_summary("endpoints file (poll)", files))
    if outages:
        print("API back after an outage -> first new connection routed to the endpoint changed meanwhile")
        for outage_s, times in outages.items():
            print(_outage_summary(outage_s, times))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
