"""The workers' handoffs without processes: the record codec (fuzzed) and the ask / claim / forward
book, time passed in."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket

import pytest
from aioquic.asyncio import connect
from hypothesis import given, settings
from hypothesis import strategies as st

from router.demo.pki import DemoPki
from router.demo.quic_pods import client_configuration, request
from router.udp.handoff_book import HandoffBook
from router.udp.handoff_codec import (
    Handoff,
    HandoffError,
    HandoffKind,
    decode_handoffs,
    encode_handoff,
    encode_message_head,
)
from router.udp.worker_link import WorkerLink, WorkerPeers
from router.worker_process import WorkerChannels
from tests.support.names import host as sni
from tests.support.polling import eventually
from tests.support.quic_pods_harness import ROUTER_HOST, running

_v4 = st.ip_addresses(v=4).map(lambda ip: (str(ip), 0))
_v6 = st.ip_addresses(v=6).map(lambda ip: (socket.inet_ntop(socket.AF_INET6, ip.packed), 0, 0, 0))


@st.composite
def _addresses(draw: st.DrawFn) -> tuple[object, ...]:
    base = draw(st.one_of(_v4, _v6))
    port = draw(st.integers(0, 0xFFFF))
    if len(base) == 2:
        return (base[0], port)
    return (base[0], port, draw(st.integers(0, 0xFFFFFFFF)), draw(st.integers(0, 0xFFFFFFFF)))


_records = st.tuples(
    st.sampled_from([HandoffKind.ASK, HandoffKind.FORWARD]), st.integers(0, 0xFFFFFFFF), _addresses(),
    st.binary(max_size=1500),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_records, min_size=1, max_size=5))
def test_records_decode_to_what_was_encoded_in_order(
    records: list[tuple[HandoffKind, int, tuple[object, ...], bytes]],
) -> None:
    message = b"".join(encode_handoff(*record) for record in records)
    assert decode_handoffs(message) == [Handoff(*record) for record in records]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_our_error(message: bytes) -> None:
    try:
        records = decode_handoffs(message)
    except HandoffError:
        return
    for record in records:
        assert isinstance(record.kind, HandoffKind)
        ipaddress.ip_address(record.address[0])


@settings(max_examples=300, deadline=None)
@given(_records, st.data())
def test_a_cut_or_altered_record_raises_our_error_or_decodes_cleanly(
    record: tuple[HandoffKind, int, tuple[object, ...], bytes], data: st.DataObject
) -> None:
    message = bytearray(encode_handoff(*record))
    cut = data.draw(st.integers(1, len(message) - 1))
    with pytest.raises(HandoffError):
        decode_handoffs(bytes(message[:cut]))
    at = data.draw(st.integers(0, len(message) - 1))
    message[at] ^= data.draw(st.integers(1, 255))
    with contextlib.suppress(HandoffError):
        decode_handoffs(bytes(message))


def test_a_claim_round_trips_and_carries_no_payload() -> None:
    claim = encode_handoff(HandoffKind.CLAIM, 7, ("10.0.0.1", 443))
    assert decode_handoffs(claim) == [Handoff(HandoffKind.CLAIM, 7, ("10.0.0.1", 443))]
    forged = bytearray(claim)
    forged[-2:] = b"\x00\x01"
    with pytest.raises(HandoffError):
        decode_handoffs(bytes(forged) + b"x")


@pytest.mark.parametrize("address", [
    ("fe80::1%eth0", 1, 0, 2), ("stargate-0", 1), ("10.0.0.1", 70_000), ("10.0.0.1",), ("::1", 1, -1, 0),
])
def test_an_address_of_another_shape_is_refused_with_our_error(address: tuple[object, ...]) -> None:
    with pytest.raises(HandoffError):
        encode_handoff(HandoffKind.ASK, 1, address, b"x")


def test_an_over_long_payload_or_ask_id_is_refused() -> None:
    with pytest.raises(HandoffError):
        encode_handoff(HandoffKind.ASK, 1, ("10.0.0.1", 1), bytes(0x10000))
    with pytest.raises(HandoffError):
        encode_handoff(HandoffKind.ASK, 1 << 32, ("10.0.0.1", 1), b"")


# -- the book: ask, claim, forward --------------------------------------------------------
A, B = ("10.0.0.1", 1000), ("10.0.0.2", 2000)


def _book(**overrides: float) -> HandoffBook:
    args = {"asks_per_s": 10.0, "ask_burst": 3.0, "max_asks": 100, "max_forwards": 2, "ask_deadline_s": 1.0,
            "forward_idle_s": 30.0} | overrides
    return HandoffBook(**args)  # type: ignore[arg-type]


def test_a_claimed_ask_makes_the_address_forwarded_to_its_owner() -> None:
    book = _book()
    assert book.owner(A, 0.0) is None
    number = book.next_ask_id
    ask = book.ask(A, 0.0)
    assert ask == number and book.next_ask_id == number + 1 and book.unanswered == 1
    assert book.claimed(ask, A, 3, 0.01)
    assert book.unanswered == 0 and book.owner(A, 0.02) == 3
    assert book.overdue(5.0) == 0  # a claimed ask is never counted dropped


def test_an_unclaimed_ask_is_counted_once_after_its_deadline() -> None:
    book = _book()
    book.ask(A, 0.0)
    book.ask(B, 0.5)
    assert book.next_deadline == 1.0
    assert book.overdue(0.9) == 0
    assert book.overdue(1.0) == 1 and book.next_deadline == 1.5
    assert book.overdue(2.0) == 1 and book.overdue(9.0) == 0 and book.next_deadline is None


def test_a_late_or_stray_claim_teaches_nothing() -> None:
    book = _book()
    ask = book.ask(A, 0.0)
    assert ask is not None
    assert not book.claimed(ask, B, 1, 0.1)  # not the address asked about
    assert not book.claimed(ask + 1, A, 1, 0.1)  # never asked
    assert book.overdue(1.0) == 1
    assert not book.claimed(ask, A, 1, 1.1)  # counted dropped already
    assert book.owner(A, 1.2) is None


def test_asks_are_limited_by_the_bucket_and_by_how_many_wait() -> None:
    book = _book(ask_burst=3.0, asks_per_s=10.0)
    assert [book.ask(A, 0.0) is not None for _ in range(5)] == [True, True, True, False, False]
    assert book.ask(A, 0.1) is not None  # a token came back
    few = _book(ask_burst=50.0, max_asks=2)
    assert [few.ask(A, 0.0) is not None for _ in range(3)] == [True, True, False]


def test_forward_entries_are_capped_least_recently_used_first_and_expire_when_idle() -> None:
    book = _book(max_forwards=2, forward_idle_s=10.0)
    c = ("10.0.0.3", 3000)
    for i, address in enumerate((A, B)):
        ask = book.ask(address, 0.0)
        assert ask is not None and book.claimed(ask, address, i + 1, 0.0)
    assert book.owner(A, 1.0) == 1  # A used: B is the least recent
    ask = book.ask(c, 1.0)
    assert ask is not None and book.claimed(ask, c, 1, 1.0)
    assert book.forward_count == 2 and book.owner(B, 1.0) is None and book.owner(A, 1.0) == 1
    assert book.owner(A, 10.9) == 1  # a datagram keeps it
    assert book.owner(c, 11.0) is None  # idle 10 s: forgotten
    book.overdue(30.0)
    assert book.forward_count == 0


def test_the_book_refuses_bounds_that_would_not_bound() -> None:
    with pytest.raises(ValueError):
        _book(max_asks=0)
    with pytest.raises(ValueError):
        _book(forward_idle_s=0.0)


# -- the link: the supervisor's socket pairs, in one process ------------------------------------
def _peers(channels: WorkerChannels, index: int) -> WorkerPeers:
    seat = channels.seat(index, 1000 + index, 2000 + index, None)  # health/control unused here
    return WorkerPeers(seat.index, seat.count, seat.inbox_fd, seat.outbox_fds)


async def test_links_batch_an_iterations_records_and_a_late_worker_drops_what_queued_for_it() -> None:
    channels = WorkerChannels(3)
    got: list[tuple[Handoff, int]] = []
    lost: list[int] = []
    links = [WorkerLink(_peers(channels, i), lambda h, s: got.append((h, s)), lost.append) for i in range(3)]
    loop = asyncio.get_running_loop()
    for link in links[:2]:  # worker 2 is not up: its inbox holds what is sent to it
        link.open(loop)
    try:
        for n in range(3):
            links[0].queue(1, encode_handoff(HandoffKind.FORWARD, 0, A, b"d%d" % n), forward=True)
        links[0].queue(2, encode_handoff(HandoffKind.ASK, 5, A, b"y"))
        await eventually(lambda: len(got) == 3, what="the forwards to arrive")
        assert [(h.payload, sender) for h, sender in got] == [(b"d0", 0), (b"d1", 0), (b"d2", 0)]
        links[2].open(loop)  # a restarted worker: its predecessor's asks are not its own
        links[1].queue(2, encode_handoff(HandoffKind.ASK, 6, A, b"z"))
        await eventually(lambda: len(got) == 4, what="the ask sent after worker 2 started")
        assert (got[3][0].payload, got[3][1]) == (b"z", 1)
        assert lost == []
    finally:
        for link in links:
            link.close()
        channels.close()


async def test_a_full_inbox_loses_the_message_and_says_how_many_forwards_went_with_it() -> None:
    channels = WorkerChannels(2)
    lost: list[int] = []
    sender = WorkerLink(_peers(channels, 0), lambda h, s: None, lost.append)
    sender.open(asyncio.get_running_loop())
    try:
        for _ in range(10_000):  # worker 1 reads nothing: its queue fills, then sends are refused
            sender.queue(1, encode_handoff(HandoffKind.FORWARD, 0, A, b"x" * 1000), forward=True)
            sender.queue(1, encode_handoff(HandoffKind.FORWARD, 0, A, b"y" * 1000), forward=True)
            sender.flush()
            if lost:
                break
        assert lost and set(lost) == {2}
    finally:
        sender.close()
        channels.close()


async def test_messages_naming_no_sibling_as_sender_are_not_read() -> None:
    channels = WorkerChannels(2)
    got: list[tuple[Handoff, int]] = []
    reader = WorkerLink(_peers(channels, 1), lambda h, s: got.append((h, s)), lambda n: None)
    reader.open(asyncio.get_running_loop())
    try:
        outbox = channels.pairs[1][1]
        record = encode_handoff(HandoffKind.CLAIM, 1, A)
        for head in (b"\x07", b"\x01", b""):  # past the workers, itself, no head at all
            outbox.send(head + record)
        outbox.send(encode_message_head(0) + record)
        await eventually(lambda: len(got) == 1, what="the one message from worker 0")
        assert got[0][1] == 0
    finally:
        reader.close()
        channels.close()


async def test_a_worker_whose_descriptors_are_not_its_channels_routes_as_a_lone_worker_and_says_so(
    pki: DemoPki, caplog: pytest.LogCaptureFixture
) -> None:
    read_end, write_end = os.pipe()  # a pipe, not a socket pair
    try:
        workers = WorkerPeers(0, 2, read_end, (-1, write_end))
        async with running(pki, workers=workers) as h:
            assert h.router.handoff_book is None
            assert "cannot reach the other workers" in caplog.text
            config = client_configuration(sni("stargate-0"), h.cafile)
            async with connect(ROUTER_HOST, h.port, configuration=config) as client:
                assert await request(client, b"alone") == b"stargate-0:alone"
    finally:
        os.close(read_end)
        os.close(write_end)


async def test_a_worker_reads_its_own_copies_and_leaves_the_supervisors_channels_open(pki: DemoPki) -> None:
    channels = WorkerChannels(2)
    try:
        async with running(pki, workers=_peers(channels, 1)) as h:
            assert h.router.handoff_book is not None
        inbox, outbox = channels.pairs[1]
        outbox.send(b"still here")  # the worker closed its duplicates, not the run's sockets
        assert inbox.recv(100) == b"still here"
    finally:
        channels.close()
