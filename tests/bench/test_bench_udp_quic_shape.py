"""The bench's UDP loads are QUIC-shaped, so the router confirms their flows (``router/udp/
handshake_watch.py``) and the loads measure the confirmed path: every flow opens with a real
Initial, its pod answers it, its client then sends one short header to the connection ID the
answer carried (the Initial's SCID), and every datagram a load sends on it carries that DCID. On
the Python peers and the C peers (``bench/udp_peers.c``), at a bare socket standing for the pod,
and end to end through the router with a handshake timeout short enough that an unconfirmed
flow would end within the load."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import quic_load, udp_peers
from bench.context import POD, POD_HOST, SNI
from bench.procs import Agent, Router, call_all
from bench.quic_scenarios import establish_flows, unconfirmed_endings
from quic.packet import parse_long_header
from router import constants as c
from tests.support.polling import eventually_blocking, holds_blocking

SIZE = 1200
HANDSHAKE_TIMEOUT_MS = 300
"""The router's ``--quic-handshake-timeout-ms`` end to end: with its sweep (every 500 ms), an
unconfirmed flow ends within ~0.8 s, well inside the loads below."""
LOAD_S = 1.2


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


# -- end to end: the router confirms every load flow ------------------------------------------------
def _run_relay(pod: Agent, clients: Agent) -> int:
    before = pod.call(quic_load.udp_sink_stats)[0]
    sent, _elapsed = clients.call(quic_load.udp_blast, LOAD_S, SIZE)
    eventually_blocking(lambda: pod.call(quic_load.udp_sink_stats)[0] > before, what="the relay to reach the pod")
    return sent


def _run_download(pod: Agent, clients: Agent) -> int:
    clients.submit(quic_load.count_flow_datagrams, LOAD_S + 0.3)
    sent, _elapsed = pod.call(quic_load.udp_sink_blast, LOAD_S, SIZE)
    received: int = clients.result()
    assert sent > 0
    return received


def _run_echo(pod: Agent, clients: Agent) -> int:
    echoes, _refills, _elapsed = clients.call(quic_load.udp_echo_window, LOAD_S, SIZE, 8)
    return int(echoes)


@pytest.mark.parametrize("shape", ["relay", "download", "echo"])
@pytest.mark.parametrize("kind", ["python", "c"])
def test_the_router_confirms_every_load_flow(tmp_path: Path, kind: str, shape: str) -> None:
    binary = udp_peers.build() if kind == "c" else None
    if kind == "c" and binary is None:
        pytest.skip("no C compiler: the bench runs the Python peers")
    with contextlib.ExitStack() as stack:
        pod, clients = Agent("udp-pod"), Agent("udp-clients")
        stack.callback(pod.close)
        stack.callback(clients.close)
        call_all([pod, clients], quic_load.use_c_peers, [(binary,), (binary,)])
        port = pod.call(quic_load.start_udp_sink, POD_HOST, shape == "echo")
        router = Router(tmp_path, [(POD, POD_HOST, 1, port)],
                        extra=["--quic-handshake-timeout-ms", str(HANDSHAKE_TIMEOUT_MS)])
        stack.callback(router.close)
        addr = ("127.0.0.1", router.udp_port)

        def active() -> float:
            return router.process.metric(c.ACTIVE_CONNECTIONS, protocol="quic")

        # The control: a flow whose Initial the pod answers but whose client never sends a short
        # header is never confirmed, and the router ends it at the handshake timeout.
        clients.call(quic_load.open_udp_flows, addr, quic_load.client_initials(SNI, 1))
        clients.call(quic_load.retire_udp_flows)
        establish_flows(clients, addr, quic_load.client_initials(SNI, 3))
        moved = {"relay": _run_relay, "download": _run_download, "echo": _run_echo}[shape](pod, clients)
        assert moved > 0
        eventually_blocking(lambda: unconfirmed_endings(router) == 1,
                            what=lambda: f"the control flow's handshake timeout alone ({unconfirmed_endings(router)} "
                                         "flows ended unconfirmed)")
        holds_blocking(lambda: active() == 3 and unconfirmed_endings(router) == 1, 0.6,
                       what="the three load flows alive past the handshake timeout")
