"""One connection's or flow's access record: what the router knows about it while it lives.

Its own module so that ``live_view`` and ``access_log`` both read it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from router.outcomes import GrpcOutcome, ProtocolLabel, QuicFlowOutcome, Termination

Outcome = GrpcOutcome | QuicFlowOutcome | None
"""The counter's outcome label of a connection or flow; None for a flow that never got one (a QUIC
flow whose ClientHello never completed, a TCP connection cut by the drain before its decision)."""

ACCESS_MESSAGE: Final = "access"
"""The ``msg`` (and ``event``) of every access line, to filter them with one match."""


@dataclass(slots=True, eq=False)
class AccessRecord:
    """What the router knows about one connection or flow; the live view reads it while it lives.

    Byte counts include the bytes peeked for the hostname and the router's own answers; while a relay
    runs, ``probe`` adds its live counts, so a long stream shows them growing.
    """

    protocol: ProtocolLabel
    """``h2c``, ``tls`` or ``quic`` (a TCP connection counts as h2c until its bytes say TLS)."""
    client: str
    """``ip:port`` or ``[v6]:port``."""
    started: float
    """Monotonic time of accept (TCP) or of the flow's first datagram (QUIC)."""
    hostname: str | None = None
    pod: str | None = None
    pod_address: str | None = None
    """``ip:port`` of the pod once dialled."""
    decided_at: float | None = None
    """Monotonic time of the routing decision."""
    bytes_client_to_pod: int = 0
    bytes_pod_to_client: int = 0
    last_active: float = 0.0
    probe: Callable[[], tuple[int, int, float]] | None = None
    """Live ``(client_to_pod, pod_to_client, last_active)`` of a running relay, added to the counts."""
    listed: bool = False
    """Listed in the live view (false only past its bound, where it is merely counted)."""
    ended: bool = False

    def current(self) -> tuple[int, int, float]:
        """Byte counts and last activity now (the probe's live part included)."""
        up, down, last = self.bytes_client_to_pod, self.bytes_pod_to_client, self.last_active
        if self.probe is not None:
            live_up, live_down, live_last = self.probe()
            up, down, last = up + live_up, down + live_down, max(last, live_last)
        return up, down, max(last, self.started)

    def settle(self) -> None:
        """Fold the probe's live counts into the record for good (its relay is gone)."""
        self.bytes_client_to_pod, self.bytes_pod_to_client, self.last_active = self.current()
        self.probe = None

    def values(self, outcome: Outcome, termination: Termination, now: float) -> LineValues:
        """The access line's values after ``event``, in the line's order (for the renderers and ``fields``)."""
        up, down = self.bytes_client_to_pod, self.bytes_pod_to_client
        if self.probe is not None:  # a relay still running (a drain's cut): its live counts too
            up, down, _last = self.current()
        decided = self.decided_at
        return (
            self.protocol, self.client, self.hostname, self.pod, self.pod_address, outcome, termination,
            up, down, round((now - self.started) * 1000.0, 3),
            None if decided is None else round((decided - self.started) * 1e6),
        )

    def fields(self, outcome: Outcome, termination: Termination, now: float) -> dict[str, Any]:
        """The access line's keys, in their documented order."""
        protocol, client, hostname, pod, pod_address, _, _, up, down, duration, decision = self.values(
            outcome, termination, now
        )
        return {
            "event": ACCESS_MESSAGE,
            "protocol": protocol,
            "client": client,
            "hostname": hostname,
            "pod": pod,
            "pod_address": pod_address,
            "outcome": outcome,
            "termination": str(termination),
            "bytes_client_to_pod": up,
            "bytes_pod_to_client": down,
            "duration_ms": duration,
            "decision_us": decision,
        }


LineValues = tuple[
    ProtocolLabel, str, str | None, str | None, str | None, Outcome, Termination, int, int, float, int | None
]
"""``AccessRecord.values``: protocol, client, hostname, pod, pod_address, outcome, termination,
bytes_client_to_pod, bytes_pod_to_client, duration_ms, decision_us."""
