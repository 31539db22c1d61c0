"""Client datagrams to their flows: the QUIC edge's demultiplexing, as QUIC's own (docs/quic.md).

The common case is one dict lookup: an address with one unshared flow takes its short headers; the
rest is judged by the pure ``verdicts.judge``. A spoofed Initial from a live client's address costs a
pending flow of its own and never touches the live connection. A bug a datagram meets costs that
datagram only: logged, rate-limited, never raised into the listener or the C splice, whose batch
holds other clients' datagrams.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from router import constants as c
from router.log_limiter import RateLimitedLog
from router.outcomes import QuicDropReason
from router.udp.datapath import Datapath, Link
from router.udp.flow_endings import FlowEndings, Table
from router.udp.flow_opening import FlowOpener
from router.udp.flows import Address, Flow
from router.udp.joins import Joins
from router.udp.pod_link import Outboxes
from router.udp.refusals import QuicRefusals, peer
from router.udp.settings import UdpRouterSettings
from router.udp.verdicts import Verdict, judge

log = logging.getLogger("router.udp_router")
"""The router's logger: migration lines keep the name operators filter on."""


class ClientDemux:
    """Takes each client datagram to its flow, its pending flow, a refusal's answer, a join or a drop."""

    def __init__(
        self, settings: UdpRouterSettings, table: Table, opener: FlowOpener, joins: Joins, endings: FlowEndings,
        refusals: QuicRefusals, datapath: Datapath, outboxes: Outboxes[Flow[Link]], clock: Callable[[], float],
    ) -> None:
        self._cid_length = settings.cid_length
        self._native = settings.extensions.initials
        self._table = table
        self._opener = opener
        self._joins = joins
        self._endings = endings
        self._refusals = refusals
        self._datapath = datapath
        self._outboxes = outboxes
        self._clock = clock
        self.errors = RateLimitedLog(log, c.QUIC_DATAGRAM_ERROR_LOG_LINES_PER_S)
        """Where a bug a client datagram met is logged: a traceback a second at most, the rest counted."""

    def deliver(self, data: bytes, addr: Address) -> None:
        """One client datagram, from the listener or handed back by the C splice."""
        try:
            flow = self._table.flow(addr)
            now = self._clock()
            if flow is not None and data and not data[0] & 0x80 and not flow.shared:  # one lookup
                self.to_pod(flow, data, now)
            else:
                self._judged(flow, data, addr, now)
        except Exception:  # a bug costs this datagram, never the batch's others, nor a traceback each
            self.errors.log(logging.ERROR, "unexpected error handling a quic datagram from %s", peer(addr),
                            exc_info=True)

    def to_pod(self, flow: Flow[Link], data: bytes, now: float) -> None:
        """Into the flow's outbox, sent with every outbox touched in this loop iteration."""
        flow.last_active = now
        flow.client_bytes += len(data)
        watch = flow.handshake
        if watch is not None and watch.client_sent(data, flow.cids):
            self._table.confirm(flow)
            self._datapath.confirm(flow)
        link = flow.handle
        if link.sock is not None:
            self._outboxes.add(link, data)

    def _judged(self, first: Flow[Link] | None, data: bytes, addr: Address, now: float) -> None:
        """Carry out ``verdicts.judge`` on what no flow simply takes."""
        unrouted = judge(self._table, first, data, addr, now, self._cid_length, self._native)
        match unrouted.verdict:
            case Verdict.FORWARD if unrouted.flow is not None:
                self.to_pod(unrouted.flow, data, now)
            case Verdict.JOIN if unrouted.flow is not None:
                self._join(unrouted.flow, data, addr, now)
            case Verdict.FEED if unrouted.pending is not None:
                self._opener.feed(unrouted.pending, data, now)
            case Verdict.OPEN if unrouted.header is not None:
                self._opener.open(unrouted.header, data, addr, now)
            case Verdict.REANSWER if unrouted.rejection is not None:
                self._refusals.reanswer(unrouted.rejection, len(data), addr, now)
            case Verdict.NEGOTIATE if unrouted.header is not None:
                self._endings.drop(QuicDropReason.NOT_INITIAL)
                self._refusals.negotiate_version(unrouted.header.dcid, unrouted.header.scid, len(data), addr, now)
            case Verdict.UNNAMED if unrouted.flow is not None:
                taker = self._joins.take_unnamed(unrouted.flow, data, now)
                if taker is not None:
                    self.to_pod(taker, data, now)
            case Verdict.MISS:
                if not self._joins.take(data, addr, now):
                    self._endings.drop(QuicDropReason.NOT_INITIAL)
            case _:
                self._endings.drop(unrouted.drop_reason or QuicDropReason.MALFORMED)

    def _join(self, flow: Flow[Link], data: bytes, addr: Address, now: float) -> None:
        """A known pod CID from a new address: NAT rebinding or migration; follow the client."""
        old = flow.address
        if not self._table.migrate(flow, addr):
            self._endings.drop(QuicDropReason.NOT_INITIAL)
            return
        log.debug("quic flow to %s moved from %s to %s", flow.pod_name, peer(old), peer(addr))
        self._datapath.moved(flow)
        self.to_pod(flow, data, now)
