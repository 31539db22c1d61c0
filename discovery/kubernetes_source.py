"""Discovery from the Kubernetes API: list, then watch, the EndpointSlices of one Service.

The raw JSON of every list and watch event is kept (``_preload_content=False``), so the
slices reach the same pure ``targets_from_slices`` as the file source's, and BOOKMARK
and ERROR events are seen as they are. The loop is the usual reflector:

* list (label selector ``kubernetes.io/service-name=<service>``), replace the store whole;
* watch from the list's resourceVersion with bookmarks; every event (BOOKMARK included)
  advances the resourceVersion; a stream that ends or drops is re-watched from it;
* 410 Gone (an ERROR event or the HTTP status) means that resourceVersion was compacted:
  re-list, and the store is replaced atomically only once the list is complete;
* any other failure (403, 5xx, refused, timeouts, garbage) is retried with capped
  exponential backoff; the last good snapshot keeps serving meanwhile.

Never a hot loop: a retry is immediate only after a *healthy* watch (one that delivered
an event or stayed open WATCH_HEALTHY_AFTER_S); everything else waits for the backoff.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from discovery.backoff import Backoff
from discovery.constants import (
    KUBE_API_CONNECT_TIMEOUT_S,
    KUBE_LIST_TIMEOUT_S,
    SERVICE_NAME_LABEL,
    WATCH_HEALTHY_AFTER_S,
    WATCH_READ_SLACK_S,
    WATCH_TIMEOUT_S,
)
from discovery.endpoint_slices import EndpointSliceError
from discovery.observer import DiscoveryObserver
from discovery.settings import DiscoverySettings
from discovery.slice_store import SliceStore
from discovery.targets import TargetSnapshot

logger = logging.getLogger("discovery.kubernetes_source")  # pinned: operators filter logs by this name

SOURCE_LABEL = "kubernetes"
EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})
HTTP_GONE = 410
IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"


class KubeApiResponseError(ValueError):
    """A list body or watch line that is not what the API server sends."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One line of a watch stream."""

    type: str
    object: dict[str, Any]
    resource_version: str | None
    status_code: int | None = None
    """For ERROR events: the Status code (410 = the resourceVersion is gone)."""


def parse_watch_event(line: bytes | str) -> WatchEvent:
    """Parse one newline-delimited JSON watch event."""
    data = _json_object(line, "watch event")
    event_type, obj = data.get("type"), data.get("object")
    if not isinstance(event_type, str) or event_type not in EVENT_TYPES:
        raise KubeApiResponseError(f"watch event has unknown type {event_type!r:.40}")
    if not isinstance(obj, dict):
        raise KubeApiResponseError(f"{event_type} event has no object")
    if event_type == "ERROR":
        code = obj.get("code")
        return WatchEvent(event_type, obj, None, code if type(code) is int else None)
    resource_version = _resource_version(obj)
    if event_type == "BOOKMARK" and resource_version is None:
        raise KubeApiResponseError("BOOKMARK event has no resourceVersion")
    return WatchEvent(event_type, obj, resource_version)


def parse_slice_list(body: bytes | str) -> tuple[list[dict[str, Any]], str]:
    """The items and resourceVersion of an EndpointSliceList."""
    data = _json_object(body, "list")
    items = data.get("items")
    if items is None:
        items = []
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise KubeApiResponseError("list items must be a list of objects")
    resource_version = _resource_version(data)
    if resource_version is None:
        raise KubeApiResponseError("list has no metadata.resourceVersion")
    return items, resource_version


def _json_object(text: bytes | str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise KubeApiResponseError(f"{what} is not JSON: {exc!s:.80}") from None
    if not isinstance(data, dict):
        raise KubeApiResponseError(f"{what} is not a JSON object")
    return data


def _resource_version(obj: dict[str, Any]) -> str | None:
    metadata = obj.get("metadata")
    value = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
    return value if isinstance(value, str) and value else None


class ApiStatusError(Exception):
    """The API server answered with an error status (or an ERROR event other than 410)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


class _Gone(Exception):
    """The resourceVersion we hold was compacted away: re-list."""


class KubernetesSource:
    """Keeps a snapshot of the Service's ready pods current from the API server."""

    def __init__(
        self,
        settings: DiscoverySettings,
        publish: Callable[[TargetSnapshot], None],
        observer: DiscoveryObserver | None = None,
        *,
        kubeconfig: Path | None = None,
        backoff: Backoff | None = None,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._publish = publish
        self._observer = observer
        self._kubeconfig = kubeconfig
        self._backoff = backoff if backoff is not None else Backoff()
        self._watch_timeout_s = watch_timeout_s
        self._clock = clock
        self._store = SliceStore(settings)
        self._selector = f"{SERVICE_NAME_LABEL}={settings.service_name}"
        self._published: TargetSnapshot | None = None
        self._resource_version: str | None = None
        self._failing = False
        self._last_watch_healthy = False
        self.synced = asyncio.Event()
        self.last_sync_monotonic: float | None = None
        if observer is not None:
            observer.synced(SOURCE_LABEL, self.sync_age_s)

    @property
    def resource_version(self) -> str | None:
        """The resourceVersion the next watch resumes from (None: a list comes first)."""
        return self._resource_version

    def sync_age_s(self) -> float:
        """Seconds since the API last confirmed our view (list, watch accepted, event); -1 before."""
        if self.last_sync_monotonic is None:
            return -1.0
        return max(0.0, self._clock() - self.last_sync_monotonic)

    async def run(self) -> None:
        """List and watch until cancelled; API and data errors are retried, never raised."""
        api_client = await self._connect()
        try:
            api = client.DiscoveryV1Api(api_client)
            while True:
                healthy = False
                try:
                    if self._resource_version is None:
                        await self._list(api)
                    healthy = await self._watch(api)
                except _Gone:
                    logger.info("EndpointSlice watch expired (410); re-listing")
                    self._resource_version = None
                    healthy = self._last_watch_healthy
                except asyncio.CancelledError:
                    raise
                except (KubeApiResponseError, EndpointSliceError) as exc:
                    self._failed(exc)
                    self._resource_version = None  # the stream cannot be trusted past this point
                    healthy = self._last_watch_healthy
                except Exception as exc:  # API statuses, connection errors, timeouts, anything else
                    self._failed(exc)
                    healthy = self._last_watch_healthy
                if healthy:
                    self._backoff.reset()
                else:
                    await asyncio.sleep(self._backoff.next_delay())
        finally:
            await api_client.close()

    async def _connect(self) -> Any:
        """An ApiClient on a fresh Configuration (never the global default); retried until it loads."""
        while True:
            cfg = client.Configuration()
            try:
                if self._kubeconfig is not None:
                    await config.load_kube_config(
                        config_file=str(self._kubeconfig), client_configuration=cfg, persist_config=False,
                    )
                elif os.environ.get(IN_CLUSTER_ENV):
                    config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
                else:
                    await config.load_kube_config(client_configuration=cfg, persist_config=False)
                return client.ApiClient(cfg)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # missing/invalid kubeconfig or service-account files
                self._failed(exc)
                await asyncio.sleep(self._backoff.next_delay())

    async def _list(self, api: Any) -> None:
        self._last_watch_healthy = False
        response = await api.list_namespaced_endpoint_slice(
            self._settings.namespace, label_selector=self._selector, _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(
                total=KUBE_LIST_TIMEOUT_S, connect=KUBE_API_CONNECT_TIMEOUT_S,
            ),
        )
        try:
            body = await response.read()
        finally:
            response.release()
        if response.status != 200:
            raise ApiStatusError(response.status, _status_detail(body))
        slices, resource_version = parse_slice_list(body)
        self._store.replace_all(slices)  # atomic: the old set serves until the list is complete
        self._resource_version = resource_version
        self._synced_now()
        self._derive("list")
        self.synced.set()

    async def _watch(self, api: Any) -> bool:
        """One watch stream; True when it ended cleanly after being healthy."""
        self._last_watch_healthy = False
        started = self._clock()
        response = await api.list_namespaced_endpoint_slice(
            self._settings.namespace, label_selector=self._selector, watch=True,
            resource_version=self._resource_version, allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout_s, _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(
                total=None, connect=KUBE_API_CONNECT_TIMEOUT_S,
                sock_read=self._watch_timeout_s + WATCH_READ_SLACK_S,
            ),
        )
        accepted = False
        try:
            if response.status != 200:
                body = await response.read()
                if response.status == HTTP_GONE:
                    raise _Gone()
                raise ApiStatusError(response.status, _status_detail(body))
            accepted = True
            self._synced_now()
            while True:
                line = await response.content.readline()
                if not line:
                    self._synced_now()  # the server's timeout: everything up to now was delivered
                    break
                if line.strip():
                    self._handle(parse_watch_event(line))
        finally:
            response.release()
            if accepted and self._clock() - started >= WATCH_HEALTHY_AFTER_S:
                self._last_watch_healthy = True  # however it ended, it was a working stream
        return self._last_watch_healthy

    def _handle(self, event: WatchEvent) -> None:
        if event.type == "ERROR":
            message = event.object.get("message")
            if event.status_code == HTTP_GONE:
                raise _Gone()
            raise ApiStatusError(event.status_code or 0, f"watch ERROR event: {message!s:.200}")
        self._last_watch_healthy = True
        self._synced_now()
        if event.type == "ADDED" or event.type == "MODIFIED":
            self._store.apply(event.object)
        elif event.type == "DELETED":
            self._store.delete(event.object)
        if event.resource_version is not None:
            self._resource_version = event.resource_version
        if event.type != "BOOKMARK":
            self._derive(event.type)

    def _derive(self, why: str) -> None:
        """Publish the store's snapshot if it differs from the last one published."""
        snapshot = self._store.snapshot()
        if snapshot == self._published:
            if self._observer is not None:
                self._observer.unchanged(SOURCE_LABEL)
            return
        self._published = snapshot
        self._publish(snapshot)
        if self._observer is not None:
            self._observer.published(SOURCE_LABEL, len(snapshot))
        logger.info("EndpointSlices (%s): %d ready targets", why, len(snapshot))

    def _failed(self, exc: BaseException) -> None:
        if self._observer is not None:
            self._observer.error(SOURCE_LABEL)
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        # The first failure of a streak is a warning; retries during an outage stay at debug.
        level = logging.DEBUG if self._failing else logging.WARNING
        logger.log(level, "EndpointSlice discovery failed (%s: %s); keeping the last snapshot",
                   type(exc).__name__, detail)
        self._failing = True

    def _synced_now(self) -> None:
        if self._failing:
            logger.info("EndpointSlice discovery recovered")
            self._failing = False
        self.last_sync_monotonic = self._clock()


def _status_detail(body: bytes) -> str:
    """The message of a Kubernetes Status body, or the start of whatever came instead."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body[:200].decode("utf-8", "replace")
    message = data.get("message") if isinstance(data, dict) else None
    return str(message)[:200] if message is not None else str(data)[:200]
