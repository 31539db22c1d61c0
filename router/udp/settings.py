"""The QUIC side's settings: what the CLI and the tests may tune, checked once at construction."""

from __future__ import annotations

from dataclasses import dataclass, fields

from quic.frames import QUIC_MAX_CRYPTO_BYTES
from router import constants as c
from router.udp.flow_table import FlowLimits


@dataclass(frozen=True)
class UdpRouterSettings:
    """Knobs of the QUIC side; defaults from ``router/constants.py`` (the CRYPTO cap from ``quic/frames.py``)."""

    relay_idle_timeout_s: float = c.DEFAULT_RELAY_IDLE_TIMEOUT_MS / 1000
    cid_length: int | None = None
    """Length of the pod's connection IDs in short headers; None learns it from long headers."""
    max_crypto_bytes: int = QUIC_MAX_CRYPTO_BYTES
    max_pending_flows: int = c.QUIC_MAX_PENDING_FLOWS
    max_pending_datagrams_per_flow: int = c.QUIC_MAX_PENDING_DATAGRAMS_PER_FLOW
    max_pending_bytes_per_flow: int = c.QUIC_MAX_PENDING_BYTES_PER_FLOW
    pending_flow_timeout_s: float = c.QUIC_PENDING_FLOW_TIMEOUT_MS / 1000
    max_flows: int = c.QUIC_MAX_FLOWS
    max_learned_cids_per_flow: int = c.QUIC_MAX_LEARNED_CIDS_PER_FLOW
    reject_budget_bytes_per_s: float = c.QUIC_REJECT_BUDGET_BYTES_PER_S
    rejection_memory_s: float = c.QUIC_REJECTION_MEMORY_MS / 1000
    max_remembered_rejections: int = c.QUIC_MAX_REMEMBERED_REJECTIONS
    answers_per_rejection: int = c.QUIC_ANSWERS_PER_REJECTION
    flow_takeover_quiet_s: float = c.QUIC_FLOW_TAKEOVER_QUIET_MS / 1000
    sweep_interval_s: float = c.QUIC_FLOW_SWEEP_INTERVAL_MS / 1000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "cid_length":
                if value is not None and not 1 <= value <= 20:
                    raise ValueError(f"cid_length must be None or 1..20, got {value!r}")
            elif not value > 0:
                raise ValueError(f"{f.name} must be > 0, got {value!r}")

    def flow_limits(self) -> FlowLimits:
        return FlowLimits(
            max_pending_flows=self.max_pending_flows,
            max_pending_datagrams_per_flow=self.max_pending_datagrams_per_flow,
            max_pending_bytes_per_flow=self.max_pending_bytes_per_flow,
            pending_flow_timeout_s=self.pending_flow_timeout_s,
            max_flows=self.max_flows,
            idle_timeout_s=self.relay_idle_timeout_s,
            max_learned_cids_per_flow=self.max_learned_cids_per_flow,
            rejection_memory_s=self.rejection_memory_s,
            max_remembered_rejections=self.max_remembered_rejections,
            answers_per_rejection=self.answers_per_rejection,
            takeover_quiet_s=self.flow_takeover_quiet_s,
        )
