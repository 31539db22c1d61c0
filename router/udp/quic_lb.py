"""QUIC-LB: pods that name themselves in every connection ID they issue, found again statelessly.

The plaintext layout of draft-ietf-quic-load-balancers (docs/quic.md): a first octet (config rotation
in its top three bits, ``0b111``: not routable), the server ID, a nonce of at least four octets. A
pod's server ID is the last ``server_id_bytes`` octets of its address as 16 octets (IPv4 mapped):
no extra API reads, no state shared between replicas. Sans-IO; nothing here raises on client bytes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from discovery.targets import Target, TargetSnapshot
from quic.packet import LONG_FORM, MAX_CID_LENGTH, QUIC_V1, QUIC_V2, PacketType, long_header_cids, packet_type_bits
from router.constants import MAX_PORT

UNROUTABLE_ROTATION = 0b111
"""Config rotation bits of a connection ID that encodes no server ID (the draft's 5-tuple fallback)."""
ROTATION_SHIFT = 5
"""The config rotation is the first octet's top three bits."""
SELF_ENCODED_LENGTH_MASK = 0x1F
"""The first octet's low five bits: the connection ID's length minus one, when the pod self-encodes it."""
MIN_NONCE_BYTES = 4
"""The draft's shortest nonce: what follows the server ID in every connection ID."""
MAX_SERVER_ID_BYTES = MAX_CID_LENGTH - 1 - MIN_NONCE_BYTES
"""15: the first octet, the server ID and a 4-octet nonce fit a v1/v2 connection ID (20 octets)."""
ADDRESS_BYTES = 16
"""A pod address as octets: IPv6, or IPv4 mapped into IPv6."""

_HANDSHAKE_BITS = {version: packet_type_bits(version, PacketType.HANDSHAKE) for version in (QUIC_V1, QUIC_V2)}
"""The type bits of a v1/v2 Handshake packet: its DCID is always one the server issued."""


def check_server_id_bytes(server_id_bytes: int) -> int:
    """``server_id_bytes`` if it is 1..15, else ``ValueError`` naming the range."""
    if not 1 <= server_id_bytes <= MAX_SERVER_ID_BYTES:
        raise ValueError(f"server ID length must be 1-{MAX_SERVER_ID_BYTES} octets, got {server_id_bytes!r}")
    return server_id_bytes


def self_encoded_length(first_octet: int) -> int:
    """The connection ID length a first octet self-encodes (its low five bits, plus one)."""
    return (first_octet & SELF_ENCODED_LENGTH_MASK) + 1


def server_id(cid: bytes, server_id_bytes: int) -> bytes | None:
    """The server ID ``cid`` encodes; None when it encodes none (config rotation ``0b111``) or is
    too short to hold one."""
    if len(cid) <= server_id_bytes or cid[0] >> ROTATION_SHIFT == UNROUTABLE_ROTATION:
        return None
    return cid[1 : 1 + server_id_bytes]


def routable_cid(datagram: bytes, cid_length: int | None) -> bytes | None:
    """The connection ID a client datagram can be routed by: a short header's DCID (``cid_length``
    octets, else as many as its first octet self-encodes) or a v1/v2 Handshake packet's (one the
    server issued). None for an Initial or 0-RTT (the client chose that DCID), another version, too
    short a datagram, or a length over 20 octets (no pod issues one)."""
    if len(datagram) < 2:
        return None
    if not datagram[0] & LONG_FORM:
        length = cid_length if cid_length is not None else self_encoded_length(datagram[1])
        end = 1 + length
        return datagram[1:end] if 0 < length <= MAX_CID_LENGTH and end <= len(datagram) else None
    version = int.from_bytes(datagram[1:5])
    if _HANDSHAKE_BITS.get(version) != datagram[0] & 0x30:
        return None
    dcid = long_header_cids(datagram)[0]
    return dcid if 0 < len(dcid) <= MAX_CID_LENGTH else None


def pod_server_id(address: str, server_id_bytes: int) -> bytes | None:
    """The server ID of a pod at ``address``: the last ``server_id_bytes`` octets of the address as
    16 octets (IPv4 mapped into IPv6); None for anything that is not an IP address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv4Address):
        ip = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    return ip.packed[ADDRESS_BYTES - server_id_bytes :]


@dataclass(frozen=True, slots=True)
class ServerIds:
    """Server ID -> ready pod, for one snapshot. Two pods whose addresses end alike share a server
    ID: it names neither (``ambiguous``), as a pod without a usable QUIC port names nothing."""

    server_id_bytes: int
    by_id: Mapping[bytes, Target] = field(default_factory=lambda: MappingProxyType({}))
    ambiguous: tuple[str, ...] = ()
    """Pod names whose server ID another pod also has, sorted."""

    @classmethod
    def of(cls, snapshot: TargetSnapshot, server_id_bytes: int) -> ServerIds:
        check_server_id_bytes(server_id_bytes)
        by_id: dict[bytes, Target] = {}
        shared: dict[bytes, list[str]] = {}
        for target in snapshot:
            sid = pod_server_id(target.address, server_id_bytes)
            if sid is None or not 0 < target.quic_port <= MAX_PORT:
                continue
            if sid in shared:
                shared[sid].append(target.pod_name)
            elif sid in by_id:
                shared[sid] = [by_id.pop(sid).pod_name, target.pod_name]
            else:
                by_id[sid] = target
        ambiguous = tuple(sorted(name for names in shared.values() for name in names))
        return cls(server_id_bytes, MappingProxyType(by_id), ambiguous)

    def target(self, cid: bytes) -> Target | None:
        """The ready pod ``cid``'s server ID names, if exactly one does."""
        sid = server_id(cid, self.server_id_bytes)
        return self.by_id.get(sid) if sid is not None else None
