"""How QUIC flows and attempts end: one place that closes, accounts for and forgets them.

Every end (pod socket error, refusal, eviction, sweep expiry, drain, close) comes here, so each is
accounted once: the datapath lets go of the socket before it is closed, the access record ends, the
client's slot is freed, the outcome is counted, and ``drain`` is woken once nothing is left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from quic.initial_sniffer import InitialSniffer
from router.client_limits import ClientSlots
from router.metrics import ProtocolSeries, RouterMetrics
from router.outcomes import QuicDropReason, QuicFlowOutcome, QuicOutcome, Termination
from router.udp.datapath import Datapath, Link
from router.udp.flow_access import FlowAccess
from router.udp.flow_table import UdpFlowTable
from router.udp.flows import Flow, PendingFlow
from router.udp.pod_link import Outboxes
from router.udp.refusals import peer

log = logging.getLogger("router.udp_router")
"""The router's logger: flow failures keep the name operators filter on."""

Table = UdpFlowTable[InitialSniffer, Link]


class FlowEndings:
    """Ends the edge's flows and pending attempts, and flushes its byte counts."""

    def __init__(
        self, table: Table, access: FlowAccess, slots: ClientSlots, metrics: RouterMetrics, series: ProtocolSeries,
        datapath: Datapath, outboxes: Outboxes[Flow[Link]], clock: Callable[[], float],
    ) -> None:
        self._table = table
        self._access = access
        self._slots = slots
        self._metrics = metrics
        self._series = series
        self._datapath = datapath
        self._outboxes = outboxes
        self._clock = clock
        self.empty = asyncio.Event()
        """Set while no flow or pending flow is left: what ``drain`` waits for."""
        self.empty.set()

    def sweep(self, now: float) -> None:
        """Expire pending, unconfirmed and silent flows; flush byte counters (the sweeper calls this)."""
        expired = self._table.expire(now)
        for pending in expired.pending:
            self.drop(QuicDropReason.PENDING_TIMEOUT, max(1, len(pending.datagrams)))
            self._slots.release(pending)
            self._access.end_pending(pending, None, Termination.PEEK_TIMEOUT, now)
        for flow in expired.unconfirmed:  # its client and pod were never seen talking: a flood's, or a failed handshake
            self.finish(flow, QuicOutcome.COMPLETED, Termination.HANDSHAKE_TIMEOUT)
        relay_idle_s = self._table.limits.idle_timeout_s
        for flow in expired.flows:  # the client's own idle timeout ended it, or the relay's bound
            ending = Termination.QUIC_IDLE_TIMEOUT if flow.idle_timeout_s < relay_idle_s else Termination.IDLE_TIMEOUT
            self.finish(flow, QuicOutcome.COMPLETED, ending)
        self.note_if_empty()
        self.flush_byte_counters()

    def failed(self, flow: Flow[Link], exc: Exception) -> None:
        """The flow's pod socket failed (ECONNREFUSED: the pod is gone)."""
        log.info("quic flow %s -> %s failed: %s", peer(flow.address), flow.pod_name, exc)
        if self._table.remove(flow):
            self.finish(flow, QuicOutcome.RELAY_ERROR, Termination.POD_RESET)

    def finish(self, flow: Flow[Link], outcome: QuicOutcome, termination: Termination) -> None:
        """Account for a flow the table no longer holds, close its socket, write its access line."""
        self._datapath.detach(flow)
        flow.handle.close()
        self._access.end_flow(flow, outcome, termination, self._clock())
        self._slots.release(flow)
        self._metrics.quic_outcome(outcome)
        self.note_if_empty()

    def discard(self, pending: PendingFlow[InitialSniffer], termination: Termination,
                outcome: QuicFlowOutcome | None = None, answered: int = 0) -> None:
        """Forget an attempt that never became a flow; its access line says why."""
        self._access.end_pending(pending, outcome, termination, self._clock(), answered)
        self._table.discard_pending(pending)
        self._slots.release(pending)
        self.note_if_empty()

    def make_room(self, address: tuple[object, ...]) -> None:
        """Before a new attempt from ``address``: a full pending table ends its oldest undecided attempt,
        a full flow table its oldest unconfirmed flow; a confirmed flow is never evicted."""
        evicted = self._table.make_room(address)
        if evicted is not None:
            self.drop(QuicDropReason.PENDING_FULL, max(1, len(evicted.datagrams)))
            self.discard(evicted, Termination.REJECTED)
        unconfirmed = self._table.evict_unconfirmed()
        if unconfirmed is not None:
            self.finish(unconfirmed, QuicOutcome.COMPLETED, Termination.EVICTED)

    def note_if_empty(self) -> None:
        if not self._table.flow_count and not self._table.pending_count:
            self.empty.set()

    def close_all(self) -> None:
        """The drain ran out, or the edge closes: every attempt and flow ends now."""
        for pending in self._table.pending_flows():
            self.discard(pending, Termination.DRAIN)
        for flow in self._table.flows():
            if self._table.remove(flow):
                self.finish(flow, QuicOutcome.COMPLETED, Termination.DRAIN)

    def drop(self, reason: QuicDropReason, count: int = 1) -> None:
        self._metrics.quic_drop(reason, count)

    def flush_byte_counters(self) -> None:
        to_pod, to_client = self._datapath.take_counts()
        self._series.count_bytes(self._outboxes.sent_bytes + to_pod, to_client)
        self._outboxes.sent_bytes = 0
