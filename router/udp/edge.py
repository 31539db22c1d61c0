"""The QUIC reverse-tunnel edge: one UDP listener, one connected UDP socket per routed flow.

The router never terminates QUIC. Pod replies leave through the listener, so workers only ever see
the router's address, and the pod sees one stable peer (the flow's socket) while the client's NAT
rebinds. ``UdpRouter`` owns the sockets' lifecycle and the sweeper and composes the parts, one
concern per module (docs/architecture.md, one QUIC flow).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from discovery.targets import TargetSnapshot
from quic.initial_sniffer import InitialSniffer
from router.access_log import AccessLog
from router.client_limits import ClientSlots
from router.extensions import Extensions
from router.hostname import HostnameTemplate
from router.metrics import ProtocolSeries, RouterMetrics
from router.outcomes import ProtocolLabel, QuicOutcome
from router.udp.cid_index import CidIndex
from router.udp.datapath import Datapath, Link, PathEvents
from router.udp.demux import ClientDemux
from router.udp.flow_access import FlowAccess
from router.udp.flow_endings import FlowEndings
from router.udp.flow_opening import FlowOpener
from router.udp.flow_table import UdpFlowTable
from router.udp.flows import Flow
from router.udp.joins import IndexNamer, Joins, PodNamer, ServerIdNamer
from router.udp.native import SpliceDatapath
from router.udp.pod_link import Outboxes
from router.udp.python_path import PythonDatapath
from router.udp.refusals import QuicRefusals
from router.udp.settings import UdpRouterSettings

log = logging.getLogger("router.udp_router")  # pinned: operators filter logs by this name

def open_datapath(extensions: Extensions, clock: Callable[[], float]) -> Datapath:
    """The datapath ``extensions`` chose: the C splice, or the pure-Python reference."""
    if extensions.splice:
        return SpliceDatapath(clock, extensions.io_uring)
    return PythonDatapath(clock)


class UdpRouter:
    """Routes QUIC flows by ClientHello SNI to the named pod and splices their datagrams."""

    def __init__(
        self,
        settings: UdpRouterSettings,
        template: HostnameTemplate,
        snapshot: Callable[[], TargetSnapshot],
        metrics: RouterMetrics,
        access: AccessLog | None = None,
        index: CidIndex | None = None,
        datapath: Datapath | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``index``: the ``--workers N`` shared connection-ID index (None: one process). ``datapath``
        and ``clock`` are the process's (``Extensions``, monotonic time) unless a test passes its own."""
        self.settings = settings
        self._snapshot = snapshot
        self._index = index
        self._clock = clock
        series = ProtocolSeries(metrics, ProtocolLabel.QUIC)
        self.table: UdpFlowTable[InitialSniffer, Link] = UdpFlowTable(settings.limits)
        self.path = datapath if datapath is not None else open_datapath(settings.extensions, clock)
        counts = settings.max_flows_per_client if settings.client_counts is None else settings.client_counts
        slots = ClientSlots(counts)  # per pending flow, then its flow
        self._access = FlowAccess(access if access is not None else AccessLog(metrics))
        self._outboxes: Outboxes[Flow[Link]] = Outboxes(self._call_soon)
        self.endings = FlowEndings(self.table, self._access, slots, metrics, series, self.path, self._outboxes, clock)
        self.refusals = refusals = QuicRefusals(
            self.table, metrics, settings.reject_budget_bytes_per_s, self.path.send_to_client,
            settings.extensions.initials,
        )
        opened = (metrics.quic_flow_series(QuicOutcome.ACCEPTED), metrics.quic_flow_series(QuicOutcome.JOINED))
        self.opener = FlowOpener(
            settings, template, snapshot, self.table, slots, self._access, refusals, self.endings, self.path,
            self._outboxes, series, opened, clock,
        )
        self.joins = Joins(
            self._namers(), self.table, self.opener, self.endings, settings.quic_lb_joins_per_s,
            settings.quic_lb_join_burst,
        )
        self.demux = ClientDemux(
            settings, self.table, self.opener, self.joins, self.endings, refusals, self.path, self._outboxes, clock,
        )
        if index is not None:  # what this worker's flows learn, the others may join
            self.table.on_learned, self.table.on_forgotten = self._publish, index.remove
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.Task[None] | None = None
        # The flow gauges are read from the table at scrape time, not updated per flow.
        metrics.pending_flows.set_function(lambda: self.table.pending_count)
        series.active.set_function(lambda: self.table.flow_count)

    def _namers(self) -> tuple[PodNamer, ...]:
        s = self.settings
        namers: list[PodNamer] = []
        if s.quic_lb_server_id_bytes:
            namers.append(ServerIdNamer(s.quic_lb_server_id_bytes, s.cid_length, self._snapshot))
        if self._index is not None:
            namers.append(IndexNamer(self._index, s.cid_length, self._snapshot))
        return tuple(namers)

    def _publish(self, flow: Flow[Link], cid: bytes) -> None:
        """A pod CID ``flow`` learned, for the other workers to find its pod by."""
        target = self._snapshot().get(flow.pod_name)
        if self._index is not None and target is not None:
            self._index.put(cid, target.address, target.quic_port)

    def _call_soon(self, callback: Callable[[], None]) -> None:
        if self._loop is not None:
            self._loop.call_soon(callback)
        else:  # no loop (a test driving the edge by hand): at once
            callback()

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> tuple[str, int]:
        """Bind the listener and start the sweeper; returns the bound (host, port)."""
        self._loop = loop = asyncio.get_running_loop()
        events = PathEvents(self.demux.deliver, self._learn_pod_cid, self._pod_answered, self.endings.failed)
        bound = await self.path.open(host, port, reuse_port, events)
        s = self.settings  # ending flows in time: ``flow_endings``
        interval = min(s.sweep_interval_s, s.limits.shortest_flow_idle_s / 4, s.limits.pending_flow_timeout_s / 4)
        self._sweeper = loop.create_task(self._sweep_forever(interval), name="quic-flow-sweeper")
        return bound

    def _learn_pod_cid(self, flow: Flow[Link], scid: bytes) -> None:
        """A new SCID of the pod's long header: the client's DCID after the handshake, and after it moves."""
        self.table.learn_pod_cid(flow, scid, self.settings.cid_length)

    def _pod_answered(self, flow: Flow[Link], size: int, count: int) -> None:
        """``count`` datagrams of at most ``size`` bytes the pod sent an unconfirmed flow's client."""
        watch = flow.handshake
        if watch is not None and watch.pod_sent(size, count):
            self.table.confirm(flow)
            self.path.confirm(flow)

    async def _sweep_forever(self, interval_s: float) -> None:
        """Sweep every ``interval_s`` while the table holds something time could expire, and
        sleep on an event while it holds nothing: an idle router is not woken twice a second."""
        occupied = asyncio.Event()
        self.table.on_occupied = occupied.set
        while True:
            if self.table.idle:  # the last sweep flushed the byte counts of the last flow
                occupied.clear()
                await occupied.wait()
            await asyncio.sleep(interval_s)
            self.sweep(self._clock())

    def sweep(self, now: float) -> None:
        """Expire pending, unconfirmed and silent flows, flush byte counters (the sweeper calls this)."""
        self.endings.sweep(now)

    def flush_metrics(self) -> None:
        """Push batched byte counts to Prometheus now (the sweeper does it periodically)."""
        self.endings.flush_byte_counters()

    def stop_accepting(self) -> None:
        """Refuse new flows from now on (they get CONNECTION_CLOSE); routed ones keep going."""
        self.opener.accepting = False

    async def drain(self, timeout_s: float) -> None:
        """Stop accepting, wait up to ``timeout_s`` for flows to end, then close the rest."""
        self.stop_accepting()
        if self.table.flow_count or self.table.pending_count:
            self.endings.empty.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.endings.empty.wait(), timeout_s)
        self.endings.close_all()

    async def close(self) -> None:
        """Close every flow and the listener; idempotent."""
        self.opener.accepting = False
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        self._sweeper = None
        self.endings.close_all()
        self.endings.flush_byte_counters()
        self.path.close()

    @property
    def datapath(self) -> str:
        """What moves established flows' datagrams (logged at start): the datapath's name."""
        return self.path.name

    @property
    def active_flows(self) -> int:
        return self.table.flow_count

    @property
    def pending_flows(self) -> int:
        return self.table.pending_count
