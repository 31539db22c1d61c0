"""``bench/udp_peers.c``: the UDP loads' C clients and pod, run against each other on loopback
(the bench runs them through the router and nginx); what they send is QUIC-shaped as
``tests/bench/test_bench_udp_quic_shape.py`` checks."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench import udp_peers
from bench.udp_peers import NativePod
from tests.support.polling import eventually_blocking
from tests.support.quic_flood_harness import kernel_queued

POD_HOST = "127.0.0.2"
INITIAL = b"\xc0initial"
"""A flow's first datagram: a long header, which every pod answers with itself."""


def counting_client_runs() -> bool:
    """The C clients' ``count`` runs: a child of this process whose argv is ``udp_peers count ...``."""
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            for pid in (task / "children").read_text().split():
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:2] == [b"count"]:
                    return True
    return False


@pytest.fixture(scope="module")
def binary() -> Path:
    built = udp_peers.build()
    if built is None:
        pytest.skip("no C compiler: the bench runs the Python peers")
    return built


def _pod(binary: Path, echo: bool) -> Iterator[tuple[NativePod, int]]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((POD_HOST, 0))
    native = NativePod(binary, sock, echo)
    try:
        yield native, sock.getsockname()[1]
    finally:
        native.close()
        sock.close()


@pytest.fixture
def echo_pod(binary: Path) -> Iterator[tuple[NativePod, int]]:
    yield from _pod(binary, echo=True)


@pytest.fixture
def sink_pod(binary: Path) -> Iterator[tuple[NativePod, int]]:
    yield from _pod(binary, echo=False)


@pytest.fixture
def flows(request: pytest.FixtureRequest) -> Iterator[list[tuple[socket.socket, bytes]]]:
    """Three flow sockets to the pod fixture named by the parameter ("echo" or "sink"), each with
    a connection ID of its own."""
    _native, port = request.getfixturevalue(f"{request.param}_pod")
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    for sock in socks:
        sock.connect((POD_HOST, port))
        sock.send(INITIAL)  # a flow's first datagram, answered by either pod: not part of any load
    for sock in socks:  # its answer read now, so no load counts it as one of its own
        sock.settimeout(5)
        assert sock.recv(2048) == INITIAL
        sock.settimeout(None)
    try:
        yield [(sock, bytes([i + 1]) * 8) for i, sock in enumerate(socks)]
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.parametrize("flows", ["echo"], indirect=True)
def test_the_c_client_keeps_its_window_in_flight_through_the_c_pod(
        binary: Path, echo_pod: tuple[NativePod, int], flows: list[tuple[socket.socket, bytes]]) -> None:
    echoes, refills, elapsed = udp_peers.echo_window(binary, flows, 0.3, 1200, 8, 0.05)
    datagrams, size, sources = echo_pod[0].stats()
    assert 0.3 <= elapsed < 5
    assert echoes > 3 * 8 and refills == 0  # loopback with nothing in between loses nothing
    assert sources == 3
    assert datagrams >= echoes + 3 and size >= 1200 * echoes  # the pod saw every echo and the Initials


@pytest.mark.parametrize("segments", [1, 10])
@pytest.mark.parametrize("flows", ["sink"], indirect=True)
def test_the_c_clients_blast_reaches_the_c_pod_on_every_flow(
        binary: Path, sink_pod: tuple[NativePod, int], flows: list[tuple[socket.socket, bytes]], segments: int) -> None:
    sent, elapsed = udp_peers.blast(binary, flows, 0.2, 1200, segments)
    assert 0.2 <= elapsed < 5 and sent > 0 and sent % segments == 0
    eventually_blocking(lambda: kernel_queued({(POD_HOST, sink_pod[1])}) == 0, what="what is queued at the pod read")
    datagrams, size, sources = sink_pod[0].stats()
    assert sources == 3
    assert 0 < datagrams - 3 <= sent and size - 3 * len(INITIAL) == 1200 * (datagrams - 3)


@pytest.mark.parametrize("segments", [1, 10])
@pytest.mark.parametrize("flows", ["sink"], indirect=True)
def test_the_c_pods_blast_is_counted_by_the_c_clients(
        binary: Path, sink_pod: tuple[NativePod, int], flows: list[tuple[socket.socket, bytes]], segments: int) -> None:
    native, _port = sink_pod
    eventually_blocking(lambda: native.stats()[2] >= 3, interval_s=0.01, what="the pod to know its three sources")
    with ThreadPoolExecutor(1) as pool:  # the clients count while the pod sends, as in the bench
        counted = pool.submit(udp_peers.count, binary, [sock for sock, _cid in flows], 0.6)
        eventually_blocking(counting_client_runs, interval_s=0.005, what="the C clients' count to start")
        sent, elapsed = native.blast(0.2, 1200, segments)
        received = counted.result()
    assert 0.2 <= elapsed < 5 and sent > 0 and sent % segments == 0
    assert 0 < received <= sent  # each segment arrives as a datagram of its own


def test_the_c_sink_answers_each_long_header_and_no_short_one(sink_pod: tuple[NativePod, int]) -> None:
    native, port = sink_pod
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((POD_HOST, port))
        sock.settimeout(5)
        sent = (INITIAL, b"\x40short", b"\xc0again")  # in order: an answer to the short one would come second
        for datagram in sent:
            sock.send(datagram)
        assert sock.recv(100) == INITIAL
        assert sock.recv(100) == b"\xc0again"
        assert native.stats() == (3, sum(map(len, sent)), 1)


def test_a_flow_is_a_descriptor_with_an_optional_connection_id(binary: Path) -> None:
    for bad in ("x", "3:abc", "3:" + "ab" * 21, "3;ab"):
        done = subprocess.run([str(binary), "count", "0.01", bad], capture_output=True, text=True)
        assert done.returncode == 2 and "FD:HEX" in done.stderr, bad


def test_forgetting_sources_counts_only_new_ones(echo_pod: tuple[NativePod, int]) -> None:
    native, port = echo_pod
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((POD_HOST, port))
        sock.send(b"one")
        assert sock.recv(100) == b"one"
        assert native.stats() == (1, 3, 1)
        native.forget_sources()
        assert native.stats() == (1, 3, 0)
        sock.send(b"two")
        assert sock.recv(100) == b"two"
        assert native.stats() == (2, 6, 1)
