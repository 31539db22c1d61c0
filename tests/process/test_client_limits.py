"""Per-client slot table: IPv4 per address, IPv6 per /64, entries gone at 0, 0 = unlimited."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.client_limits import ClientLimitTable, ClientSlots, client_key


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("::ffff:192.0.2.9", "192.0.2.9"),
        ("not-an-address", "not-an-address"),
        ("", ""),
    ],
)
def test_client_key_counts_ipv4_per_address_and_ipv6_per_64(host: str, key: str) -> None:
    assert client_key(host) == key


def test_limit_refuses_past_n_and_a_release_frees_a_slot() -> None:
    table = ClientLimitTable(2)
    assert table.try_acquire("a") and table.try_acquire("a")
    assert not table.try_acquire("a")
    assert table.held("a") == 2
    assert table.try_acquire("b")  # another client is not affected
    table.release("a")
    assert table.try_acquire("a")


def test_entry_leaves_the_table_at_zero() -> None:
    table = ClientLimitTable(3)
    table.try_acquire("a")
    table.try_acquire("a")
    table.release("a")
    table.release("a")
    assert len(table) == 0 and table.held("a") == 0
    table.release("a")  # an extra release never goes negative nor creates an entry
    assert len(table) == 0


def test_zero_means_unlimited_and_tracks_nothing() -> None:
    table = ClientLimitTable(0)
    assert not table.enabled
    assert all(table.try_acquire("a") for _ in range(1000))
    assert len(table) == 0
    table.release("a")


def test_negative_limit_is_a_bug() -> None:
    with pytest.raises(ValueError):
        ClientLimitTable(-1)


def test_many_distinct_clients_leave_nothing_behind() -> None:
    table = ClientLimitTable(1)
    for i in range(100_000):
        key = client_key(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
        assert table.try_acquire(key)
        table.release(key)
    assert len(table) == 0


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.lists(st.tuples(st.booleans(), st.sampled_from("abc")), max_size=60))
def test_table_matches_a_model_and_never_exceeds_its_limit(limit: int, ops: list[tuple[bool, str]]) -> None:
    table, model = ClientLimitTable(limit), {"a": 0, "b": 0, "c": 0}
    for acquire, key in ops:
        if acquire:
            assert table.try_acquire(key) == (model[key] < limit)
            model[key] = min(limit, model[key] + 1)
        else:
            table.release(key)
            model[key] = max(0, model[key] - 1)
        assert table.held(key) == model[key] <= limit
        assert len(table) == sum(1 for v in model.values() if v)


def test_client_slots_are_taken_moved_and_released_once() -> None:
    slots = ClientSlots(1)
    pending, flow, other = object(), object(), object()
    assert slots.take(pending, "2001:db8::1")
    assert not slots.take(other, "2001:db8::2")  # the same /64
    slots.move(pending, flow)
    slots.release(pending)  # no longer the holder: nothing happens
    assert not slots.take(other, "2001:db8::2")
    slots.release(flow)
    slots.release(flow)
    assert slots.take(other, "2001:db8::2")
    slots.release(other)
    assert len(slots) == 0 and len(slots.table) == 0


def test_client_slots_without_a_limit_hold_nothing() -> None:
    slots = ClientSlots(0)
    owners = [object() for _ in range(100)]
    assert all(slots.take(o, "10.0.0.1") for o in owners)
    assert len(slots) == 0
    for o in owners:
        slots.release(o)
