"""Answers of the QUIC edge to attempts it will not route: CONNECTION_CLOSE and Version Negotiation.

The router is no amplifier: an answer is never larger than what provoked it, within one global byte
budget, at most ``answers_per_rejection`` times per attempt. Refusals are logged rate-limited (a
flood is counted, not written line by line) and remembered so retransmits cost a lookup.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from discovery.targets import host_port
from quic.initial_sniffer import InitialSniffer
from quic.native import InitialProtection
from quic.packet import QuicErrorCode, QuicPacketError
from quic.server_packets import build_initial_close, build_version_negotiation
from router.log_limiter import RateLimitedLog
from router.log_text import clip_optional
from router.metrics import RouterMetrics
from router.outcomes import DroppedLog, QuicDropReason, QuicFlowOutcome, WebTransportOutcome
from router.routing import REFUSAL_ANSWERS, Refusal
from router.udp.flow_limits import FlowTableError
from router.udp.flow_table import UdpFlowTable
from router.udp.flows import Address, PendingFlow
from router.udp.rejections import Rejection

log = logging.getLogger("router.udp_router")
"""The router's logger: refusal lines keep the name operators filter on."""


def quic_answer(refusal: Refusal, webtransport: bool = False) -> tuple[QuicFlowOutcome, str]:
    """The outcome a refused QUIC attempt counts as (its WebTransport name under ``webtransport``)
    and its CONNECTION_CLOSE reason phrase."""
    answer = REFUSAL_ANSWERS[refusal]
    assert answer.quic_outcome is not None and answer.quic_reason is not None, f"{refusal} is not a QUIC refusal"
    if webtransport:
        return WebTransportOutcome(answer.webtransport_outcome or answer.quic_outcome), answer.quic_reason
    return answer.quic_outcome, answer.quic_reason


def peer(addr: Address) -> str:
    """``host:port``, IPv6 hosts bracketed."""
    return host_port(str(addr[0]), int(addr[1]))


@dataclass(slots=True)
class ByteBudget:
    """Token bucket of bytes per second (time passed in): caps what refusals may send."""

    rate_per_s: float
    burst: float
    tokens: float = -1.0
    updated_at: float | None = None

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0 or self.burst <= 0:
            raise FlowTableError(f"rate_per_s and burst must be > 0, got {self.rate_per_s}, {self.burst}")
        if self.tokens < 0:
            self.tokens = self.burst

    def take(self, size: int, now: float) -> bool:
        """Spend ``size`` bytes if the bucket holds them; refill by elapsed time first."""
        if self.updated_at is not None and now > self.updated_at:
            self.tokens = min(self.burst, self.tokens + (now - self.updated_at) * self.rate_per_s)
        if self.updated_at is None or now > self.updated_at:
            self.updated_at = now
        if size > self.tokens:
            return False
        self.tokens -= size
        return True


class QuicRefusals:
    """Counts, logs, remembers and (budget permitting) answers refused QUIC attempts."""

    def __init__(
        self,
        table: UdpFlowTable[Any, Any],
        metrics: RouterMetrics,
        budget_bytes_per_s: float,
        send: Callable[[bytes, Address], bool],
        native: InitialProtection | None = None,
    ) -> None:
        self._table = table
        self._native = native
        """The C key schedule for the answers' server Initials, when the router uses it."""
        self._metrics = metrics
        self._budget = ByteBudget(budget_bytes_per_s, budget_bytes_per_s)
        self.send = send
        """Sends an answer through the public socket (the datapath's); False when it is closed."""
        self.log = RateLimitedLog(log, dropped=metrics.dropped_lines(DroppedLog.REJECTION))

    def refuse(
        self, addr: Address, version: int, dcid: bytes, scid: bytes, received: int, now: float,
        hostname: str | None, refusal: Refusal,
    ) -> int:
        """Count, log, remember and answer a refused attempt (``received``: bytes it sent);
        returns the bytes answered (0 when the answer was not sent)."""
        outcome, reason = quic_answer(refusal, self._metrics.webtransport)
        self._metrics.quic_outcome(outcome)
        self.log.info("quic flow refused: hostname=%r peer=%s outcome=%s",
                      clip_optional(hostname), peer(addr), outcome)
        try:
            answer = build_initial_close(
                version, dcid, scid, reason, QuicErrorCode.CONNECTION_REFUSED, native=self._native
            )
        except QuicPacketError:  # CIDs no close can be built for: nothing to answer
            self._metrics.quic_drop(QuicDropReason.MALFORMED)
            return 0
        self._table.rejections.remember((addr, dcid), answer, now)
        if not self.answer(answer, received, addr, now):
            self._metrics.quic_drop(QuicDropReason.RATE_LIMITED)
            return 0
        return len(answer)

    def refuse_pending(
        self, pending: PendingFlow[InitialSniffer], hostname: str | None, refusal: Refusal, now: float
    ) -> tuple[QuicFlowOutcome, int]:
        """Refuse an attempt whose ClientHello was read: ``(outcome, bytes answered)``; answered only
        when its Initial gave the version and CIDs to answer with."""
        sniffer, outcome = pending.sniffer, quic_answer(refusal, self._metrics.webtransport)[0]
        if sniffer.version is None or sniffer.original_dcid is None or sniffer.client_scid is None:
            self._metrics.quic_outcome(outcome)
            return outcome, 0
        return outcome, self.refuse(pending.address, sniffer.version, sniffer.original_dcid, sniffer.client_scid,
                                    pending.buffered_bytes, now, hostname, refusal)

    def reanswer(self, rejection: Rejection, received: int, addr: Address, now: float) -> None:
        """A retransmit of a refused attempt: answer again while its answers last, else drop."""
        if rejection.answers_left > 0 and self.answer(rejection.answer, received, addr, now):
            rejection.answers_left -= 1
        else:
            self._metrics.quic_drop(QuicDropReason.RATE_LIMITED)

    def negotiate_version(self, dcid: bytes, scid: bytes, received: int, addr: Address, now: float) -> None:
        try:
            answer = build_version_negotiation(dcid, scid)
        except QuicPacketError:
            return
        self.answer(answer, received, addr, now)

    def answer(self, answer: bytes, received: int, addr: Address, now: float) -> bool:
        """Send an answer if it is no larger than what provoked it and within budget."""
        if len(answer) > received or not self._budget.take(len(answer), now):
            return False
        return self.send(answer, addr)
