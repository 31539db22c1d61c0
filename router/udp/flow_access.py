"""The access records of QUIC flows: one per attempt, opened with its pending flow, ended once.

A record travels with the pending flow, then with the established flow (the table keeps it opaque).
Its byte counts are what the client's datagrams carried (a pending flow's buffered ones, then the
flow's) and what the pod's replies, or a refusal, carried back.
"""

from __future__ import annotations

from typing import Any

from discovery.targets import Target
from router.access_log import AccessLog
from router.access_record import AccessRecord, Outcome
from router.log_text import clip_optional
from router.outcomes import ProtocolLabel, Termination
from router.routing import Refusal, Refused
from router.udp.flows import Address, Flow, PendingFlow
from router.udp.refusals import peer, quic_answer

PROTOCOL = ProtocolLabel.QUIC


class FlowAccess:
    """Adapts the access log to the QUIC edge's pending and established flows."""

    def __init__(self, access: AccessLog) -> None:
        self.log = access

    def open(self, pending: PendingFlow[Any], now: float) -> None:
        record = pending.access = self.log.open(PROTOCOL, peer(pending.address), now)
        record.probe = lambda: (pending.buffered_bytes, 0, now)  # the live view: what waits for the pod

    def decided(self, pending: PendingFlow[Any], hostname: str | None, decision: Target | Refused, now: float) -> None:
        """The ClientHello is read: its hostname, the pod it names and (when routable) its address."""
        record: AccessRecord | None = pending.access
        if record is not None:
            record.hostname, record.pod, record.decided_at = clip_optional(hostname), decision.pod_name, now
            record.pod_address = decision.quic_endpoint if isinstance(decision, Target) else None

    def established(self, pending: PendingFlow[Any], flow: Flow[Any], pod_address: str) -> None:
        """The pod socket is open: the record follows the flow, whose counters it reads live."""
        record: AccessRecord | None = pending.access
        if record is None:
            return
        flow.access, record.pod, record.pod_address = record, flow.pod_name, pod_address
        record.probe = lambda: (flow.client_bytes, flow.pod_bytes, flow.last_active)

    def end_pending(
        self, pending: PendingFlow[Any], outcome: Outcome, termination: Termination, now: float, answered: int = 0,
    ) -> None:
        """An attempt that never became a flow (refused, timed out, evicted, malformed, drained)."""
        record: AccessRecord | None = pending.access
        if record is None or record.ended:
            return
        if termination is not Termination.DIAL_FAILED:
            record.pod_address = None
        record.probe = None
        record.bytes_client_to_pod, record.bytes_pod_to_client = pending.buffered_bytes, answered
        self.log.end(record, outcome, termination, now)

    def end_flow(self, flow: Flow[Any], outcome: Outcome, termination: Termination, now: float) -> None:
        record: AccessRecord | None = flow.access
        if record is None or record.ended:
            return
        record.probe = None
        record.bytes_client_to_pod, record.bytes_pod_to_client = flow.client_bytes, flow.pod_bytes
        record.last_active = flow.last_active
        self.log.end(record, outcome, termination, now)

    def refused_unopened(self, addr: Address, received: int, answered: int, refusal: Refusal, now: float) -> None:
        """A new connection refused before any pending flow (draining, or its client over its limit)."""
        record = self.log.open(PROTOCOL, peer(addr), now)
        record.bytes_client_to_pod, record.bytes_pod_to_client = received, answered
        self.log.end(record, quic_answer(refusal)[0], Termination.REJECTED, now)
