"""EndpointsFileSource: publish on change, keep the last good snapshot on a bad file, never crash."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import yaml

from discovery import constants as dc
from discovery import file_source
from discovery.file_source import EndpointsFileSource, load_endpoints_file
from discovery.settings import DiscoverySettings
from router import constants as c
from router.app import MetricsDiscoveryObserver
from router.metrics import RouterMetrics
from tests.support.fake_kube_api import make_endpoint, make_slice
from tests.support.polling import eventually
from tests.support.snapshot_recorder import SnapshotRecorder

SETTINGS = DiscoverySettings("stargate", "stargate-headless", "grpc", "quic")
POLL_S = 0.05
Start = Callable[[EndpointsFileSource], None]


def write(path: Path, pods: dict[str, str], *, as_json: bool = False) -> None:
    """Replace the file atomically (as a careful writer would) with one slice of ``pods``."""
    slice_ = make_slice("s", [make_endpoint(name, address) for name, address in pods.items()])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"kind": "List", "items": [slice_]}) if as_json else yaml.safe_dump(slice_))
    os.replace(tmp, path)


def updates(metrics: RouterMetrics, result: str) -> float:
    value = metrics.registry.get_sample_value(
        f"{c.DISCOVERY_UPDATES_TOTAL}_total", {"source": "file", "result": result},
    )
    return value or 0.0


def gauge(metrics: RouterMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


@pytest.fixture
async def running() -> AsyncIterator[Start]:
    tasks: list[asyncio.Task[None]] = []

    def start(source: EndpointsFileSource) -> None:
        tasks.append(asyncio.create_task(source.run()))

    yield start
    for task in tasks:
        task.cancel()
    for task in tasks:
        with pytest.raises(asyncio.CancelledError):
            await task


def test_load_once_publishes_the_files_targets_and_marks_synced(
    tmp_path: Path, recorder: SnapshotRecorder, metrics: RouterMetrics,
) -> None:
    path = tmp_path / "endpoints.yaml"
    write(path, {"stargate-0": "10.0.0.1", "stargate-1": "fd00::2"})
    source = EndpointsFileSource(SETTINGS, recorder, MetricsDiscoveryObserver(metrics), path=path)
    assert gauge(metrics, c.DISCOVERY_LAST_SYNC_AGE_SECONDS) == -1
    assert source.load_once() is True
    assert recorder.pod_names == ["stargate-0", "stargate-1"]
    assert source.synced.is_set()
    assert source.last_sync_monotonic is not None
    assert updates(metrics, "published") == 1
    assert gauge(metrics, c.READY_TARGETS) == 2
    age = gauge(metrics, c.DISCOVERY_LAST_SYNC_AGE_SECONDS)
    assert age is not None and 0 <= age < 60


@pytest.mark.parametrize("content", [None, "key: [unclosed", "- not\n- a slice\n", b"\xff\xfe\x00bad utf-8"])
def test_load_once_on_a_missing_or_unusable_file_fails_without_publishing(
    tmp_path: Path, recorder: SnapshotRecorder, metrics: RouterMetrics, content: str | bytes | None,
) -> None:
    path = tmp_path / "endpoints.yaml"
    if isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    source = EndpointsFileSource(SETTINGS, recorder, MetricsDiscoveryObserver(metrics), path=path)
    assert source.load_once() is False
    assert recorder.published == []
    assert not source.synced.is_set()
    assert updates(metrics, "error") == 1


def test_a_directory_or_oversized_file_is_refused(tmp_path: Path) -> None:
    assert load_endpoints_file(tmp_path, SETTINGS).snapshot is None
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(dc.ENDPOINTS_FILE_MAX_BYTES + 1)  # sparse: costs no disk
    load = load_endpoints_file(big, SETTINGS)
    assert load.snapshot is None and load.error is not None and "larger than" in load.error


async def synced_source(
    tmp_path: Path, recorder: SnapshotRecorder, metrics: RouterMetrics | None, running: Start,
) -> tuple[Path, EndpointsFileSource]:
    """A running source over an endpoints file naming stargate-0, once it has synced."""
    path = tmp_path / "endpoints.yaml"
    write(path, {"stargate-0": "10.0.0.1"})
    source = EndpointsFileSource(
        SETTINGS, recorder, MetricsDiscoveryObserver(metrics) if metrics else None, path=path, poll_interval_s=POLL_S,
    )
    running(source)
    await asyncio.wait_for(source.synced.wait(), 3)
    return path, source


async def test_run_republishes_when_the_file_changes(
    tmp_path: Path, recorder: SnapshotRecorder, running: Start,
) -> None:
    path, _source = await synced_source(tmp_path, recorder, None, running)
    assert recorder.pod_names == ["stargate-0"]
    write(path, {"stargate-0": "10.0.0.1", "stargate-1": "10.0.0.2"})  # scale up
    await eventually(lambda: recorder.pod_names == ["stargate-0", "stargate-1"], 3)
    write(path, {"stargate-1": "10.0.0.2"}, as_json=True)  # scale down, now in JSON
    await eventually(lambda: recorder.pod_names == ["stargate-1"], 3)


async def test_in_place_rewrite_is_noticed(
    tmp_path: Path, recorder: SnapshotRecorder, running: Start,
) -> None:
    path, _source = await synced_source(tmp_path, recorder, None, running)
    text = path.read_text().replace("10.0.0.1", "10.0.0.9")  # same size, same inode
    path.write_text(text)
    await eventually(lambda: recorder.address_of("stargate-0") == "10.0.0.9", 3)


async def test_configmap_style_symlink_swap_is_noticed(
    tmp_path: Path, recorder: SnapshotRecorder, running: Start,
) -> None:
    for version, pods in (("v1", {"a": "10.0.0.1"}), ("v2", {"b": "10.0.0.2"})):
        (tmp_path / version).mkdir()
        write(tmp_path / version / "endpoints.yaml", pods)
    data = tmp_path / "..data"
    data.symlink_to("v1")
    path = tmp_path / "endpoints.yaml"
    path.symlink_to("..data/endpoints.yaml")
    source = EndpointsFileSource(SETTINGS, recorder, path=path, poll_interval_s=POLL_S)
    running(source)
    await eventually(lambda: recorder.pod_names == ["a"], 3)
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", data)
    await eventually(lambda: recorder.pod_names == ["b"], 3)


async def test_unchanged_targets_are_not_republished(
    tmp_path: Path, recorder: SnapshotRecorder, metrics: RouterMetrics, running: Start,
) -> None:
    path, _source = await synced_source(tmp_path, recorder, metrics, running)
    write(path, {"stargate-0": "10.0.0.1"}, as_json=True)  # a new file, the same targets
    await eventually(lambda: updates(metrics, "unchanged") == 1, 3)
    assert len(recorder.published) == 1
    assert updates(metrics, "published") == 1


@pytest.fixture
def polls(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """How many polls the source has begun (each looks at the file once): ``n + 1`` begun is ``n`` done."""
    begun = [0]
    looks = file_source.stat_identity

    def counted(path: Path) -> file_source.FileIdentity | None:
        begun[0] += 1
        return looks(path)

    monkeypatch.setattr(file_source, "stat_identity", counted)
    return lambda: begun[0]


async def test_broken_file_keeps_the_last_good_snapshot_logged_once_and_counted(
    tmp_path: Path, recorder: SnapshotRecorder, metrics: RouterMetrics, running: Start,
    caplog: pytest.LogCaptureFixture, polls: Callable[[], int],
) -> None:
    path, _source = await synced_source(tmp_path, recorder, metrics, running)
    with caplog.at_level(logging.WARNING, logger="discovery.file_source"):
        path.write_text("items: [unclosed")
        await eventually(lambda: updates(metrics, "error") == 1, 3)
        broken_at = polls()
        await eventually(lambda: polls() > broken_at + 10, 3, what="ten polls of the same broken file")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    assert updates(metrics, "error") == 1
    assert recorder.pod_names == ["stargate-0"] and len(recorder.published) == 1
    assert gauge(metrics, c.READY_TARGETS) == 1
    write(path, {"stargate-1": "10.0.0.2"})  # fixed
    await eventually(lambda: recorder.pod_names == ["stargate-1"], 3)


async def test_deleted_file_keeps_the_last_good_snapshot_and_sync_age_grows(
    tmp_path: Path, recorder: SnapshotRecorder, metrics: RouterMetrics, running: Start, polls: Callable[[], int],
) -> None:
    path, source = await synced_source(tmp_path, recorder, metrics, running)
    path.unlink()
    await eventually(lambda: updates(metrics, "error") == 1, 3)
    synced_at = source.last_sync_monotonic
    deleted_at = polls()
    await eventually(lambda: polls() > deleted_at + 5, 3, what="five polls without the file")
    assert source.last_sync_monotonic == synced_at  # no longer confirmed
    assert recorder.pod_names == ["stargate-0"]
    write(path, {"stargate-0": "10.0.0.1"})
    await eventually(lambda: source.last_sync_monotonic != synced_at, 3)
    assert len(recorder.published) == 1


async def test_file_appearing_after_start_is_picked_up_and_marks_synced(
    tmp_path: Path, recorder: SnapshotRecorder, running: Start, polls: Callable[[], int],
) -> None:
    path = tmp_path / "endpoints.yaml"
    source = EndpointsFileSource(SETTINGS, recorder, path=path, poll_interval_s=POLL_S)
    assert source.load_once() is False
    running(source)
    await eventually(lambda: polls() > 3, 3, what="three polls without the file")
    assert not source.synced.is_set()
    write(path, {"stargate-0": "10.0.0.1"})
    await asyncio.wait_for(source.synced.wait(), 3)
    assert recorder.pod_names == ["stargate-0"]


def test_poll_interval_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        EndpointsFileSource(SETTINGS, lambda s: None, path=tmp_path / "x", poll_interval_s=0)


async def test_file_that_vanishes_and_comes_back_unchanged_is_confirmed_again_within_a_poll(
    tmp_path: Path, recorder: SnapshotRecorder, metrics: RouterMetrics, running: Start,
) -> None:
    """A writer that removes then re-creates the file (not an atomic rename): same content back."""
    path, source = await synced_source(tmp_path, recorder, metrics, running)
    aside = tmp_path / "aside.yaml"
    os.rename(path, aside)
    await eventually(lambda: updates(metrics, "error") == 1, 3)
    synced_at = source.last_sync_monotonic
    os.rename(aside, path)  # the very same file (inode, size, mtime) is back
    await eventually(lambda: source.last_sync_monotonic != synced_at, 3)
    assert updates(metrics, "unchanged") >= 1
    assert len(recorder.published) == 1 and recorder.pod_names == ["stargate-0"]


def configmap_volume(root: Path, version: str, pods: dict[str, str]) -> None:
    """Write ``pods`` as the kubelet updates a ConfigMap volume: a new timestamped directory, then
    an atomic swap of the ``..data`` symlink; ``endpoints.yaml`` -> ``..data/endpoints.yaml`` stays."""
    target = root / f"..{version}"
    target.mkdir()
    write(target / "endpoints.yaml", pods)
    tmp_link = root / "..data_tmp"
    tmp_link.symlink_to(target.name)
    old = os.readlink(root / "..data") if (root / "..data").is_symlink() else None
    os.replace(tmp_link, root / "..data")
    if old is not None:
        shutil.rmtree(root / old)
    if not (root / "endpoints.yaml").is_symlink():
        (root / "endpoints.yaml").symlink_to("..data/endpoints.yaml")


async def test_configmap_style_symlink_swap_is_picked_up_within_a_poll(
    tmp_path: Path, recorder: SnapshotRecorder, metrics: RouterMetrics, running: Start,
) -> None:
    configmap_volume(tmp_path, "2026_11_30_01", {"stargate-0": "10.0.0.1"})
    path = tmp_path / "endpoints.yaml"
    source = EndpointsFileSource(
        SETTINGS, recorder, MetricsDiscoveryObserver(metrics), path=path, poll_interval_s=POLL_S,
    )
    running(source)
    await asyncio.wait_for(source.synced.wait(), 3)
    for n, pods in enumerate(({"stargate-1": "10.0.0.2"}, {"stargate-1": "10.0.0.3"}, {"stargate-0": "10.0.0.1"})):
        configmap_volume(tmp_path, f"2026_11_30_0{n + 2}", pods)
        await eventually(lambda pods=pods: {p: recorder.address_of(p) for p in recorder.pods} == pods, 3)
    assert updates(metrics, "error") == 0
    assert len(recorder.published) == 4
