"""A loopback Kubernetes API server for EndpointSlices that speaks list/watch faithfully.

Real aiohttp server on 127.0.0.1, driven by the real kubernetes-asyncio client. It keeps
a global resourceVersion (RV) bumped by every write, an event history for watches to
replay from any RV, and the test controls the faults: compaction (old RVs -> 410, also
while the server is down), HTTP errors for the next N requests (429/503 with Retry-After:
a throttle), streams cut mid-event, frozen streams (open, silent: a half-open connection),
periodic bookmarks, an outage on the same port, latency. Every request is recorded so a
test can check what the client asked for.

Also here: ``make_slice`` / ``make_endpoint``, the EndpointSlice builders the tests share.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from discovery.constants import SERVICE_NAME_LABEL
from tests.support.polling import deliberate_pause

API_PREFIX = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"


# ---------------------------------------------------------------------------
# EndpointSlice builders
# ---------------------------------------------------------------------------
def make_endpoint(
    pod: str | None,
    address: str,
    *,
    ready: bool | None = True,
    serving: bool | None = True,
    terminating: bool | None = False,
    kind: str | None = "Pod",
) -> dict[str, Any]:
    """One endpoint as the EndpointSlice controller writes it (None leaves a field absent)."""
    conditions = {k: v for k, v in (("ready", ready), ("serving", serving), ("terminating", terminating))
                  if v is not None}
    endpoint: dict[str, Any] = {"addresses": [address], "conditions": conditions}
    if pod is not None:
        ref: dict[str, Any] = {"name": pod, "namespace": "stargate"}
        if kind is not None:
            ref["kind"] = kind
        endpoint["targetRef"] = ref
    return endpoint


def make_slice(
    name: str,
    endpoints: list[Any],
    *,
    service: str = "stargate-headless",
    grpc_port: int = 50051,
    quic_port: int = 50052,
    ports: list[dict[str, Any]] | None = None,
    namespace: str = "stargate",
) -> dict[str, Any]:
    """An EndpointSlice of ``service`` with the default grpc (TCP) and quic (UDP) ports."""
    if ports is None:
        ports = [
            {"name": "grpc", "port": grpc_port, "protocol": "TCP"},
            {"name": "quic", "port": quic_port, "protocol": "UDP"},
        ]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": namespace, "labels": {SERVICE_NAME_LABEL: service}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints,
    }


# ---------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RecordedRequest:
    at: float
    """time.monotonic() when the request arrived."""
    kind: str
    """``list`` or ``watch``."""
    query: dict[str, str]
    status: int


@dataclass(slots=True)
class _Watch:
    namespace: str
    selector: dict[str, str]
    bookmarks: bool
    queue: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    transport: asyncio.Transport | None = None
    hung: bool = False
    """Open but silent from now on: nothing more is written, not even at the server timeout."""


def _parse_selector(text: str) -> dict[str, str]:
    """Equality-based label selector (``k=v``, ``k==v``, comma-separated)."""
    selector: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in text.split(","))):
        key, _, value = term.replace("==", "=").partition("=")
        selector[key.strip()] = value.strip()
    return selector


def _matches(obj: dict[str, Any], namespace: str, selector: dict[str, str]) -> bool:
    metadata = obj.get("metadata", {})
    labels = metadata.get("labels") or {}
    return metadata.get("namespace") == namespace and all(labels.get(k) == v for k, v in selector.items())


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeKubeApi:
    """EndpointSlices in any namespace; list, watch, and the faults a test needs."""

    def __init__(self) -> None:
        self.rv = 1
        self.compacted_rv = 0
        """Watches from an RV below this get 410 Gone (the history before it is compacted)."""
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.requests: list[RecordedRequest] = []
        self.latency_s = 0.0
        self.gone_as_http_status = False
        """Answer a too-old watch with HTTP 410 instead of a 200 stream carrying an ERROR event."""
        self.bookmark_interval_s: float | None = None
        """Send a BOOKMARK to every bookmark watch this often (the API server does about once a minute)."""
        self.hang_new_watches = False
        """New watches are accepted (200, headers) and then stay silent: a frozen stream."""
        self.port = 0
        self._failures: list[tuple[int, str | None]] = []
        self._watches: list[_Watch] = []
        self._frozen = False
        self._cut_next_event = False
        self._runner: web.AppRunner | None = None

    # -- lifecycle ---------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self) -> None:
        """Listen on 127.0.0.1 (a fresh port the first time, the same port after ``stop``)."""
        app = web.Application()
        app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices", self._handle)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        if self.port == 0:
            self.port = int(runner.addresses[0][1])
        self._runner = runner

    async def stop(self) -> None:
        """Go down: cut every open watch and stop listening (connections are then refused)."""
        self._cut_all_watches()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig that points at this server over plain http, no auth."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))
        return path

    # -- object mutations (each bumps the RV and notifies open watches) -----
    def upsert(self, obj: dict[str, Any]) -> int:
        """Create (ADDED) or replace (MODIFIED) a slice; returns its new resourceVersion."""
        obj = copy.deepcopy(obj)
        metadata = obj.setdefault("metadata", {})
        key = (metadata["namespace"], metadata["name"])
        event = "MODIFIED" if key in self.objects else "ADDED"
        self.rv += 1
        metadata["resourceVersion"] = str(self.rv)
        self.objects[key] = obj
        self._record(event, obj)
        return self.rv

    def delete(self, namespace: str, name: str) -> int:
        """Delete a slice (DELETED carries its last state at the new RV)."""
        obj = copy.deepcopy(self.objects.pop((namespace, name)))
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._record("DELETED", obj)
        return self.rv

    def _record(self, event: str, obj: dict[str, Any]) -> None:
        self.history.append((self.rv, event, obj))
        if self._frozen:
            return
        for watch in self._watches:
            if _matches(obj, watch.namespace, watch.selector):
                watch.queue.put_nowait(("event", {"type": event, "object": obj}))

    # -- fault controls ----------------------------------------------------
    def fail_next(self, status: int, count: int = 1, retry_after: str | None = None) -> None:
        """The next ``count`` requests (list or watch) are answered with ``status`` (and ``Retry-After``)."""
        self._failures.extend([(status, retry_after)] * count)

    def throttle(self, count: int, retry_after_s: int = 1) -> None:
        """API Priority and Fairness: the next ``count`` requests get 429 with ``Retry-After``."""
        self.fail_next(429, count, str(retry_after_s))

    def hang_watches(self) -> None:
        """Every open watch goes silent with its connection left open (events are still recorded,
        so a re-watch from the last RV gets them)."""
        for watch in self._watches:
            watch.hung = True

    def freeze_watches(self) -> None:
        """Open watches stop receiving events (a lagging watch cache); follow with ``compact``."""
        self._frozen = True

    def compact(self, expire_open_watches: bool = True) -> None:
        """Compact the history: after one more (unrelated) write, every older RV is gone.

        Open watches get an ERROR 410 event and end, as a watch that fell behind does.
        """
        self.rv += 1  # other cluster activity: the list RV moves past every RV a client holds
        self.compacted_rv = self.rv
        self.history = [entry for entry in self.history if entry[0] >= self.compacted_rv]
        self._frozen = False
        if expire_open_watches:
            for watch in self._watches:
                watch.queue.put_nowait(("gone", None))

    def cut_next_event(self) -> None:
        """The next event to each open watch is sent half, then the connection is dropped."""
        self._cut_next_event = True

    def drop_watches(self) -> None:
        """Drop every open watch connection between events."""
        self._cut_all_watches()

    def send_bookmark(self, unrelated_writes: int = 0) -> int:
        """Advance the RV by ``unrelated_writes`` and send a BOOKMARK at it to bookmark watches."""
        self.rv += unrelated_writes
        for watch in self._watches:
            if watch.bookmarks:
                watch.queue.put_nowait(("event", self._bookmark()))
        return self.rv

    def _bookmark(self) -> dict[str, Any]:
        return {"type": "BOOKMARK", "object": {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
                                               "metadata": {"resourceVersion": str(self.rv)}}}

    def send_raw(self, data: bytes) -> None:
        """Write ``data`` as-is to every open watch (garbage a broken proxy might send)."""
        for watch in self._watches:
            watch.queue.put_nowait(("raw", data))

    def requests_of(self, kind: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.kind == kind]

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    def _cut_all_watches(self) -> None:
        for watch in self._watches:
            watch.queue.put_nowait(("drop", None))

    # -- HTTP --------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        is_watch = query.get("watch", "").lower() in ("true", "1")  # Go ParseBool: the client sends "True"
        kind = "watch" if is_watch else "list"
        if self.latency_s:
            await deliberate_pause(self.latency_s, "a slow API server: each request waits latency_s")
        if self._failures:
            status, retry_after = self._failures.pop(0)
            self.requests.append(RecordedRequest(time.monotonic(), kind, query, status))
            headers = {"Retry-After": retry_after} if retry_after is not None else None
            return web.json_response(_status(status, "Injected", f"injected {status}"), status=status,
                                     headers=headers)
        namespace = request.match_info["namespace"]
        selector = _parse_selector(query.get("labelSelector", ""))
        if not is_watch:
            self.requests.append(RecordedRequest(time.monotonic(), kind, query, 200))
            items = [copy.deepcopy(o) for o in self.objects.values() if _matches(o, namespace, selector)]
            for item in items:  # a list's items carry no kind/apiVersion, as on a real API server
                item.pop("kind", None)
                item.pop("apiVersion", None)
            return web.json_response({
                "kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                "metadata": {"resourceVersion": str(self.rv)}, "items": items,
            })
        return await self._watch(request, query, namespace, selector)

    async def _watch(
        self, request: web.Request, query: dict[str, str], namespace: str, selector: dict[str, str],
    ) -> web.StreamResponse:
        since = query.get("resourceVersion", "")
        too_old = since not in ("", "0") and int(since) < self.compacted_rv
        if too_old and self.gone_as_http_status:
            self.requests.append(RecordedRequest(time.monotonic(), "watch", query, 410))
            gone = _status(410, "Expired", f"too old resource version: {since}")
            return web.json_response(gone, status=410)
        self.requests.append(RecordedRequest(time.monotonic(), "watch", query, 200))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if too_old:
            error = _status(410, "Expired", f"too old resource version: {since} ({self.compacted_rv})")
            await response.write(json.dumps({"type": "ERROR", "object": error}).encode() + b"\n")
            return response
        watch = _Watch(namespace, selector, query.get("allowWatchBookmarks", "").lower() in ("true", "1"),
                       transport=request.transport, hung=self.hang_new_watches)
        if since in ("", "0"):  # no RV: synthetic ADDED for everything that exists
            for obj in self.objects.values():
                if _matches(obj, namespace, selector):
                    watch.queue.put_nowait(("event", {"type": "ADDED", "object": obj}))
        else:
            for rv, event, obj in self.history:
                if rv > int(since) and _matches(obj, namespace, selector):
                    watch.queue.put_nowait(("event", {"type": event, "object": obj}))
        timeout = float(query.get("timeoutSeconds", "1800"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_bookmark = loop.time() + (self.bookmark_interval_s or timeout)
        self._watches.append(watch)
        try:
            while True:
                if watch.hung:  # silent until dropped: the server timeout does not end it either
                    what, payload = await watch.queue.get()
                    if what == "drop":
                        self._abort(watch)
                        return response
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return response  # server-side timeout: a clean end of stream
                try:
                    what, payload = await asyncio.wait_for(
                        watch.queue.get(), min(remaining, max(0.0, next_bookmark - loop.time())),
                    )
                except TimeoutError:
                    if loop.time() < next_bookmark:
                        continue  # the server timeout: the loop ends the stream
                    next_bookmark = loop.time() + (self.bookmark_interval_s or timeout)
                    if not (self.bookmark_interval_s and watch.bookmarks):
                        continue
                    what, payload = "event", self._bookmark()
                if watch.hung and what != "drop":
                    continue  # frozen while this wait was pending
                if what == "drop":
                    self._abort(watch)
                    return response
                if what == "gone":
                    error = _status(410, "Expired", "too old resource version")
                    await response.write(json.dumps({"type": "ERROR", "object": error}).encode() + b"\n")
                    return response
                if what == "raw":
                    await response.write(payload)
                    continue
                line = json.dumps(payload).encode() + b"\n"
                if self._cut_next_event:
                    self._cut_next_event = False
                    await response.write(line[: len(line) // 2])
                    self._abort(watch)
                    return response
                await response.write(line)
        except ConnectionResetError:
            return response
        finally:
            self._watches.remove(watch)

    @staticmethod
    def _abort(watch: _Watch) -> None:
        if watch.transport is not None:
            watch.transport.abort()
