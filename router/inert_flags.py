"""The Rust router's flags that an L4 router accepts but cannot act on, and the warning naming them.

The Rust router terminates TLS and QUIC; this one ends neither, so it holds no certificate and cannot
PING inside encrypted QUIC. The flags are parsed so the chart's args run unchanged, but never silently:
the start output names every one given away from its default, with the reason.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass

from router import constants as c
from router.flag_values import ConfigError, boolean

NO_CERTIFICATE_REASON = "the router holds no certificate: TLS and QUIC end at the pod"
"""Why the certificate flags change nothing."""

NO_PING_REASON = (
    "the router cannot send PINGs inside encrypted QUIC: the tunnel's endpoints' QUIC keep-alive "
    "keeps an idle tunnel open"
)
"""Why ``--relay-keep-alive-ms`` changes nothing (docs/coming-from-rust.md)."""


@dataclass(frozen=True, slots=True)
class InertFlags:
    """The values given for the flags that have no effect at L4 (each default: not given)."""

    tls_cert_path: str | None = None
    """``--tls-cert-path`` / ``STARGATE_TLS_CERT_PATH``: the Rust router's serving certificate."""
    tls_key_path: str | None = None
    """``--tls-key-path`` / ``STARGATE_TLS_KEY_PATH``: its key."""
    quic_insecure: bool = False
    """``--quic-insecure`` / ``STARGATE_QUIC_INSECURE``: the Rust router skipped verifying its peer."""
    upstream_tls_cert_path: str | None = None
    """``--upstream-tls-cert-path`` / ``STARGATE_UPSTREAM_TLS_CERT_PATH``: CA for its WebTransport upstreams."""
    relay_keep_alive_ms: int = c.DEFAULT_RELAY_KEEP_ALIVE_MS
    """``--relay-keep-alive-ms``: the Rust router's QUIC keep-alive period (0 disables)."""

    def certificate_flags(self) -> tuple[str, ...]:
        """The certificate flags given, in the order of the Rust router's help."""
        given = (
            ("--tls-cert-path", self.tls_cert_path is not None),
            ("--tls-key-path", self.tls_key_path is not None),
            ("--quic-insecure", self.quic_insecure),
            ("--upstream-tls-cert-path", self.upstream_tls_cert_path is not None),
        )
        return tuple(flag for flag, present in given if present)

    def given(self) -> tuple[str, ...]:
        """Every flag given away from its default, the keep-alive last."""
        keep_alive = self.relay_keep_alive_ms != c.DEFAULT_RELAY_KEEP_ALIVE_MS
        return (*self.certificate_flags(), *(("--relay-keep-alive-ms",) if keep_alive else ()))

    def warning(self) -> str | None:
        """One line naming each flag given and why it has no effect; None when none was given."""
        parts = []
        if certificates := self.certificate_flags():
            parts.append(f"{', '.join(certificates)} ({NO_CERTIFICATE_REASON})")
        if self.relay_keep_alive_ms != c.DEFAULT_RELAY_KEEP_ALIVE_MS:
            parts.append(f"--relay-keep-alive-ms={self.relay_keep_alive_ms} ({NO_PING_REASON})")
        return "flags with no effect at L4: " + "; ".join(parts) if parts else None


def add_inert_flags(p: argparse.ArgumentParser) -> None:
    """The Rust router's certificate and keep-alive flags: accepted, no effect at L4."""
    add = p.add_argument
    add("--tls-cert-path", default=None, help=f"accepted, no effect: TLS ends at the pod (env {c.TLS_CERT_PATH_ENV})")
    add("--tls-key-path", default=None, help=f"accepted, no effect: the router holds no key (env {c.TLS_KEY_PATH_ENV})")
    add(
        "--quic-insecure", nargs="?", const="true", default=None,
        help=f"accepted, no effect: QUIC ends at the pod (true/false; env {c.QUIC_INSECURE_ENV})",
    )
    add(
        "--upstream-tls-cert-path", default=None,
        help=f"accepted with --tunnel-protocol webtransport, no effect (env {c.UPSTREAM_TLS_CERT_PATH_ENV})",
    )
    add(
        "--relay-keep-alive-ms", default=str(c.DEFAULT_RELAY_KEEP_ALIVE_MS),
        help="accepted, no effect: the tunnel's endpoints keep QUIC alive (0 disables)",
    )


def from_env(flag_value: str | None, env: Mapping[str, str], name: str) -> str | None:
    """The flag's value, else its environment variable's (an empty one counts as unset), as clap reads them."""
    if flag_value is not None:
        return flag_value
    return env.get(name) or None


def parse_inert_flags(ns: argparse.Namespace, env: Mapping[str, str], tunnel_protocol: str) -> InertFlags:
    """The Rust router's certificate and keep-alive flags, validated as it validates them."""
    insecure_text = from_env(ns.quic_insecure, env, c.QUIC_INSECURE_ENV)
    flag = "--quic-insecure" if ns.quic_insecure is not None else f"--quic-insecure (env {c.QUIC_INSECURE_ENV})"
    quic_insecure = insecure_text is not None and boolean(flag, insecure_text)
    upstream = from_env(ns.upstream_tls_cert_path, env, c.UPSTREAM_TLS_CERT_PATH_ENV)
    if upstream is not None and tunnel_protocol != c.WEBTRANSPORT:
        raise ConfigError(
            f"--upstream-tls-cert-path: requires --tunnel-protocol {c.WEBTRANSPORT} (it is {tunnel_protocol})"
        )
    keep_alive = ns.relay_keep_alive_ms.strip()
    if not keep_alive.isdigit():
        raise ConfigError(
            "--relay-keep-alive-ms: expected a whole number of milliseconds (0 disables), "
            f"got {ns.relay_keep_alive_ms!r}"
        )
    return InertFlags(
        tls_cert_path=from_env(ns.tls_cert_path, env, c.TLS_CERT_PATH_ENV),
        tls_key_path=from_env(ns.tls_key_path, env, c.TLS_KEY_PATH_ENV),
        quic_insecure=quic_insecure,
        upstream_tls_cert_path=upstream,
        relay_keep_alive_ms=int(keep_alive),
    )
