"""Label values of the router's metrics and log lines, as ``StrEnum``s so mypy catches a typo.

The values are the Rust router's, so its dashboards and alerts keep working; a member is its label
value, in metrics and logs alike. ``Termination`` is this router's own (docs/metrics.md).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class ProtocolLabel(StrEnum):
    """Value of the ``protocol`` label: how the client reached the pod."""

    H2C = "h2c"
    """gRPC over HTTP/2 prior knowledge, routed by ``:authority``."""
    TLS = "tls"
    """gRPC over TLS, routed by the ClientHello SNI (never terminated)."""
    QUIC = "quic"
    """The QUIC reverse tunnel over UDP, routed by the Initial's ClientHello SNI."""


TCP_PROTOCOLS: Final = (ProtocolLabel.H2C, ProtocolLabel.TLS)
"""The ``protocol`` values of the gRPC connection counter (the TCP edge's two)."""


class GrpcOutcome(StrEnum):
    """Value of ``outcome`` on the gRPC (TCP) connection counter: how one connection ended."""

    ACCEPTED = "accepted"
    MISSING_AUTHORITY = "missing_authority"
    UNKNOWN_AUTHORITY = "unknown_authority"
    TARGET_UNAVAILABLE = "target_unavailable"
    CONNECT_ERROR = "connect_error"
    PROTOCOL_ERROR = "protocol_error"
    PEEK_TIMEOUT = "peek_timeout"
    CLIENT_LIMIT = "client_limit"
    """The client IP already held ``--max-connections-per-client`` connections (not the Rust router's)."""
    COMPLETED = "completed"
    RELAY_ERROR = "relay_error"


class QuicOutcome(StrEnum):
    """Value of ``outcome`` on the QUIC flow counter (the Rust router's names)."""

    ACCEPTED = "accepted"
    MISSING_SNI = "missing_sni"
    UNKNOWN_SNI = "unknown_sni"
    TARGET_UNAVAILABLE = "target_unavailable"
    CLIENT_LIMIT = "client_limit"
    """The client IP already held ``--max-quic-flows-per-client`` flows (not the Rust router's)."""
    JOINED = "joined"
    """Opened by its connection ID for a connection routed elsewhere (replica, worker); not the Rust router's.
    Counted instead of ``accepted``, so ``accepted`` summed over replicas and workers counts each once."""
    COMPLETED = "completed"
    RELAY_ERROR = "relay_error"


class WebTransportOutcome(StrEnum):
    """Value of ``outcome`` on the WebTransport session counter (the Rust router's names); every
    ``QuicOutcome`` has a member of the same name, so a flow counts alike in either family."""

    ACCEPTED = "accepted"
    MISSING_SNI = "missing_sni"
    UNKNOWN_SNI = "unknown_sni"
    TARGET_UNAVAILABLE = "target_unavailable"
    INVALID_CONNECT = "invalid_connect"
    """The Rust router's: a bad extended CONNECT, inside encrypted HTTP/3; an L4 router never sees it (0)."""
    UPSTREAM_CONNECT_ERROR = "upstream_connect_error"
    """The pod was chosen but its socket could not be opened (the QUIC family counts ``target_unavailable``)."""
    UPSTREAM_REJECTED = "upstream_rejected"
    """The Rust router's: the pod refused the CONNECT, inside encrypted HTTP/3; an L4 router never sees it (0)."""
    CLIENT_LIMIT = "client_limit"
    """The client IP already held ``--max-quic-flows-per-client`` flows (not the Rust router's)."""
    JOINED = "joined"
    """A flow opened by the server ID in its connection ID (``QuicOutcome.JOINED``; not the Rust router's)."""
    COMPLETED = "completed"
    RELAY_ERROR = "relay_error"


QuicFlowOutcome = QuicOutcome | WebTransportOutcome
"""The outcome a QUIC flow is counted and logged with, in the family ``--tunnel-protocol`` picks."""


class QuicDropReason(StrEnum):
    """Value of ``reason`` on the dropped-datagram counter: why a datagram was not routed."""

    NOT_INITIAL = "not_initial"
    SHORT_INITIAL = "short_initial"
    MALFORMED = "malformed"
    PENDING_FULL = "pending_full"
    FLOW_TABLE_FULL = "flow_table_full"
    PENDING_TIMEOUT = "pending_timeout"
    RATE_LIMITED = "rate_limited"
    QUIC_LB_UNKNOWN_SERVER = "quic_lb_unknown_server"
    """A connection ID whose QUIC-LB server ID names no ready pod, or two (their addresses end alike)."""
    QUIC_LB_RATE_LIMITED = "quic_lb_rate_limited"
    """It named a pod, but this second's joins were spent (``QUIC_LB_JOINS_PER_S``)."""
    QUIC_LB_REFUSED = "quic_lb_refused"
    """It named a pod, but the router is draining or its client holds ``--max-quic-flows-per-client``."""


class RelayDirection(StrEnum):
    """Value of ``direction`` on the relayed-bytes counter."""

    CLIENT_TO_POD = "client_to_pod"
    POD_TO_CLIENT = "pod_to_client"


class DiscoverySource(StrEnum):
    """Value of ``source`` on the discovery metrics."""

    KUBERNETES = "kubernetes"
    FILE = "file"


class DiscoveryResult(StrEnum):
    """Value of ``result`` on the discovery updates counter."""

    PUBLISHED = "published"
    UNCHANGED = "unchanged"
    ERROR = "error"


class Termination(StrEnum):
    """Who ended a connection or flow, and how: the ``termination`` key and metric label."""

    CLIENT_CLOSE = "client_close"
    """The client finished first (FIN), or closed before naming a host; the pod then finished too."""
    CLIENT_RESET = "client_reset"
    """The client's socket failed: RST, or a write to it was refused (EPIPE/ECONNRESET)."""
    POD_CLOSE = "pod_close"
    """The pod finished first (FIN); the client then finished too."""
    POD_RESET = "pod_reset"
    """The pod's socket failed: RST, or a write to it was refused."""
    IDLE_TIMEOUT = "idle_timeout"
    """Nothing moved either way for ``--relay-idle-timeout-ms`` (a QUIC flow whose client set no idle timeout)."""
    QUIC_IDLE_TIMEOUT = "quic_idle_timeout"
    """(QUIC) silent past its idle timeout (the client's, >= 3 PTOs): both ends have dropped it; the usual end."""
    DRAIN = "drain"
    """Still open when the drain after SIGTERM ran out (``--drain-timeout-ms``): cut."""
    DIAL_FAILED = "dial_failed"
    """The pod was chosen but could not be reached (refused, timed out, no socket)."""
    PEEK_TIMEOUT = "peek_timeout"
    """The client did not present a hostname within ``--peek-timeout-ms``."""
    REJECTED = "rejected"
    """Refused before any pod was dialled: no, unknown or unroutable hostname, or unparsable bytes."""
    ROUTER_ERROR = "router_error"
    """The router failed on its side (an OS error that is no peer's reset, or a bug)."""
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    """(QUIC) routed, but not confirmed within ``--quic-handshake-timeout-ms`` (``router.udp.handshake_watch``)."""
    EVICTED = "evicted"
    """(QUIC) the oldest unconfirmed flow when the table was full: it made room (a confirmed flow never does)."""


class DroppedLog(StrEnum):
    """Value of ``log`` on the dropped log lines counter: the log whose budget held a line back."""

    ACCESS = "access"
    """An access line over ``ACCESS_LOG_LINES_PER_S`` (a rejected connection's: over the rejection rate)."""
    REJECTION = "rejection"
    """A refusal's line of the TCP or QUIC edge, over ``REJECTION_LOG_LINES_PER_S``."""
