"""The shared per-client table's layout and probing on a plain buffer: counts per worker column,
a client's count their sum, keys found once, free entries reused, a full window said as such."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.client_count_table import (
    HEADER_BYTES,
    Admission,
    ClientCountTable,
    LayoutError,
    TableLayout,
    pack_key,
)

SALT = bytes(range(16))


def table(capacity: int = 64, workers: int = 2, window: int = 8) -> ClientCountTable:
    layout = TableLayout(capacity, workers, window, SALT)
    return ClientCountTable(memoryview(bytearray(layout.region_bytes)), layout)


def key(n: int) -> bytes:
    return pack_key(f"10.0.{n >> 8 & 255}.{n & 255}")


def test_keys_are_16_bytes_tagged_and_one_per_client() -> None:
    assert pack_key("192.0.2.7") == b"\x04" + bytes([192, 0, 2, 7]) + bytes(11)
    assert pack_key("2001:db8:1:2::/64") == b"\x06" + bytes.fromhex("20010db800010002") + bytes(7)
    assert pack_key("::/64") != bytes(16)  # the all-zero key marks an entry never used
    assert pack_key("not-an-address") != pack_key("not-an-address2")
    assert all(len(pack_key(k)) == 16 and pack_key(k)[0] for k in ("", "x", "1.2.3", "::1/64", "\0"))


def test_the_header_round_trips_and_anything_else_is_a_layout_error() -> None:
    layout = TableLayout(1024, 3, 16, SALT)
    header = layout.header()
    assert len(header) == HEADER_BYTES and TableLayout.parse(header) == layout
    assert layout.file_bytes == HEADER_BYTES + 2 * 1024 * (16 + 4 * 3)
    for bad in (b"", b"x" * 64, header[:10]):
        with pytest.raises(LayoutError):
            TableLayout.parse(bad)
    with pytest.raises(LayoutError):
        TableLayout(8, 1, 9, SALT)  # a window past the table
    with pytest.raises(LayoutError):
        ClientCountTable(memoryview(bytearray(10)), layout)


def test_a_client_counts_once_over_every_column() -> None:
    t = table()
    assert t.acquire(key(1), 0, 3) is Admission.ADMITTED
    assert t.acquire(key(1), 1, 3) is Admission.ADMITTED
    assert t.acquire(key(1), 1, 3) is Admission.ADMITTED
    assert t.acquire(key(1), 0, 3) is Admission.AT_LIMIT
    assert t.acquire(key(2), 0, 3) is Admission.ADMITTED  # another client is not affected
    assert (t.total(key(1)), t.held(key(1), 0), t.held(key(1), 1)) == (3, 1, 2)
    assert t.release(key(1), 0)
    assert not t.release(key(1), 0)  # column 0 holds none of it now: nothing taken from column 1
    assert t.acquire(key(1), 0, 3) is Admission.ADMITTED


def test_clearing_a_column_gives_a_dead_workers_slots_back() -> None:
    t = table()
    for _ in range(2):
        t.acquire(key(1), 1, 2)
    assert t.acquire(key(1), 0, 2) is Admission.AT_LIMIT
    t.clear_column(1)
    assert t.total(key(1)) == 0 and t.live_entries() == 0
    assert not t.release(key(1), 1)  # column 1 holds nothing now
    assert t.acquire(key(1), 0, 2) is Admission.ADMITTED


def test_a_window_held_by_other_clients_is_full_and_frees_on_release() -> None:
    t = table(capacity=4, workers=1, window=4)
    for n in range(4):
        assert t.acquire(key(n), 0, 1) is Admission.ADMITTED
    assert t.acquire(key(9), 0, 1) is Admission.FULL
    assert t.acquire(key(0), 0, 1) is Admission.AT_LIMIT  # a held client is still found
    t.release(key(2), 0)
    assert t.acquire(key(9), 0, 1) is Admission.ADMITTED
    assert t.live_entries() == 4


def test_many_distinct_clients_through_a_small_table_never_fill_it() -> None:
    t = table(capacity=256, workers=2, window=16)
    for n in range(20_000):
        assert t.acquire(key(n), n % 2, 1) is Admission.ADMITTED
        assert t.release(key(n), n % 2)
    assert t.live_entries() == 0


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 8),
    st.integers(1, 3),
    st.integers(1, 3),
    st.data(),
    st.lists(st.tuples(st.sampled_from(["acquire", "release", "clear"]), st.integers(0, 2), st.integers(0, 11)),
             max_size=120),
)
def test_workers_sharing_the_table_match_a_model_of_counts_per_column(
    capacity: int, workers: int, limit: int, data: st.DataObject, ops: list[tuple[str, int, int]]
) -> None:
    window = data.draw(st.integers(1, capacity))
    layout = TableLayout(capacity, workers, window, SALT)
    shared = memoryview(bytearray(layout.region_bytes))
    workers_tables = [ClientCountTable(shared, layout) for _ in range(workers)]  # one per process
    t = workers_tables[0]  # any of them reads every column
    model: dict[int, list[int]] = {n: [0] * workers for n in range(12)}

    def live() -> int:
        return sum(1 for counts in model.values() if sum(counts))

    for op, worker, n in ops:
        column = worker % workers
        counts = model[n]
        if op == "acquire":
            result = workers_tables[column].acquire(key(n), column, limit)
            if sum(counts) >= limit:
                assert result is Admission.AT_LIMIT
            elif result is Admission.FULL:  # only when its whole window holds other clients' slots
                assert not sum(counts) and live() >= window
                assert window < capacity or live() == capacity
            else:
                assert result is Admission.ADMITTED
                counts[column] += 1
            if window == capacity and live() < capacity:
                assert result is not Admission.FULL
        elif op == "release":
            assert workers_tables[column].release(key(n), column) == bool(counts[column])
            counts[column] = max(0, counts[column] - 1)
        else:  # the worker in this place restarted
            workers_tables[column] = ClientCountTable(shared, layout)
            workers_tables[column].clear_column(column)
            for held in model.values():
                held[column] = 0
        for m, held in model.items():
            assert t.total(key(m)) == sum(held) <= limit
            assert [t.held(key(m), w) for w in range(workers)] == held
        assert t.live_entries() == live()


def test_a_freed_entry_that_a_later_clients_probe_passes_stays_in_the_chain() -> None:
    t = table(capacity=64, workers=1, window=8)
    home = t._home(key(0))
    first, second = [n for n in range(5000) if t._home(key(n)) == home][:2]
    t.acquire(key(first), 0, 2)
    t.acquire(key(second), 0, 2)  # the next entry: its probe passes the first's
    t.release(key(first), 0)
    assert t.total(key(second)) == 1
    assert t.acquire(key(second), 0, 2) is Admission.ADMITTED  # found, not stored a second time
    assert t.acquire(key(second), 0, 2) is Admission.AT_LIMIT
    t.release(key(second), 0)
    t.release(key(second), 0)
    assert t.live_entries() == 0
    assert bytes(t._keys) == bytes(64 * 16)  # every entry never used again: lookups stop at once
