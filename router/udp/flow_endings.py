"""How QUIC flows and attempts end: one place that closes, accounts for and forgets them.

Every end goes through here, whatever caused it: a pod socket error, a refusal, a full pending
table (eviction), an expiry in the sweep (a connection's own idle timeout, or the relay's), a
drain or close. Each closes the flow's
socket, ends its access record (``flow_access``), frees its client's slot, counts its outcome
and wakes ``drain`` once nothing is left. The relayed-byte counters are flushed here too, from
the sweep. ``FlowEndings`` is a base class of ``edge.UdpRouter`` rather than an object beside
it: it acts on the router's own table, slots and metrics, so there is one copy of each and the
per-datagram path pays no extra indirection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from quic.initial_sniffer import InitialSniffer
from router.client_limits import ClientSlots
from router.metrics import ProtocolSeries, RouterMetrics
from router.outcomes import QuicDropReason, QuicFlowOutcome, QuicOutcome, Termination
from router.udp.flow_access import FlowAccess
from router.udp.flow_table import Flow, PendingFlow, UdpFlowTable
from router.udp.pod_link import Outboxes, PodLink
from router.udp.pod_to_client import ClientReplies
from router.udp.refusals import peer

if TYPE_CHECKING:
    from router.udp._splice import Splicer

log = logging.getLogger("router.udp_router")
"""The router's logger: flow failures keep the name operators filter on."""

Link = PodLink["Flow[Link]"]
"""A flow's pod link; the flow table keeps it as the flow's handle."""


class FlowEndings:
    """Ends flows and pending attempts of ``UdpRouter``, which sets the state declared here."""

    _table: UdpFlowTable[InitialSniffer, Link]
    _access: FlowAccess
    _slots: ClientSlots
    _metrics: RouterMetrics
    _series: ProtocolSeries
    _clock: Callable[[], float]
    _empty: asyncio.Event
    """Set while no flow or pending flow is left: what ``drain`` waits for."""
    _outboxes: Outboxes[Flow[Link]]
    _replies: ClientReplies
    _splicer: Splicer | None
    """The C splice, whose byte counts join the pure-Python path's (``native``)."""

    async def _sweep_forever(self, interval_s: float) -> None:
        """Sweep every ``interval_s`` while the table holds something time could expire, and
        sleep on an event while it holds nothing: an idle router is not woken twice a second."""
        occupied = asyncio.Event()
        self._table.on_occupied = occupied.set
        while True:
            if self._table.idle:  # the last sweep flushed the byte counts of the last flow
                occupied.clear()
                await occupied.wait()
            await asyncio.sleep(interval_s)
            self.sweep(self._clock())

    def sweep(self, now: float) -> None:
        """Expire pending and silent flows, flush byte counters (the sweeper calls this)."""
        expired = self._table.expire(now)
        for pending in expired.pending:
            self._drop(QuicDropReason.PENDING_TIMEOUT, max(1, len(pending.datagrams)))
            self._slots.release(pending)
            self._access.end_pending(pending, None, Termination.PEEK_TIMEOUT, now)
        for flow in expired.unconfirmed:  # its client and pod were never seen talking: a flood's, or a failed handshake
            self._finish(flow, QuicOutcome.COMPLETED, Termination.HANDSHAKE_TIMEOUT)
        relay_idle_s = self._table.limits.idle_timeout_s
        for flow in expired.flows:  # the client's own idle timeout ended it, or the relay's bound
            ending = Termination.QUIC_IDLE_TIMEOUT if flow.idle_timeout_s < relay_idle_s else Termination.IDLE_TIMEOUT
            self._finish(flow, QuicOutcome.COMPLETED, ending)
        self._note_if_empty()
        self._flush_byte_counters()

    def flush_metrics(self) -> None:
        """Push batched byte counts to Prometheus now (the sweeper does it periodically)."""
        self._flush_byte_counters()

    def _flow_failed(self, flow: Flow[Link], exc: Exception) -> None:
        log.info("quic flow %s -> %s failed: %s", peer(flow.address), flow.pod_name, exc)
        if self._table.remove(flow):
            self._finish(flow, QuicOutcome.RELAY_ERROR, Termination.POD_RESET)

    def _finish(self, flow: Flow[Link], outcome: QuicOutcome, termination: Termination) -> None:
        """Account for a flow the table no longer holds, close its socket, write its access line."""
        flow.handle.close()
        self._access.end_flow(flow, outcome, termination, self._clock())
        self._slots.release(flow)
        self._metrics.quic_outcome(outcome)
        self._note_if_empty()

    def _discard(self, pending: PendingFlow[InitialSniffer], termination: Termination,
                 outcome: QuicFlowOutcome | None = None, answered: int = 0) -> None:
        """Forget an attempt that never became a flow; its access line says why."""
        self._access.end_pending(pending, outcome, termination, self._clock(), answered)
        self._table.discard_pending(pending)
        self._slots.release(pending)
        self._note_if_empty()

    def _make_room_for_flow(self) -> None:
        """A new flow is about to be opened: with the table full, the oldest unconfirmed flow ends
        to make room (none: the new one is refused, ``flow_table_full``)."""
        evicted = self._table.evict_unconfirmed()
        if evicted is not None:
            self._finish(evicted, QuicOutcome.COMPLETED, Termination.EVICTED)

    def _confirm(self, flow: Flow[Link]) -> None:
        """The flow's client and pod are talking (``handshake_watch``): it lives its connection's
        idle timeout now, and the C splice moves its datagrams both ways."""
        self._table.confirm(flow)
        flow.handle.confirm()

    def _evict(self, pending: PendingFlow[InitialSniffer]) -> None:
        """The oldest pending flow made room for a new one: its datagrams count as ``pending_full``."""
        self._drop(QuicDropReason.PENDING_FULL, max(1, len(pending.datagrams)))
        self._discard(pending, Termination.REJECTED)

    def _note_if_empty(self) -> None:
        if not self._table.flow_count and not self._table.pending_count:
            self._empty.set()

    def _close_flows(self) -> None:
        for pending in self._table.pending_flows():
            self._discard(pending, Termination.DRAIN)
        for flow in self._table.flows():
            if self._table.remove(flow):
                self._finish(flow, QuicOutcome.COMPLETED, Termination.DRAIN)

    def _drop(self, reason: QuicDropReason, count: int = 1) -> None:
        self._metrics.quic_drop(reason, count)

    def _flush_byte_counters(self) -> None:
        to_pod, to_client = self._splicer.take_counts() if self._splicer is not None else (0, 0)
        self._series.count_bytes(self._outboxes.sent_bytes + to_pod, self._replies.sent_bytes + to_client)
        self._outboxes.sent_bytes = self._replies.sent_bytes = 0
