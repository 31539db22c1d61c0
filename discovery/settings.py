"""What to discover: which Service's EndpointSlices, and which named ports carry gRPC and QUIC.

Shared by both sources and the pure slice -> snapshot function, so a file and a cluster
are read with exactly the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DiscoverySettings:
    """Namespace and Service to watch; port names as in the Stargate pod spec. No defaults: the CLI's are passed in."""

    namespace: str
    service_name: str
    grpc_port_name: str
    quic_port_name: str

    def __post_init__(self) -> None:
        # An empty name would silently match nothing (or, for the selector, everything).
        for field_name in ("namespace", "service_name", "grpc_port_name", "quic_port_name"):
            value = getattr(self, field_name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"DiscoverySettings.{field_name} must be a non-empty string, got {value!r}")
