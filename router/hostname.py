"""Hostname template matching: ``{pod_name}.stargate.external`` <-> ``stargate-0``.

The pod name must be exactly one DNS-1123 label, so a deeper name, an IP literal, userinfo, NUL or
non-ASCII never name a pod (docs/security.md). Matching never raises: a hostname yields a valid label or
None. A text longer than any authority that may name a pod (``MAX_AUTHORITY_LENGTH``) is refused before
anything reads or remembers it. Punycode labels are taken undecoded: pod names may have that form.
"""

from __future__ import annotations

import dataclasses
import re
import string
from dataclasses import dataclass

from router.constants import (
    HOSTNAME_CACHE_ENTRIES,
    MAX_AUTHORITY_LENGTH,
    MAX_HOSTNAME_LENGTH,
    MAX_POD_NAME_LENGTH,
    MAX_PORT_DIGITS,
)

POD_NAME_FIELD = "pod_name"
NAMESPACE_FIELD = "namespace"

_DNS1123_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
"""RFC 1123 label as Kubernetes validates it (lower-case only, checked after lowering)."""


class TemplateError(ValueError):
    """The configured hostname template cannot identify a pod."""


def is_pod_label(name: str) -> bool:
    """True if ``name`` is one DNS-1123 label of at most MAX_POD_NAME_LENGTH characters."""
    return len(name) <= MAX_POD_NAME_LENGTH and _DNS1123_LABEL.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class HostnameTemplate:
    """A template split around ``{pod_name}`` into a lower-cased prefix and suffix."""

    prefix: str
    suffix: str
    _names: dict[str, str] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)
    """Hostnames seen before -> the pod they name (only those that name one; emptied when full)."""

    @classmethod
    def parse(cls, template: str, namespace: str) -> HostnameTemplate:
        """Accept exactly one ``{pod_name}``, substitute ``{namespace}``, refuse other fields."""
        prefix_parts: list[str] = []
        suffix_parts: list[str] = []
        pod_fields = 0
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise TemplateError(f"invalid hostname template {template!r}: {exc}") from exc
        for literal, field, spec, conversion in parsed:
            (suffix_parts if pod_fields else prefix_parts).append(literal)
            if field is None:
                continue
            if spec or conversion:
                raise TemplateError(f"template field {{{field}}} may not carry a format spec")
            if field == POD_NAME_FIELD:
                pod_fields += 1
                if pod_fields > 1:
                    raise TemplateError(f"template {template!r} has more than one {{pod_name}}")
            elif field == NAMESPACE_FIELD:
                (suffix_parts if pod_fields else prefix_parts).append(namespace)
            else:
                raise TemplateError(f"template {template!r} has unknown field {{{field}}}")
        if pod_fields != 1:
            raise TemplateError(f"template {template!r} must contain exactly one {{pod_name}}")
        prefix, suffix = "".join(prefix_parts).lower(), "".join(suffix_parts).lower()
        if not (prefix + suffix).isascii():
            raise TemplateError(f"template {template!r} is not ASCII (use the punycode form)")
        # Hostnames are matched without their trailing dot, so the template is too.
        return cls(prefix, suffix.removesuffix("."))

    def pod_name_for(self, hostname: str) -> str | None:
        """The pod a worker names in ``:authority`` / SNI, or None if it names none. A text longer than
        any authority that may name a pod (``MAX_AUTHORITY_LENGTH``) names none: it is not matched, and
        never remembered, so the table holds at most its entries times that length."""
        if len(hostname) > MAX_AUTHORITY_LENGTH:
            return None
        known = self._names.get(hostname)
        if known is not None:
            return known
        pod = self._match(hostname)
        if pod is not None:
            if len(self._names) >= HOSTNAME_CACHE_ENTRIES:
                self._names.clear()
            self._names[hostname] = pod
        return pod

    def _match(self, hostname: str) -> str | None:
        host = _strip_port(hostname)
        if host is None:
            return None
        if host.endswith("."):
            host = host[:-1]
        if len(host) > MAX_HOSTNAME_LENGTH or not host.isascii():
            return None
        host = host.lower()
        if len(host) < len(self.prefix) + len(self.suffix):
            return None
        if not (host.startswith(self.prefix) and host.endswith(self.suffix)):
            return None
        middle = host[len(self.prefix) : len(host) - len(self.suffix)]
        return middle if is_pod_label(middle) else None

    def hostname_for(self, pod_name: str) -> str:
        """The hostname that names ``pod_name`` (what Stargate advertises to workers)."""
        return f"{self.prefix}{pod_name}{self.suffix}"


def _strip_port(hostname: str) -> str | None:
    """Drop a ``:port`` (1 to ``MAX_PORT_DIGITS`` ASCII digits); IPv6 literals and bad ports yield None."""
    if hostname.startswith("["):
        return None
    host, sep, port = hostname.rpartition(":")
    if not sep:
        return hostname
    if not 0 < len(port) <= MAX_PORT_DIGITS or not (port.isascii() and port.isdigit()) or ":" in host:
        return None
    return host
