"""Command-line flags -> a validated, immutable ``RouterConfig``.

Flag names and defaults are the Rust router's, so an existing Deployment's args work
unchanged. Every bad value becomes one ``ConfigError`` line naming the flag; the CLI
turns that into exit status 2, like argparse does for unknown flags.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from router import constants as c
from router.flag_values import (
    ConfigError,
    IPNetwork,
    SocketAddress,
    boolean,
    every_source_warning,
    log_level,
    non_negative_ms,
    parse_cidrs,
    parse_socket_address,
    per_client_limit,
    port_name,
    positive_ms,
)
from router.inert_flags import InertFlags, add_inert_flags, parse_inert_flags
from router.udp.quic_lb import MAX_SERVER_ID_BYTES

TRUSTED_CIDRS_FLAG = "--proxy-protocol-trusted-cidrs"
"""Named by its parser, the PROXY-on check and the trust-everything warning."""


@dataclass(frozen=True, slots=True)
class RouterConfig:
    listen_addr: SocketAddress
    reverse_tunnel_listen_addr: SocketAddress
    health_listen_addr: SocketAddress
    target_namespace: str
    target_service_name: str
    advertised_hostname_template: str
    grpc_port_name: str
    quic_port_name: str
    connect_timeout_s: float
    relay_idle_timeout_s: float
    peek_timeout_s: float
    endpoints_file: Path | None
    kubeconfig: Path | None
    kube_watch_idle_timeout_s: float
    round_robin_paths: frozenset[str]
    shutdown_delay_s: float
    drain_timeout_s: float
    log_format: str
    log_level: str
    workers: int
    quic_cid_length: int | None
    accept_proxy_protocol: bool = c.DEFAULT_ACCEPT_PROXY_PROTOCOL
    proxy_protocol_trusted_cidrs: tuple[IPNetwork, ...] = c.DEFAULT_PROXY_PROTOCOL_TRUSTED_CIDRS
    """Sources allowed to send a PROXY header: none by default, and at least one when PROXY is on."""
    max_connections_per_client: int = c.DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    max_quic_flows_per_client: int = c.DEFAULT_MAX_QUIC_FLOWS_PER_CLIENT
    access_log: bool = True
    """One access line per connection and flow (``--access-log on|off``)."""
    tcp_defer_accept: bool = c.DEFAULT_TCP_DEFER_ACCEPT == "on"
    """TCP connections accepted once their first bytes came (``--tcp-defer-accept on|off``)."""
    debug_endpoints: bool = False
    """``/debug/targets`` and ``/debug/connections`` on the health listener (they show client addresses)."""
    quic_lb_server_id_bytes: int = c.DEFAULT_QUIC_LB_SERVER_ID_BYTES
    """QUIC-LB server ID length, 1..15 octets (``--quic-lb-server-id-bytes``); 0 = off."""
    quic_handshake_timeout_s: float = c.DEFAULT_QUIC_HANDSHAKE_TIMEOUT_MS / 1000
    """How long a QUIC flow may live unconfirmed (``--quic-handshake-timeout-ms``, ``handshake_watch``)."""
    tunnel_protocol: str = c.DEFAULT_TUNNEL_PROTOCOL
    """``raw-quic`` or ``webtransport``: routed alike; says which counter the QUIC listener's flows go to."""
    inert: InertFlags = field(default_factory=InertFlags)
    """The Rust router's certificate and keep-alive flags, accepted with no effect (``router.inert_flags``)."""

    def proxy_trust_warning(self) -> str | None:
        """One line at start when PROXY headers are believed from every IPv4 or IPv6 source."""
        if not self.accept_proxy_protocol:
            return None
        return every_source_warning(TRUSTED_CIDRS_FLAG, self.proxy_protocol_trusted_cidrs)

    @property
    def webtransport(self) -> bool:
        """The QUIC listener's flows count as WebTransport sessions (``--tunnel-protocol webtransport``)."""
        return self.tunnel_protocol == c.WEBTRANSPORT


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The router's flags (``stargate-router [flags]``), added to ``parser`` when given (``check``
    takes exactly these flags); ``demo`` is a separate subcommand."""
    p = parser if parser is not None else argparse.ArgumentParser(
        prog="stargate-router",
        description="Route worker gRPC (h2c/TLS) and QUIC to the Stargate pod named in "
        ":authority / SNI, splicing bytes without terminating TLS.",
    )
    add = p.add_argument
    add("--listen-addr", default=c.DEFAULT_LISTEN_ADDR, help="TCP listener for worker gRPC (h2c or TLS)")
    add(
        "--reverse-tunnel-listen-addr", default=c.DEFAULT_REVERSE_TUNNEL_LISTEN_ADDR,
        help="UDP listener for QUIC reverse tunnels",
    )
    add("--health-listen-addr", default=c.DEFAULT_HEALTH_LISTEN_ADDR, help="HTTP /healthz /livez /readyz /metrics")
    add("--target-namespace", default=None, help=f"namespace of the Stargate pods (env {c.TARGET_NAMESPACE_ENV})")
    add(
        "--target-service-name", default=c.DEFAULT_TARGET_SERVICE_NAME,
        help="Service whose EndpointSlices list the pods",
    )
    add(
        "--advertised-hostname-template", default=c.DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE,
        help="hostname workers use; {pod_name} required, {namespace} substituted",
    )
    add("--grpc-port-name", default=c.DEFAULT_GRPC_PORT_NAME, help="named TCP port in the EndpointSlices")
    add("--quic-port-name", default=c.DEFAULT_QUIC_PORT_NAME, help="named UDP port in the EndpointSlices")
    add("--connect-timeout-ms", default=str(c.DEFAULT_CONNECT_TIMEOUT_MS), help="dial timeout to the pod")
    add(
        "--relay-idle-timeout-ms", default=str(c.DEFAULT_RELAY_IDLE_TIMEOUT_MS),
        help="close a spliced connection or UDP flow idle this long",
    )
    add("--peek-timeout-ms", default=str(c.DEFAULT_PEEK_TIMEOUT_MS), help="time allowed to present the hostname")
    add("--endpoints-file", default=None, help="static EndpointSlice file (else Kubernetes discovery)")
    add("--kubeconfig", default=None, help="kubeconfig for Kubernetes discovery (else in-cluster / KUBECONFIG)")
    add(
        "--kube-watch-idle-timeout-ms", default=str(c.DEFAULT_KUBE_WATCH_IDLE_TIMEOUT_MS),
        help="replace a Kubernetes watch on which nothing (event or bookmark) arrived this long",
    )
    add(
        "--round-robin-paths", default=",".join(c.DEFAULT_ROUND_ROBIN_PATHS),
        help="comma-separated h2c paths routed round-robin when the authority names no pod",
    )
    add("--shutdown-delay-ms", default=str(c.DEFAULT_SHUTDOWN_DELAY_MS), help="keep accepting this long after SIGTERM")
    add("--drain-timeout-ms", default=str(c.DEFAULT_DRAIN_TIMEOUT_MS), help="then let open flows finish this long")
    add("--log-format", default=c.DEFAULT_LOG_FORMAT, help="text or json")
    add("--log-level", default=None, help=f"debug, info, warning, error (env {c.LOG_LEVEL_ENV})")
    add("--workers", default=str(c.DEFAULT_WORKERS), help="processes sharing the listeners (SO_REUSEPORT)")
    add("--quic-cid-length", default=None, help="pod connection ID length (default: learned from long headers)")
    add(
        "--quic-lb-server-id-bytes", default=str(c.DEFAULT_QUIC_LB_SERVER_ID_BYTES),
        help="pods issue QUIC-LB connection IDs whose server ID is the last N bytes of their address: "
        "route datagrams no flow knows by it (1-15; 0 = off)",
    )
    add(
        "--quic-handshake-timeout-ms", default=str(c.DEFAULT_QUIC_HANDSHAKE_TIMEOUT_MS),
        help="a QUIC flow whose client and pod are not seen talking by then is ended; until then it is "
        "the first to make room when the flow table is full",
    )
    add(
        "--accept-proxy-protocol", nargs="?", const="true", default=str(c.DEFAULT_ACCEPT_PROXY_PROTOCOL).lower(),
        help="every TCP connection starts with a PROXY v1/v2 header naming the client (true/false)",
    )
    add(
        TRUSTED_CIDRS_FLAG, default=None,
        help="comma-separated CIDRs allowed to send PROXY headers (required with --accept-proxy-protocol; "
        "no source by default); other sources are closed unread",
    )
    add(
        "--max-connections-per-client", default=str(c.DEFAULT_MAX_CONNECTIONS_PER_CLIENT),
        help="TCP connections one client IP (IPv6: /64) may hold open; 0 = no limit",
    )
    add(
        "--max-quic-flows-per-client", default=str(c.DEFAULT_MAX_QUIC_FLOWS_PER_CLIENT),
        help="routed plus pending QUIC flows one client IP (IPv6: /64) may hold; 0 = no limit",
    )
    add(
        "--tcp-defer-accept", default=c.DEFAULT_TCP_DEFER_ACCEPT,
        help=f"on or off: accept a TCP connection once its first bytes came (a silent one after "
        f"{c.TCP_DEFER_ACCEPT_S} s)",
    )
    add(
        "--access-log", default=c.DEFAULT_ACCESS_LOG,
        help="on or off: one info line per connection and QUIC flow when it ends",
    )
    add(
        "--debug-endpoints", action="store_true",
        help="serve /debug/targets and /debug/connections on the health listener (shows client addresses)",
    )
    add(
        "--tunnel-protocol", default=c.DEFAULT_TUNNEL_PROTOCOL,
        help="raw-quic or webtransport: both route by SNI; webtransport counts the QUIC listener's flows "
        "as webtransport_sessions_total",
    )
    add_inert_flags(p)
    return p


def config_from_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> RouterConfig:
    """Parse and validate; ``ConfigError`` (one line naming the flag) on any bad value, and argparse exits 2
    itself on unknown flags (the same contract)."""
    env = os.environ if environ is None else environ
    ns = build_parser().parse_args(argv)
    namespace = ns.target_namespace or env.get(c.TARGET_NAMESPACE_ENV, "")
    if not namespace:
        raise ConfigError(f"--target-namespace: required (or set {c.TARGET_NAMESPACE_ENV})")
    template = ns.advertised_hostname_template
    if template.count("{pod_name}") != 1:
        raise ConfigError("--advertised-hostname-template: must contain {pod_name} exactly once")
    try:
        template.replace("{pod_name}", "x").replace("{namespace}", "y").format()
    except (IndexError, KeyError, ValueError):
        raise ConfigError(
            "--advertised-hostname-template: only {pod_name} and {namespace} may be substituted"
        ) from None
    endpoints_file = Path(ns.endpoints_file) if ns.endpoints_file else None
    if endpoints_file is not None and not os.access(endpoints_file, os.R_OK):
        raise ConfigError(f"--endpoints-file: cannot read {str(endpoints_file)!r}")
    kubeconfig = Path(ns.kubeconfig) if ns.kubeconfig else None
    if kubeconfig is not None and not os.access(kubeconfig, os.R_OK):
        raise ConfigError(f"--kubeconfig: cannot read {str(kubeconfig)!r}")
    watch_idle_s = positive_ms("--kube-watch-idle-timeout-ms", ns.kube_watch_idle_timeout_ms)
    if watch_idle_s * 1000 < c.MIN_KUBE_WATCH_IDLE_TIMEOUT_MS:
        raise ConfigError(
            f"--kube-watch-idle-timeout-ms: must be at least {c.MIN_KUBE_WATCH_IDLE_TIMEOUT_MS}, "
            f"got {ns.kube_watch_idle_timeout_ms}"
        )
    if ns.log_format not in ("text", "json"):
        raise ConfigError(f"--log-format: expected text or json, got {ns.log_format!r}")
    level = log_level(ns.log_level or env.get(c.LOG_LEVEL_ENV) or c.DEFAULT_LOG_LEVEL)
    if not ns.workers.isdigit() or not 1 <= int(ns.workers) <= c.MAX_WORKERS:
        raise ConfigError(f"--workers: expected 1-{c.MAX_WORKERS}, got {ns.workers!r}")
    cid_length: int | None = None
    if ns.quic_cid_length is not None:
        if not ns.quic_cid_length.isdigit() or not 1 <= int(ns.quic_cid_length) <= 20:
            raise ConfigError(f"--quic-cid-length: expected 1-20, got {ns.quic_cid_length!r}")
        cid_length = int(ns.quic_cid_length)
    server_id_bytes = ns.quic_lb_server_id_bytes
    if not server_id_bytes.isdigit() or not 0 <= int(server_id_bytes) <= MAX_SERVER_ID_BYTES:
        raise ConfigError(f"--quic-lb-server-id-bytes: expected 0-{MAX_SERVER_ID_BYTES}, got {server_id_bytes!r}")
    for flag, value in (("--access-log", ns.access_log), ("--tcp-defer-accept", ns.tcp_defer_accept)):
        if value not in ("on", "off"):
            raise ConfigError(f"{flag}: expected on or off, got {value!r}")
    if ns.tunnel_protocol not in c.TUNNEL_PROTOCOLS:
        raise ConfigError(f"--tunnel-protocol: expected {' or '.join(c.TUNNEL_PROTOCOLS)}, got {ns.tunnel_protocol!r}")
    inert = parse_inert_flags(ns, env, ns.tunnel_protocol)
    accept_proxy = boolean("--accept-proxy-protocol", ns.accept_proxy_protocol)
    trusted = (c.DEFAULT_PROXY_PROTOCOL_TRUSTED_CIDRS if ns.proxy_protocol_trusted_cidrs is None
               else parse_cidrs(TRUSTED_CIDRS_FLAG, ns.proxy_protocol_trusted_cidrs))
    if accept_proxy and not trusted:
        raise ConfigError(
            f"{TRUSTED_CIDRS_FLAG}: required with --accept-proxy-protocol "
            "(the balancer's addresses; no source is trusted by default)"
        )
    paths = frozenset(p.strip() for p in ns.round_robin_paths.split(",") if p.strip())
    for path in paths:
        if not path.startswith("/"):
            raise ConfigError(f"--round-robin-paths: {path!r} is not an absolute path")
    return RouterConfig(
        listen_addr=parse_socket_address("--listen-addr", ns.listen_addr),
        reverse_tunnel_listen_addr=parse_socket_address(
            "--reverse-tunnel-listen-addr", ns.reverse_tunnel_listen_addr
        ),
        health_listen_addr=parse_socket_address("--health-listen-addr", ns.health_listen_addr),
        target_namespace=namespace,
        target_service_name=ns.target_service_name,
        advertised_hostname_template=template,
        grpc_port_name=port_name("--grpc-port-name", ns.grpc_port_name),
        quic_port_name=port_name("--quic-port-name", ns.quic_port_name),
        connect_timeout_s=positive_ms("--connect-timeout-ms", ns.connect_timeout_ms),
        relay_idle_timeout_s=positive_ms("--relay-idle-timeout-ms", ns.relay_idle_timeout_ms),
        peek_timeout_s=positive_ms("--peek-timeout-ms", ns.peek_timeout_ms),
        endpoints_file=endpoints_file,
        kubeconfig=kubeconfig,
        kube_watch_idle_timeout_s=watch_idle_s,
        round_robin_paths=paths,
        shutdown_delay_s=non_negative_ms("--shutdown-delay-ms", ns.shutdown_delay_ms),
        drain_timeout_s=non_negative_ms("--drain-timeout-ms", ns.drain_timeout_ms),
        log_format=ns.log_format,
        log_level=level,
        workers=int(ns.workers),
        quic_cid_length=cid_length,
        accept_proxy_protocol=accept_proxy,
        proxy_protocol_trusted_cidrs=trusted,
        max_connections_per_client=per_client_limit("--max-connections-per-client", ns.max_connections_per_client),
        max_quic_flows_per_client=per_client_limit("--max-quic-flows-per-client", ns.max_quic_flows_per_client),
        access_log=ns.access_log == "on",
        tcp_defer_accept=ns.tcp_defer_accept == "on",
        debug_endpoints=bool(ns.debug_endpoints),
        quic_lb_server_id_bytes=int(server_id_bytes),
        quic_handshake_timeout_s=positive_ms("--quic-handshake-timeout-ms", ns.quic_handshake_timeout_ms),
        tunnel_protocol=ns.tunnel_protocol,
        inert=inert,
    )
