"""The QUIC side's settings: what the CLI and the tests may tune, checked once at construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from quic.frames import QUIC_MAX_CRYPTO_BYTES
from router import constants as c
from router.udp.flow_table import FlowLimits


@dataclass(frozen=True)
class UdpRouterSettings:
    """Knobs of the QUIC side; defaults from ``router/constants.py`` (the CRYPTO cap from ``quic/frames.py``).

    The flow table's bounds (including the idle timeout) are its ``FlowLimits``, validated there.
    """

    limits: FlowLimits = field(default_factory=FlowLimits)
    cid_length: int | None = None
    """Length of the pod's connection IDs in short headers; None learns it from long headers."""
    max_crypto_bytes: int = QUIC_MAX_CRYPTO_BYTES
    reject_budget_bytes_per_s: float = c.QUIC_REJECT_BUDGET_BYTES_PER_S
    sweep_interval_s: float = c.QUIC_FLOW_SWEEP_INTERVAL_MS / 1000
    max_flows_per_client: int = c.DEFAULT_MAX_QUIC_FLOWS_PER_CLIENT
    """Routed plus pending flows one client IP (IPv6: /64) may hold; 0 = no limit."""
    native: bool | None = None
    """Established flows through the C splice: None when it is built and not switched off by
    ``NO_EXTENSIONS_ENV``, False never (the pure-Python path), True always (an error if not built)."""
    io_uring: bool | None = None
    """The C splice's sends to many pods in one ``io_uring_enter`` per batch, where the kernel
    allows it: None unless ``NO_IO_URING_ENV`` is set, False never, True where allowed."""

    def __post_init__(self) -> None:
        if self.cid_length is not None and not 1 <= self.cid_length <= 20:
            raise ValueError(f"cid_length must be None or 1..20, got {self.cid_length!r}")
        for name in ("max_crypto_bytes", "reject_budget_bytes_per_s", "sweep_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.max_flows_per_client < 0:
            raise ValueError(f"max_flows_per_client must be >= 0, got {self.max_flows_per_client!r}")
