"""KubernetesSource against a loopback API server, through the real kubernetes-asyncio client."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from discovery import constants as dc
from discovery.backoff import Backoff, retry_after_delay
from discovery.kube_wire import parse_retry_after
from discovery.kubernetes_source import (
    KubeApiResponseError,
    KubernetesSource,
    keepalive_socket,
    parse_slice_list,
    parse_watch_event,
)
from discovery.observer import RewatchCause
from discovery.settings import DiscoverySettings
from router import constants as c
from router.app import MetricsDiscoveryObserver
from router.metrics import RouterMetrics
from tests.support.fake_kube_api import FakeKubeApi, make_endpoint, make_slice
from tests.support.polling import eventually, holds
from tests.support.snapshot_recorder import SnapshotRecorder

NS = "stargate"
SETTINGS = DiscoverySettings(NS, "stargate-headless", "grpc", "quic")
CONVERGE_S = 5.0
FAST_BACKOFF = (0.1, 1.0)
"""Outage tests retry at least once a second, so "back within 5 s" does not wait on a 30 s cap."""


Start = Callable[..., KubernetesSource]


@pytest.fixture
async def start(
    api: FakeKubeApi, tmp_path: Path, recorder: SnapshotRecorder, metrics: RouterMetrics,
) -> AsyncIterator[Start]:
    tasks: list[asyncio.Task[None]] = []

    def _start(backoff: tuple[float, float] | None = None, kubeconfig: Path | None = None,
               **kwargs: Any) -> KubernetesSource:
        kwargs.setdefault("watch_idle_timeout_s", c.DEFAULT_KUBE_WATCH_IDLE_TIMEOUT_MS / 1000)
        source = KubernetesSource(
            SETTINGS, recorder, MetricsDiscoveryObserver(metrics),
            kubeconfig=kubeconfig or api.write_kubeconfig(tmp_path / "kubeconfig"),
            backoff=Backoff(*backoff) if backoff else None, **kwargs,
        )
        tasks.append(asyncio.create_task(source.run()))
        return source

    yield _start
    for task in tasks:
        task.cancel()
    for task in tasks:
        with pytest.raises(asyncio.CancelledError):
            await task


def updates(metrics: RouterMetrics, result: str) -> float:
    value = metrics.registry.get_sample_value(
        f"{c.DISCOVERY_UPDATES_TOTAL}_total", {"source": "kubernetes", "result": result},
    )
    return value or 0.0


def pods_slice(name: str, pods: dict[str, str], **conditions: Any) -> dict[str, Any]:
    return make_slice(name, [make_endpoint(pod, address, **conditions) for pod, address in pods.items()])


async def synced(source: KubernetesSource) -> None:
    await asyncio.wait_for(source.synced.wait(), CONVERGE_S)


async def synced_on_one_pod(api: FakeKubeApi, start: Start, **kwargs: Any) -> KubernetesSource:
    """The usual opening: slice ``s-a`` holds ready ``stargate-0``, and a source (``kwargs``) has listed it."""
    api.upsert(pods_slice("s-a", {"stargate-0": "10.0.0.1"}))
    source = start(**kwargs)
    await synced(source)
    return source


# ---------------------------------------------------------------------------
# list and watch
# ---------------------------------------------------------------------------
async def test_initial_list_publishes_the_services_ready_pods_and_watches_from_its_rv(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder, metrics: RouterMetrics,
) -> None:
    api.upsert(pods_slice("stargate-headless-a", {"stargate-0": "10.0.0.1", "stargate-1": "fd00::2"}))
    api.upsert(make_slice("other-a", [make_endpoint("other-0", "10.0.9.9")], service="other"))
    api.upsert(make_slice("elsewhere", [make_endpoint("x-0", "10.0.8.8")], namespace="other-ns"))
    assert metrics.registry.get_sample_value(c.DISCOVERY_LAST_SYNC_AGE_SECONDS) == -1
    source = start()
    await synced(source)
    assert recorder.pods == {"stargate-0": "10.0.0.1", "stargate-1": "fd00::2"}
    listed = api.requests_of("list")[0]
    assert listed.query["labelSelector"] == f"{dc.SERVICE_NAME_LABEL}=stargate-headless"
    await eventually(lambda: api.open_watches == 1, CONVERGE_S)
    watch = api.requests_of("watch")[0]
    assert watch.query["resourceVersion"] == str(api.rv)
    assert watch.query["allowWatchBookmarks"].lower() == "true"
    assert watch.query["labelSelector"] == listed.query["labelSelector"]
    assert metrics.registry.get_sample_value(c.READY_TARGETS) == 2
    age = metrics.registry.get_sample_value(c.DISCOVERY_LAST_SYNC_AGE_SECONDS)
    assert age is not None and 0 <= age < 60


async def test_scale_up_and_down_follow_watch_events(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder, metrics: RouterMetrics,
) -> None:
    source = await synced_on_one_pod(api, start)
    api.upsert(pods_slice("s-a", {"stargate-0": "10.0.0.1", "stargate-1": "10.0.0.2"}))
    api.upsert(pods_slice("s-b", {"stargate-2": "10.0.0.3"}))
    await eventually(lambda: set(recorder.pods) == {"stargate-0", "stargate-1", "stargate-2"}, CONVERGE_S)
    api.upsert(pods_slice("s-a", {"stargate-0": "10.0.0.1"}))
    api.delete(NS, "s-b")
    await eventually(lambda: set(recorder.pods) == {"stargate-0"}, CONVERGE_S)
    assert metrics.registry.get_sample_value(c.READY_TARGETS) == 1
    assert source.resource_version == str(api.rv)


async def test_pod_replaced_by_a_new_pod_of_the_same_name_moves_to_its_new_address(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder,
) -> None:
    await synced_on_one_pod(api, start)
    api.upsert(pods_slice("s-a", {"stargate-0": "10.0.0.1"}, ready=False, serving=False, terminating=True))
    await eventually(lambda: recorder.pods == {}, CONVERGE_S)
    api.upsert(pods_slice("s-a", {"stargate-0": "10.0.0.7"}))
    await eventually(lambda: recorder.pods == {"stargate-0": "10.0.0.7"}, CONVERGE_S)


async def test_pod_becoming_unready_then_terminating_leaves_the_snapshot(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder,
) -> None:
    api.upsert(pods_slice("s-a", {"stargate-0": "10.0.0.1", "stargate-1": "10.0.0.2"}))
    source = start()
    await synced(source)
    both = make_endpoint("stargate-0", "10.0.0.1")
    api.upsert(make_slice("s-a", [both, make_endpoint("stargate-1", "10.0.0.2", ready=False)]))
    await eventually(lambda: recorder.pods == {"stargate-0": "10.0.0.1"}, CONVERGE_S)
    api.upsert(make_slice("s-a", [both, make_endpoint("stargate-1", "10.0.0.2")]))  # ready again
    await eventually(lambda: len(recorder.pods) == 2, CONVERGE_S)
    terminating = make_endpoint("stargate-1", "10.0.0.2", ready=False, serving=True, terminating=True)
    api.upsert(make_slice("s-a", [both, terminating]))
    await eventually(lambda: recorder.pods == {"stargate-0": "10.0.0.1"}, CONVERGE_S)


async def test_unchanged_targets_are_counted_not_republished(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder, metrics: RouterMetrics,
) -> None:
    await synced_on_one_pod(api, start)
    api.upsert(make_slice("other-a", [make_endpoint("x", "10.0.0.5")], service="other"))  # not watched
    slice_ = pods_slice("s-a", {"stargate-0": "10.0.0.1"})
    slice_["metadata"]["annotations"] = {"touched": "yes"}
    api.upsert(slice_)
    await eventually(lambda: updates(metrics, "unchanged") == 1, CONVERGE_S)
    assert len(recorder.published) == 1
    assert updates(metrics, "published") == 1


# ---------------------------------------------------------------------------
# resourceVersion bookkeeping: 410, dropped streams, bookmarks, timeouts
# ---------------------------------------------------------------------------
async def test_compacted_watch_gets_410_and_relists_replacing_the_whole_set(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder,
) -> None:
    await synced_on_one_pod(api, start)
    await eventually(lambda: api.open_watches == 1, CONVERGE_S)
    api.freeze_watches()  # the watch falls behind: it will never see these events
    api.delete(NS, "s-a")
    api.upsert(pods_slice("s-b", {"stargate-5": "10.0.0.5"}))
    api.compact()  # ERROR 410 to the open watch
    await eventually(lambda: recorder.pods == {"stargate-5": "10.0.0.5"}, CONVERGE_S)
    assert len(api.requests_of("list")) == 2
    assert [set(s.by_pod) for s in recorder.published] == [{"stargate-0"}, {"stargate-5"}]  # no partial view


async def test_watch_answered_with_http_410_relists(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder,
) -> None:
    api.gone_as_http_status = True
    await synced_on_one_pod(api, start)
    await eventually(lambda: api.open_watches == 1, CONVERGE_S)
    api.freeze_watches()
    api.upsert(pods_slice("s-a", {"stargate-1": "10.0.0.2"}))
    api.compact(expire_open_watches=False)
    api.drop_watches()  # the re-watch from the old RV meets HTTP 410
    await eventually(lambda: recorder.pods == {"stargate-1": "10.0.0.2"}, CONVERGE_S)
    assert any(r.status == 410 for r in api.requests_of("watch"))
    assert len(api.requests_of("list")) == 2


async def test_stream_cut_mid_event_rewatches_from_the_last_complete_events_rv(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder,
) -> None:
    await synced_on_one_pod(api, start)
    api.upsert(pods_slice("s-a", {"stargate-0": "10.0.0.1", "stargate-1": "10.0.0.2"}))
    await eventually(lambda: len(recorder.pods) == 2, CONVERGE_S)
    last_complete = str(api.rv)
    watches_before = len(api.requests_of("watch"))
    api.cut_next_event()
    api.upsert(pods_slice("s-b", {"stargate-2": "10.0.0.3"}))  # sent half, then the connection drops
    await eventually(lambda: len(recorder.pods) == 3, CONVERGE_S)
    rewatch = api.requests_of("watch")[watches_before]
    assert rewatch.query["resourceVersion"] == last_complete
    assert len(api.requests_of("list")) == 1  # no re-list for a dropped stream


async def test_bookmark_advances_the_resource_version_a_rewatch_resumes_from(
    api: FakeKubeApi, start: Start,
) -> None:
    source = await synced_on_one_pod(api, start)
    await eventually(lambda: api.open_watches == 1, CONVERGE_S)
    bookmark_rv = api.send_bookmark(unrelated_writes=7)
    await eventually(lambda: source.resource_version == str(bookmark_rv), CONVERGE_S)
    watches_before = len(api.requests_of("watch"))
    api.drop_watches()
    await eventually(lambda: len(api.requests_of("watch")) > watches_before, CONVERGE_S)
    assert api.requests_of("watch")[watches_before].query["resourceVersion"] == str(bookmark_rv)


async def test_server_watch_timeout_rewatches_from_the_last_rv_without_relisting(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder,
) -> None:
    await synced_on_one_pod(api, start, watch_timeout_s=1)
    await eventually(lambda: len(api.requests_of("watch")) >= 2, CONVERGE_S)
    first, second = api.requests_of("watch")[:2]
    assert first.query["timeoutSeconds"] == "1"
    assert second.query["resourceVersion"] == first.query["resourceVersion"]
    assert len(api.requests_of("list")) == 1
    assert len(recorder.published) == 1


async def test_garbage_on_the_watch_stream_relists_and_keeps_serving(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder, metrics: RouterMetrics,
) -> None:
    await synced_on_one_pod(api, start, backoff=FAST_BACKOFF)
    await eventually(lambda: api.open_watches == 1, CONVERGE_S)
    api.send_raw(b"<html>502 Bad Gateway</html>\n")
    await eventually(lambda: len(api.requests_of("list")) == 2, CONVERGE_S)
    assert updates(metrics, "error") == 1
    assert recorder.pods == {"stargate-0": "10.0.0.1"}


# ---------------------------------------------------------------------------
# errors and outages: backoff, last snapshot kept, convergence
# ---------------------------------------------------------------------------
async def test_403_is_retried_with_backoff_never_an_immediate_repoll(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder, metrics: RouterMetrics,
) -> None:
    api.upsert(pods_slice("s-a", {"stargate-0": "10.0.0.1"}))
    api.fail_next(403, 3)
    source = start()  # the default backoff: 0.5 s, doubling
    await asyncio.wait_for(source.synced.wait(), 10)
    lists = api.requests_of("list")
    assert [r.status for r in lists] == [403, 403, 403, 200]
    gaps = [b.at - a.at for a, b in itertools.pairwise(lists)]
    assert all(gap >= 0.8 * dc.BACKOFF_INITIAL_S for gap in gaps), gaps
    assert updates(metrics, "error") == 3
    assert recorder.pods == {"stargate-0": "10.0.0.1"}


async def test_5xx_on_the_watch_is_retried_from_the_same_rv(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder,
) -> None:
    source = await synced_on_one_pod(api, start, backoff=FAST_BACKOFF)
    await eventually(lambda: api.open_watches == 1, CONVERGE_S)
    rv = source.resource_version
    api.fail_next(500, 2)
    api.drop_watches()
    await eventually(lambda: len(api.requests_of("watch")) == 4 and api.open_watches == 1, CONVERGE_S)
    retries = api.requests_of("watch")[1:]
    assert [r.status for r in retries] == [500, 500, 200]
    assert all(r.query["resourceVersion"] == rv for r in retries)
    assert len(api.requests_of("list")) == 1


@pytest.mark.parametrize("outage_s", [3.0, pytest.param(10.0, marks=pytest.mark.slow)])
async def test_api_outage_keeps_the_last_snapshot_and_converges_when_back(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder, metrics: RouterMetrics, outage_s: float,
) -> None:
    api.upsert(pods_slice("s-a", {"stargate-0": "10.0.0.1", "stargate-1": "10.0.0.2"}))
    source = start(backoff=FAST_BACKOFF)
    await synced(source)
    await eventually(lambda: api.open_watches == 1, CONVERGE_S)
    await api.stop()
    api.upsert(pods_slice("s-a", {"stargate-1": "10.0.0.2"}))  # changes while unreachable
    api.upsert(pods_slice("s-b", {"stargate-2": "10.0.0.3"}))
    await holds(lambda: recorder.pods == {"stargate-0": "10.0.0.1", "stargate-1": "10.0.0.2"}, outage_s, 0.05,
                what="the last snapshot through the whole outage")  # the outage's length is the test's parameter
    assert len(recorder.published) == 1
    errors = updates(metrics, "error")
    assert 1 <= errors <= outage_s / FAST_BACKOFF[0] + 2  # retried, never in a hot loop
    age = metrics.registry.get_sample_value(c.DISCOVERY_LAST_SYNC_AGE_SECONDS)
    assert age is not None and age >= outage_s * 0.9
    await api.start()  # same port
    await eventually(lambda: recorder.pods == {"stargate-1": "10.0.0.2", "stargate-2": "10.0.0.3"}, CONVERGE_S)


async def test_api_outage_with_compaction_relists_when_back(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder, metrics: RouterMetrics,
) -> None:
    await synced_on_one_pod(api, start, backoff=FAST_BACKOFF)
    await api.stop()
    api.upsert(pods_slice("s-a", {"stargate-9": "10.0.0.9"}))
    api.compact()
    await eventually(lambda: updates(metrics, "error") >= 2, CONVERGE_S, what="the outage seen: a dial refused")
    await api.start()
    await eventually(lambda: recorder.pods == {"stargate-9": "10.0.0.9"}, CONVERGE_S)
    assert len(api.requests_of("list")) == 2


async def test_slow_api_server_still_syncs(api: FakeKubeApi, start: Start, recorder: SnapshotRecorder) -> None:
    api.latency_s = 0.5
    await synced_on_one_pod(api, start)
    api.upsert(pods_slice("s-a", {"stargate-0": "10.0.0.2"}))
    await eventually(lambda: recorder.pods == {"stargate-0": "10.0.0.2"}, CONVERGE_S)


async def test_missing_kubeconfig_is_retried_until_it_appears(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder, metrics: RouterMetrics, tmp_path: Path,
) -> None:
    api.upsert(pods_slice("s-a", {"stargate-0": "10.0.0.1"}))
    path = tmp_path / "later" / "kubeconfig"
    source = start(backoff=FAST_BACKOFF, kubeconfig=path)
    await eventually(lambda: updates(metrics, "error") >= 1, CONVERGE_S)
    assert not source.synced.is_set()
    path.parent.mkdir()
    api.write_kubeconfig(path)
    await synced(source)
    assert recorder.pods == {"stargate-0": "10.0.0.1"}


# ---------------------------------------------------------------------------
# the response parsers
# ---------------------------------------------------------------------------
def test_parse_watch_event_reads_type_object_and_resource_version() -> None:
    event = parse_watch_event(json.dumps({"type": "ADDED", "object": {"metadata": {"resourceVersion": "7"}}}))
    assert (event.type, event.resource_version) == ("ADDED", "7")
    bookmark = parse_watch_event(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}\n')
    assert bookmark.resource_version == "9"
    error = parse_watch_event(b'{"type":"ERROR","object":{"kind":"Status","code":410}}')
    assert error.status_code == 410


@pytest.mark.parametrize("line", [
    b"", b"not json", b"[]", b'{"type":"ADDED"}', b'{"type":"NOPE","object":{}}',
    b'{"type":"BOOKMARK","object":{"metadata":{}}}', b'{"type":"ADDED","object":[]}', b"\xff",
])
def test_parse_watch_event_rejects_malformed_lines(line: bytes) -> None:
    with pytest.raises(KubeApiResponseError):
        parse_watch_event(line)


def test_parse_slice_list_needs_items_and_a_resource_version() -> None:
    assert parse_slice_list(b'{"items":null,"metadata":{"resourceVersion":"3"}}') == ([], "3")
    for body in (b'{"items":[]}', b'{"items":[1],"metadata":{"resourceVersion":"3"}}', b"x", b"1"):
        with pytest.raises(KubeApiResponseError):
            parse_slice_list(body)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=30,
)
event_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "x"]) | json_values,
     "object": json_values | st.fixed_dictionaries({"metadata": json_values, "code": json_values})},
)


@settings(deadline=None, max_examples=300)
@given(st.binary(max_size=100) | json_values.map(lambda v: json.dumps(v).encode())
       | event_like.map(lambda v: json.dumps(v).encode()))
def test_fuzz_response_parsers_raise_only_kube_api_response_error(data: bytes) -> None:
    for parse in (parse_watch_event, parse_slice_list):
        with contextlib.suppress(KubeApiResponseError):
            parse(data)


# ---------------------------------------------------------------------------
# Never stale (issue 15): 410 is progress, a silent watch is replaced, Retry-After honoured.
# Where a test shows something did *not* wait, the wait it must not take is long (30 s) and
# the convergence bound (CONVERGE_S) well below it, so timing noise cannot blur the two.
# ---------------------------------------------------------------------------
SLOW_BACKOFF = (30.0, 30.0)
"""A backoff the tests must never see: any sleep on it would blow the CONVERGE_S bound."""


def rewatches(metrics: RouterMetrics, cause: RewatchCause) -> float:
    value = metrics.registry.get_sample_value(f"{c.DISCOVERY_REWATCHES_TOTAL}_total", {"cause": str(cause)})
    assert value is not None, "the re-watch counter is zero-initialised for every cause"
    return value


# ---------------------------------------------------------------------------
# 410 is progress, not failure
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("as_http_status", [False, True], ids=["error-event", "http-410"])
async def test_410_relists_at_once_without_a_backoff(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder, metrics: RouterMetrics, as_http_status: bool,
) -> None:
    api.gone_as_http_status = as_http_status
    await synced_on_one_pod(api, start, backoff=SLOW_BACKOFF, watch_idle_timeout_s=0.5)
    await eventually(lambda: api.open_watches == 1, CONVERGE_S)
    api.freeze_watches()
    api.upsert(pods_slice("s-a", {"stargate-1": "10.0.0.2"}))
    api.compact(expire_open_watches=not as_http_status)
    if as_http_status:
        api.hang_watches()  # replaced when idle; the re-watch from the compacted RV meets HTTP 410
    await eventually(lambda: recorder.pods == {"stargate-1": "10.0.0.2"}, CONVERGE_S)
    assert len(api.requests_of("list")) == 2
    assert rewatches(metrics, RewatchCause.EXPIRED) == 1


async def test_outage_with_compaction_converges_at_once_when_the_api_returns(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder, metrics: RouterMetrics,
) -> None:
    """Refused dials are retried at least every RECONNECT_BACKOFF_MAX_S; the 410 on return is answered
    by an immediate re-list: the 30 s backoff is never slept."""
    await synced_on_one_pod(api, start, backoff=SLOW_BACKOFF)
    await eventually(lambda: api.open_watches == 1, CONVERGE_S)
    await api.stop()
    api.upsert(pods_slice("s-a", {"stargate-9": "10.0.0.9"}))
    api.compact()  # the history the router would resume from is gone while it cannot see
    # the watch cut and refused dials retried (the 30 s backoff would have left one error)
    await eventually(lambda: updates(metrics, "error") >= 3, CONVERGE_S, what="refused dials retried")
    assert recorder.pods == {"stargate-0": "10.0.0.1"}
    await api.start()
    await eventually(lambda: recorder.pods == {"stargate-9": "10.0.0.9"}, CONVERGE_S)
    assert rewatches(metrics, RewatchCause.EXPIRED) == 1
    assert updates(metrics, "error") >= 2  # the watch drop and the refused dials


async def test_a_410_loop_without_progress_backs_off_never_a_hot_loop(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder,
) -> None:
    api.gone_as_http_status = True
    api.upsert(pods_slice("s-a", {"stargate-0": "10.0.0.1"}))
    api.compacted_rv = 10**9  # every watch meets 410, even from a fresh list
    source = start(backoff=(0.2, 0.2))
    await synced(source)
    # a window of 2 s to count re-lists in: after the first 410, each further one waits >= 0.1 s
    await holds(lambda: len(api.requests_of("list")) <= 2.0 / 0.1 + 2, 2.0, what="no list loop")
    lists = len(api.requests_of("list"))
    assert 2 <= lists <= 2.0 / 0.1 + 2, lists


# ---------------------------------------------------------------------------
# A silent watch is replaced; a quiet healthy one is kept
# ---------------------------------------------------------------------------
async def test_a_frozen_watch_is_replaced_by_a_rewatch_from_its_resource_version(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder, metrics: RouterMetrics,
) -> None:
    source = await synced_on_one_pod(api, start, backoff=SLOW_BACKOFF, watch_idle_timeout_s=0.5)
    await eventually(lambda: api.open_watches == 1, CONVERGE_S)
    held_rv = source.resource_version
    api.hang_watches()  # open, silent: what a half-open connection looks like from here
    api.upsert(pods_slice("s-a", {"stargate-1": "10.0.0.2"}))
    await eventually(lambda: recorder.pods == {"stargate-1": "10.0.0.2"}, CONVERGE_S)
    assert rewatches(metrics, RewatchCause.IDLE) == 1
    assert len(api.requests_of("list")) == 1  # a re-watch, not a re-list
    assert api.requests_of("watch")[1].query["resourceVersion"] == held_rv
    assert updates(metrics, "error") == 0


async def test_a_quiet_watch_with_bookmarks_is_never_replaced(
    api: FakeKubeApi, start: Start, metrics: RouterMetrics,
) -> None:
    api.bookmark_interval_s = 0.1
    # ten bookmark periods: a loaded CI machine stalls for less
    source = await synced_on_one_pod(api, start, watch_idle_timeout_s=1.0)
    await eventually(lambda: api.open_watches == 1, CONVERGE_S)
    first = api.requests_of("watch")[0]
    assert first.query["allowWatchBookmarks"].lower() == "true"
    api.rv += 5  # unrelated cluster activity: the bookmarks carry it
    # three and a half idle periods, no event: only bookmarks, never a new request
    await holds(lambda: len(api.requests) == 2 and rewatches(metrics, RewatchCause.IDLE) == 0, 3.5, 0.05,
                what="the list and the one watch, no re-watch")
    assert int(source.resource_version or 0) > int(first.query["resourceVersion"])


async def test_the_server_ending_a_watch_counts_as_ended(
    api: FakeKubeApi, start: Start, metrics: RouterMetrics,
) -> None:
    await synced_on_one_pod(api, start, watch_timeout_s=1)
    await eventually(lambda: rewatches(metrics, RewatchCause.ENDED) >= 1, CONVERGE_S)
    assert rewatches(metrics, RewatchCause.IDLE) == 0


async def test_a_dropped_watch_counts_as_dropped(api: FakeKubeApi, start: Start, metrics: RouterMetrics) -> None:
    await synced_on_one_pod(api, start)
    await eventually(lambda: api.open_watches == 1, CONVERGE_S)
    api.drop_watches()
    await eventually(lambda: rewatches(metrics, RewatchCause.DROPPED) == 1, CONVERGE_S)


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
async def test_api_connections_carry_tcp_keepalive(api: FakeKubeApi, start: Start) -> None:
    await synced_on_one_pod(api, start)
    await eventually(lambda: api.open_watches == 1, CONVERGE_S)
    out = (await asyncio.to_thread(
        subprocess.run, ["ss", "-tnoH", "state", "established", "dst", f"127.0.0.1:{api.port}"],
        capture_output=True, text=True, timeout=10,
    )).stdout
    assert out.strip(), "no client connection to the API"
    assert all("keepalive" in line for line in out.splitlines()), out


def test_keepalive_socket_sets_client_go_options() -> None:
    import socket

    sock = keepalive_socket((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", 1)))
    with sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == dc.TCP_KEEPALIVE_IDLE_S
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == dc.TCP_KEEPALIVE_INTERVAL_S
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == dc.TCP_KEEPALIVE_PROBES


# ---------------------------------------------------------------------------
# Retry-After
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("status", [429, 503])
async def test_throttled_requests_wait_what_retry_after_says(
    api: FakeKubeApi, start: Start, recorder: SnapshotRecorder, metrics: RouterMetrics, status: int,
) -> None:
    api.fail_next(status, 3, retry_after="1")
    api.upsert(pods_slice("s-a", {"stargate-0": "10.0.0.1"}))
    source = start(backoff=(0.05, 0.05))  # the backoff alone would retry 20 times a second
    await asyncio.wait_for(source.synced.wait(), CONVERGE_S + 3)
    lists = api.requests_of("list")
    assert [r.status for r in lists] == [status] * 3 + [200]
    gaps = [b.at - a.at for a, b in itertools.pairwise(lists)]
    assert all(gap >= 1.0 for gap in gaps), gaps
    assert updates(metrics, "error") == 3


def test_parse_retry_after() -> None:
    assert parse_retry_after("1") == 1.0
    assert parse_retry_after(" 120 ") == 120.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-1") is None
    assert parse_retry_after("9" * 5000) == 1e9
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None  # a date needs the wall clock


@given(st.text(max_size=64))
def test_parse_retry_after_never_raises(value: str) -> None:
    result = parse_retry_after(value, now=0.0)
    assert result is None or (math.isfinite(result) and result >= 0)


@given(st.floats(allow_nan=True), st.floats(min_value=-1, max_value=2) | st.just(math.nan))
def test_retry_after_delay_is_never_early_and_capped(retry_after: float, r: float) -> None:
    delay = retry_after_delay(retry_after, dc.BACKOFF_MAX_S, lambda: r)
    asked = min(retry_after, dc.BACKOFF_MAX_S) if retry_after >= 0 else 0.0
    assert delay >= asked
    assert dc.RETRY_AFTER_MIN_S <= delay <= dc.BACKOFF_MAX_S * (1 + dc.RETRY_AFTER_JITTER)
