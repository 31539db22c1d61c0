"""One flag's value -> its typed value, or a ``ConfigError`` naming the flag.

Every bad value becomes one line naming its flag, which the CLI prints before exiting 2.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from discovery.targets import host_port
from router import constants as c

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
"""A trusted source network of ``--proxy-protocol-trusted-cidrs``."""


class ConfigError(ValueError):
    """A bad flag value; the message starts with the flag's name."""


CONFIG_ERROR_PREFIX = "stargate-router: error: "
"""Starts the CLI's ``ConfigError`` line, as argparse's; the supervisor recognises its workers' by it."""

CONFIG_ERROR_STATUS = 2
"""Argparse's usage-error status; the supervisor never restarts a worker exiting so (same flags, same failure)."""


@dataclass(frozen=True, slots=True)
class SocketAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return host_port(self.host, self.port)


def parse_socket_address(flag: str, value: str) -> SocketAddress:
    """``host:port`` or ``[v6]:port`` with a numeric host; port 0 allowed (tests)."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{flag}: expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise ConfigError(f"{flag}: {host!r} is not an IP address") from None
    if not port_text.isdigit() or not 0 <= int(port_text) <= c.MAX_PORT:
        raise ConfigError(f"{flag}: port must be 0-{c.MAX_PORT}, got {port_text!r}")
    return SocketAddress(host, int(port_text))


def positive_ms(flag: str, value: str) -> float:
    try:
        ms = int(value)
    except ValueError:
        raise ConfigError(f"{flag}: expected a whole number of milliseconds, got {value!r}") from None
    if ms <= 0:
        raise ConfigError(f"{flag}: must be positive, got {ms}")
    return ms / 1000.0


def non_negative_ms(flag: str, value: str) -> float:
    if value.strip() == "0":
        return 0.0
    return positive_ms(flag, value)


def port_name(flag: str, value: str) -> str:
    if not value or len(value) > 15:
        raise ConfigError(f"{flag}: a port name is 1-15 characters, got {value!r}")
    return value


def boolean(flag: str, value: str) -> bool:
    text = value.strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"{flag}: expected true or false, got {value!r}")


def per_client_limit(flag: str, value: str) -> int:
    text = value.strip()
    if not text.isdigit() or int(text) > c.MAX_PER_CLIENT_LIMIT:
        raise ConfigError(f"{flag}: expected 0 (no limit) to {c.MAX_PER_CLIENT_LIMIT}, got {value!r}")
    return int(text)


def parse_cidrs(flag: str, value: str) -> tuple[IPNetwork, ...]:
    """Comma-separated IPv4/IPv6 networks (a bare address is a /32 or /128), at least one; a /0
    is kept as given (the edge checks it like any other network)."""
    networks: list[IPNetwork] = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=True))
        except ValueError as exc:
            raise ConfigError(f"{flag}: {item!r} is not a CIDR ({exc})") from None
    if not networks:
        raise ConfigError(f"{flag}: expected at least one CIDR, got {value!r}")
    return tuple(networks)


def every_source_warning(flag: str, networks: tuple[IPNetwork, ...]) -> str | None:
    """One line when ``networks`` trust every IPv4 or IPv6 source (a /0, given explicitly); else None."""
    versions = sorted({n.version for n in networks if n.prefixlen == 0})
    if not versions:
        return None
    sources = "every source" if versions == [4, 6] else f"every IPv{versions[0]} source"
    return (f"{flag} trusts {sources}: any peer that reaches --listen-addr can claim any client address "
            "(name the balancer's addresses instead)")


def log_level(value: str) -> str:
    """A level name (Python's or the Rust router's ``trace``/``warn``). A Rust env-filter such as
    ``info,kube=warn`` is accepted for drop-in compatibility: its bare default level is used."""
    from router.logging_setup import LOG_LEVELS

    level = value.strip().lower()
    if "," in level or "=" in level:
        bare = [d for d in level.split(",") if d and "=" not in d]
        level = bare[-1] if bare else c.DEFAULT_LOG_LEVEL
    if level not in LOG_LEVELS:
        raise ConfigError(f"--log-level: expected one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return level
