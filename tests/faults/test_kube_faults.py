"""The router process on Kubernetes discovery while the API server misbehaves.

The router runs with ``--kubeconfig`` pointing at the loopback ``FakeKubeApi`` (in this
test's event loop) and routes real grpcio calls to real grpcio pods on 127.0.0.2+. While
the API is down, answers 410 over and over, cuts its watch streams or answers slowly,
a probe keeps calling a pod of the last snapshot through the router: every call must
succeed. When the API behaves again, the changes made meanwhile must reach the routing.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from discovery import constants as dc
from router import constants as c
from router.demo.grpc_pods import RunningPod, start_pod
from tests.support.fake_kube_api import FakeKubeApi, make_endpoint, make_slice
from tests.support.names import host
from tests.support.polling import becomes_true, deliberate_pause, eventually, holds
from tests.support.router_probes import WhoAmIProbe, timed_whoami
from tests.support.router_process import RouterProcess

NAMESPACE = "stargate"
PODS = (("stargate-0", "127.0.0.2"), ("stargate-1", "127.0.0.3"), ("stargate-2", "127.0.0.4"))
CONVERGE_S = dc.BACKOFF_MAX_S + 10
"""Bound for "converges once the API is back": the router retries at least every BACKOFF_MAX_S."""
QUICK_S = 5.0
"""Bound for changes that need no retry (a healthy watch delivers them at once)."""
STORMS = 8
"""Compactions in a 410 storm (odd: stargate-1 added, even: removed again; the last adds stargate-2)."""


@pytest.fixture(scope="module")
def pods() -> Iterator[dict[str, RunningPod]]:
    running = {name: start_pod(name, address) for name, address in PODS}
    try:
        yield running
    finally:
        for pod in running.values():
            pod.stop()


def pod_slice(pod: RunningPod, **metadata: Any) -> dict[str, Any]:
    """One EndpointSlice per pod (each demo pod listens on its own port)."""
    slice_ = make_slice(f"stargate-headless-{pod.pod_name}", [make_endpoint(pod.pod_name, pod.address)],
                        grpc_port=pod.port, namespace=NAMESPACE)
    slice_["metadata"].update(metadata)
    return slice_


@pytest.fixture
async def start_router(api: FakeKubeApi, tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    routers: list[RouterProcess] = []

    async def _start(*extra: str, one_process: str = "") -> RouterProcess:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        router = RouterProcess([
            "--listen-addr", "127.0.0.1:0", "--reverse-tunnel-listen-addr", "127.0.0.1:0",
            "--health-listen-addr", "127.0.0.1:0", "--kubeconfig", str(kubeconfig),
            "--target-namespace", NAMESPACE, "--shutdown-delay-ms", "0", "--drain-timeout-ms", "2000",
            *extra,
        ], one_process=one_process)
        routers.append(router)
        await asyncio.to_thread(router.wait_ready)
        return router

    yield _start
    for router in routers:
        assert await asyncio.to_thread(router.stop) == 0
        router.__exit__()


async def answer(router: RouterProcess, pod: str) -> str:
    """Who answers a WhoAmI naming ``pod`` through the router (or the gRPC status code name)."""
    return (await asyncio.to_thread(timed_whoami, router, host(pod)))[0]


async def converges(router: RouterProcess, expected: dict[str, str], timeout_s: float) -> float:
    """Wait until every pod name answers as expected; returns the seconds it took."""
    started = time.monotonic()
    got: dict[str, str] = {}

    async def routed() -> bool:
        nonlocal got
        got = {pod: await answer(router, pod) for pod in expected}
        return got == expected

    await eventually(routed, timeout_s, 0.2, what=lambda: f"routing to converge: {got} != {expected}")
    return time.monotonic() - started


async def ready(router: RouterProcess) -> bool:
    """The router's readiness answers 200: an API outage must never drain it."""
    return (await asyncio.to_thread(router.http_get, "/readyz"))[0] == 200


async def errors(router: RouterProcess) -> float:
    return await asyncio.to_thread(
        router.metric, c.DISCOVERY_UPDATES_TOTAL + "_total", source="kubernetes", result="error"
    )


async def start_probe(router: RouterProcess) -> WhoAmIProbe:
    probe = WhoAmIProbe(router, host("stargate-0"), interval_s=0.25)
    probe.start()
    return probe


async def stop_probe(probe: WhoAmIProbe) -> None:
    await asyncio.to_thread(probe.stop)
    assert len(probe.results) >= 2, "the probe made no calls"
    assert probe.failures("stargate-0") == [], "routing on the last snapshot failed"


# ---------------------------------------------------------------------------
# End to end on the Kubernetes source
# ---------------------------------------------------------------------------
async def test_router_on_kubeconfig_routes_by_authority_and_follows_the_api(
    api: FakeKubeApi, start_router: Callable[[], Any], pods: dict[str, RunningPod],
) -> None:
    api.upsert(pod_slice(pods["stargate-0"]))
    router = await start_router()
    assert await answer(router, "stargate-0") == "stargate-0"
    assert await answer(router, "stargate-1") == "UNAVAILABLE"
    api.upsert(pod_slice(pods["stargate-1"]))  # a pod added through the API becomes routable
    added_in = await converges(router, {"stargate-1": "stargate-1", "stargate-0": "stargate-0"}, QUICK_S)
    api.delete(NAMESPACE, "stargate-headless-stargate-0")
    removed_in = await converges(router, {"stargate-0": "UNAVAILABLE", "stargate-1": "stargate-1"}, QUICK_S)
    print(f"\nkube e2e: added pod routable after {added_in:.2f}s, removed pod refused after {removed_in:.2f}s")
    assert await asyncio.to_thread(router.metric, c.READY_TARGETS) == 1


# ---------------------------------------------------------------------------
# API faults: routing continues on the last snapshot, then converges
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("outage_s", [5.0, pytest.param(30.0, marks=pytest.mark.slow)], ids=lambda s: f"{s:.0f}s")
@pytest.mark.timeout(180)
async def test_api_down_keeps_routing_on_the_last_snapshot_then_converges(
    api: FakeKubeApi, start_router: Callable[[], Any], pods: dict[str, RunningPod], outage_s: float,
) -> None:
    api.upsert(pod_slice(pods["stargate-0"]))
    api.upsert(pod_slice(pods["stargate-2"]))
    router = await start_router()
    probe = await start_probe(router)
    await api.stop()
    api.upsert(pod_slice(pods["stargate-1"]))  # changes the router cannot see yet
    api.delete(NAMESPACE, "stargate-headless-stargate-2")
    errors_before, down_at = await errors(router), time.monotonic()
    # the outage, its length the test's parameter; readiness holds all along
    await holds(lambda: ready(router), outage_s, 0.5, what="readiness through the API outage")
    assert await answer(router, "stargate-2") == "stargate-2"  # the last snapshot, still served
    assert await answer(router, "stargate-1") == "UNAVAILABLE"
    age = await asyncio.to_thread(router.metric, c.DISCOVERY_LAST_SYNC_AGE_SECONDS)
    retries, down_s = await errors(router) - errors_before, time.monotonic() - down_at
    assert age >= outage_s * 0.9
    # Every worker watches on its own (its own discovery): each retried, none in a hot loop (at
    # most one retry per initial backoff over the time the API was really down, however long).
    assert router.workers <= retries <= router.workers * (down_s / dc.BACKOFF_INITIAL_S + 2)
    await api.start()  # same port
    took = await converges(
        router, {"stargate-0": "stargate-0", "stargate-1": "stargate-1", "stargate-2": "UNAVAILABLE"}, CONVERGE_S,
    )
    await stop_probe(probe)
    print(f"\napi down {outage_s:.0f}s: {len(probe.results)} calls ok (max {probe.max_latency_s:.3f}s), "
          f"{retries:.0f} retries, converged {took:.1f}s after the API returned")


async def test_410_storm_keeps_routing_and_converges(
    api: FakeKubeApi, start_router: Callable[[], Any], pods: dict[str, RunningPod],
) -> None:
    api.upsert(pod_slice(pods["stargate-0"]))
    router = await start_router()
    probe = await start_probe(router)
    lists_before = len(api.requests_of("list"))
    for storm in range(STORMS):  # 5 times a second, the watch falls behind and its RV is compacted away
        gone_as_http_status = storm >= STORMS // 2  # first as ERROR events on open watches, then as HTTP 410
        api.gone_as_http_status = gone_as_http_status
        api.freeze_watches()  # so only a re-list can see these changes
        if storm % 2:
            api.upsert(pod_slice(pods["stargate-1"]))
        elif storm:
            api.delete(NAMESPACE, "stargate-headless-stargate-1")
        api.upsert(pod_slice(pods["stargate-0"], annotations={"storm": str(storm)}))
        if storm == STORMS - 1:
            api.upsert(pod_slice(pods["stargate-2"]))
        api.compact(expire_open_watches=not gone_as_http_status)
        if gone_as_http_status:
            api.drop_watches()  # the re-watch from the compacted RV meets HTTP 410
        await deliberate_pause(0.2, "the storm's pace: five compactions a second, faster than a re-list settles")
    expected = {"stargate-0": "stargate-0", "stargate-1": "stargate-1", "stargate-2": "stargate-2"}
    took = await converges(router, expected, CONVERGE_S)
    await stop_probe(probe)
    relists = len(api.requests_of("list")) - lists_before
    gone = sum(1 for r in api.requests_of("watch") if r.status == 410)
    print(f"\n410 storm: {relists} re-lists, {gone} HTTP 410s, "
          f"{len(probe.results)} calls ok, converged {took:.1f}s after the storm")
    assert relists >= 1
    assert relists <= router.workers * (STORMS + 1)  # one re-list per 410 per worker at most: no list loop


async def test_watch_streams_cut_every_second_keep_routing_and_converge(
    api: FakeKubeApi, start_router: Callable[[], Any], pods: dict[str, RunningPod],
) -> None:
    api.upsert(pod_slice(pods["stargate-0"]))
    router = await start_router()
    probe = await start_probe(router)
    watches_before = len(api.requests_of("watch"))
    for second in range(3):
        await deliberate_pause(1.0, "the fault's pace: a cut every second")
        if second % 2:
            api.cut_next_event()  # the next event arrives half-written, then the stream drops
            api.upsert(pod_slice(pods["stargate-1"], annotations={"cut": str(second)}))
        else:
            api.drop_watches()
    api.upsert(pod_slice(pods["stargate-2"]))
    took = await converges(
        router, {"stargate-0": "stargate-0", "stargate-1": "stargate-1", "stargate-2": "stargate-2"}, CONVERGE_S,
    )
    await stop_probe(probe)
    rewatches = len(api.requests_of("watch")) - watches_before
    print(f"\nwatch cut every second: {rewatches} re-watches, {len(api.requests_of('list'))} lists, "
          f"{len(probe.results)} calls ok, converged {took:.1f}s after the last cut")
    assert rewatches >= 2
    assert rewatches <= router.workers * 3 * 10  # each worker re-watched, never in a hot loop


async def test_slow_api_keeps_routing_and_converges(
    api: FakeKubeApi, start_router: Callable[[], Any], pods: dict[str, RunningPod],
) -> None:
    api.upsert(pod_slice(pods["stargate-0"]))
    api.latency_s = 0.5  # even the first list is slow: the router becomes ready after it
    router = await start_router()
    await eventually(lambda: api.open_watches >= router.workers, QUICK_S, 0.05, what="the workers' watches")
    assert api.open_watches == router.workers  # one watch per worker
    probe = await start_probe(router)
    api.latency_s = 1.5
    api.freeze_watches()
    api.upsert(pod_slice(pods["stargate-1"]))
    written = time.monotonic()
    api.compact()  # 410: the re-list and the re-watch each wait 1.5 s for their answer
    took = await converges(router, {"stargate-0": "stargate-0", "stargate-1": "stargate-1"}, CONVERGE_S)
    await stop_probe(probe)
    print(f"\nslow API (1.5 s per request): {len(probe.results)} calls ok, pod added via the API routable "
          f"{time.monotonic() - written:.1f}s after it was written")
    assert took >= api.latency_s * 0.9, "the change was routable before the slow API could deliver it"


# ---------------------------------------------------------------------------
# Never stale (issue 15), through the router process
# ---------------------------------------------------------------------------
IDLE_MS = 1000
"""A small watch idle timeout for the tests (the default is three bookmark periods, 180 s)."""
RETURN_S = 3.0
"""Bound for "routing follows the API after its return" (target < 1 s; before issue 15: 3.7-9.9 s)."""


async def rewatches(router: RouterProcess, cause: str) -> float:
    return await asyncio.to_thread(router.metric, c.DISCOVERY_REWATCHES_TOTAL + "_total", cause=cause)


async def every_worker_rewatched(router: RouterProcess, cause: str) -> bool:
    return await rewatches(router, cause) >= router.workers


@pytest.mark.parametrize("outage_s", [5.0, pytest.param(30.0, marks=pytest.mark.slow)], ids=lambda s: f"{s:.0f}s")
@pytest.mark.timeout(120)
async def test_api_back_after_an_outage_with_compaction_routes_the_new_world_at_once(
    api: FakeKubeApi, start_router: Callable[..., Any], pods: dict[str, RunningPod], outage_s: float,
) -> None:
    api.upsert(pod_slice(pods["stargate-0"]))
    api.upsert(pod_slice(pods["stargate-2"]))
    router = await start_router()
    await api.stop()
    api.upsert(pod_slice(pods["stargate-1"]))
    api.delete(NAMESPACE, "stargate-headless-stargate-2")
    api.compact()  # the router's resourceVersion is gone: its re-watch will meet 410
    # the outage, its length the test's parameter; readiness holds all along
    await holds(lambda: ready(router), outage_s, 0.5, what="readiness through the API outage")
    assert await answer(router, "stargate-2") == "stargate-2"
    await api.start()
    back = time.monotonic()
    took = await converges(
        router, {"stargate-0": "stargate-0", "stargate-1": "stargate-1", "stargate-2": "UNAVAILABLE"}, CONVERGE_S,
    )
    # Calls show the workers they reached; every worker re-lists after its own expired re-watch.
    await eventually(lambda: every_worker_rewatched(router, "expired"), CONVERGE_S, 0.05, what="every worker's 410")
    assert await rewatches(router, "expired") == router.workers
    # At once: each worker's re-list came within RETURN_S of the API's return, on the router's own
    # retry timer (at most RECONNECT_BACKOFF_MAX_S), as the fake API saw it; the calls above only confirm.
    relisted = sorted(r.at - back for r in api.requests_of("list") if r.at >= back and r.status == 200)
    assert len(relisted) >= router.workers and relisted[router.workers - 1] < RETURN_S, relisted
    print(f"\napi down {outage_s:.0f}s with compaction: re-listed {relisted[router.workers - 1]:.2f}s and "
          f"routing followed {took:.2f}s after the API returned")


async def test_frozen_watch_is_replaced_within_the_idle_timeout_and_the_change_routed(
    api: FakeKubeApi, start_router: Callable[..., Any], pods: dict[str, RunningPod],
) -> None:
    api.upsert(pod_slice(pods["stargate-0"]))
    router = await start_router("--kube-watch-idle-timeout-ms", str(IDLE_MS))
    await eventually(lambda: api.open_watches == router.workers)  # one watch per worker
    lists = len(api.requests_of("list"))
    api.hang_watches()  # open, silent: a half-open connection
    api.upsert(pod_slice(pods["stargate-1"]))
    took = await converges(router, {"stargate-0": "stargate-0", "stargate-1": "stargate-1"}, IDLE_MS / 1000 + QUICK_S)
    # Routing through one worker shows one replaced watch; every worker replaces its own in the same bound.
    await becomes_true(lambda: every_worker_rewatched(router, "idle"), IDLE_MS / 1000 + QUICK_S, 0.05)
    assert await rewatches(router, "idle") == router.workers
    assert len(api.requests_of("list")) == lists  # a re-watch from the last resourceVersion, not a re-list
    print(f"\nfrozen watch: replaced and the change routed {took:.2f}s after the write (idle timeout {IDLE_MS} ms)")


async def test_quiet_healthy_watch_is_kept(
    api: FakeKubeApi, start_router: Callable[..., Any], pods: dict[str, RunningPod],
) -> None:
    api.bookmark_interval_s = IDLE_MS / 1000 / 4
    api.upsert(pod_slice(pods["stargate-0"]))
    router = await start_router("--kube-watch-idle-timeout-ms", str(IDLE_MS))
    await eventually(lambda: api.open_watches == router.workers)  # one watch per worker
    requests = len(api.requests)
    # four idle periods with bookmarks only: never a new request
    await holds(lambda: len(api.requests) == requests, 4 * IDLE_MS / 1000, 0.05, what="no request but the watch")
    assert await rewatches(router, "idle") == 0
    assert await answer(router, "stargate-0") == "stargate-0"


async def test_throttled_requests_are_spaced_by_retry_after(
    api: FakeKubeApi, start_router: Callable[..., Any], pods: dict[str, RunningPod],
) -> None:
    api.upsert(pod_slice(pods["stargate-0"]))
    router = await start_router(
        one_process="the spacing of one client's requests after 429s: the API cannot tell whose request is "
        "whose when every worker watches on its own",
    )
    await eventually(lambda: api.open_watches == 1)
    before = len(api.requests)
    api.throttle(3, retry_after_s=1)
    api.drop_watches()  # the re-watch meets API Priority and Fairness
    api.upsert(pod_slice(pods["stargate-1"]))  # after the drop: only the accepted re-watch delivers it
    await eventually(lambda: len(api.requests) >= before + 4, 3 + QUICK_S)
    await converges(router, {"stargate-0": "stargate-0", "stargate-1": "stargate-1"}, QUICK_S)
    throttled = api.requests[before:]
    assert [r.status for r in throttled[:4]] == [429, 429, 429, 200]
    gaps = [b.at - a.at for a, b in itertools.pairwise(throttled[:4])]
    assert all(gap >= 1.0 for gap in gaps), gaps
    print("\nthrottled: gaps " + ", ".join(f"{g:.2f}s" for g in gaps) + " for Retry-After: 1")
