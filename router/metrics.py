"""Prometheus families of the router, on its own registry, every series present at 0.

The families hold plain numbers without a lock (``router.metric_families``): update them on the loop only.
Every label combination is created up front: a series that appears at its first event makes
dashboards' outcome ratios jump from "no data" and hides rejections that have not happened yet.
"""

from __future__ import annotations

from itertools import product
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from discovery.observer import RewatchCause
from router import constants as c
from router.metric_families import CounterFamily, CounterSeries, GaugeFamily, HistogramFamily
from router.outcomes import (
    TCP_PROTOCOLS,
    DiscoveryResult,
    DiscoverySource,
    DroppedLog,
    GrpcOutcome,
    ProtocolLabel,
    QuicDropReason,
    QuicFlowOutcome,
    QuicOutcome,
    RelayDirection,
    Termination,
    WebTransportOutcome,
)


class RouterMetrics:
    """All metric families of one router process; QUIC flows count in ``quic_connections_total``, or
    with ``webtransport`` in ``webtransport_sessions_total`` (both are exported, as by the Rust router)."""

    def __init__(
        self, version: str = "0.0.0", registry: CollectorRegistry | None = None, *, webtransport: bool = False
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.webtransport = webtransport
        r = self.registry
        self.grpc_connections = CounterFamily(
            c.GRPC_CONNECTIONS_TOTAL, "TCP (gRPC) connections by protocol and outcome.",
            ["protocol", "outcome"], registry=r,
        )
        self.quic_connections = CounterFamily(
            c.QUIC_CONNECTIONS_TOTAL, "QUIC flows by outcome.", ["outcome"], registry=r,
        )
        self.webtransport_sessions = CounterFamily(
            c.WEBTRANSPORT_SESSIONS_TOTAL, "WebTransport sessions (QUIC flows under --tunnel-protocol webtransport) "
            "by outcome.", ["outcome"], registry=r,
        )
        self.relayed_bytes = CounterFamily(
            c.RELAYED_BYTES_TOTAL, "Bytes spliced between clients and pods.",
            ["protocol", "direction"], registry=r,
        )
        self.active_connections = GaugeFamily(
            c.ACTIVE_CONNECTIONS, "Spliced TCP connections and UDP flows now open.",
            ["protocol"], registry=r,
        )
        self.pending_flows = GaugeFamily(
            c.PENDING_FLOWS, "UDP flows waiting for a complete ClientHello.", registry=r,
        )
        self.quic_dropped = CounterFamily(
            c.QUIC_DROPPED_DATAGRAMS_TOTAL, "Datagrams dropped without routing, by reason.",
            ["reason"], registry=r,
        )
        self.ready_targets = GaugeFamily(
            c.READY_TARGETS, "Pods in the current routing snapshot.", registry=r,
        )
        self.decision_latency = HistogramFamily(
            c.DECISION_LATENCY_SECONDS, "First byte to routing decision.", ["protocol"],
            buckets=c.LATENCY_BUCKETS_S, registry=r,
        )
        self.dial_latency = HistogramFamily(
            c.DIAL_LATENCY_SECONDS, "Time to connect to the pod.", ["protocol"],
            buckets=c.LATENCY_BUCKETS_S, registry=r,
        )
        self.discovery_updates = CounterFamily(
            c.DISCOVERY_UPDATES_TOTAL, "Discovery events by source and result.",
            ["source", "result"], registry=r,
        )
        self.discovery_last_sync_age = GaugeFamily(
            c.DISCOVERY_LAST_SYNC_AGE_SECONDS,
            "Seconds since discovery last synced successfully (-1 before the first sync).",
            registry=r,
        )
        self.discovery_last_sync_age.set(-1)
        self.terminations = CounterFamily(
            c.TERMINATIONS_TOTAL, "Ended connections and flows by protocol and termination (who ended it, how).",
            ["protocol", "termination"], registry=r,
        )
        self.connection_duration = HistogramFamily(
            c.CONNECTION_DURATION_SECONDS, "Accept (or first datagram) to end of a connection or flow.",
            ["protocol"], buckets=c.DURATION_BUCKETS_S, registry=r,
        )
        self.discovery_rewatches = CounterFamily(
            c.DISCOVERY_REWATCHES_TOTAL, "Kubernetes watches re-opened, by cause.", ["cause"], registry=r,
        )
        self.log_lines_dropped = CounterFamily(
            c.LOG_LINES_DROPPED_TOTAL, "Log lines held back by their log's budget, by log.", ["log"], registry=r,
        )
        self.build_info = GaugeFamily(c.BUILD_INFO, "Build information.", ["version"], registry=r)
        self.build_info.labels(version=version).set(1)
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, fds
        self._zero_init()

    def _zero_init(self) -> None:
        """Every series of every labelled family, at 0 before any traffic (label values in label order)."""
        protocols = tuple(ProtocolLabel)
        families: tuple[tuple[Any, tuple[tuple[str, ...], ...]], ...] = (
            (self.grpc_connections, (TCP_PROTOCOLS, tuple(GrpcOutcome))),
            (self.quic_connections, (tuple(QuicOutcome),)),
            (self.webtransport_sessions, (tuple(WebTransportOutcome),)),
            (self.relayed_bytes, (protocols, tuple(RelayDirection))),
            (self.active_connections, (protocols,)),
            (self.decision_latency, (protocols,)),
            (self.dial_latency, (protocols,)),
            (self.connection_duration, (protocols,)),
            (self.terminations, (protocols, tuple(Termination))),
            (self.quic_dropped, (tuple(QuicDropReason),)),
            (self.discovery_updates, (tuple(DiscoverySource), tuple(DiscoveryResult))),
            (self.discovery_rewatches, (tuple(RewatchCause),)),
            (self.log_lines_dropped, (tuple(DroppedLog),)),
        )
        for family, label_values in families:
            for values in product(*label_values):
                family.labels(*values)

    def grpc_outcome(self, protocol: ProtocolLabel, outcome: GrpcOutcome) -> None:
        self.grpc_connections.labels(protocol=protocol, outcome=outcome).inc()

    def quic_flow_series(self, outcome: QuicFlowOutcome) -> CounterSeries:
        """The series a QUIC flow with ``outcome`` counts in: its family's member of that name."""
        if self.webtransport:
            return self.webtransport_sessions.labels(outcome=WebTransportOutcome(outcome))
        return self.quic_connections.labels(outcome=QuicOutcome(outcome))

    def quic_outcome(self, outcome: QuicFlowOutcome) -> None:
        self.quic_flow_series(outcome).inc()

    def quic_drop(self, reason: QuicDropReason, count: int = 1) -> None:
        self.quic_dropped.labels(reason=reason).inc(count)

    def dropped_lines(self, log: DroppedLog) -> CounterSeries:
        """The series a budget of ``log`` counts its held-back lines in."""
        return self.log_lines_dropped.labels(log=log)


    def render(self) -> bytes:
        """Prometheus text exposition of every family."""
        return generate_latest(self.registry)


class ProtocolSeries:
    """The children one protocol touches per connection or flow, looked up once (not per event)."""

    __slots__ = ("active", "decision", "dial", "down", "up")

    def __init__(self, metrics: RouterMetrics, protocol: ProtocolLabel) -> None:
        self.decision = metrics.decision_latency.labels(protocol=protocol)
        self.dial = metrics.dial_latency.labels(protocol=protocol)
        self.up = metrics.relayed_bytes.labels(protocol=protocol, direction=RelayDirection.CLIENT_TO_POD)
        self.down = metrics.relayed_bytes.labels(protocol=protocol, direction=RelayDirection.POD_TO_CLIENT)
        self.active = metrics.active_connections.labels(protocol=protocol)

    def count_bytes(self, client_to_pod: int, pod_to_client: int) -> None:
        """Add relayed bytes (batched by the caller: a counter update per chunk would cost too much)."""
        if client_to_pod:
            self.up.inc(client_to_pod)
        if pod_to_client:
            self.down.inc(pod_to_client)


class TcpSeries(ProtocolSeries):
    """One TCP protocol's series, with its outcome counters."""

    __slots__ = ("outcomes",)

    def __init__(self, metrics: RouterMetrics, protocol: ProtocolLabel) -> None:
        super().__init__(metrics, protocol)
        self.outcomes = {
            o: metrics.grpc_connections.labels(protocol=protocol, outcome=o) for o in GrpcOutcome
        }
