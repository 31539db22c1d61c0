"""Hostile names in the h2c ``:authority`` and the TLS SNI: rejected as they should be, never routed.

One router process with ``--advertised-hostname-template {pod_name}.{namespace}.svc`` in
namespace ``demo``; its only pod ``stargate-0`` is a raw listener that counts accepts, so
"never routed" is a count that does not move. Each case checks three things: the client
got the answer of its protocol (gRPC status from an ``h2`` client that validates nothing,
or a TLS alert to a hand-built ClientHello), the connection counter moved for exactly the
expected ``{protocol, outcome}`` and nothing else, and the pod saw no connection.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest

from router.demo.grpc_pods import WHOAMI
from router.tcp.first_bytes import PEEK_READ_BYTES
from tests.support.polling import eventually_blocking, holds_blocking
from tests.support.router_probes import moved, outcome_counts
from tests.support.router_process import RouterProcess, router_args, write_endpoints
from tests.support.tcp_peers import CountingPod, read_to_eof
from tests.support.tls import (
    alpn_extension,
    append_extension,
    client_hello,
    extension,
    sni_extension,
    ssl_client_hello_records,
)
from wire.grpc import GrpcStatus
from wire.tls import TlsAlert, tls_alert

NAMESPACE = "demo"
TEMPLATE = "{pod_name}.{namespace}.svc"
POD = "stargate-0"
LEGIT = f"{POD}.{NAMESPACE}.svc"
FORGED = "FORGED-LOG-LINE"
"""Text a CR/LF-carrying name tries to start a router log line with."""
LATE_CHANCE_S = 0.02
"""How long what must not happen (a hostile name's dial reaching the pod, a forged log line) is
watched for after the client's answer: the dial would come before the answer, the line with it;
the pod's accept thread and the log's reader thread get this long to show either."""

REJECTED = "unknown_authority"
UNAVAILABLE = "target_unavailable"
MISSING = "missing_authority"
MALFORMED = "protocol_error"

GRPC_STATUS = {REJECTED: GrpcStatus.INVALID_ARGUMENT, MISSING: GrpcStatus.INVALID_ARGUMENT,
               UNAVAILABLE: GrpcStatus.UNAVAILABLE}
"""The gRPC status an h2c client gets per outcome (a malformed stream is closed unanswered)."""

TLS_ALERT = {REJECTED: TlsAlert.UNRECOGNIZED_NAME, MISSING: TlsAlert.UNRECOGNIZED_NAME,
             UNAVAILABLE: TlsAlert.INTERNAL_ERROR, MALFORMED: TlsAlert.DECODE_ERROR}
"""The fatal alert a TLS client gets per outcome."""

HOSTILE_NAMES: list[tuple[str, bytes, str]] = [
    ("ip-literal", b"127.0.0.2", REJECTED),
    ("ip-literal-with-port", b"127.0.0.2:50051", REJECTED),
    ("ipv6-literal", b"[::1]:50071", REJECTED),
    ("ipv6-bare", b"::ffff:127.0.0.2", REJECTED),
    ("decimal-ip", b"2130706434", REJECTED),
    ("ip-in-pod-label", b"127.0.0.2.demo.svc", REJECTED),
    ("other-namespace", b"stargate-0.other.svc", REJECTED),
    ("other-namespace-nested", b"stargate-0.other.demo.svc", REJECTED),
    ("namespace-only", b"demo.svc", REJECTED),
    ("empty-pod-label", b".demo.svc", REJECTED),
    ("dotted-pod-label", b"x.stargate-0.demo.svc", REJECTED),
    ("double-dot", b"stargate-0..demo.svc", REJECTED),
    ("two-trailing-dots", b"stargate-0.demo.svc..", REJECTED),
    ("suffix-then-more", b"stargate-0.demo.svc.evil.example", REJECTED),
    ("label-of-64", b"a" * 64 + b".demo.svc", REJECTED),
    ("name-of-254", b"a" * 245 + b".demo.svc", REJECTED),
    ("name-of-4k", b"s" * 4000 + b".demo.svc", REJECTED),
    ("utf8-non-ascii", "stärgate-0.demo.svc".encode(), REJECTED),
    ("fullwidth-nfkc-equal", "\uff53\uff54\uff41\uff52\uff47\uff41\uff54\uff45-0.demo.svc".encode(), REJECTED),
    ("cyrillic-homograph", "\u0455targate-0.demo.svc".encode(), REJECTED),
    ("long-s-casefold", "\u017ftargate-0.demo.svc".encode(), REJECTED),
    ("invalid-utf8", b"stargate-0\xe9.demo.svc", REJECTED),
    ("idna-of-homograph", "\u0455targate-0".encode("idna") + b".demo.svc", UNAVAILABLE),
    ("idna-uppercase", "\u0455targate-0".encode("idna").upper() + b".DEMO.SVC", UNAVAILABLE),
    ("nul-in-label", b"stargate-0\x00.demo.svc", REJECTED),
    ("nul-first", b"\x00stargate-0.demo.svc", REJECTED),
    ("nul-last", b"stargate-0.demo.svc\x00", REJECTED),
    ("nul-then-other-host", b"stargate-0.demo.svc\x00.evil.example", REJECTED),
    ("crlf-log-injection", b"stargate-0.demo.svc\r\n" + FORGED.encode() + b" info forged", REJECTED),
    ("leading-space", b" stargate-0.demo.svc", REJECTED),
    ("trailing-tab", b"stargate-0.demo.svc\t", REJECTED),
    ("userinfo", b"user@stargate-0.demo.svc", REJECTED),
    ("userinfo-password", b"user:secret@stargate-0.demo.svc", REJECTED),
    ("at-other-host", b"stargate-0.demo.svc@evil.example", REJECTED),
    ("percent-encoded", b"stargate%2D0.demo.svc", REJECTED),
    ("path-suffix", b"stargate-0.demo.svc/x", REJECTED),
    ("port-not-digits", b"stargate-0.demo.svc:x1", REJECTED),
    ("empty-port", b"stargate-0.demo.svc:", REJECTED),
    ("two-ports", b"stargate-0.demo.svc:1:2", REJECTED),
    ("arabic-digit-port", "stargate-0.demo.svc:\u0665".encode(), REJECTED),
    ("underscore", b"stargate_0.demo.svc", REJECTED),
    ("leading-hyphen", b"-stargate-0.demo.svc", REJECTED),
    ("wildcard", b"*.demo.svc", REJECTED),
    ("empty", b"", REJECTED),
    ("not-in-snapshot", b"stargate-9.demo.svc", UNAVAILABLE),
]
"""(case, name, outcome): sent as ``:authority`` and as SNI alike."""

LEGIT_NAMES = [LEGIT.encode(), LEGIT.upper().encode(), LEGIT.encode() + b"."]
"""Positive controls: these do reach the pod, so a count that stays put means something."""


@dataclass
class Deployment:
    router: RouterProcess
    pod: CountingPod


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    pod = CountingPod("127.0.0.2")
    endpoints = tmp_path_factory.mktemp("abuse") / "endpoints.json"
    write_endpoints(endpoints, [(POD, pod.address, pod.port, 1)])
    args = router_args(endpoints, "--target-namespace", NAMESPACE, "--advertised-hostname-template", TEMPLATE)
    try:
        with RouterProcess(args) as router:
            router.wait_ready()
            yield Deployment(router, pod)
            assert router.stop() == 0
    finally:
        pod.stop()


@pytest.fixture
def never_routed(deployment: Deployment) -> Iterator[Deployment]:
    """Fails the test if the pod's accept count moved during it."""
    accepted = deployment.pod.accepted
    yield deployment
    holds_blocking(lambda: deployment.pod.accepted == accepted, LATE_CHANCE_S, what="a hostile name kept off the pod")


# ---------------------------------------------------------------------------
# h2c :authority
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class H2Answer:
    grpc_status: int | None
    """None: the router closed without a gRPC answer."""
    grpc_message: str | None


def h2c_call(port: int, headers: list[tuple[bytes, bytes]]) -> H2Answer:
    """One request with exactly ``headers`` (nothing validated or normalised), read to EOF."""
    config = h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False,
        validate_inbound_headers=False,
    )
    conn = h2.connection.H2Connection(config)
    conn.initiate_connection()
    conn.send_headers(1, headers)
    conn.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(conn.data_to_send())
        answer = read_to_eof(sock)
    fields: dict[bytes, bytes] = {}
    try:
        for event in conn.receive_data(answer):
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                fields.update((bytes(k), bytes(v)) for k, v in event.headers)
    except h2.exceptions.ProtocolError:
        pass
    status = fields.get(b"grpc-status")
    message = fields.get(b"grpc-message")
    return H2Answer(int(status) if status is not None else None, message.decode() if message else None)


def request_headers(authority: bytes | None, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", WHOAMI.encode())]
    if authority is not None:
        headers.append((b":authority", authority))
    return [*headers, *extra, (b"content-type", b"application/grpc"), (b"te", b"trailers")]


def assert_h2c_outcome(deployment: Deployment, headers: list[tuple[bytes, bytes]], outcome: str) -> H2Answer:
    before = outcome_counts(deployment.router)
    answer = h2c_call(deployment.router.grpc_port, headers)
    assert moved(before, outcome_counts(deployment.router)) == {f"h2c/{outcome}": 1}
    assert answer.grpc_status == GRPC_STATUS.get(outcome), answer
    return answer


@pytest.mark.parametrize(("name", "outcome"), [(n, o) for _, n, o in HOSTILE_NAMES],
                         ids=[case for case, _, _ in HOSTILE_NAMES])
def test_hostile_authority_is_rejected_never_routed(never_routed: Deployment, name: bytes, outcome: str) -> None:
    assert_h2c_outcome(never_routed, request_headers(name), outcome)


H2C_HEADER_CASES: list[tuple[str, list[tuple[bytes, bytes]], str]] = [
    ("no-authority-no-host", request_headers(None), MISSING),
    ("host-only-with-userinfo", request_headers(None, (b"host", b"user@stargate-0.demo.svc")), REJECTED),
    ("authority-wins-over-host", request_headers(b"evil.example", (b"host", LEGIT.encode())), REJECTED),
    ("duplicate-authority", request_headers(LEGIT.encode(), (b":authority", b"evil.example")), MALFORMED),
    ("duplicate-authority-evil-first", request_headers(b"evil.example", (b":authority", LEGIT.encode())), MALFORMED),
    ("duplicate-host", request_headers(None, (b"host", LEGIT.encode()), (b"host", b"evil.example")), MALFORMED),
    ("authority-beyond-peek-limit", request_headers(b"a" * (PEEK_READ_BYTES + 1024) + b".demo.svc"), MALFORMED),
]


@pytest.mark.parametrize(("headers", "outcome"), [(h, o) for _, h, o in H2C_HEADER_CASES],
                         ids=[case for case, _, _ in H2C_HEADER_CASES])
def test_ambiguous_or_missing_authority_headers_never_route(
    never_routed: Deployment, headers: list[tuple[bytes, bytes]], outcome: str,
) -> None:
    assert_h2c_outcome(never_routed, headers, outcome)


def test_rejection_message_names_the_authority_escaped(never_routed: Deployment) -> None:
    answer = assert_h2c_outcome(never_routed, request_headers(b"stargate-0.demo.svc\r\nx\x00"), REJECTED)
    assert answer.grpc_message is not None
    assert "stargate-0.demo.svc\\r\\nx\\x00" in answer.grpc_message  # repr-escaped
    assert answer.grpc_message.isprintable()


# ---------------------------------------------------------------------------
# TLS SNI
# ---------------------------------------------------------------------------
def tls_answer(port: int, hello: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(hello)
        return read_to_eof(sock)


def assert_tls_outcome(deployment: Deployment, hello: bytes, outcome: str) -> None:
    before = outcome_counts(deployment.router)
    answer = tls_answer(deployment.router.grpc_port, hello)
    assert moved(before, outcome_counts(deployment.router)) == {f"tls/{outcome}": 1}
    assert answer == tls_alert(TLS_ALERT[outcome])


@pytest.mark.parametrize(("name", "outcome"), [(n, o) for _, n, o in HOSTILE_NAMES],
                         ids=[case for case, _, _ in HOSTILE_NAMES])
def test_hostile_sni_is_rejected_never_routed(never_routed: Deployment, name: bytes, outcome: str) -> None:
    assert_tls_outcome(never_routed, client_hello([sni_extension(name), alpn_extension(b"h2")]), outcome)


def real_client_hello(server_name: str) -> bytes:
    """The first flight of Python's ``ssl`` client (one record) for ``server_name``."""
    return ssl_client_hello_records(server_name, alpn=())


SNI_CASES: list[tuple[str, list[bytes], str]] = [
    ("no-server-name", [alpn_extension(b"h2")], MISSING),
    ("empty-server-name-list", [extension(0, b"\x00\x00")], MISSING),
    ("only-non-host-name-type", [sni_extension(LEGIT.encode(), name_type=1)], MISSING),
    ("duplicate-sni-legit-first", [sni_extension(LEGIT.encode()), sni_extension(b"evil.example")], MALFORMED),
    ("duplicate-sni-evil-first", [sni_extension(b"evil.example"), sni_extension(LEGIT.encode())], MALFORMED),
    ("duplicate-sni-same-name", [sni_extension(LEGIT.encode()), sni_extension(LEGIT.encode())], MALFORMED),
    ("two-host-names-in-one", [sni_extension(LEGIT.encode(), b"evil.example")], MALFORMED),
    ("sni-beyond-peek-limit", [sni_extension(b"a" * (PEEK_READ_BYTES + 1024))], MALFORMED),
    ("sni-length-overruns", [extension(0, b"\x00\x10\x00\x00\x0d" + LEGIT.encode())], MALFORMED),
]


@pytest.mark.parametrize(("extensions", "outcome"), [(e, o) for _, e, o in SNI_CASES],
                         ids=[case for case, _, _ in SNI_CASES])
def test_missing_duplicated_or_malformed_sni_never_routes(
    never_routed: Deployment, extensions: list[bytes], outcome: str,
) -> None:
    assert_tls_outcome(never_routed, client_hello(extensions), outcome)


def test_real_client_hello_with_a_second_sni_appended_never_routes(never_routed: Deployment) -> None:
    hello = append_extension(real_client_hello(LEGIT), sni_extension(b"evil.example"))
    assert_tls_outcome(never_routed, hello, MALFORMED)


# ---------------------------------------------------------------------------
# Positive controls and the log
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", LEGIT_NAMES, ids=["plain", "upper", "trailing-dot"])
@pytest.mark.parametrize("protocol", ["h2c", "tls"])
def test_legit_names_do_reach_the_pod(deployment: Deployment, protocol: str, name: bytes) -> None:
    accepted = deployment.pod.accepted
    before = outcome_counts(deployment.router)
    if protocol == "h2c":
        assert h2c_call(deployment.router.grpc_port, request_headers(name)).grpc_status is None
    else:
        tls_answer(deployment.router.grpc_port, client_hello([sni_extension(name)]))
    eventually_blocking(lambda: deployment.pod.accepted != accepted, interval_s=0.01, what="the pod's accept")
    assert deployment.pod.accepted == accepted + 1
    assert moved(before, outcome_counts(deployment.router)).get(f"{protocol}/accepted") == 1


def test_real_tls_client_reaches_the_pod(deployment: Deployment) -> None:
    accepted = deployment.pod.accepted
    assert real_client_hello(LEGIT)  # the same bytes a real client sends
    ctx = ssl.create_default_context()
    with socket.create_connection(("127.0.0.1", deployment.router.grpc_port), timeout=5) as raw:
        with pytest.raises((ssl.SSLError, OSError)):  # the counting pod hangs up: no handshake
            ctx.wrap_socket(raw, server_hostname=LEGIT)
    eventually_blocking(lambda: deployment.pod.accepted != accepted, interval_s=0.01, what="the pod's accept")
    assert deployment.pod.accepted == accepted + 1


def test_hostile_names_cannot_forge_router_log_lines(deployment: Deployment) -> None:
    name = b"x\r\n" + FORGED.encode() + b" warning forged\n"
    h2c_call(deployment.router.grpc_port, request_headers(name))
    tls_answer(deployment.router.grpc_port, client_hello([sni_extension(name)]))
    eventually_blocking(lambda: any(FORGED in line for line in deployment.router.lines),
                        what="the rejection logged")
    holds_blocking(lambda: not any(line.startswith(FORGED) for line in deployment.router.lines), LATE_CHANCE_S,
                   what="no forged line")
