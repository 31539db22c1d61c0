"""The QUIC flow table's bounds, and how long a flow may be silent.

Every bound is a field here, defaulting to ``router/constants.py`` and checked once, so a
spoofed-source flood costs bounded memory. A flow's idle timeout follows RFC 9000 section 10.1.
"""

from __future__ import annotations

from dataclasses import dataclass

from router import constants as c


class FlowTableError(ValueError):
    """Limits that cannot bound anything (zero or negative); names the offending field."""


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """Every bound of ``UdpFlowTable``; each must be > 0."""

    max_pending_flows: int = c.QUIC_MAX_PENDING_FLOWS
    max_pending_flows_per_address: int = c.QUIC_MAX_PENDING_FLOWS_PER_ADDRESS
    max_pending_datagrams_per_flow: int = c.QUIC_MAX_PENDING_DATAGRAMS_PER_FLOW
    max_pending_bytes_per_flow: int = c.QUIC_MAX_PENDING_BYTES_PER_FLOW
    pending_flow_timeout_s: float = c.QUIC_PENDING_FLOW_TIMEOUT_MS / 1000
    handshake_timeout_s: float = c.DEFAULT_QUIC_HANDSHAKE_TIMEOUT_MS / 1000
    """``--quic-handshake-timeout-ms``: the longest a flow may live unconfirmed (``handshake_watch``)."""
    max_flows: int = c.QUIC_MAX_FLOWS
    idle_timeout_s: float = c.DEFAULT_RELAY_IDLE_TIMEOUT_MS / 1000
    """``--relay-idle-timeout-ms``: the longest any flow may be silent."""
    max_learned_cids_per_flow: int = c.QUIC_MAX_LEARNED_CIDS_PER_FLOW
    rejection_memory_s: float = c.QUIC_REJECTION_MEMORY_MS / 1000
    max_remembered_rejections: int = c.QUIC_MAX_REMEMBERED_REJECTIONS
    answers_per_rejection: int = c.QUIC_ANSWERS_PER_REJECTION
    probe_timeout_s: float = c.QUIC_IDLE_PROBE_TIMEOUT_MS / 1000
    """The PTO a connection's idle timeout is at least three of (RFC 9000 section 10.1)."""
    idle_grace_s: float = c.QUIC_IDLE_GRACE_MS / 1000

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            if not getattr(self, name) > 0:
                raise FlowTableError(f"{name} must be > 0, got {getattr(self, name)!r}")

    def flow_idle_timeout_s(self, client_max_idle_ms: int) -> float:
        """RFC 9000 section 10.1: min(both ends' ``max_idle_timeout``), at least three PTOs; only the
        client's is read, so it bounds from above. None advertised (0): ``idle_timeout_s``, every flow's cap."""
        if client_max_idle_ms <= 0:
            return self.idle_timeout_s
        own = max(client_max_idle_ms / 1000, 3 * self.probe_timeout_s) + self.idle_grace_s
        return min(own, self.idle_timeout_s)

    @property
    def shortest_flow_idle_s(self) -> float:
        """The shortest silence any flow may be ended after (the sweep runs a few times within it)."""
        return min(self.idle_timeout_s, 3 * self.probe_timeout_s + self.idle_grace_s)
