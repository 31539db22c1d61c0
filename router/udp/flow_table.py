"""The QUIC router's flow table: who is pending, who is spliced to which pod, and for how long.

Sans-IO: ``now`` is seconds on any monotonic clock; the edge's ``handle`` and ``sniffer`` are opaque.
Flows are found as QUIC finds connections (docs/quic.md): an unshared address's first flow takes
every datagram in one dict lookup, flows that met at an address are told apart by connection ID,
and a learned pod CID finds its flow from any address. A pending flow is keyed by address and first
DCID, so it never threatens that address's flows. A confirmed flow is never evicted for a newcomer:
a flood of forged Initials or junk joins only competes with itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Generic, TypeVar

from quic.packet import QuicPacketError, short_header_dcid
from router.outcomes import QuicDropReason
from router.udp.flow_limits import FlowLimits, FlowTableError
from router.udp.flows import Address, Flow, PendingFlow, PendingKey
from router.udp.handshake_watch import HandshakeWatch
from router.udp.rejections import RememberedRejections

S = TypeVar("S")
H = TypeVar("H")


@dataclass(frozen=True, slots=True)
class Expired(Generic[S, H]):
    """What one sweep removed: timed-out pending flows, silent flows, flows not confirmed in time."""

    pending: tuple[PendingFlow[S], ...]
    flows: tuple[Flow[H], ...]
    unconfirmed: tuple[Flow[H], ...] = ()


class UdpFlowTable(Generic[S, H]):
    """Pending and established flows by client address and connection ID, plus a CID index."""

    def __init__(self, limits: FlowLimits | None = None) -> None:
        self.limits = limits if limits is not None else FlowLimits()
        self._pending: dict[PendingKey, PendingFlow[S]] = {}
        self._pending_at: dict[Address, int] = {}
        """How many pending flows each address has (bounded per address)."""
        self._flows: dict[Address, Flow[H]] = {}
        """Each address's first flow: the only lookup of a datagram from an unshared address."""
        self._more: dict[Address, list[Flow[H]]] = {}
        """An address's other flows, oldest first (only addresses with several)."""
        self._flow_count = 0
        self._unconfirmed: dict[Flow[H], None] = {}
        """Flows not confirmed yet, oldest first: the first to expire and to be evicted."""
        self._by_cid: dict[bytes, Flow[H]] = {}
        self._cid_lengths: dict[int, int] = {}
        self.rejections: RememberedRejections[PendingKey] = RememberedRejections(self.limits, self._occupied)
        """Refused attempts by address and first DCID: their retransmits are answered, not sniffed."""
        self.on_occupied: Callable[[], None] | None = None
        """Called when a pending flow or rejection is added: wakes the sweeper, asleep while ``idle``."""
        self.on_learned: Callable[[Flow[H], bytes], None] | None = None
        """Called with each pod CID a flow learns: what ``--workers N`` share (``cid_index``)."""
        self.on_forgotten: Callable[[bytes], None] | None = None
        """Called with each pod CID the table forgets (its flow ended, or it learned newer ones)."""

    # -- lookups (the per-datagram path: plain dict gets) ---------------------------------
    def flow(self, address: Address) -> Flow[H] | None:
        """The address's first flow (of several: the one that takes what no CID tells apart)."""
        return self._flows.get(address)

    def flows_at(self, address: Address) -> Iterator[Flow[H]]:
        """Every flow at ``address``, first first."""
        first = self._flows.get(address)
        if first is not None:
            yield first
            yield from self._more.get(address, ())

    def pending(self, address: Address, dcid: bytes) -> PendingFlow[S] | None:
        return self._pending.get((address, dcid))

    def flow_for_cid(self, cid: bytes) -> Flow[H] | None:
        """The flow a learned pod CID belongs to, wherever its client is."""
        return self._by_cid.get(cid)

    def flow_for_short_header(self, datagram: bytes, cid_length: int | None) -> Flow[H] | None:
        """The flow whose learned CID a short header carries (``cid_length`` None: any learned)."""
        for length in (cid_length,) if cid_length is not None else tuple(self._cid_lengths):
            try:
                flow = self._by_cid.get(short_header_dcid(datagram, length))
            except QuicPacketError:
                continue
            if flow is not None:
                return flow
        return None

    def flow_for_long_header(self, address: Address, dcid: bytes) -> Flow[H] | None:
        """The flow a client long header's DCID names: the original DCID of a flow at ``address``,
        or a learned pod CID (of a flow anywhere: then its client moved here)."""
        flow = self._by_cid.get(dcid) if dcid else None
        return flow or next((f for f in self.flows_at(address) if dcid in f.client_dcids), None)

    def flow_for_client_scid(self, address: Address, scid: bytes) -> Flow[H] | None:
        """The flow at ``address`` whose client chose ``scid`` as its own connection ID."""
        return next((f for f in self.flows_at(address) if f.client_scid == scid), None) if scid else None

    @property
    def cid_lengths(self) -> tuple[int, ...]:
        """Lengths of the learned CIDs (usually one), to cut short-header DCIDs with."""
        return tuple(self._cid_lengths)

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def flow_count(self) -> int:
        return self._flow_count

    @property
    def unconfirmed_count(self) -> int:
        return len(self._unconfirmed)

    @property
    def full(self) -> bool:
        """No room for one more flow or pending flow (``FlowLimits.max_flows`` counts both)."""
        return self._flow_count + len(self._pending) >= self.limits.max_flows

    @property
    def idle(self) -> bool:
        """Nothing that time could expire: no flow, no pending flow, no remembered rejection."""
        return not (self._flows or self._pending or self.rejections)

    def flows(self) -> tuple[Flow[H], ...]:
        return tuple(chain(self._flows.values(), chain.from_iterable(self._more.values())))

    def pending_flows(self) -> tuple[PendingFlow[S], ...]:
        return tuple(self._pending.values())

    # -- pending flows ------------------------------------------------------------------
    def open_pending(
        self, address: Address, sniffer: S, now: float, *, dcid: bytes = b"", scid: bytes = b""
    ) -> PendingFlow[S] | QuicDropReason:
        """Start buffering a new connection (its address and first DCID), or say (a drop reason) why not."""
        if (address, dcid) in self._pending:
            raise FlowTableError(f"address {address!r} already has a pending flow for that DCID")
        if self.full:
            return QuicDropReason.FLOW_TABLE_FULL
        if len(self._pending) >= self.limits.max_pending_flows or not self._pending_room(address):
            return QuicDropReason.PENDING_FULL
        pending = PendingFlow(address, now, sniffer, dcid=dcid, scid=scid)
        self._pending[address, dcid] = pending
        self._pending_at[address] = self._pending_at.get(address, 0) + 1
        self._occupied()
        return pending

    def _occupied(self) -> None:
        if self.on_occupied is not None:
            self.on_occupied()

    def _pending_room(self, address: Address) -> bool:
        return self._pending_at.get(address, 0) < self.limits.max_pending_flows_per_address

    def _take_pending(self, pending: PendingFlow[S]) -> None:
        del self._pending[pending.key]
        if left := self._pending_at[pending.address] - 1:
            self._pending_at[pending.address] = left
        else:
            del self._pending_at[pending.address]

    def make_room(self, address: Address) -> PendingFlow[S] | None:
        """With the pending table full, evict and return its oldest undecided flow (a legitimate one leaves
        within a round trip, a spoofed one lingers); None for an address at its own bound (refused instead)."""
        if len(self._pending) < self.limits.max_pending_flows or not self._pending_room(address):
            return None
        for pending in self._pending.values():  # insertion order is creation order
            if not pending.decided:
                self._take_pending(pending)
                return pending
        return None

    def can_buffer(self, pending: PendingFlow[S], size: int) -> bool:
        """Would one more datagram of ``size`` bytes stay within the per-flow bounds?"""
        limits = self.limits
        return (
            len(pending.datagrams) < limits.max_pending_datagrams_per_flow
            and pending.buffered_bytes + size <= limits.max_pending_bytes_per_flow
        )

    def buffer(self, pending: PendingFlow[S], datagram: bytes) -> bool:
        """Queue a datagram for the pod; False (nothing queued) if over the bounds."""
        if not self.can_buffer(pending, len(datagram)):
            return False
        pending.datagrams.append(datagram)
        pending.buffered_bytes += len(datagram)
        return True

    def discard_pending(self, pending: PendingFlow[S]) -> None:
        if self._pending.get(pending.key) is pending:
            self._take_pending(pending)

    def establish(
        self, pending: PendingFlow[S], pod_name: str, handle: H, now: float, idle_timeout_s: float | None = None,
        joined: bool = False,
    ) -> Flow[H]:
        """Turn a pending flow into a spliced, unconfirmed one beside any flows of its address (``joined``:
        opened by QUIC-LB, confirmed by the pod's answers); its datagrams stay on ``pending`` to flush."""
        if self._pending.get(pending.key) is not pending:
            raise FlowTableError(f"address {pending.address!r} has no such pending flow")
        self._take_pending(pending)
        idle = self.limits.idle_timeout_s if idle_timeout_s is None else idle_timeout_s
        flow: Flow[H] = Flow(pending.address, pod_name, handle, now, idle, client_scid=pending.scid,
                             handshake=HandshakeWatch(now, joined))
        if pending.dcid:
            flow.client_dcids.append(pending.dcid)
        self._place(flow)
        self._flow_count += 1
        self._unconfirmed[flow] = None
        return flow

    def confirm(self, flow: Flow[H]) -> None:
        """Client and pod are talking: the flow lives its idle timeout and is never evicted for a newcomer."""
        flow.handshake = None
        self._unconfirmed.pop(flow, None)

    def evict_unconfirmed(self) -> Flow[H] | None:
        """With the table full, remove its oldest unconfirmed flow and return it, to make room for a
        new one; None when the table has room or every flow is confirmed."""
        if not self.full or not self._unconfirmed:
            return None
        flow = next(iter(self._unconfirmed))
        self.remove(flow)
        return flow

    # -- established flows ----------------------------------------------------------------
    def _place(self, flow: Flow[H]) -> None:
        """Put ``flow`` at its address, after the flows already there (which it then shares)."""
        first = self._flows.get(flow.address)
        if first is None:
            self._flows[flow.address] = flow
            return
        others = self._more.setdefault(flow.address, [])
        others.append(flow)
        first.shared = flow.shared = True
        for other in others:
            other.shared = True

    def _unplace(self, flow: Flow[H]) -> bool:
        """Take ``flow`` from its address (the next one there becomes the first); False if absent."""
        address = flow.address
        others = self._more.get(address)
        if self._flows.get(address) is flow:
            if others:
                self._flows[address] = others.pop(0)
            else:
                del self._flows[address]
        elif others is not None and flow in others:
            others.remove(flow)
        else:
            return False
        if others is not None and not others:
            del self._more[address]
        return True

    def learn_cid(self, flow: Flow[H], cid: bytes) -> None:
        """Index a pod connection ID for ``flow``; the oldest is forgotten beyond the bound."""
        if not cid or self._by_cid.get(cid) is flow:
            return
        old_owner = self._by_cid.get(cid)
        if old_owner is not None:
            self._forget_cid(old_owner, cid)
            old_owner.cids.remove(cid)
        flow.cids.append(cid)
        if flow.handshake is not None:
            flow.handshake.pod_chose_cid = True
        self._by_cid[cid] = flow
        self._cid_lengths[len(cid)] = self._cid_lengths.get(len(cid), 0) + 1
        if self.on_learned is not None:
            self.on_learned(flow, cid)
        if len(flow.cids) > self.limits.max_learned_cids_per_flow:
            self._forget_cid(flow, flow.cids.popleft())

    def learn_pod_cid(self, flow: Flow[H], scid: bytes, cid_length: int | None) -> None:
        """Learn a pod's SCID unless its length is not the pods' (``cid_length``, when configured)."""
        if cid_length is None or len(scid) == cid_length:
            self.learn_cid(flow, scid)

    def migrate(self, flow: Flow[H], address: Address) -> bool:
        """Move ``flow`` to the client's new address, after any flows there; False if it is gone."""
        if not self._unplace(flow):
            return False
        flow.address = address
        self._place(flow)
        return True

    def remove(self, flow: Flow[H]) -> bool:
        """Forget a flow and its CIDs; False if it was already gone (idempotent)."""
        if not self._unplace(flow):
            return False
        self._flow_count -= 1
        self._unconfirmed.pop(flow, None)
        for cid in flow.cids:
            self._forget_cid(flow, cid)
        flow.cids.clear()
        return True

    def _forget_cid(self, flow: Flow[H], cid: bytes) -> None:
        if self._by_cid.get(cid) is not flow:
            return
        del self._by_cid[cid]
        if self.on_forgotten is not None:
            self.on_forgotten(cid)
        remaining = self._cid_lengths[len(cid)] - 1
        if remaining:
            self._cid_lengths[len(cid)] = remaining
        else:
            del self._cid_lengths[len(cid)]

    # -- time ---------------------------------------------------------------------------
    def expire(self, now: float) -> Expired[S, H]:
        """Remove pending flows past their deadline, silent flows, and stale rejections."""
        stale: list[PendingFlow[S]] = []
        for pending in self._pending.values():  # insertion order is creation order
            if now - pending.created_at < self.limits.pending_flow_timeout_s:
                break
            stale.append(pending)
        for pending in stale:
            self._take_pending(pending)
        late: list[Flow[H]] = []
        for flow in self._unconfirmed:  # insertion order is opening order
            if flow.handshake is None or now - flow.handshake.opened_at < self.limits.handshake_timeout_s:
                break
            late.append(flow)
        for flow in late:
            self.remove(flow)
        every = chain(self._flows.values(), chain.from_iterable(self._more.values()))
        silent = [f for f in every if now - f.last_active >= f.idle_timeout_s]
        for flow in silent:
            self.remove(flow)
        self.rejections.expire(now)
        return Expired(tuple(stale), tuple(silent), tuple(late))
