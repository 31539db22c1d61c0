"""How a QUIC flow starts: a new connection sniffed, routed and dialled, or a moved one joined.

A new connection takes its client's slot before it costs a pending flow (bounded) while its Initials
are read for the SNI; once routed, the buffered datagrams go to the pod in arrival order and the flow
starts unconfirmed (``handshake_watch``). A join (``joins``) has no ClientHello: its pod is the one
its connection ID names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from discovery.targets import Target, TargetSnapshot
from quic.initial_sniffer import InitialSniffer
from quic.packet import LongHeader, QuicPacketError
from router.client_limits import ClientSlots
from router.hostname import HostnameTemplate
from router.log_text import clip_optional
from router.metric_families import CounterSeries
from router.metrics import ProtocolSeries
from router.outcomes import QuicDropReason, Termination
from router.routing import Refusal, Refused, route
from router.udp.datapath import Datapath, Link
from router.udp.flow_access import FlowAccess
from router.udp.flow_endings import FlowEndings, Table
from router.udp.flows import Address, Flow, PendingFlow
from router.udp.pod_link import Outboxes, PodLink, connect_udp
from router.udp.refusals import QuicRefusals, peer
from router.udp.settings import UdpRouterSettings
from wire.client_hello import ClientHelloInfo

log = logging.getLogger("router.udp_router")
"""The router's logger: flow and unusable-Initial lines keep the name operators filter on."""


def quic_port(target: Target) -> int:
    return target.quic_port


class FlowOpener:
    """Opens pending flows, routes them, dials their pods; refuses what it cannot route."""

    def __init__(
        self, settings: UdpRouterSettings, template: HostnameTemplate, snapshot: Callable[[], TargetSnapshot],
        table: Table, slots: ClientSlots, access: FlowAccess, refusals: QuicRefusals, endings: FlowEndings,
        datapath: Datapath, outboxes: Outboxes[Flow[Link]], series: ProtocolSeries,
        opened: tuple[CounterSeries, CounterSeries], clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self._template = template
        self._snapshot = snapshot
        self._table = table
        self._slots = slots
        self._access = access
        self._refusals = refusals
        self._endings = endings
        self._datapath = datapath
        self._outboxes = outboxes
        self._series = series
        self._accepted, self._joined = opened
        """Counted once per flow: ``accepted`` (routed by its ClientHello) or ``joined``."""
        self._clock = clock
        self.accepting = True
        """False once the edge drains: new attempts are refused, routed flows keep going."""

    # -- a new connection: its Initials, then its pod ---------------------------------------
    def open(self, header: LongHeader, data: bytes, addr: Address, now: float) -> None:
        """A client Initial of a new connection: a pending flow that sniffs its ClientHello."""
        refusal = None if self.accepting else Refusal.TARGET_UNAVAILABLE
        if refusal is None and not self._slots.take(header, addr[0]):  # before it costs a pending flow
            refusal = Refusal.CLIENT_LIMIT
        if refusal is not None:
            answered = self._refusals.refuse(addr, header.version, header.dcid, header.scid, len(data), now, None,
                                             refusal)
            return self._access.refused_unopened(addr, len(data), answered, refusal, now)
        self._endings.make_room(addr)
        sniffer = InitialSniffer(self.settings.max_crypto_bytes, native=self.settings.extensions.initials)
        opened = self._table.open_pending(addr, sniffer, now, dcid=header.dcid, scid=header.scid)
        if isinstance(opened, QuicDropReason):
            self._slots.release(header)
            self._endings.drop(opened)
            return
        self._slots.move(header, opened)
        self._access.open(opened, now)
        self.feed(opened, data, now, header)

    def feed(
        self, pending: PendingFlow[InitialSniffer], data: bytes, now: float, header: LongHeader | None = None
    ) -> None:
        """One more datagram of a pending flow (``header``: its first, if parsed): buffer, find the hello."""
        if not self._table.can_buffer(pending, len(data)):
            self._endings.drop(QuicDropReason.PENDING_FULL)
            if not pending.datagrams:  # opened by this very datagram: hold no slot for nothing
                self._endings.discard(pending, Termination.REJECTED)
            return
        if pending.decided:
            self._table.buffer(pending, data)
            return
        try:
            info = pending.sniffer.feed(data, header)
        except QuicPacketError as exc:
            log.debug("quic Initial from %s unusable: %s", peer(pending.address), exc)
            self._endings.drop(QuicDropReason.MALFORMED, 1 + len(pending.datagrams))
            self._endings.discard(pending, Termination.REJECTED)
            return
        self._table.buffer(pending, data)
        if info is not None:
            self._route(pending, info, now)

    def _route(self, pending: PendingFlow[InitialSniffer], info: ClientHelloInfo, now: float) -> None:
        self._series.decision.observe(now - pending.created_at)
        hostname = info.server_name or None  # an empty SNI is a missing one
        # QUIC carries no request path, so no round-robin either.
        decision = route(hostname, None, self._snapshot(), self._template, None, port_of=quic_port)
        self._access.decided(pending, hostname, decision, now)
        if isinstance(decision, Refused):
            self.refuse_pending(pending, hostname, decision.refusal, now)
            return
        pending.decided = True
        # Now, inside this wake-up: the datagrams that came with the ClientHello are buffered, and
        # the rest of this batch finds the flow established.
        self.dial(pending, decision, hostname, self._table.limits.flow_idle_timeout_s(info.max_idle_timeout_ms))

    def dial(
        self, pending: PendingFlow[InitialSniffer], target: Target, hostname: str | None, idle_timeout_s: float,
        joined: bool = False,
    ) -> Flow[Link] | None:
        """Open the flow's socket to the pod, then flush the buffered datagrams in order; the flow, or
        None when the socket could not be opened (refused). ``joined``: opened for a moved connection."""
        started = self._clock()
        try:
            sock = connect_udp(target.address, target.quic_port)
        except OSError as exc:
            self._refusals.log.info("quic dial to %s for %s failed: %s", target.quic_endpoint,
                                    peer(pending.address), exc)
            self.refuse_pending(pending, hostname, Refusal.DIAL_FAILED, self._clock())
            return None
        now = self._clock()
        self._series.dial.observe(now - started)
        link: Link = PodLink(sock, self._endings.failed)
        flow = self._table.establish(pending, target.pod_name, link, now, idle_timeout_s, joined)
        self._slots.move(pending, flow)
        link.flow = flow
        self._access.established(pending, flow, target.quic_endpoint)
        self._datapath.attach(flow)
        (self._joined if joined else self._accepted).inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("quic flow %s -> %s (%s)", peer(flow.address), target.quic_endpoint, clip_optional(hostname))
        # The buffered datagrams leave now, in order, before the C splice may send this flow's
        # next ones: straight into the new link's outbox, not through the iteration's outboxes.
        flow.client_bytes += pending.buffered_bytes
        link.outbox.extend(pending.datagrams)
        pending.datagrams.clear()
        self._outboxes.sent_bytes += link.flush()
        return flow

    def refuse_pending(
        self, pending: PendingFlow[InitialSniffer], hostname: str | None, refusal: Refusal, now: float
    ) -> None:
        self._table.discard_pending(pending)
        outcome, answered = self._refusals.refuse_pending(pending, hostname, refusal, now)
        ending = Termination.DIAL_FAILED if refusal is Refusal.DIAL_FAILED else Termination.REJECTED
        self._endings.discard(pending, ending, outcome, answered)

    # -- a moved connection --------------------------------------------------------------------
    def open_joined(self, target: Target, cid: bytes, data: bytes, addr: Address, now: float) -> bool:
        """A flow to ``target`` for ``addr``'s connection ``cid`` (no ClientHello: the pod its ID
        names), bounded as any new flow; False when the table or the client's limit refused it."""
        self._endings.make_room(addr)
        opened = self._table.open_pending(addr, _UNREAD, now, dcid=cid)
        if isinstance(opened, QuicDropReason):
            self._endings.drop(opened)
            return True
        if not self._slots.take(opened, addr[0]) or not self._table.buffer(opened, data):
            self._table.discard_pending(opened)
            self._slots.release(opened)
            return False
        self._access.open(opened, now)
        self._access.decided(opened, None, target, now)
        flow = self.dial(opened, target, None, self._table.limits.idle_timeout_s, joined=True)
        if flow is not None and flow.handle.sock is not None:  # (its first send did not fail it)
            self.tell_apart(flow, cid)
            log.debug("quic flow %s joined %s by its connection ID", peer(addr), target.pod_name)
        return True

    def tell_apart(self, flow: Flow[Link], cid: bytes) -> None:
        """``flow`` is told apart by connection ID, ``cid`` among them, in the table and the datapath."""
        flow.shared = True
        self._table.learn_cid(flow, cid)
        self._datapath.learned(flow, cid)


_UNREAD = InitialSniffer()
"""A joined flow's pending step holds it, never fed: there is no ClientHello to read."""
