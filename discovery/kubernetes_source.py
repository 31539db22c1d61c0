"""Discovery from the Kubernetes API: list, then watch, the EndpointSlices of one Service (a reflector).

Raw JSON is kept (``_preload_content=False``) so slices reach the same ``targets_from_slices`` as the
file's, and BOOKMARK and ERROR events are seen as sent. Every event (BOOKMARK too) advances the
resourceVersion; an ended, dropped or idle watch resumes from it (a half-open connection must not
freeze routing). 410 Gone (ERROR event or status) means it was compacted: re-list at once, replacing
the store only once the list is complete. Never a hot loop: a retry is immediate only after a healthy
watch (an event, or open WATCH_HEALTHY_AFTER_S), an idle replacement or a first 410; all else backs
off while the last good snapshot serves (retry policy: docs/operating.md).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from discovery.backoff import Backoff, retry_after_delay
from discovery.constants import (
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    KUBE_API_CONNECT_TIMEOUT_S,
    KUBE_LIST_TIMEOUT_S,
    RECONNECT_BACKOFF_MAX_S,
    SERVICE_NAME_LABEL,
    TCP_KEEPALIVE_IDLE_S,
    TCP_KEEPALIVE_INTERVAL_S,
    TCP_KEEPALIVE_PROBES,
    WATCH_HEALTHY_AFTER_S,
    WATCH_READ_SLACK_S,
    WATCH_TIMEOUT_S,
)
from discovery.endpoint_slices import EndpointSliceError
from discovery.kube_config import load_configuration
from discovery.kube_wire import (
    ApiStatusError,
    KubeApiResponseError,
    WatchEvent,
    parse_retry_after,
    parse_slice_list,
    parse_watch_event,
    status_detail,
)
from discovery.observer import DiscoveryObserver, RewatchCause
from discovery.settings import DiscoverySettings
from discovery.slice_store import SliceStore
from discovery.targets import TargetSnapshot

__all__ = [
    "ApiStatusError", "KubeApiResponseError", "KubernetesSource", "WatchEvent",
    "keepalive_socket", "parse_slice_list", "parse_watch_event",
]

logger = logging.getLogger("discovery.kubernetes_source")  # pinned: operators filter logs by this name

SOURCE_LABEL = "kubernetes"
RETRY_AFTER_STATUSES = frozenset({HTTPStatus.TOO_MANY_REQUESTS, HTTPStatus.SERVICE_UNAVAILABLE})
CONNECTION_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)
"""The connection failed (refused, reset, dropped mid-stream, timed out) rather than the API answering."""


class _Gone(Exception):
    """The resourceVersion we hold was compacted away: re-list."""


def keepalive_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """aiohttp's ``socket_factory``: a TCP socket with keepalive as client-go dials it."""
    family, type_, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", TCP_KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", TCP_KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", TCP_KEEPALIVE_PROBES)):
        option = getattr(socket, name, None)  # Linux has all three; elsewhere the OS defaults apply
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    return sock


class KubernetesSource:
    """Keeps a snapshot of the Service's ready pods current from the API server."""

    def __init__(
        self,
        settings: DiscoverySettings,
        publish: Callable[[TargetSnapshot], None],
        observer: DiscoveryObserver | None = None,
        *,
        watch_idle_timeout_s: float,
        kubeconfig: Path | None = None,
        backoff: Backoff | None = None,
        reconnect_backoff: Backoff | None = None,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not watch_idle_timeout_s > 0:
            raise ValueError(f"watch_idle_timeout_s must be > 0, got {watch_idle_timeout_s!r}")
        self._settings = settings
        self._publish = publish
        self._observer = observer
        self._kubeconfig = kubeconfig
        self._backoff = backoff if backoff is not None else Backoff()
        self._reconnect_backoff = reconnect_backoff if reconnect_backoff is not None else Backoff(
            BACKOFF_INITIAL_S, RECONNECT_BACKOFF_MAX_S,
        )
        self._watch_idle_timeout_s = watch_idle_timeout_s
        self._watch_timeout_s = watch_timeout_s
        self._clock = clock
        self._store = SliceStore(settings)
        self._selector = f"{SERVICE_NAME_LABEL}={settings.service_name}"
        self._published: TargetSnapshot | None = None
        self._resource_version: str | None = None
        self._failing = False
        self._last_watch_healthy = False
        self._watch_accepted = False
        self._gone_pending = False
        """A 410 was answered with a re-list and no watch has worked since: a second is not progress."""
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
                delay = await self._step(api)
                if delay > 0:
                    await asyncio.sleep(delay)
        finally:
            await api_client.close()

    async def _step(self, api: Any) -> float:
        """One list (when needed) and one watch; returns the seconds to wait before the next."""
        self._watch_accepted = False
        try:
            if self._resource_version is None:
                await self._list(api)
            cause = await self._watch(api)
        except _Gone:
            self._answered()
            self._resource_version = None
            self._rewatched(RewatchCause.EXPIRED, "watch expired (410); re-listing")
            if self._gone_pending:  # list, watch, 410 again with nothing in between: wait a little
                return self._backoff.next_delay()
            self._gone_pending = True
            return 0.0
        except asyncio.CancelledError:
            raise
        except ApiStatusError as exc:
            self._failed(exc)
            if exc.retry_after_s is not None and exc.status in RETRY_AFTER_STATUSES:
                return retry_after_delay(exc.retry_after_s, BACKOFF_MAX_S)
            return self._after_failure()
        except (KubeApiResponseError, EndpointSliceError) as exc:
            self._failed(exc)
            self._resource_version = None  # the stream cannot be trusted past this point
            return self._after_failure()
        except CONNECTION_ERRORS as exc:
            self._failed(exc)
            if isinstance(exc, aiohttp.ClientSSLError):  # reached, but TLS failed: no reconnect will fix it
                return self._after_failure()
            return self._after_failure(self._reconnect_backoff)
        except Exception as exc:  # connection drops, read timeouts, anything else
            self._failed(exc)
            return self._after_failure()
        self._gone_pending = False
        self._rewatched(cause, "watch ended by the server" if cause is RewatchCause.ENDED
                        else f"no event or bookmark for {self._watch_idle_timeout_s:g}s; re-watching")
        if cause is RewatchCause.IDLE or self._last_watch_healthy:
            return 0.0
        return self._backoff.next_delay()

    def _after_failure(self, backoff: Backoff | None = None) -> float:
        if self._watch_accepted:
            self._gone_pending = False  # the watch from the re-list worked until it broke
            self._rewatched(RewatchCause.DROPPED, "watch stream broke")
        if self._last_watch_healthy:
            return 0.0
        return (backoff or self._backoff).next_delay()

    async def _connect(self) -> Any:
        """An ApiClient on a fresh Configuration (never the global default); retried until it loads."""
        while True:
            try:
                cfg = await load_configuration(self._kubeconfig)
                api_client = client.ApiClient(cfg)
                _install_keepalive(api_client)
                return api_client
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
        if response.status != HTTPStatus.OK:
            raise _status_error(response, body)
        slices, resource_version = parse_slice_list(body)
        self._answered()
        self._store.replace_all(slices)  # atomic: the old set serves until the list is complete
        self._resource_version = resource_version
        self._synced_now()
        self._derive("list")
        self.synced.set()

    async def _watch(self, api: Any) -> RewatchCause:
        """One watch stream until it ends (ENDED) or stays silent for the idle timeout (IDLE)."""
        self._last_watch_healthy = False
        started = self._clock()
        idle_s = self._watch_idle_timeout_s
        loop = asyncio.get_running_loop()
        response: Any = None
        try:
            async with asyncio.timeout(idle_s) as idle:
                response = await api.list_namespaced_endpoint_slice(
                    self._settings.namespace, label_selector=self._selector, watch=True,
                    resource_version=self._resource_version, allow_watch_bookmarks=True,
                    timeout_seconds=self._watch_timeout_s, _preload_content=False,
                    _request_timeout=aiohttp.ClientTimeout(
                        total=None, connect=KUBE_API_CONNECT_TIMEOUT_S,
                        sock_read=self._watch_timeout_s + WATCH_READ_SLACK_S,
                    ),
                )
                if response.status != HTTPStatus.OK:
                    body = await response.read()
                    if response.status == HTTPStatus.GONE:
                        raise _Gone()
                    raise _status_error(response, body)
                self._watch_accepted = True
                self._answered()
                self._synced_now()
                while True:
                    line = await response.content.readline()
                    idle.reschedule(loop.time() + idle_s)
                    if not line:
                        self._synced_now()  # the server's timeout: everything up to now was delivered
                        return RewatchCause.ENDED
                    if line.strip():
                        self._handle(parse_watch_event(line))
        except TimeoutError:
            if not idle.expired():
                raise  # aiohttp's own read timeout, not the watchdog
            if response is not None:
                response.close()  # drop the silent connection; never hand it back to the pool
                response = None
            return RewatchCause.IDLE
        finally:
            if response is not None:
                response.release()
            if self._watch_accepted and self._clock() - started >= WATCH_HEALTHY_AFTER_S:
                self._last_watch_healthy = True  # however it ended, it was a working stream
                self._gone_pending = False

    def _handle(self, event: WatchEvent) -> None:
        if event.type == "ERROR":
            message = event.object.get("message")
            if event.status_code == HTTPStatus.GONE:
                raise _Gone()
            raise ApiStatusError(event.status_code or 0, f"watch ERROR event: {message!s:.200}")
        self._last_watch_healthy = True
        self._gone_pending = False
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

    def _answered(self) -> None:
        """The API answered (a list, an accepted watch, a 410): it is up, so retries start afresh."""
        self._backoff.reset()
        self._reconnect_backoff.reset()

    def _rewatched(self, cause: RewatchCause, why: str) -> None:
        if self._observer is not None:
            self._observer.rewatched(SOURCE_LABEL, cause)
        # A server-side timeout every WATCH_TIMEOUT_S is routine; every other cause is news.
        level = logging.DEBUG if cause is RewatchCause.ENDED else logging.INFO
        logger.log(level, "EndpointSlice %s (cause=%s, resourceVersion=%s)", why, cause,
                   self._resource_version, extra={"cause": str(cause)})

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


def _status_error(response: Any, body: bytes) -> ApiStatusError:
    retry_after = parse_retry_after(response.headers.get("Retry-After"), time.time())
    return ApiStatusError(response.status, status_detail(body), retry_after)


def _install_keepalive(api_client: Any) -> None:
    """TCP keepalive on every API connection: kubernetes-asyncio builds its own aiohttp
    connector, so its socket factory is set before the first dial (verified by a test)."""
    connector = api_client.rest_client.pool_manager.connector
    if hasattr(connector, "_socket_factory"):
        connector._socket_factory = keepalive_socket
    else:  # pragma: no cover - an aiohttp without socket_factory
        logger.warning("aiohttp connector has no socket factory; API connections run without keepalive")
