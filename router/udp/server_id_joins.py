"""QUIC-LB joins: a datagram that no flow takes, routed to the pod its connection ID names.

With ``--quic-lb-server-id-bytes N``, pods put a server ID (the last N octets of their address) in
every connection ID they issue (``quic_lb``). A datagram that reaches this worker with no flow for it
(its connection moved here from another replica: a Gateway session expired, a replica rolled out)
is routed by that server ID: a flow is opened to the pod's QUIC port for the client's address,
without a ClientHello (its access line has no hostname and names the pod; it counts ``joined``),
and the datagram forwarded. The pod sees its connection arrive from a new address (this worker's
socket) and validates the path (RFC 9000 section 9), as for any migration. Later datagrams follow
the flow as any flow's do, also through connection IDs the router never saw (those the pod issues
in encrypted NEW_CONNECTION_ID frames): they name the same pod.

A joined flow is told apart by connection ID from the start (``Flow.shared``, and the C splice's
``learn``), because its client's socket may carry other connections, to other pods, that move here
with it: at such an address a connection ID no flow learned goes to the flow of the pod its server
ID names (which learns it), or opens one beside the others.

Bounded: only a miss comes here (a datagram of a known flow never does); a random short header
costs a slice and a dict lookup; a join costs a token of a bucket (``QUIC_LB_JOINS_PER_S``), a
client slot and room in the flow table, and without them is refused and counted. ``ServerIdJoins``
is a base class of ``edge.UdpRouter``, as ``flow_endings.FlowEndings`` is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from discovery.targets import Target, TargetSnapshot
from quic.initial_sniffer import InitialSniffer
from router.outcomes import QuicDropReason
from router.udp.flow_endings import FlowEndings, Link
from router.udp.flow_table import Address, Flow, PendingFlow
from router.udp.quic_lb import ServerIds, routable_cid, server_id
from router.udp.refusals import ByteBudget, peer
from router.udp.settings import UdpRouterSettings

log = logging.getLogger("router.udp_router")
"""The router's logger: QUIC-LB lines keep the name operators filter on."""


class ServerIdJoins(FlowEndings):
    """Opens flows for datagrams by their connection ID's server ID; ``UdpRouter`` dials them."""

    settings: UdpRouterSettings
    _snapshot: Callable[[], TargetSnapshot]
    _accepting: bool
    _server_ids: ServerIds | None
    _server_ids_of: TargetSnapshot | None
    """The snapshot ``_server_ids`` was built from: rebuilt once per snapshot, at the first miss."""
    _join_budget: ByteBudget
    """A token bucket of joins (one token each)."""
    _unread: InitialSniffer
    """A joined flow's pending step holds it, never fed: there is no ClientHello to read."""

    def _to_pod(self, flow: Flow[Link], data: bytes, now: float) -> None:
        raise NotImplementedError  # the demux's: into the flow's outbox

    def _dial(
        self, pending: PendingFlow[InitialSniffer], target: Target, hostname: str | None, idle_timeout_s: float,
        joined: bool = False,
    ) -> Flow[Link] | None:
        raise NotImplementedError  # the router's: open the pod socket, flush, count

    def _start_joins(self) -> None:
        self._server_ids = self._server_ids_of = None
        self._join_budget = ByteBudget(self.settings.quic_lb_joins_per_s, self.settings.quic_lb_join_burst)
        self._unread = InitialSniffer()

    def _server_ids_now(self) -> ServerIds | None:
        """The current snapshot's server IDs, or None with QUIC-LB off."""
        server_id_bytes = self.settings.quic_lb_server_id_bytes
        if not server_id_bytes:
            return None
        snapshot = self._snapshot()
        if snapshot is not self._server_ids_of or self._server_ids is None:
            self._server_ids_of, self._server_ids = snapshot, ServerIds.of(snapshot, server_id_bytes)
            if self._server_ids.ambiguous:
                log.warning("quic-lb: pods whose addresses end in the same %d bytes have no server ID: %s",
                            server_id_bytes, ", ".join(self._server_ids.ambiguous))
        return self._server_ids

    def _named_pod(self, data: bytes) -> tuple[bytes, Target | None] | None:
        """The datagram's connection ID and the ready pod its server ID names (None: none, or two);
        None when it carries no server ID (QUIC-LB off, config rotation ``0b111``, too short)."""
        server_ids = self._server_ids_now()
        cid = routable_cid(data, self.settings.cid_length) if server_ids is not None else None
        sid = server_id(cid, server_ids.server_id_bytes) if server_ids is not None and cid is not None else None
        if sid is None or cid is None or server_ids is None:
            return None
        return cid, server_ids.by_id.get(sid)

    def _join_unrouted(self, data: bytes, addr: Address, now: float) -> bool:
        """A datagram from an address with no flow, naming no flow's connection ID: True when QUIC-LB
        took it (joined, or dropped with a ``quic_lb_*`` reason), False when it carries no server ID
        (the caller drops it as before)."""
        named = self._named_pod(data)
        if named is None:
            return False
        cid, target = named
        if target is None:
            self._drop(QuicDropReason.QUIC_LB_UNKNOWN_SERVER)
        else:
            self._open_joined(target, cid, data, addr, now)
        return True

    def _join_unnamed(self, first: Flow[Link], data: bytes, now: float) -> bool:
        """A datagram at a shared address naming no flow's learned connection ID: to the flow there
        of the pod its server ID names (which learns it), or a new flow beside them; False when it
        names no pod (the address's first flow takes it, as without QUIC-LB)."""
        named = self._named_pod(data)
        cid, target = named if named is not None else (b"", None)
        if target is None:
            return False
        for flow in self._table.flows_at(first.address):
            if flow.pod_name == target.pod_name:
                self._to_pod(flow, data, now)
                self._learn_joined_cid(flow, cid)
                return True
        self._open_joined(target, cid, data, first.address, now)
        return True

    def _open_joined(self, target: Target, cid: bytes, data: bytes, addr: Address, now: float) -> None:
        """A flow to ``target`` for ``addr``'s connection ``cid``, bounded as any new flow and by the bucket."""
        if not self._accepting or self._table.pending(addr, cid) is not None:
            self._drop(QuicDropReason.QUIC_LB_REFUSED)
            return
        if not self._join_budget.take(1, now):
            self._drop(QuicDropReason.QUIC_LB_RATE_LIMITED)
            return
        self._make_room_for_flow()
        opened = self._table.open_pending(addr, self._unread, now, dcid=cid)
        if isinstance(opened, QuicDropReason):
            self._drop(opened)
            return
        if not self._slots.take(opened, addr[0]) or not self._table.buffer(opened, data):
            self._table.discard_pending(opened)
            self._slots.release(opened)
            self._drop(QuicDropReason.QUIC_LB_REFUSED)
            return
        self._access.open(opened, now)
        self._access.decided(opened, None, target, now)
        flow = self._dial(opened, target, None, self._table.limits.idle_timeout_s, joined=True)
        if flow is not None and flow.handle.sock is not None:  # (its first send did not fail it)
            self._learn_joined_cid(flow, cid)
            log.debug("quic flow %s joined %s by its connection ID's server ID", peer(addr), target.pod_name)

    def _learn_joined_cid(self, flow: Flow[Link], cid: bytes) -> None:
        """``flow`` is told apart by connection ID, ``cid`` among them, in Python and in the C splice."""
        flow.shared = True
        self._table.learn_cid(flow, cid)
        flow.handle.learned(cid)
