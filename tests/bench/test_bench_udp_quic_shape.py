"""The bench's UDP loads are QUIC-shaped, so the router confirms their flows (``router/udp/
handshake_watch.py``) and the loads measure the confirmed path: every flow opens with a real
Initial, its pod answers it, its client then sends one short header to the connection ID the
answer carried (the Initial's SCID), and every datagram a load sends on it carries that DCID. On
the Python peers and the C peers (``bench/udp_peers.c``), at a bare socket standing for the pod."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import quic_load, udp_peers
from bench.context import POD_HOST, SNI
from quic.packet import parse_long_header
from tests.support.polling import eventually_blocking

SIZE = 1200


@pytest.fixture(params=["python", "c"])
def peers(request: pytest.FixtureRequest) -> Iterator[Path | None]:
    """The Python peers or the C ones (skipped without a compiler), for this process's loads."""
    binary = None
    if request.param == "c" and (binary := udp_peers.build()) is None:
        pytest.skip("no C compiler: the bench runs the Python peers")
    quic_load.use_c_peers(binary)
    try:
        yield binary
    finally:
        quic_load.close_udp_flows()
        quic_load.use_c_peers(None)


@pytest.fixture
def pod() -> Iterator[socket.socket]:
    """A bare socket where the pod would be: the test reads what the clients send and answers by hand."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, quic_load.SOCKET_BUFFER_BYTES)
        sock.bind((POD_HOST, 0))
        sock.settimeout(5)
        yield sock


def _queued(sock: socket.socket) -> list[tuple[bytes, tuple[str, int]]]:
    """Every datagram waiting at ``sock``, with its source."""
    got = []
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:
            got.append(sock.recvfrom(65536))
    sock.settimeout(5)
    return got


def _assert_to_their_flows_cids(datagrams: list[tuple[bytes, tuple[str, int]]], cids: dict[tuple[str, int], bytes]
                                ) -> None:
    assert datagrams
    for data, source in datagrams:
        cid = cids[source]
        assert len(data) == SIZE and data[0] & 0xC0 == 0x40, data[:4]  # a short header, fixed bit set
        assert data[1 : 1 + len(cid)] == cid
    assert {source for _data, source in datagrams} == set(cids)  # every flow sent


def _open_answered_flows(pod: socket.socket, count: int) -> dict[tuple[str, int], bytes]:
    """``count`` flows to ``pod``, their Initials answered: each flow's source and connection ID."""
    flights = quic_load.client_initials(SNI, count)
    assert quic_load.open_udp_flows(pod.getsockname(), flights) == count
    cids = {}
    for _ in range(count):
        initial, source = pod.recvfrom(65536)
        assert initial[0] & 0x80  # a long header
        cids[source] = parse_long_header(initial).scid
        assert cids[source] in {parse_long_header(flight[0]).scid for flight in flights}
    assert quic_load.confirm_udp_flows() == count  # no answer yet: nobody confirms
    assert _queued(pod) == []
    for source in cids:
        pod.sendto(b"\xc0answer", source)
    eventually_blocking(lambda: quic_load.confirm_udp_flows() == 0, what="every flow to read its answer")
    return cids


def test_a_flow_confirms_once_answered_with_one_short_header_to_its_cid(
        peers: Path | None, pod: socket.socket) -> None:
    cids = _open_answered_flows(pod, 3)
    confirming: list[tuple[bytes, tuple[str, int]]] = []

    def three() -> bool:
        confirming.extend(_queued(pod))
        return len(confirming) >= 3

    eventually_blocking(three, what="one short header from each flow")
    assert sorted(source for _data, source in confirming) == sorted(cids)  # one each, no more
    _assert_to_their_flows_cids(confirming, cids)
    assert quic_load.confirm_udp_flows() == 0 and _queued(pod) == []  # sent once


@pytest.mark.parametrize("segments", [1, 10])
def test_the_blast_carries_each_flows_cid(peers: Path | None, pod: socket.socket, segments: int) -> None:
    cids = _open_answered_flows(pod, 3)
    sent, _elapsed = quic_load.udp_blast(0.05, SIZE, segments)
    assert sent > 0
    _assert_to_their_flows_cids(_queued(pod), cids)


def test_the_echo_window_carries_each_flows_cid(peers: Path | None, pod: socket.socket) -> None:
    cids = _open_answered_flows(pod, 3)
    _queued(pod)  # the confirming short headers
    echoes, refills, _elapsed = quic_load.udp_echo_window(0.12, SIZE, 4, 0.03)  # no echo: refilled windows
    assert echoes == 0 and refills > 0
    _assert_to_their_flows_cids(_queued(pod), cids)


def test_the_python_sink_answers_each_long_header_and_no_short_one() -> None:
    port = quic_load.start_udp_sink(POD_HOST)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((POD_HOST, port))
            sock.settimeout(5)
            sent = (b"\xc0initial", b"\x40short", b"\xc0again")  # an answer to the short one would come second
            for datagram in sent:
                sock.send(datagram)
            assert sock.recv(100) == b"\xc0initial"
            assert sock.recv(100) == b"\xc0again"
            assert quic_load.udp_sink_stats() == (3, sum(map(len, sent)), 1)
    finally:
        quic_load._STATE.pop("sink")[0].close()  # its thread ends
