"""Joins: a datagram that names no flow here, routed to the pod its connection ID names.

A connection routed elsewhere (another replica, or another worker after a NAT rebinding) may come
here; a QUIC-LB server ID or the workers' ``cid_index`` may still name its pod (docs/quic.md, joins).
The pod validates the new path itself (RFC 9000 section 9). A joined flow is unconfirmed until the
pod answers, and told apart by connection ID from the start, since its client's socket may carry
other connections that moved with it. Only a miss pays for a join, and each costs a bucket token, a
client slot and room in the flow table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from discovery.targets import Target, TargetSnapshot
from quic.packet import LONG_FORM, MAX_CID_LENGTH, long_header_cids
from router.outcomes import QuicDropReason
from router.udp.cid_index import CidIndex
from router.udp.datapath import Link
from router.udp.flow_endings import FlowEndings, Table
from router.udp.flow_opening import FlowOpener
from router.udp.flows import Address, Flow
from router.udp.quic_lb import ServerIds, routable_cid, server_id
from router.udp.refusals import ByteBudget

log = logging.getLogger("router.udp_router")
"""The router's logger: join lines keep the name operators filter on."""


@dataclass(frozen=True, slots=True)
class JoinReasons:
    """What a namer's misses count as: a pod named but not ready, a join refused, the bucket spent."""

    unknown: QuicDropReason
    refused: QuicDropReason
    rate_limited: QuicDropReason


class PodNamer(Protocol):
    """Says which pod a datagram's connection ID names."""

    reasons: JoinReasons

    def name(self, datagram: bytes) -> tuple[bytes, Target | None] | None:
        """``(connection ID, the ready pod it names or None)``; None when this namer knows nothing of it."""


class ServerIdNamer:
    """QUIC-LB: the pod whose address ends in the connection ID's server ID."""

    reasons = JoinReasons(
        QuicDropReason.QUIC_LB_UNKNOWN_SERVER, QuicDropReason.QUIC_LB_REFUSED, QuicDropReason.QUIC_LB_RATE_LIMITED
    )

    def __init__(self, server_id_bytes: int, cid_length: int | None, snapshot: Callable[[], TargetSnapshot]) -> None:
        self._server_id_bytes = server_id_bytes
        self._cid_length = cid_length
        self._snapshot = snapshot
        self._ids: ServerIds | None = None
        self._ids_of: TargetSnapshot | None = None
        """The snapshot ``_ids`` was built from: rebuilt once per snapshot, at the first miss."""

    def _server_ids(self) -> ServerIds:
        snapshot = self._snapshot()
        if snapshot is not self._ids_of or self._ids is None:
            self._ids_of, self._ids = snapshot, ServerIds.of(snapshot, self._server_id_bytes)
            if self._ids.ambiguous:
                log.warning("quic-lb: pods whose addresses end in the same %d bytes have no server ID: %s",
                            self._server_id_bytes, ", ".join(self._ids.ambiguous))
        return self._ids

    def name(self, datagram: bytes) -> tuple[bytes, Target | None] | None:
        cid = routable_cid(datagram, self._cid_length)
        sid = server_id(cid, self._server_id_bytes) if cid is not None else None
        if cid is None or sid is None:
            return None
        return cid, self._server_ids().by_id.get(sid)


class IndexNamer:
    """``--workers N``: the pod another worker's flow learned the connection ID from."""

    reasons = JoinReasons(QuicDropReason.NOT_INITIAL, QuicDropReason.NOT_INITIAL, QuicDropReason.QUIC_LB_RATE_LIMITED)

    def __init__(self, index: CidIndex, cid_length: int | None, snapshot: Callable[[], TargetSnapshot]) -> None:
        self._index = index
        self._cid_length = cid_length
        self._snapshot = snapshot
        self._endpoints: dict[tuple[str, int], Target] = {}
        self._endpoints_of: TargetSnapshot | None = None

    def name(self, datagram: bytes) -> tuple[bytes, Target | None] | None:
        for cid in self._candidates(datagram):
            endpoint = self._index.pod_of(cid)
            if endpoint is not None:
                return cid, self._ready(endpoint)
        return None

    def _candidates(self, datagram: bytes) -> tuple[bytes, ...]:
        """The connection IDs a client datagram may carry: a short header's DCID at each length some
        worker learned (or ``--quic-cid-length``), a long header's DCID."""
        if len(datagram) < 2:
            return ()
        if datagram[0] & LONG_FORM:
            dcid = long_header_cids(datagram)[0]
            return (dcid,) if 1 <= len(dcid) <= MAX_CID_LENGTH else ()
        lengths = (self._cid_length,) if self._cid_length is not None else self._index.lengths()
        return tuple(datagram[1:1 + n] for n in lengths if 1 + n <= len(datagram))

    def _ready(self, endpoint: tuple[str, int]) -> Target | None:
        snapshot = self._snapshot()
        if snapshot is not self._endpoints_of:
            self._endpoints_of = snapshot
            self._endpoints = {(t.address, t.quic_port): t for t in snapshot}
        return self._endpoints.get(endpoint)


class Joins:
    """The edge's miss handler: joins what a namer names, counts the rest with the namer's reasons."""

    def __init__(
        self, namers: tuple[PodNamer, ...], table: Table, opener: FlowOpener, endings: FlowEndings,
        joins_per_s: float, burst: float,
    ) -> None:
        self._namers = namers
        self._table = table
        self._opener = opener
        self._endings = endings
        self._budget = ByteBudget(joins_per_s, burst)
        """A token bucket of joins (one token each)."""

    def __bool__(self) -> bool:
        return bool(self._namers)

    def _named(self, data: bytes) -> tuple[PodNamer, bytes, Target | None] | None:
        for namer in self._namers:
            named = namer.name(data)
            if named is not None:
                return namer, *named
        return None

    def take(self, data: bytes, addr: Address, now: float) -> bool:
        """A datagram from an address with no flow, naming no flow's connection ID: True when a namer
        took it (joined, or dropped with its reason), False when none knows it (dropped ``not_initial``)."""
        named = self._named(data)
        if named is None:
            return False
        namer, cid, target = named
        if target is None:
            self._endings.drop(namer.reasons.unknown)
        else:
            self._join(namer, target, cid, data, addr, now)
        return True

    def take_unnamed(self, first: Flow[Link], data: bytes, now: float) -> Flow[Link] | None:
        """A datagram at a shared address naming no flow's learned connection ID: the flow there of the
        pod a namer names (which learns the ID), or ``first`` when none names a ready pod; None when a
        new flow beside them took it (or it was dropped)."""
        named = self._named(data)
        if named is None or named[2] is None:
            return first
        namer, cid, target = named[0], named[1], named[2]
        for flow in self._table.flows_at(first.address):
            if flow.pod_name == target.pod_name:
                self._opener.tell_apart(flow, cid)
                return flow
        self._join(namer, target, cid, data, first.address, now)
        return None

    def _join(self, namer: PodNamer, target: Target, cid: bytes, data: bytes, addr: Address, now: float) -> None:
        if not self._opener.accepting or self._table.pending(addr, cid) is not None:
            self._endings.drop(namer.reasons.refused)
        elif not self._budget.take(1, now):
            self._endings.drop(namer.reasons.rate_limited)
        elif not self._opener.open_joined(target, cid, data, addr, now):
            self._endings.drop(namer.reasons.refused)
