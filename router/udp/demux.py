"""Client datagrams to their flows: the QUIC edge's demultiplexing, as QUIC's own.

Every datagram from a client, on either path (the pure-Python listener, or what the C splice
hands back), comes through ``_from_client``. The common case costs one dict lookup: an address
with one flow, not shared, gives that flow every short header. The rest is judged by the pure
verdicts of ``verdicts``: a new address's datagram (a new connection, a migrated flow, an
unknown version, a refused attempt's retransmit, or junk to count), a long header from an
address with flows, and anything from a shared address, where the connection IDs tell one
connection from another (``Flow.shared``). A new connection from an address that already has
flows is sniffed beside them (a pending flow keyed by address and its DCID), so a spoofed
Initial from a live client's address costs a pending flow of its own and never touches the
live connection. A datagram that names no flow at all (the miss: a short header, or a Handshake
packet, from an address with no flow for it) may still name its pod, with QUIC-LB pods
(``server_id_joins``), as may a short header of a shared address that names none of its flows;
else, with ``--workers N``, its flow may be another worker's (``worker_follow``). A bug a
datagram meets costs that datagram only, on either path: it is logged (a traceback a second at
most, ``QUIC_DATAGRAM_ERROR_LOG_LINES_PER_S``; the rest counted as suppressed), never raised into
the listener or the C splice, whose batch holds other clients' datagrams.

``ClientDemux`` is a base class of ``edge.UdpRouter``, like ``flow_endings.FlowEndings``: it
acts on the router's own table, slots and refusals; the router decides routes (``_route``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from quic.initial_sniffer import InitialSniffer
from quic.packet import LongHeader, QuicPacketError, long_header_cids
from router.log_limiter import RateLimitedLog
from router.outcomes import QuicDropReason, Termination
from router.routing import Refusal
from router.udp.flow_endings import Link
from router.udp.flow_table import Address, Flow, PendingFlow
from router.udp.pod_link import Outboxes
from router.udp.refusals import QuicRefusals, peer
from router.udp.settings import UdpRouterSettings
from router.udp.verdicts import Verdict, classify_on_flow, classify_unrouted
from router.udp.worker_follow import WorkerFollow
from wire.client_hello import ClientHelloInfo

log = logging.getLogger("router.udp_router")
"""The router's logger: migration and unusable-Initial lines keep the name operators filter on."""


class ClientDemux(WorkerFollow):
    """Takes each client datagram to its flow, its pending flow, a refusal's answer, or a drop."""

    settings: UdpRouterSettings
    _refusals: QuicRefusals
    _accepting: bool
    _loop: asyncio.AbstractEventLoop | None
    _outboxes: Outboxes[Flow[Link]]
    _datagram_errors: RateLimitedLog
    """Where a bug a client datagram met is logged: a traceback a second at most, the rest counted."""

    def _route(self, pending: PendingFlow[InitialSniffer], info: ClientHelloInfo, now: float) -> None:
        raise NotImplementedError  # the router's: pick the pod, dial it or refuse

    # -- the per-datagram paths -----------------------------------------------------------
    def _from_client(self, data: bytes, addr: Address) -> None:
        try:
            flow = self._table.flow(addr)
            now = self._clock()
            if flow is None:
                self._from_new_address(data, addr, now)
            elif data and not data[0] & 0x80 and not flow.shared:  # the common case: one lookup
                self._to_pod(flow, data, now)
            else:
                self._from_flow_address(flow, data, now)
        except Exception:  # a bug costs this datagram, never the batch's others, nor a traceback each
            self._datagram_errors.log(
                logging.ERROR, "unexpected error handling a quic datagram from %s", peer(addr), exc_info=True
            )

    def _handed_back(self, data: bytes, addr: Address) -> None:
        """A datagram the C splice did not send: ``_from_client`` looked up per call (the flood audit wraps it)."""
        self._from_client(data, addr)

    def _splice_failed(self, flow: Flow[Link], error: int) -> None:
        """The C splice met an error on the flow's pod socket (ECONNREFUSED: the pod is gone)."""
        self._flow_failed(flow, OSError(error, os.strerror(error)))

    def _to_pod(self, flow: Flow[Link], data: bytes, now: float) -> None:
        """Into the flow's outbox, sent with every outbox touched in this loop iteration."""
        flow.last_active = now
        flow.client_bytes += len(data)
        watch = flow.handshake
        if watch is not None and watch.client_sent(data, flow.cids):
            self._confirm(flow)
        link = flow.handle
        if link.sock is not None:
            self._outboxes.add(link, data)

    def _call_soon(self, callback: Callable[[], None]) -> None:
        assert self._loop is not None
        self._loop.call_soon(callback)

    def _from_new_address(self, data: bytes, addr: Address, now: float) -> None:
        if data and data[0] & 0x80:  # a datagram of a connection being sniffed: its first DCID
            pending = self._table.pending(addr, long_header_cids(data)[0])
            if pending is not None:
                self._feed(pending, data, now)
                return
        unrouted = classify_unrouted(
            self._table, data, addr, now, self.settings.cid_length, self.settings.extensions.initials
        )
        verdict, header = unrouted.verdict, unrouted.header
        if verdict is Verdict.JOIN and unrouted.flow is not None:
            self._join(unrouted.flow, data, addr, now)
        elif verdict is Verdict.REANSWER and unrouted.rejection is not None:
            self._refusals.reanswer(unrouted.rejection, len(data), addr, now)
        elif verdict is Verdict.NEGOTIATE and header is not None:
            self._drop(QuicDropReason.NOT_INITIAL)
            self._refusals.negotiate_version(header.dcid, header.scid, len(data), addr, now)
        elif verdict is Verdict.OPEN and header is not None:
            self._open(header, data, addr, now)
        else:
            reason = unrouted.drop_reason or QuicDropReason.MALFORMED
            if reason is not QuicDropReason.NOT_INITIAL or not (
                self._join_unrouted(data, addr, now) or self._follow_miss(data, addr, now)
            ):
                self._drop(reason)

    def _from_flow_address(self, first: Flow[Link], data: bytes, now: float) -> None:
        """A long header from an address with flows, or any datagram of a shared address."""
        unrouted = classify_on_flow(
            self._table, first, data, now, self.settings.cid_length, self.settings.extensions.initials
        )
        verdict, header, flow = unrouted.verdict, unrouted.header, unrouted.flow
        addr = first.address
        if verdict is Verdict.FORWARD and flow is not None:
            self._to_pod(flow, data, now)
        elif verdict is Verdict.UNNAMED and flow is not None:
            if not (self._join_unnamed(flow, data, now) or self._follow_unnamed(data, addr, now)):
                self._to_pod(flow, data, now)
        elif verdict is Verdict.JOIN and flow is not None:
            self._join(flow, data, addr, now)
        elif verdict is Verdict.FEED and unrouted.pending is not None:
            self._feed(unrouted.pending, data, now)
        elif verdict is Verdict.REANSWER and unrouted.rejection is not None:
            self._refusals.reanswer(unrouted.rejection, len(data), addr, now)
        elif verdict is Verdict.OPEN and header is not None:
            self._open(header, data, addr, now)
        else:
            self._drop(unrouted.drop_reason or QuicDropReason.MALFORMED)

    def _join(self, flow: Flow[Link], data: bytes, addr: Address, now: float) -> None:
        """A known pod CID from a new address: NAT rebinding or migration; follow the client."""
        old = flow.address
        if not self._table.migrate(flow, addr):
            self._drop(QuicDropReason.NOT_INITIAL)
            return
        log.debug("quic flow to %s moved from %s to %s", flow.pod_name, peer(old), peer(addr))
        flow.handle.moved(addr)
        self._to_pod(flow, data, now)

    def _open(self, header: LongHeader, data: bytes, addr: Address, now: float) -> None:
        refusal = None if self._accepting else Refusal.TARGET_UNAVAILABLE
        if refusal is None and not self._slots.take(header, addr[0]):  # before it costs a pending flow
            refusal = Refusal.CLIENT_LIMIT
        if refusal is not None:
            answered = self._refusals.refuse(addr, header.version, header.dcid, header.scid, len(data), now, None,
                                             refusal)
            return self._access.refused_unopened(addr, len(data), answered, refusal, now)
        evicted = self._table.make_room(addr)
        if evicted is not None:
            self._evict(evicted)
        self._make_room_for_flow()
        sniffer = InitialSniffer(self.settings.max_crypto_bytes, native=self.settings.extensions.initials)
        opened = self._table.open_pending(addr, sniffer, now, dcid=header.dcid, scid=header.scid)
        if isinstance(opened, QuicDropReason):
            self._slots.release(header)
            self._drop(opened)
            return
        self._slots.move(header, opened)
        self._access.open(opened, now)
        self._feed(opened, data, now, header)

    def _feed(
        self, pending: PendingFlow[InitialSniffer], data: bytes, now: float, header: LongHeader | None = None
    ) -> None:
        """One more datagram of a pending flow (``header``: its first, if parsed): buffer, find the hello."""
        if not self._table.can_buffer(pending, len(data)):
            self._drop(QuicDropReason.PENDING_FULL)
            if not pending.datagrams:  # opened by this very datagram: hold no slot for nothing
                self._discard(pending, Termination.REJECTED)
            return
        if pending.decided:
            self._table.buffer(pending, data)
            return
        try:
            info = pending.sniffer.feed(data, header)
        except QuicPacketError as exc:
            log.debug("quic Initial from %s unusable: %s", peer(pending.address), exc)
            self._drop(QuicDropReason.MALFORMED, 1 + len(pending.datagrams))
            self._discard(pending, Termination.REJECTED)
            return
        self._table.buffer(pending, data)
        if info is not None:
            self._route(pending, info, now)
