"""The QUIC router's flow table: who is pending, who is spliced to which pod, and for how long.

Sans-IO on purpose: no sockets, no clock. Every method that depends on time takes ``now``
(seconds, any monotonic origin), so bounds and expiry are tested on plain values. The
asyncio edge (``edge``) owns the sockets and keeps an opaque ``handle`` per
flow (its pod-side transport) and an opaque ``sniffer`` per pending flow.

A flow is keyed by the client address. NAT rebinding and connection migration change that
address mid-connection, so the table also indexes the pod's connection IDs, learned from
the Source Connection ID of the pod's long-header packets: a datagram from an unknown
address whose Destination Connection ID is a learned one belongs to that flow. CIDs the
pod issues later in (encrypted) NEW_CONNECTION_ID frames cannot be seen by an L4 router,
so a client that migrates *and* switches to such a CID at the same time is not followed.

A new connection from the address of an established flow (a NAT reusing a port whose mapping
expired, a client reusing its socket) is told apart by its Initial: a DCID that is neither one
of the flow's client DCIDs nor a learned pod CID. It is sniffed as a *contender* (a pending
flow at the same address, bounded like any pending flow) and, once its ClientHello is read,
``contend`` decides: same pod, it shares the flow; another pod (or refused), it takes the
address over only if the old flow's client has been quiet for ``takeover_quiet_s``, so a live
connection's ACKs and keepalives keep it safe from a spoofed Initial.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

from quic.packet import QuicPacketError, long_header_scid, short_header_dcid
from router import constants as c
from router.outcomes import QuicDropReason

Address = tuple[Any, ...]
"""A socket address as asyncio reports it: ``(host, port)`` or ``(host, port, flow, scope)``."""

S = TypeVar("S")
H = TypeVar("H")


class FlowTableError(ValueError):
    """Limits that cannot bound anything (zero or negative); names the offending field."""


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """Every bound of the table, so a spoofed-source flood costs bounded memory."""

    max_pending_flows: int = c.QUIC_MAX_PENDING_FLOWS
    max_pending_datagrams_per_flow: int = c.QUIC_MAX_PENDING_DATAGRAMS_PER_FLOW
    max_pending_bytes_per_flow: int = c.QUIC_MAX_PENDING_BYTES_PER_FLOW
    pending_flow_timeout_s: float = c.QUIC_PENDING_FLOW_TIMEOUT_MS / 1000
    max_flows: int = c.QUIC_MAX_FLOWS
    idle_timeout_s: float = c.DEFAULT_RELAY_IDLE_TIMEOUT_MS / 1000
    max_learned_cids_per_flow: int = c.QUIC_MAX_LEARNED_CIDS_PER_FLOW
    rejection_memory_s: float = c.QUIC_REJECTION_MEMORY_MS / 1000
    max_remembered_rejections: int = c.QUIC_MAX_REMEMBERED_REJECTIONS
    answers_per_rejection: int = c.QUIC_ANSWERS_PER_REJECTION
    takeover_quiet_s: float = c.QUIC_FLOW_TAKEOVER_QUIET_MS / 1000

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            if not getattr(self, name) > 0:
                raise FlowTableError(f"{name} must be > 0, got {getattr(self, name)!r}")


@dataclass(slots=True, eq=False)
class PendingFlow(Generic[S]):
    """A client address whose ClientHello is incomplete; its datagrams wait here, in order."""

    address: Address
    created_at: float
    sniffer: S
    datagrams: list[bytes] = field(default_factory=list)
    buffered_bytes: int = 0
    decided: bool = False
    """The pod is chosen and its socket is being opened; datagrams still queue here."""
    dcid: bytes = b""
    """DCID of the Initial that opened it: the client's original DCID (tells a contender's datagrams)."""
    access: Any = None
    """The edge's access record of this attempt (opaque here)."""


@dataclass(slots=True, eq=False)
class Flow(Generic[H]):
    """A client address spliced to one pod through ``handle`` (the pod-side socket)."""

    address: Address
    pod_name: str
    handle: H
    last_active: float
    cids: deque[bytes] = field(default_factory=deque)
    """Learned pod connection IDs, oldest first (bounded)."""
    client_dcids: deque[bytes] = field(default_factory=deque)
    """Original DCIDs of the client connections spliced here (bounded like ``cids``)."""
    client_seen_at: float = 0.0
    """When the client last sent a datagram on this flow (pod traffic does not count)."""
    access: Any = None
    """The edge's access record of this flow (opaque here)."""
    client_bytes: int = 0
    """Bytes of the datagrams the client sent on this flow (its access line's count)."""
    pod_bytes: int = 0
    """Bytes of the datagrams the pod sent the client on this flow."""


@dataclass(slots=True, eq=False)
class Rejection:
    """A refused connection attempt, remembered so its retransmits cost a dict lookup."""

    dcid: bytes
    expires_at: float
    answer: bytes
    answers_left: int


@dataclass(frozen=True, slots=True)
class Expired(Generic[S, H]):
    """What one sweep removed: pending flows that never completed, and idle flows."""

    pending: tuple[PendingFlow[S], ...]
    flows: tuple[Flow[H], ...]


class UdpFlowTable(Generic[S, H]):
    """Pending and established flows by client address, plus a learned-CID index."""

    def __init__(self, limits: FlowLimits | None = None) -> None:
        self.limits = limits if limits is not None else FlowLimits()
        self._pending: dict[Address, PendingFlow[S]] = {}
        self._flows: dict[Address, Flow[H]] = {}
        self._by_cid: dict[bytes, Flow[H]] = {}
        self._cid_lengths: dict[int, int] = {}
        self._rejections: OrderedDict[Address, Rejection] = OrderedDict()
        self.on_occupied: Callable[[], None] | None = None
        """Called when a pending flow or a rejection is added: something may need expiring
        (the sweeper sleeps while the table is ``idle``)."""

    # -- lookups (the per-datagram path: plain dict gets) ---------------------------------
    def flow(self, address: Address) -> Flow[H] | None:
        return self._flows.get(address)

    def pending(self, address: Address) -> PendingFlow[S] | None:
        return self._pending.get(address)

    def flow_for_cid(self, cid: bytes) -> Flow[H] | None:
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

    @property
    def cid_lengths(self) -> tuple[int, ...]:
        """Lengths of the learned CIDs (usually one), to cut short-header DCIDs with."""
        return tuple(self._cid_lengths)

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def flow_count(self) -> int:
        return len(self._flows)

    @property
    def idle(self) -> bool:
        """Nothing that time could expire: no flow, no pending flow, no remembered rejection."""
        return not (self._flows or self._pending or self._rejections)

    def flows(self) -> tuple[Flow[H], ...]:
        return tuple(self._flows.values())

    def pending_flows(self) -> tuple[PendingFlow[S], ...]:
        return tuple(self._pending.values())

    # -- pending flows ------------------------------------------------------------------
    def open_pending(
        self, address: Address, sniffer: S, now: float, *, dcid: bytes = b"", contending: bool = False
    ) -> PendingFlow[S] | QuicDropReason:
        """Start buffering for a new address (or, ``contending``, a new connection from an
        established flow's address), or say (a drop reason) why not."""
        if address in self._pending or (address in self._flows and not contending):
            raise FlowTableError(f"address {address!r} already has a flow")
        if len(self._flows) + len(self._pending) >= self.limits.max_flows:
            return QuicDropReason.FLOW_TABLE_FULL
        if len(self._pending) >= self.limits.max_pending_flows:
            return QuicDropReason.PENDING_FULL
        pending = PendingFlow(address, now, sniffer, dcid=dcid)
        self._pending[address] = pending
        if self.on_occupied is not None:
            self.on_occupied()
        return pending

    def make_room(self) -> PendingFlow[S] | None:
        """With the pending table full, evict its oldest undecided flow (the one a spoofed
        flood has held longest; a legitimate one leaves within a round trip) and return it."""
        if len(self._pending) < self.limits.max_pending_flows:
            return None
        for pending in self._pending.values():  # insertion order is creation order
            if not pending.decided:
                del self._pending[pending.address]
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
        if self._pending.get(pending.address) is pending:
            del self._pending[pending.address]

    def establish(self, pending: PendingFlow[S], pod_name: str, handle: H, now: float) -> Flow[H]:
        """Turn a pending flow into a spliced one; its datagrams stay on ``pending`` to flush."""
        if self._pending.get(pending.address) is not pending:
            raise FlowTableError(f"address {pending.address!r} is not pending")
        if pending.address in self._flows:
            raise FlowTableError(f"address {pending.address!r} still has a flow: retire it first")
        del self._pending[pending.address]
        flow: Flow[H] = Flow(pending.address, pod_name, handle, now, client_seen_at=now)
        self._add_client_dcid(flow, pending.dcid)
        self._flows[pending.address] = flow
        return flow

    def contend(self, flow: Flow[H], pod_name: str | None, now: float) -> Contention:
        """Decide for a contender whose ClientHello names ``pod_name`` (None: refused)."""
        if pod_name is not None and pod_name == flow.pod_name:
            return Contention.SHARE
        if now - flow.client_seen_at >= self.limits.takeover_quiet_s:
            return Contention.TAKE_OVER
        return Contention.REFUSE

    def share(self, pending: PendingFlow[S], flow: Flow[H]) -> None:
        """A contender for the flow's own pod joins it: its datagrams stay on ``pending`` to flush."""
        self.discard_pending(pending)
        self._add_client_dcid(flow, pending.dcid)

    def _add_client_dcid(self, flow: Flow[H], dcid: bytes) -> None:
        if dcid and dcid not in flow.client_dcids:
            flow.client_dcids.append(dcid)
            if len(flow.client_dcids) > self.limits.max_learned_cids_per_flow:
                flow.client_dcids.popleft()

    # -- established flows ----------------------------------------------------------------
    def learn_cid(self, flow: Flow[H], cid: bytes) -> None:
        """Index a pod connection ID for ``flow``; the oldest is forgotten beyond the bound."""
        if not cid or self._by_cid.get(cid) is flow:
            return
        old_owner = self._by_cid.get(cid)
        if old_owner is not None:
            self._forget_cid(old_owner, cid)
            old_owner.cids.remove(cid)
        flow.cids.append(cid)
        self._by_cid[cid] = flow
        self._cid_lengths[len(cid)] = self._cid_lengths.get(len(cid), 0) + 1
        if len(flow.cids) > self.limits.max_learned_cids_per_flow:
            self._forget_cid(flow, flow.cids.popleft())

    def learn_from_pod(self, flow: Flow[H], datagram: bytes, cid_length: int | None) -> None:
        """Learn the SCID of a pod's v1/v2 long header: a migrated client's DCID will be it."""
        scid = long_header_scid(datagram)
        if scid is not None:
            self.learn_pod_cid(flow, scid, cid_length)

    def learn_pod_cid(self, flow: Flow[H], scid: bytes, cid_length: int | None) -> None:
        """Learn a pod's SCID unless its length is not the pods' (``cid_length``, when configured)."""
        if cid_length is None or len(scid) == cid_length:
            self.learn_cid(flow, scid)

    def migrate(self, flow: Flow[H], address: Address) -> bool:
        """Re-key ``flow`` to the client's new address; False if that address is taken."""
        if self._flows.get(flow.address) is not flow:
            return False
        if address in self._flows or address in self._pending:
            return False
        del self._flows[flow.address]
        flow.address = address
        self._flows[address] = flow
        return True

    def remove(self, flow: Flow[H]) -> bool:
        """Forget a flow and its CIDs; False if it was already gone (idempotent)."""
        if self._flows.get(flow.address) is not flow:
            return False
        del self._flows[flow.address]
        for cid in flow.cids:
            self._forget_cid(flow, cid)
        flow.cids.clear()
        return True

    def _forget_cid(self, flow: Flow[H], cid: bytes) -> None:
        if self._by_cid.get(cid) is not flow:
            return
        del self._by_cid[cid]
        remaining = self._cid_lengths[len(cid)] - 1
        if remaining:
            self._cid_lengths[len(cid)] = remaining
        else:
            del self._cid_lengths[len(cid)]

    # -- rejections ---------------------------------------------------------------------
    def remember_rejection(self, address: Address, dcid: bytes, answer: bytes, now: float) -> None:
        """Remember a refused attempt (its first answer already sent); oldest evicted first."""
        self._rejections.pop(address, None)
        while len(self._rejections) >= self.limits.max_remembered_rejections:
            self._rejections.popitem(last=False)
        expires_at = now + self.limits.rejection_memory_s
        left = self.limits.answers_per_rejection - 1
        self._rejections[address] = Rejection(dcid, expires_at, answer, left)
        if self.on_occupied is not None:
            self.on_occupied()

    def rejection(self, address: Address, dcid: bytes, now: float) -> Rejection | None:
        """The remembered refusal of this attempt, if any; a new DCID is a new attempt."""
        rejection = self._rejections.get(address)
        if rejection is None:
            return None
        if rejection.dcid != dcid or rejection.expires_at <= now:
            del self._rejections[address]
            return None
        return rejection

    @property
    def rejection_count(self) -> int:
        return len(self._rejections)

    # -- time ---------------------------------------------------------------------------
    def expire(self, now: float) -> Expired[S, H]:
        """Remove pending flows past their deadline, idle flows, and stale rejections."""
        limits = self.limits
        stale: list[PendingFlow[S]] = []
        for pending in self._pending.values():  # insertion order is creation order
            if now - pending.created_at < limits.pending_flow_timeout_s:
                break
            stale.append(pending)
        for pending in stale:
            del self._pending[pending.address]
        idle = [f for f in self._flows.values() if now - f.last_active >= limits.idle_timeout_s]
        for flow in idle:
            self.remove(flow)
        while self._rejections:
            address, rejection = next(iter(self._rejections.items()))
            if rejection.expires_at > now:
                break
            del self._rejections[address]
        return Expired(tuple(stale), tuple(idle))


class Contention(Enum):
    """What becomes of a new connection from an established flow's address (see ``contend``)."""

    SHARE = "share"
    """It names the flow's pod: its datagrams go through the flow's socket, nothing else changes."""
    TAKE_OVER = "take_over"
    """Another pod (or refused) and the old client is quiet: retire the old flow, route the new."""
    REFUSE = "refuse"
    """Another pod (or refused) but the old client is live: the new attempt is refused."""
