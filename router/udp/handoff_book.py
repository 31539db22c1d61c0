"""What one worker remembers about flows the other workers hold: sans-IO, time passed in.

With ``--workers N`` the kernel spreads client datagrams over the workers by their 4-tuple, so a
client whose NAT rebinds may reach a worker that holds no flow for it: a miss. That worker asks
the others (``ask``: one number per miss, a token of a bucket); the one holding the flow takes the
datagram and claims it (``claimed``); the asker then forwards that address's next datagrams to the
owner straight away (``owner``). An ask nobody claims within ``ask_deadline_s`` is a miss as any
other: ``overdue`` hands it back to be counted as dropped.

Bounded for floods: asks beyond the bucket are refused (the miss is dropped at once), unanswered
asks are at most ``max_asks``, forward entries at most ``max_forwards`` (the least recently used
goes first: its client's next datagram is asked about again) and each is forgotten after
``forward_idle_s`` without a datagram, as a silent flow is (found stale when next used, or swept
with the overdue asks).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from router.udp.refusals import ByteBudget

Address = tuple[Any, ...]


class HandoffBook:
    """Forward entries (client address -> owning worker) and unanswered asks of one worker."""

    def __init__(
        self, asks_per_s: float, ask_burst: float, max_asks: int, max_forwards: int, ask_deadline_s: float,
        forward_idle_s: float,
    ) -> None:
        if max_asks < 1 or max_forwards < 1 or not ask_deadline_s > 0 or not forward_idle_s > 0:
            raise ValueError("max_asks, max_forwards, ask_deadline_s and forward_idle_s must be > 0")
        self._bucket = ByteBudget(asks_per_s, ask_burst)
        self._max_asks = max_asks
        self._max_forwards = max_forwards
        self._ask_deadline_s = ask_deadline_s
        self._forward_idle_s = forward_idle_s
        self._asks: OrderedDict[int, tuple[Address, float]] = OrderedDict()
        """Unanswered asks by number: (client address, deadline); insertion order is deadline order."""
        self._forwards: OrderedDict[Address, tuple[int, float]] = OrderedDict()
        """Client address -> (owning worker, last datagram forwarded), least recently used first."""
        self._next_id = 0

    @property
    def unanswered(self) -> int:
        return len(self._asks)

    @property
    def forward_count(self) -> int:
        return len(self._forwards)

    @property
    def next_ask_id(self) -> int:
        """The number the next ask will take (its record is encoded before the ask is)."""
        return self._next_id

    @property
    def next_deadline(self) -> float | None:
        """When the oldest unanswered ask falls due (None: none is waiting)."""
        return next(iter(self._asks.values()))[1] if self._asks else None

    def owner(self, address: Address, now: float) -> int | None:
        """The worker a claim named for ``address``, unless idle too long (then forgotten)."""
        entry = self._forwards.get(address)
        if entry is None:
            return None
        owner, last = entry
        if now - last >= self._forward_idle_s:
            del self._forwards[address]
            return None
        self._forwards[address] = owner, now
        self._forwards.move_to_end(address)
        return owner

    def ask(self, address: Address, now: float) -> int | None:
        """A number for a new ask about ``address``'s datagram, or None: over the rate, or too many
        asks unanswered (the caller drops the datagram as a miss)."""
        if len(self._asks) >= self._max_asks or not self._bucket.take(1, now):
            return None
        ask_id = self._next_id
        self._next_id = (ask_id + 1) & 0xFFFFFFFF
        self._asks[ask_id] = address, now + self._ask_deadline_s
        return ask_id

    def claimed(self, ask_id: int, address: Address, owner: int, now: float) -> bool:
        """Worker ``owner`` took the datagram of ask ``ask_id``: its address is forwarded there from
        now on. False (nothing learned) when that ask is not this address's: a late or stray claim."""
        asked = self._asks.get(ask_id)
        if asked is None or asked[0] != address:
            return False
        del self._asks[ask_id]
        self._forwards[address] = owner, now
        self._forwards.move_to_end(address)
        while len(self._forwards) > self._max_forwards:
            self._forwards.popitem(last=False)
        return True

    def overdue(self, now: float) -> int:
        """Forget the asks nobody claimed in time, and stale forward entries; how many asks
        (each a datagram dropped as a miss)."""
        count = 0
        while self._asks:
            ask_id, (_, deadline) = next(iter(self._asks.items()))
            if deadline > now:
                break
            del self._asks[ask_id]
            count += 1
        while self._forwards:
            address, (_, last) = next(iter(self._forwards.items()))
            if now - last < self._forward_idle_s:
                break
            del self._forwards[address]
        return count
