"""The one routing decision both edges call, on its own: every target path and every refusal."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from discovery.targets import Target, TargetSnapshot
from router import constants as c
from router.hostname import HostnameTemplate
from router.outcomes import GrpcOutcome, QuicOutcome, WebTransportOutcome
from router.routing import REFUSAL_ANSWERS, Refusal, Refused, RoundRobin, route
from wire.grpc import GrpcStatus
from wire.tls import TlsAlert

TEMPLATE = HostnameTemplate.parse("{pod_name}.stargate.external", "ns")
RR_PATH = "/stargate.StargateControlPlane/WatchStargates"
A = Target("stargate-0", "10.0.0.1", 50051, 50052)
B = Target("stargate-1", "10.0.0.2", 50051, 50052)
SNAPSHOT = TargetSnapshot.of([B, A])


def grpc(target: Target) -> int:
    return target.grpc_port


def quic(target: Target) -> int:
    return target.quic_port


def decide(
    hostname: str | None, path: str | None = None, snapshot: TargetSnapshot = SNAPSHOT,
    rr: RoundRobin | None = None, port_of: Callable[[Target], int] = grpc,
) -> Target | Refused:
    return route(
        hostname, path, snapshot, TEMPLATE, rr if rr is not None else RoundRobin(),
        round_robin_paths=frozenset({RR_PATH}), port_of=port_of,
    )


def test_a_hostname_naming_a_ready_pod_routes_to_it() -> None:
    assert decide("stargate-1.stargate.external:50071") == B
    assert decide("STARGATE-0.stargate.external.") == A


def test_a_named_ready_pod_wins_over_round_robin() -> None:
    assert decide("stargate-1.stargate.external", RR_PATH) == B


def test_round_robin_path_without_a_usable_name_takes_ready_pods_in_turn() -> None:
    rr = RoundRobin()
    picks = [decide(host, RR_PATH, rr=rr) for host in (None, "x.example", "stargate-9.stargate.external", None)]
    assert picks == [A, B, A, B]  # sorted by pod name, whatever the hostname said


def test_round_robin_state_is_shared_across_calls_not_per_hostname() -> None:
    rr = RoundRobin()
    assert [decide(None, RR_PATH, rr=rr) for _ in range(3)] == [A, B, A]


def test_round_robin_with_no_ready_pod_is_refused() -> None:
    assert decide(None, RR_PATH, snapshot=TargetSnapshot.of([])) == Refused(Refusal.NO_READY_TARGET)


def test_other_paths_do_not_round_robin() -> None:
    assert decide(None, "/stargate.Stargate/Attach") == Refused(Refusal.MISSING_NAME)


def test_no_round_robin_state_means_no_round_robin() -> None:
    got = route(None, RR_PATH, SNAPSHOT, TEMPLATE, None, round_robin_paths=frozenset({RR_PATH}), port_of=grpc)
    assert got == Refused(Refusal.MISSING_NAME)


def test_missing_hostname_is_refused() -> None:
    assert decide(None) == Refused(Refusal.MISSING_NAME)


@pytest.mark.parametrize(
    "hostname", ["", "stargate-0.example.com", "x.stargate-0.stargate.external", "[::1]:50071", "10.0.0.1"]
)
def test_a_hostname_naming_no_pod_is_refused_as_unknown(hostname: str) -> None:
    assert decide(hostname) == Refused(Refusal.UNKNOWN_NAME)


def test_a_named_pod_absent_from_the_snapshot_is_unavailable_with_its_name() -> None:
    assert decide("stargate-9.stargate.external") == Refused(Refusal.TARGET_UNAVAILABLE, "stargate-9")


@pytest.mark.parametrize("port", [0, -1, 65_536])
def test_a_pod_without_a_usable_port_for_this_edge_is_unavailable(port: int) -> None:
    snapshot = TargetSnapshot.of([Target("stargate-0", "10.0.0.1", 50051, port)])
    assert decide("stargate-0.stargate.external", snapshot=snapshot, port_of=quic) == Refused(
        Refusal.TARGET_UNAVAILABLE, "stargate-0"
    )
    assert decide("stargate-0.stargate.external", snapshot=snapshot, port_of=grpc) == snapshot.get("stargate-0")


def test_every_refusal_has_one_answer_row() -> None:
    assert set(REFUSAL_ANSWERS) == set(Refusal)


@pytest.mark.parametrize(
    ("refusal", "grpc_outcome", "quic_outcome", "status", "alert", "reason"),
    [
        (Refusal.MISSING_NAME, GrpcOutcome.MISSING_AUTHORITY, QuicOutcome.MISSING_SNI,
         GrpcStatus.INVALID_ARGUMENT, TlsAlert.UNRECOGNIZED_NAME, c.REASON_MISSING_SNI),
        (Refusal.UNKNOWN_NAME, GrpcOutcome.UNKNOWN_AUTHORITY, QuicOutcome.UNKNOWN_SNI,
         GrpcStatus.INVALID_ARGUMENT, TlsAlert.UNRECOGNIZED_NAME, c.REASON_UNKNOWN_SNI),
        (Refusal.NO_READY_TARGET, GrpcOutcome.TARGET_UNAVAILABLE, QuicOutcome.TARGET_UNAVAILABLE,
         GrpcStatus.UNAVAILABLE, TlsAlert.INTERNAL_ERROR, c.REASON_TARGET_NOT_READY),
        (Refusal.TARGET_UNAVAILABLE, GrpcOutcome.TARGET_UNAVAILABLE, QuicOutcome.TARGET_UNAVAILABLE,
         GrpcStatus.UNAVAILABLE, TlsAlert.INTERNAL_ERROR, c.REASON_TARGET_NOT_READY),
        (Refusal.DIAL_FAILED, GrpcOutcome.CONNECT_ERROR, QuicOutcome.TARGET_UNAVAILABLE,
         GrpcStatus.UNAVAILABLE, TlsAlert.INTERNAL_ERROR, c.REASON_TARGET_NOT_READY),
        (Refusal.MALFORMED, GrpcOutcome.PROTOCOL_ERROR, None, None, TlsAlert.DECODE_ERROR, None),
        (Refusal.CLIENT_LIMIT, GrpcOutcome.CLIENT_LIMIT, QuicOutcome.CLIENT_LIMIT,
         GrpcStatus.UNAVAILABLE, TlsAlert.INTERNAL_ERROR, c.REASON_TOO_MANY_CONNECTIONS),
    ],
)
def test_refusal_answers_are_the_rust_routers(
    refusal: Refusal, grpc_outcome: GrpcOutcome | None, quic_outcome: QuicOutcome | None,
    status: GrpcStatus | None, alert: TlsAlert | None, reason: str | None,
) -> None:
    answer = REFUSAL_ANSWERS[refusal]
    assert (answer.grpc_outcome, answer.quic_outcome, answer.grpc_status, answer.tls_alert, answer.quic_reason) == (
        grpc_outcome, quic_outcome, status, alert, reason,
    )


def test_only_a_failed_dial_has_its_own_webtransport_outcome() -> None:
    """The session family's ``upstream_connect_error``; every other QUIC refusal keeps its QUIC name there."""
    own = {r: a.webtransport_outcome for r, a in REFUSAL_ANSWERS.items() if a.webtransport_outcome is not None}
    assert own == {Refusal.DIAL_FAILED: WebTransportOutcome.UPSTREAM_CONNECT_ERROR}
