"""The router process: discovery, listeners, health, and the SIGTERM drain.

Order matters for a rolling update behind a Gateway: on SIGTERM ``/readyz`` turns 503
at once, the listeners keep accepting for ``--shutdown-delay-ms`` (the Gateway needs
that long to stop sending), then stop; spliced connections and flows get
``--drain-timeout-ms`` to finish, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import signal
import socket
import time
from collections.abc import Callable
from importlib import metadata
from typing import Protocol

from discovery.observer import RewatchCause
from discovery.settings import DiscoverySettings
from discovery.targets import EMPTY_SNAPSHOT, TargetSnapshot
from router.access_log import AccessLog
from router.bind_failure import BindFailure, binding
from router.config import RouterConfig
from router.constants import GC_YOUNG_THRESHOLD
from router.debug_endpoints import router_routes
from router.flag_values import ConfigError
from router.health import HealthServer
from router.hostname import HostnameTemplate, TemplateError
from router.metrics import RouterMetrics
from router.runtime import Runtime
from router.tcp.edge import TcpRouter, TcpRouterSettings
from router.udp.edge import UdpRouter
from router.udp.flow_limits import FlowLimits
from router.udp.settings import UdpRouterSettings
from router.worker_seat import WorkerReport, report

log = logging.getLogger("router.app")  # pinned: operators filter logs by this name


class DiscoverySource(Protocol):
    synced: asyncio.Event
    last_sync_monotonic: float | None

    async def run(self) -> None: ...


class MetricsDiscoveryObserver:
    """``DiscoveryObserver`` -> the router's Prometheus families (discovery knows no metrics)."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self._metrics = metrics

    def published(self, source: str, ready_targets: int) -> None:
        self._metrics.discovery_updates.labels(source=source, result="published").inc()
        self._metrics.ready_targets.set(ready_targets)

    def unchanged(self, source: str) -> None:
        self._metrics.discovery_updates.labels(source=source, result="unchanged").inc()

    def error(self, source: str) -> None:
        self._metrics.discovery_updates.labels(source=source, result="error").inc()

    def rewatched(self, source: str, cause: RewatchCause) -> None:
        self._metrics.discovery_rewatches.labels(cause=cause).inc()

    def synced(self, source: str, sync_age_s: Callable[[], float]) -> None:
        self._metrics.discovery_last_sync_age.set_function(sync_age_s)


def version() -> str:
    try:
        return metadata.version("stargate-router")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def raise_fd_limit() -> None:
    """Each spliced connection holds 2 sockets (+2 pipes); lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class RouterApp:
    """One router process (one worker)."""

    def __init__(self, config: RouterConfig, runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = Runtime.at_start(config) if runtime is None else runtime
        """What this process chose once at start (``router.runtime``): extensions, memory, counts, seat."""
        self.seat = self.runtime.seat
        self.extensions = self.runtime.extensions
        self.memory = self.runtime.memory
        self.metrics = RouterMetrics(version(), webtransport=config.webtransport)
        try:
            self.template = HostnameTemplate.parse(
                config.advertised_hostname_template, config.target_namespace
            )
        except TemplateError as exc:
            raise ConfigError(f"--advertised-hostname-template: {exc}") from None
        self._snapshot: TargetSnapshot = EMPTY_SNAPSHOT
        self._shutting_down = False
        self._stop = asyncio.Event()
        self.source = self._make_source()
        self.access = AccessLog(self.metrics, enabled=config.access_log)
        self.tcp = TcpRouter(
            TcpRouterSettings(
                connect_timeout_s=config.connect_timeout_s,
                relay_idle_timeout_s=config.relay_idle_timeout_s,
                peek_timeout_s=config.peek_timeout_s,
                round_robin_paths=config.round_robin_paths,
                accept_proxy_protocol=config.accept_proxy_protocol,
                proxy_protocol_trusted_cidrs=config.proxy_protocol_trusted_cidrs,
                max_connections_per_client=config.max_connections_per_client,
                client_counts=self.runtime.tcp_counts,
                defer_accept=config.tcp_defer_accept,
                extensions=self.extensions,
            ),
            self.template, self.snapshot, self.metrics, self.access,
        )
        self.udp = UdpRouter(
            UdpRouterSettings(
                limits=FlowLimits(
                    idle_timeout_s=config.relay_idle_timeout_s, max_pending_flows=self.memory.max_pending_flows,
                    max_flows=self.memory.max_flows, handshake_timeout_s=config.quic_handshake_timeout_s,
                ),
                cid_length=config.quic_cid_length,
                max_flows_per_client=config.max_quic_flows_per_client,
                client_counts=self.runtime.quic_counts,
                quic_lb_server_id_bytes=config.quic_lb_server_id_bytes,
                extensions=self.extensions,
            ),
            self.template, self.snapshot, self.metrics, self.access, index=self.runtime.cid_index,
        )
        self.health = HealthServer(self.metrics, self.is_ready)
        if config.debug_endpoints:
            routes, query_routes = router_routes(
                self.access.live, self.snapshot, "file" if config.endpoints_file is not None else "kubernetes",
                self.is_ready, self._sync_age_s,
            )
            self.health.routes.update(routes)
            self.health.query_routes.update(query_routes)

    def _make_source(self) -> DiscoverySource:
        settings = DiscoverySettings(
            namespace=self.config.target_namespace,
            service_name=self.config.target_service_name,
            grpc_port_name=self.config.grpc_port_name,
            quic_port_name=self.config.quic_port_name,
        )
        observer = MetricsDiscoveryObserver(self.metrics)
        if self.config.endpoints_file is not None:
            from discovery.file_source import EndpointsFileSource

            return EndpointsFileSource(settings, self.publish, observer, path=self.config.endpoints_file)
        from discovery.kubernetes_source import KubernetesSource

        return KubernetesSource(
            settings, self.publish, observer, kubeconfig=self.config.kubeconfig,
            watch_idle_timeout_s=self.config.kube_watch_idle_timeout_s,
        )

    def _sync_age_s(self) -> float:
        """Seconds since discovery last synced, -1 before the first sync."""
        if self.source.last_sync_monotonic is None:
            return -1.0
        return max(0.0, time.monotonic() - self.source.last_sync_monotonic)

    def snapshot(self) -> TargetSnapshot:
        return self._snapshot

    def publish(self, snapshot: TargetSnapshot) -> None:
        """Swap the routing table atomically (one reference assignment); the source counts it."""
        self._snapshot = snapshot
        log.info("routing snapshot updated: %d ready pods", len(snapshot),
                 extra={"pods": ",".join(t.pod_name for t in snapshot)})

    def is_ready(self) -> bool:
        return self.source.synced.is_set() and not self._shutting_down

    def request_stop(self) -> None:
        """SIGTERM/SIGINT: readiness fails at once; the drain starts in ``run``."""
        if not self._shutting_down:
            log.info("shutdown requested: readiness now failing")
        self._shutting_down = True
        self._stop.set()

    async def start(self) -> None:
        cfg = self.config
        try:
            if self.seat is not None:  # the private port the supervisor bound for this worker
                self.health_addr = await self.health.start_on(socket.socket(fileno=self.seat.health_fd))
            else:
                with binding("--health-listen-addr", cfg.health_listen_addr):
                    self.health_addr = await self.health.start(cfg.health_listen_addr.host, cfg.health_listen_addr.port)
            with binding("--listen-addr", cfg.listen_addr):
                self.tcp_addr = await self.tcp.start(cfg.listen_addr.host, cfg.listen_addr.port)
            with binding("--reverse-tunnel-listen-addr", cfg.reverse_tunnel_listen_addr):
                self.udp_addr = await self.udp.start(
                    cfg.reverse_tunnel_listen_addr.host, cfg.reverse_tunnel_listen_addr.port, reuse_port=True
                )
        except BindFailure:  # the process ends: let go of what is bound
            self.tcp.stop_accepting()
            await self.health.close()
            raise
        self._source_task = asyncio.create_task(self.source.run(), name="discovery")
        log.info("%s", self.runtime.memory_line)
        datapaths = (
            f"quic_datapath={self.udp.datapath} quic_initials={self.extensions.start_fields()['quic_initials']} "
            f"tcp_pump={self.tcp.pump}"
        )
        grpc, quic, health = (f"{a[0]}:{a[1]}" for a in (self.tcp_addr, self.udp_addr, self.health_addr))
        if self.seat is None:
            log.info("listening grpc=%s quic=%s health=%s %s", grpc, quic, health, datapaths)
        else:  # the supervisor's own line names the public addresses once every worker has bound
            log.info("worker %d bound grpc=%s quic=%s private-health=%s %s", self.seat.index, grpc, quic, health,
                     datapaths)
            report(self.seat, WorkerReport.BOUND)

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT, then drain; returns the exit status."""
        raise_fd_limit()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        await self.start()
        # What exists now (modules, config, metrics) lives as long as the process: keep it out of
        # the collector's passes, which then only scan what connections and flows allocate.
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        await self._stop.wait()
        await self.shutdown()
        return 0

    async def shutdown(self) -> None:
        cfg = self.config
        self._shutting_down = True
        if cfg.shutdown_delay_s > 0:
            await asyncio.sleep(cfg.shutdown_delay_s)
        self.tcp.stop_accepting()
        self.udp.stop_accepting()
        log.info(
            "listeners closed; draining %d connections and %d flows for up to %.1fs",
            self.tcp.active_connections, self.udp.active_flows, cfg.drain_timeout_s,
        )
        await asyncio.gather(
            self.tcp.drain(cfg.drain_timeout_s), self.udp.drain(cfg.drain_timeout_s)
        )
        self._source_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._source_task
        await self.udp.close()
        await self.health.close()
        log.info("drained; exiting")
