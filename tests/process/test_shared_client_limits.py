"""The shared per-client table's plumbing in one process: a memfd mapped twice stands for two
workers (``tests/process/test_workers_client_limits.py`` runs real ones)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from router.client_count_table import LayoutError
from router.client_limits import ClientLimitTable, ClientSlots
from router.shared_client_limits import (
    CountedRegion,
    SharedClientLimitTable,
    SharedTableFile,
    client_counts,
    create_table_file,
    table_file_for,
)

TCP = CountedRegion.TCP_CONNECTIONS


@pytest.fixture()
def table_fd() -> Iterator[int]:
    fd = create_table_file(2)
    try:
        yield fd
    finally:
        os.close(fd)


def worker(fd: int, index: int, limit: int, region: CountedRegion = TCP) -> SharedClientLimitTable:
    return SharedTableFile(fd, index).counts(region, limit)


def test_two_workers_count_a_client_once(table_fd: int) -> None:
    zero, one = worker(table_fd, 0, 3), worker(table_fd, 1, 3)
    assert zero.try_acquire("192.0.2.1") and one.try_acquire("192.0.2.1") and one.try_acquire("192.0.2.1")
    assert not zero.try_acquire("192.0.2.1") and not one.try_acquire("192.0.2.1")
    assert zero.try_acquire("192.0.2.2")  # another client is not affected
    assert zero.held("192.0.2.1") == one.held("192.0.2.1") == 3
    zero.release("192.0.2.1")
    zero.release("192.0.2.1")  # worker 0 held one: a second release takes nothing from worker 1
    assert one.held("192.0.2.1") == 2
    assert zero.try_acquire("192.0.2.1")
    assert (len(zero), len(one)) == (2, 1)


def test_the_two_limits_count_apart(table_fd: int) -> None:
    tcp, quic = worker(table_fd, 0, 1), worker(table_fd, 1, 1, CountedRegion.QUIC_FLOWS)
    assert tcp.try_acquire("2001:db8::/64") and quic.try_acquire("2001:db8::/64")


def test_a_restarted_worker_gives_back_what_its_dead_predecessor_held(table_fd: int) -> None:
    survivor, dying = worker(table_fd, 0, 2), worker(table_fd, 1, 2)
    assert dying.try_acquire("192.0.2.1") and dying.try_acquire("192.0.2.1")
    assert not survivor.try_acquire("192.0.2.1")  # until the replacement starts, they still count
    worker(table_fd, 1, 2)  # worker 1 restarted: its column starts empty
    assert survivor.try_acquire("192.0.2.1") and survivor.try_acquire("192.0.2.1")
    assert not survivor.try_acquire("192.0.2.1")


def test_a_full_table_counts_new_clients_per_worker_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    fd = create_table_file(2, capacity=2, window=2)
    try:
        zero, one = worker(fd, 0, 1), worker(fd, 1, 1)
        assert zero.try_acquire("192.0.2.1") and one.try_acquire("192.0.2.2")
        with caplog.at_level(logging.WARNING, "router.client_limits"):
            assert zero.try_acquire("192.0.2.3") and not zero.try_acquire("192.0.2.3")
            assert one.try_acquire("192.0.2.3")  # counted by each worker alone
            assert zero.try_acquire("192.0.2.4")
        assert sum("shared per-client table full" in r.message for r in caplog.records) == 2  # once per worker
        zero.release("192.0.2.3")
        assert zero.try_acquire("192.0.2.3")
        zero.release("192.0.2.1")  # room again: the next new client is shared
        assert one.try_acquire("192.0.2.5") and not zero.try_acquire("192.0.2.5")
    finally:
        os.close(fd)


def test_client_slots_take_the_shared_counts(table_fd: int) -> None:
    zero, one = ClientSlots(worker(table_fd, 0, 1)), ClientSlots(worker(table_fd, 1, 1))
    pending, flow = object(), object()
    assert zero.take(pending, "2001:db8::1")
    assert not one.take(object(), "2001:db8::2")  # the same /64, on the other worker
    zero.move(pending, flow)
    zero.release(flow)
    assert one.take(object(), "2001:db8::3")


def test_one_process_counts_in_its_own_dict_and_a_worker_in_the_shared_table(table_fd: int) -> None:
    alone = client_counts(2, 3)
    assert [type(t) for t in alone] == [ClientLimitTable, ClientLimitTable]
    assert [t.limit for t in alone] == [2, 3]
    tcp, quic = client_counts(2, 0, table_fd, 1)
    assert isinstance(tcp, SharedClientLimitTable) and tcp.limit == 2
    assert isinstance(quic, ClientLimitTable) and not quic.enabled
    assert all(type(t) is ClientLimitTable for t in client_counts(0, 0, table_fd, 1))


@pytest.mark.parametrize("fd", [999999, 0])  # no such descriptor; stdin: not a table
def test_descriptors_naming_no_table_are_a_layout_error(fd: int) -> None:
    with pytest.raises(LayoutError):
        client_counts(1, 1, fd, 0)


def test_a_worker_index_past_the_tables_columns_is_a_layout_error(table_fd: int) -> None:
    with pytest.raises(LayoutError):
        client_counts(1, 1, table_fd, 2)


def test_the_supervisor_makes_a_table_only_for_several_workers_with_a_limit() -> None:
    assert table_file_for(1, 3, 3) is None
    assert table_file_for(4, 0, 0) is None
    fd = table_file_for(4, 0, 2)
    assert fd is not None
    try:
        assert not os.get_inheritable(fd)  # passed to workers with pass_fds only
        assert SharedTableFile(fd, 3).layout.workers == 4
    finally:
        os.close(fd)
