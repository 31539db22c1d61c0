"""Refused QUIC connection attempts, remembered a while: a client retransmits its first Initial
until answered, and each retransmit should cost a dict lookup and get the same answer, not a new
sniff. Bounded (oldest forgotten first) and swept by age; sans-IO (time is ``now``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from router.udp.flow_limits import FlowLimits

K = TypeVar("K", bound=Hashable)


@dataclass(slots=True, eq=False)
class Rejection:
    """One refused attempt: the answer it was sent, and how many more times it may be sent."""

    expires_at: float
    answer: bytes
    answers_left: int


class RememberedRejections(Generic[K]):
    """Rejections by attempt (the flow table keys them by client address and first DCID)."""

    def __init__(self, limits: FlowLimits, on_added: Callable[[], None]) -> None:
        self._limits = limits
        self._on_added = on_added
        """Something now needs expiring (the table wakes its sweeper)."""
        self._by_key: OrderedDict[K, Rejection] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_key)

    def remember(self, key: K, answer: bytes, now: float) -> None:
        """Remember a refused attempt (its first answer already sent); the oldest go beyond the bound."""
        limits = self._limits
        self._by_key.pop(key, None)
        while len(self._by_key) >= limits.max_remembered_rejections:
            self._by_key.popitem(last=False)
        self._by_key[key] = Rejection(now + limits.rejection_memory_s, answer, limits.answers_per_rejection - 1)
        self._on_added()

    def get(self, key: K, now: float) -> Rejection | None:
        """The remembered refusal of this attempt, if any and not expired."""
        rejection = self._by_key.get(key)
        if rejection is None:
            return None
        if rejection.expires_at <= now:
            del self._by_key[key]
            return None
        return rejection

    def expire(self, now: float) -> None:
        """Forget every rejection past its memory (insertion order is expiry order: one memory span)."""
        by_key = self._by_key
        while by_key:
            key, rejection = next(iter(by_key.items()))
            if rejection.expires_at > now:
                break
            del by_key[key]
