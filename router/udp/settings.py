"""The QUIC side's settings: what the CLI and the tests may tune, checked once at construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from quic.frames import QUIC_MAX_CRYPTO_BYTES
from router import constants as c
from router.client_limits import ClientCounts
from router.extensions import PYTHON, Extensions
from router.udp.flow_limits import FlowLimits
from router.udp.quic_lb import check_server_id_bytes


@dataclass(frozen=True)
class UdpRouterSettings:
    """Knobs of the QUIC side, defaults from ``router/constants.py``; the flow table's bounds are ``FlowLimits``."""

    limits: FlowLimits = field(default_factory=FlowLimits)
    cid_length: int | None = None
    """Length of the pod's connection IDs in short headers; None learns it from long headers."""
    max_crypto_bytes: int = QUIC_MAX_CRYPTO_BYTES
    reject_budget_bytes_per_s: float = c.QUIC_REJECT_BUDGET_BYTES_PER_S
    sweep_interval_s: float = c.QUIC_FLOW_SWEEP_INTERVAL_MS / 1000
    max_flows_per_client: int = c.DEFAULT_MAX_QUIC_FLOWS_PER_CLIENT
    """Routed plus pending flows one client IP (IPv6: /64) may hold; 0 = no limit."""
    client_counts: ClientCounts | None = None
    """Where flows per client are counted: None, this process; with ``--workers N``, the workers' shared table."""
    quic_lb_server_id_bytes: int = c.DEFAULT_QUIC_LB_SERVER_ID_BYTES
    """QUIC-LB server ID length: a datagram no flow takes joins the pod its connection ID names; 0 = off."""
    quic_lb_joins_per_s: float = c.QUIC_LB_JOINS_PER_S
    quic_lb_join_burst: float = c.QUIC_LB_JOIN_BURST
    extensions: Extensions = PYTHON
    """Which C extensions the edge uses, chosen once by the process (``router.runtime``); default: pure Python."""

    def __post_init__(self) -> None:
        self.extensions.require()
        if self.cid_length is not None and not 1 <= self.cid_length <= 20:
            raise ValueError(f"cid_length must be None or 1..20, got {self.cid_length!r}")
        if self.quic_lb_server_id_bytes:
            check_server_id_bytes(self.quic_lb_server_id_bytes)
        for name in ("max_crypto_bytes", "reject_budget_bytes_per_s", "sweep_interval_s", "quic_lb_joins_per_s",
                     "quic_lb_join_burst"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.max_flows_per_client < 0:
            raise ValueError(f"max_flows_per_client must be >= 0, got {self.max_flows_per_client!r}")
