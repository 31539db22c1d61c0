"""What a QUIC flow is, pending or spliced: the records the flow table keeps and the edge reads."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from router import constants as c
from router.udp.handshake_watch import HandshakeWatch

Address = tuple[Any, ...]
"""A socket address as asyncio reports it: ``(host, port)`` or ``(host, port, flow, scope)``."""

PendingKey = tuple[Address, bytes]
"""A pending flow's key: its client address and the DCID of its first Initial."""

S = TypeVar("S")
"""The edge's sniffer of a pending flow (opaque here)."""
H = TypeVar("H")
"""The edge's handle of a flow's pod socket (opaque here)."""


@dataclass(slots=True, eq=False)
class PendingFlow(Generic[S]):
    """A client connection whose ClientHello is incomplete; its datagrams wait here, in order."""

    address: Address
    created_at: float
    sniffer: S
    datagrams: list[bytes] = field(default_factory=list)
    buffered_bytes: int = 0
    decided: bool = False
    """The pod is chosen and its socket is being opened; datagrams still queue here."""
    dcid: bytes = b""
    """DCID of the Initial that opened it: the client's original DCID, half its key."""
    scid: bytes = b""
    """The client's SCID: its own connection ID, in every long header it sends."""
    access: Any = None
    """The edge's access record of this attempt (opaque here)."""

    @property
    def key(self) -> PendingKey:
        return self.address, self.dcid


@dataclass(slots=True, eq=False)
class Flow(Generic[H]):
    """A client connection spliced to one pod through ``handle`` (the pod-side socket)."""

    address: Address
    pod_name: str
    handle: H
    last_active: float
    idle_timeout_s: float = c.DEFAULT_RELAY_IDLE_TIMEOUT_MS / 1000
    """Silence after which the connection has ended at both ends (``FlowLimits.flow_idle_timeout_s``)."""
    cids: deque[bytes] = field(default_factory=deque)
    """Learned pod connection IDs, oldest first (bounded)."""
    client_dcids: deque[bytes] = field(default_factory=deque)
    """The client's original DCID (its Initials and 0-RTT packets carry it)."""
    client_scid: bytes = b""
    """The client's own connection ID (its long headers carry it); b"" when it chose none."""
    shared: bool = False
    """It met another flow at an address, or QUIC-LB joined it: its datagrams are told apart by CID."""
    access: Any = None
    """The edge's access record of this flow (opaque here)."""
    client_bytes: int = 0
    """Bytes of the datagrams the client sent on this flow (its access line's count)."""
    pod_bytes: int = 0
    """Bytes of the datagrams the pod sent the client on this flow."""
    handshake: HandshakeWatch | None = None
    """What the flow has shown while unconfirmed; None once confirmed (``handshake_watch``)."""

    @property
    def confirmed(self) -> bool:
        return self.handshake is None
