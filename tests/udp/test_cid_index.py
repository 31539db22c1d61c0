"""The workers' shared connection-ID index (``router.udp.cid_index``): on a bytearray, then a memfd."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.udp.cid_index import (
    ENTRY_BYTES,
    HEADER_BYTES,
    MASK_BYTES,
    CidIndex,
    CidIndexError,
    IndexLayout,
    create_index_file,
    map_index,
)

POD = ("127.0.0.2", 50052)


def _buffer(workers: int = 2, capacity: int = 64, window: int = 4) -> memoryview:
    layout = IndexLayout(capacity, workers, window, bytes(range(16)))
    buffer = bytearray(layout.file_bytes)
    buffer[:HEADER_BYTES] = layout.header()
    return memoryview(buffer)


def test_what_one_worker_says_every_worker_reads() -> None:
    buffer = _buffer(3)
    first, second, third = (CidIndex(buffer, me) for me in range(3))
    assert first.put(b"12345678", *POD)
    assert second.put(b"abcd", "2001:db8::7", 443)
    assert third.pod_of(b"12345678") == POD and first.pod_of(b"abcd") == ("2001:db8::7", 443)
    assert third.lengths() == (4, 8) and third.pod_of(b"87654321") is None
    first.remove(b"12345678")
    assert second.pod_of(b"12345678") is None


def test_a_worker_removes_only_its_own_entries_and_a_successor_starts_clear() -> None:
    buffer = _buffer()
    old, other = CidIndex(buffer, 0), CidIndex(buffer, 1)
    old.put(b"cid-one!", *POD)
    other.put(b"cid-one!", "127.0.0.3", 50052)  # the connection moved: the other worker's flow learned it too
    other.remove(b"cid-one!")
    assert other.pod_of(b"cid-one!") == POD  # the first worker's entry stays
    successor = CidIndex(buffer, 0)
    successor.clear_mine()
    assert other.pod_of(b"cid-one!") is None


def test_what_cannot_be_said_is_refused_and_nothing_raises() -> None:
    index = CidIndex(_buffer(), 0)
    assert not index.put(b"", *POD)
    assert not index.put(b"x" * 21, *POD)
    assert not index.put(b"cid", "stargate-0", 1)  # a name, not an address
    assert not index.put(b"cid", "127.0.0.2", 0)
    assert index.pod_of(b"") is None and index.pod_of(b"x" * 21) is None
    index.remove(b"x" * 21)


def test_an_entry_being_written_or_written_over_is_a_miss_never_a_wrong_pod() -> None:
    buffer = _buffer(capacity=1, window=1)
    writer, reader = CidIndex(buffer, 0), CidIndex(buffer, 1)
    writer.put(b"cid-one!", *POD)
    entry = HEADER_BYTES + MASK_BYTES
    (sequence,) = struct.unpack_from("<I", buffer, entry)
    assert sequence % 2 == 0 and reader.pod_of(b"cid-one!") == POD
    struct.pack_into("<I", buffer, entry, sequence + 1)  # a writer in the middle of its write
    assert reader.pod_of(b"cid-one!") is None


def test_a_full_window_gives_up_a_hint_not_a_write() -> None:
    index = CidIndex(_buffer(capacity=4, window=2), 0)
    for n in range(100):
        assert index.put(n.to_bytes(8, "big"), *POD)
    found = [n for n in range(100) if index.pod_of(n.to_bytes(8, "big")) is not None]
    assert 1 <= len(found) <= 4 and 99 in found  # the newest is always there


def test_a_buffer_that_is_no_index_is_refused() -> None:
    with pytest.raises(CidIndexError):
        CidIndex(memoryview(bytearray(HEADER_BYTES)), 0)
    with pytest.raises(CidIndexError):
        CidIndex(_buffer(workers=2), 2)
    with pytest.raises(CidIndexError):
        IndexLayout(0, 1, 1, bytes(16))


_CIDS = [bytes([n]) * length for n in range(1, 5) for length in (4, 8, 20)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "remove", "restart"]), st.integers(0, 2),
                          st.sampled_from(_CIDS), st.integers(1, 3)), max_size=60))
def test_any_sequence_reads_as_a_model_of_per_worker_dicts(ops: list[tuple[str, int, bytes, int]]) -> None:
    """With room for every ID, the index reads as one dict per worker: this worker's first, then the others'."""
    buffer = _buffer(workers=3, capacity=64, window=64)
    workers = [CidIndex(buffer, me) for me in range(3)]
    model: list[dict[bytes, tuple[str, int]]] = [{}, {}, {}]
    for op, me, cid, pod in ops:
        endpoint = (f"10.0.0.{pod}", 50052)
        if op == "put":
            workers[me].put(cid, *endpoint)
            model[me][cid] = endpoint
        elif op == "remove":
            workers[me].remove(cid)
            model[me].pop(cid, None)
        else:
            workers[me] = CidIndex(buffer, me)
            workers[me].clear_mine()
            model[me].clear()
        for reader in range(3):
            for known in _CIDS:
                order = [reader, *(w for w in range(3) if w != reader)]
                expected = next((model[w][known] for w in order if known in model[w]), None)
                assert workers[reader].pod_of(known) == expected


def test_the_supervisors_memfd_is_one_index_every_worker_maps() -> None:
    fd = create_index_file(2, 16, 4)
    try:
        assert os.fstat(fd).st_size == HEADER_BYTES + 2 * (MASK_BYTES + 16 * ENTRY_BYTES)
        first, second = map_index(fd, 0), map_index(fd, 1)
        first.put(b"cid-one!", *POD)
        assert second.pod_of(b"cid-one!") == POD
        assert map_index(fd, 0).pod_of(b"cid-one!") is None  # a new worker 0 cleared its region
        with pytest.raises(CidIndexError):
            map_index(fd, 2)
    finally:
        os.close(fd)
