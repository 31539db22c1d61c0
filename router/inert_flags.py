"""The Rust router's flags that an L4 router accepts but cannot act on, and the warning naming them.

The Rust ``stargate-k8s-router`` terminates TLS and QUIC, so its chart passes a certificate,
a key, ``--quic-insecure``, an upstream CA for WebTransport and a QUIC keep-alive period. This
router ends neither: the worker's TLS or QUIC session reaches the pod, the router holds no
certificate and cannot send a PING inside an encrypted QUIC connection. The flags are parsed
(``router.config``) so the chart's args run unchanged, and never silently: the start output
names every one given away from its default, with the reason (``warning``).
"""

from __future__ import annotations

from dataclasses import dataclass

from router import constants as c

NO_CERTIFICATE_REASON = "the router holds no certificate: TLS and QUIC end at the pod"
"""Why the certificate flags change nothing."""

NO_PING_REASON = (
    "the router cannot send PINGs inside encrypted QUIC: the tunnel's endpoints' QUIC keep-alive "
    "keeps an idle tunnel open"
)
"""Why ``--relay-keep-alive-ms`` changes nothing (README, "Switching from the Rust router's chart")."""


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
