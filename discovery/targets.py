"""The routing table's value types: one ``Target`` per ready pod, in an immutable snapshot.

A ``TargetSnapshot`` is built whole by a pure function and swapped atomically, so a
connection always routes against one consistent view of the pods.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Target:
    """One ready Stargate pod: where its gRPC (TCP) and QUIC (UDP) ports are."""

    pod_name: str
    address: str
    """The pod IP as in the EndpointSlice (``addresses[0]``), without brackets."""
    grpc_port: int
    quic_port: int

    grpc_endpoint: str = field(init=False, repr=False, compare=False)
    """``ip:port`` (IPv6 ``[ip]:port``) as the Rust router renders it; formatted per snapshot, not per connection."""
    quic_endpoint: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "grpc_endpoint", host_port(self.address, self.grpc_port))
        object.__setattr__(self, "quic_endpoint", host_port(self.address, self.quic_port))


def host_port(address: str, port: int) -> str:
    """``ip:port``, IPv6 bracketed (``[ip]:port``): the one formatter of an endpoint."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


@dataclass(frozen=True, slots=True)
class TargetSnapshot:
    """Immutable pod name -> Target map, sorted by pod name; O(1) lookup."""

    by_pod: Mapping[str, Target] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, targets: list[Target] | tuple[Target, ...]) -> TargetSnapshot:
        ordered = sorted(targets, key=lambda t: t.pod_name)
        return cls(MappingProxyType({t.pod_name: t for t in ordered}))

    def get(self, pod_name: str) -> Target | None:
        return self.by_pod.get(pod_name)

    def __len__(self) -> int:
        return len(self.by_pod)

    def __iter__(self) -> Iterator[Target]:
        return iter(self.by_pod.values())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TargetSnapshot):
            return NotImplemented
        return dict(self.by_pod) == dict(other.by_pod)

    def __hash__(self) -> int:
        return hash(tuple(self.by_pod.values()))


EMPTY_SNAPSHOT = TargetSnapshot()
