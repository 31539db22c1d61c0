"""The one routing decision both edges call: a hostname names a pod, or the attempt is refused.

Pure: (hostname, path, snapshot, template, round-robin state) -> ``Target`` or ``Refused``. How
each refusal is answered in each protocol is the one table ``REFUSAL_ANSWERS``, so the TCP and QUIC
edges cannot drift apart.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from discovery.targets import Target, TargetSnapshot
from router import constants as c
from router.hostname import HostnameTemplate
from router.outcomes import GrpcOutcome, QuicOutcome, WebTransportOutcome
from wire.grpc import GrpcStatus
from wire.tls import TlsAlert


class Refusal(StrEnum):
    """Why an attempt is not routed; ``REFUSAL_ANSWERS`` says how each is answered."""

    MISSING_NAME = "missing_name"
    """No ``:authority`` / ``host`` header, or no SNI."""
    UNKNOWN_NAME = "unknown_name"
    """The hostname names no pod under the template."""
    NO_READY_TARGET = "no_ready_target"
    """A round-robin request found the snapshot empty."""
    TARGET_UNAVAILABLE = "target_unavailable"
    """The hostname names a pod that is not in the snapshot (or has no usable port)."""
    DIAL_FAILED = "dial_failed"
    """The pod was chosen but could not be reached (TCP connect, UDP socket)."""
    MALFORMED = "malformed"
    """The first bytes are neither a ClientHello nor an h2c request the router can read."""
    CLIENT_LIMIT = "client_limit"
    """The client (its IP, after PROXY protocol; IPv6 per /64) is at its per-client limit."""


@dataclass(frozen=True, slots=True)
class RefusalAnswer:
    """What one refusal is counted as and answered with in each protocol (None: not applicable)."""

    grpc_outcome: GrpcOutcome | None
    quic_outcome: QuicOutcome | None
    grpc_status: GrpcStatus | None
    """None: an h2c client is not answered (a malformed start is just closed)."""
    tls_alert: TlsAlert | None
    quic_reason: str | None
    webtransport_outcome: WebTransportOutcome | None = None
    """Counted under ``--tunnel-protocol webtransport``; None: the QUIC outcome's name."""


_UNAVAILABLE: Final = RefusalAnswer(
    GrpcOutcome.TARGET_UNAVAILABLE, QuicOutcome.TARGET_UNAVAILABLE,
    GrpcStatus.UNAVAILABLE, TlsAlert.INTERNAL_ERROR, c.REASON_TARGET_NOT_READY,
)

REFUSAL_ANSWERS: Final[Mapping[Refusal, RefusalAnswer]] = MappingProxyType({
    Refusal.MISSING_NAME: RefusalAnswer(
        GrpcOutcome.MISSING_AUTHORITY, QuicOutcome.MISSING_SNI,
        GrpcStatus.INVALID_ARGUMENT, TlsAlert.UNRECOGNIZED_NAME, c.REASON_MISSING_SNI,
    ),
    Refusal.UNKNOWN_NAME: RefusalAnswer(
        GrpcOutcome.UNKNOWN_AUTHORITY, QuicOutcome.UNKNOWN_SNI,
        GrpcStatus.INVALID_ARGUMENT, TlsAlert.UNRECOGNIZED_NAME, c.REASON_UNKNOWN_SNI,
    ),
    Refusal.NO_READY_TARGET: _UNAVAILABLE,
    Refusal.TARGET_UNAVAILABLE: _UNAVAILABLE,
    Refusal.DIAL_FAILED: RefusalAnswer(
        GrpcOutcome.CONNECT_ERROR, QuicOutcome.TARGET_UNAVAILABLE,
        GrpcStatus.UNAVAILABLE, TlsAlert.INTERNAL_ERROR, c.REASON_TARGET_NOT_READY,
        WebTransportOutcome.UPSTREAM_CONNECT_ERROR,
    ),
    Refusal.MALFORMED: RefusalAnswer(GrpcOutcome.PROTOCOL_ERROR, None, None, TlsAlert.DECODE_ERROR, None),
    Refusal.CLIENT_LIMIT: RefusalAnswer(  # TLS has no "try later" alert: internal_error, as for a busy pod
        GrpcOutcome.CLIENT_LIMIT, QuicOutcome.CLIENT_LIMIT,
        GrpcStatus.UNAVAILABLE, TlsAlert.INTERNAL_ERROR, c.REASON_TOO_MANY_CONNECTIONS,
    ),
})
"""The refusal -> outcome / gRPC status / TLS alert / QUIC reason phrase table, for both edges."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A routing decision that names no target: why, and the pod if the hostname named one."""

    refusal: Refusal
    pod_name: str | None = None


class RoundRobin:
    """Which ready pod the next round-robin request goes to: a counter over the sorted snapshot."""

    __slots__ = ("_counter",)

    def __init__(self) -> None:
        self._counter = itertools.count()

    def pick(self, targets: list[Target]) -> Target:
        """The next of ``targets`` (non-empty) in turn."""
        return targets[next(self._counter) % len(targets)]


def route(
    hostname: str | None,
    path: str | None,
    snapshot: TargetSnapshot,
    template: HostnameTemplate,
    round_robin: RoundRobin | None,
    *,
    round_robin_paths: frozenset[str] = frozenset(),
    port_of: Callable[[Target], int],
) -> Target | Refused:
    """The target ``hostname`` names, or why there is none; on a round-robin ``path``, a hostname that
    names no routable pod goes to any ready pod in turn (``round_robin`` None: never)."""
    pod_name = template.pod_name_for(hostname) if hostname is not None else None
    target = snapshot.get(pod_name) if pod_name is not None else None
    if target is not None and 0 < port_of(target) <= c.MAX_PORT:
        return target
    if round_robin is not None and path is not None and path in round_robin_paths:
        targets = list(snapshot)
        return round_robin.pick(targets) if targets else Refused(Refusal.NO_READY_TARGET)
    if hostname is None:
        return Refused(Refusal.MISSING_NAME)
    if pod_name is None:
        return Refused(Refusal.UNKNOWN_NAME)
    return Refused(Refusal.TARGET_UNAVAILABLE, pod_name)
