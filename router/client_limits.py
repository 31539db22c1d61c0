"""How much one client may hold at once: a count per client key, bounded by construction.

The key is the client's IP after PROXY protocol; IPv6 counts per /64, since one host gets a whole /64 and
could otherwise take 2^64 slots by changing its interface ID (docs/security.md). An entry exists only while
its count is above 0, so entries never outnumber open connections and flows, which are bounded already.
A limit of 0 tracks nothing. With ``--workers N`` the ``ClientCounts`` is the workers' shared table.
"""

from __future__ import annotations

import ipaddress
from typing import Protocol

IPV6_CLIENT_PREFIX = 64
"""IPv6 clients are counted per /64: the smallest prefix a site hands one host (RFC 6177)."""


def client_key(host: str) -> str:
    """The key a client is counted under: its IPv4 address (IPv4-mapped too), or its IPv6 /64; never raises.
    A host that is not an IP address (no socket or PROXY header gives one) is its own key."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped
        if mapped is not None:
            return str(mapped)
        return str(ipaddress.IPv6Network((address, IPV6_CLIENT_PREFIX), strict=False))
    return str(address)


class ClientCounts(Protocol):
    """Where an edge's per-client counts live: this process (``ClientLimitTable``) or every worker."""

    @property
    def limit(self) -> int: ...

    @property
    def enabled(self) -> bool: ...

    def try_acquire(self, key: str) -> bool: ...

    def release(self, key: str) -> None: ...

    def held(self, key: str) -> int: ...

    def __len__(self) -> int: ...


class ClientLimitTable:
    """Open connections (or flows) per client key, refused past ``limit`` (0: unlimited)."""

    __slots__ = ("_counts", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.limit = limit
        self._counts: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        """False for limit 0: nothing is counted, every acquire succeeds."""
        return self.limit > 0

    def try_acquire(self, key: str) -> bool:
        """Take one slot for ``key``; False (nothing taken) when it already holds ``limit``."""
        if not self.limit:
            return True
        held = self._counts.get(key, 0)
        if held >= self.limit:
            return False
        self._counts[key] = held + 1
        return True

    def release(self, key: str) -> None:
        """Give one slot back; the entry leaves the table at 0 (releasing an absent key is a no-op)."""
        held = self._counts.get(key, 0)
        if held > 1:
            self._counts[key] = held - 1
        elif held:
            del self._counts[key]

    def held(self, key: str) -> int:
        """Slots ``key`` holds now."""
        return self._counts.get(key, 0)

    def __len__(self) -> int:
        """Clients holding at least one slot (the table's size)."""
        return len(self._counts)


class ClientSlots:
    """Which owner (a TCP connection, a pending or routed QUIC flow) holds which client's slot.

    Owners are compared by identity; ``release`` may be called any number of times (only the first gives
    the slot back), so a slot is never given back twice.
    """

    __slots__ = ("_held", "table")

    def __init__(self, counts: ClientCounts | int) -> None:
        """``counts``: where the counts live, or a limit counted in this process alone."""
        self.table: ClientCounts = ClientLimitTable(counts) if isinstance(counts, int) else counts
        self._held: dict[object, str] = {}

    def take(self, owner: object, host: str) -> bool:
        """Take a slot of ``host``'s client for ``owner``; False when that client is at its limit."""
        if not self.table.enabled:
            return True
        key = client_key(host)
        if not self.table.try_acquire(key):
            return False
        self._held[owner] = key
        return True

    def move(self, old: object, new: object) -> None:
        """``new`` now holds ``old``'s slot (a pending flow routed as a flow)."""
        key = self._held.pop(old, None)
        if key is not None:
            self._held[new] = key

    def release(self, owner: object) -> None:
        """Give ``owner``'s slot back, if it holds one."""
        key = self._held.pop(owner, None)
        if key is not None:
            self.table.release(key)

    def __len__(self) -> int:
        """Owners holding a slot."""
        return len(self._held)
