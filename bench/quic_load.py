"""QUIC / UDP load generators and pods; every function here runs inside an ``Agent`` process
(``client_initials`` also in the parent).

A UDP flow is routed by the router only after a real QUIC client Initial naming the pod, and
confirmed (``router/udp/handshake_watch.py``: moved by the C splice, never ended at the handshake
timeout) only once its client sends a short header to a connection ID the pod chose. So the loads
are QUIC-shaped as a real client and pod are: every flow's socket first sends an Initial flight
(built by aioquic) and the pod answers it (the echo pod echoes everything; the sink pod answers
every long header it receives, the Initial and its retransmits, with that datagram). The answer's
SCID is the client's own SCID ``S``, which the middle box reads as the pod's connection ID; the
client, once it has read the answer, sends one short header to ``S`` (the flow is confirmed before
any load), and every datagram a load sends on the flow after that is 1,200 bytes whose first octet
is a short header's and whose DCID (bytes 1..1+len(S)) is ``S``, the rest random. The pods' own
datagrams (the download) stay short-header-looking random bytes: the middle box reads no pod short
header. The UDP sink pod counts datagrams and remembers the distinct source addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from bench import udp_peers
from quic.packet import parse_long_header
from router.udp.batching import segment_cmsg

_STATE: dict[str, Any] = {}
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
ECHO_STALL_S = 0.05
"""A flow with no echo for this long is refilled to its window, as a sender's loss recovery would."""
LONG_HEADER = 0x80
"""RFC 9000 section 17: the first bit of a long header (an Initial); a short header has it clear."""
SHORT_HEADER = 0x40
"""A short header's first octet: the long-header bit clear, the fixed bit set."""


@dataclass(eq=False)
class UdpFlow:
    """One load flow: its connected socket, the Initial flight that opened it, and ``cid``, the SCID
    of that Initial: what the pod's answer teaches the middle box as the pod's connection ID, so the
    DCID of every short header the flow sends."""

    sock: socket.socket
    flight: list[bytes]
    cid: bytes
    answered: bool = False
    """The pod's answer came back and the flow sent its confirming short header."""


def use_c_peers(binary: Path | None) -> None:
    """From now on this agent's loads run in ``binary`` (bench/udp_peers.c), or in Python if None;
    a pod started after this call too."""
    _STATE["peers"] = binary


def _c_peers() -> Path | None:
    """The C peers' binary if this agent uses them."""
    binary: Path | None = _STATE.get("peers")
    return binary


def _flows() -> list[UdpFlow]:
    """The open flows, in the order they were opened."""
    flows: list[UdpFlow] = _STATE.get("flows", [])
    return flows


def _flow_sockets() -> list[socket.socket]:
    """The open flows' sockets, in the order they were opened."""
    return [flow.sock for flow in _flows()]


def short_header(size: int, cid: bytes) -> bytes:
    """``size`` bytes as a client's 1-RTT packet to ``cid``: a short header's first octet, ``cid`` as
    its DCID, random bytes after (what protected packet numbers and payload look like)."""
    payload = bytearray(os.urandom(size))
    payload[0] = SHORT_HEADER | (payload[0] & 0x3F)
    payload[1 : 1 + len(cid)] = cid
    return bytes(payload)


def client_initials(server_name: str, count: int, alpn: str = "stargate-whoami") -> list[list[bytes]]:
    """First-flight datagrams of ``count`` fresh aioquic clients (each one list, usually 1 Initial)."""
    flights = []
    for _ in range(count):
        config = QuicConfiguration(is_client=True, alpn_protocols=[alpn], server_name=server_name)
        conn = QuicConnection(configuration=config)
        now = time.monotonic()
        conn.connect(("127.0.0.1", 443), now=now)
        flights.append([data for data, _addr in conn.datagrams_to_send(now=now)])
    return flights


# ---------------------------------------------------------------------------------------
# The UDP sink pod
# ---------------------------------------------------------------------------------------
def _sink_loop(sock: socket.socket, counts: list[int], sources: set[Any]) -> None:
    buf = bytearray(65536)
    view = memoryview(buf)
    recv = sock.recvfrom_into
    add = sources.add
    while True:
        try:
            n, addr = recv(buf)
        except OSError:
            return
        counts[0] += 1
        counts[1] += n
        add(addr)
        if n and buf[0] & LONG_HEADER:  # an Initial (or its retransmit): answered, as a server answers it
            with contextlib.suppress(OSError):
                sock.sendto(view[:n], addr)


def _echo_loop(sock: socket.socket, counts: list[int], sources: set[Any]) -> None:
    buf = bytearray(65536)
    view = memoryview(buf)
    recv, send = sock.recvfrom_into, sock.sendto
    add = sources.add
    while True:
        try:
            n, addr = recv(buf)
            send(view[:n], addr)
        except BlockingIOError:  # ENOBUFS-like: the echo is lost, as UDP loses
            continue
        except OSError:
            return
        counts[0] += 1
        counts[1] += n
        add(addr)


def start_udp_sink(host: str, echo: bool = False) -> int:
    """A UDP pod that counts what it receives and answers each long header (a flow's Initial, or
    its retransmit) with that datagram, as a server answers an Initial with its own, or, ``echo``,
    sends every datagram back to its source; ``udp_sink_stats()`` reads the counts."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.bind((host, 0))
    if (binary := _c_peers()) is not None:
        _STATE["c_pod"] = udp_peers.NativePod(binary, sock, echo)
        _STATE["sink"] = (sock, [0, 0], set[Any]())
        return int(sock.getsockname()[1])
    counts, sources = [0, 0], set[Any]()
    _STATE["sink"] = (sock, counts, sources)
    loop = _echo_loop if echo else _sink_loop
    threading.Thread(target=loop, args=(sock, counts, sources), daemon=True).start()
    return int(sock.getsockname()[1])


def udp_sink_stats() -> tuple[int, int, int]:
    """(datagrams, bytes, distinct source addresses) received so far."""
    if "c_pod" in _STATE:
        return _STATE["c_pod"].stats()  # type: ignore[no-any-return]
    _sock, counts, sources = _STATE["sink"]
    return counts[0], counts[1], len(sources)


def udp_sink_blast(seconds: float, size: int, segments: int = 1) -> tuple[int, float]:
    """The pod sends ``size``-byte short-header-looking datagrams, round-robin, to every source
    address it has seen (each flow's middle-box socket, or the client itself when direct), for
    ``seconds``: one ``sendto`` each as a pod without GSO would (aioquic), or with ``segments`` > 1
    that many per ``sendmsg`` as one ``UDP_SEGMENT`` batch (quinn); returns (sent, elapsed)."""
    if "c_pod" in _STATE:
        return _STATE["c_pod"].blast(seconds, size, segments)  # type: ignore[no-any-return]
    sock, _counts, sources = _STATE["sink"]
    targets = list(sources)
    payload = bytearray(os.urandom(size))
    payload[0] = 0x40 | (payload[0] & 0x3F)
    data = bytes(payload) * segments
    gso = [segment_cmsg(size)] if segments > 1 else []
    sent = errors = 0
    clock = time.perf_counter
    started = clock()
    deadline = started + seconds
    rounds_per_check = max(1, 256 // max(1, len(targets) * segments))
    while clock() < deadline:
        for _ in range(rounds_per_check):
            for target in targets:
                try:
                    if gso:
                        sock.sendmsg([data], gso, 0, target)
                    else:
                        sock.sendto(data, target)
                except OSError:  # ENOBUFS
                    errors += segments
            sent += len(targets) * segments
    return sent - errors, clock() - started


def count_flow_datagrams(seconds: float) -> int:
    """Datagrams the open flows' sockets receive within ``seconds`` (the download side)."""
    if (binary := _c_peers()) is not None:
        return udp_peers.count(binary, _flow_sockets(), seconds)
    selector = selectors.DefaultSelector()
    buf = bytearray(65536)
    for sock in _flow_sockets():
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        sock.setblocking(False)
        _drain(sock, buf)
        selector.register(sock, selectors.EVENT_READ)
    received = 0
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            for key, _events in selector.select(min(left, 0.1)):
                recv = key.fileobj.recv_into  # type: ignore[union-attr]
                try:
                    while True:
                        recv(buf)
                        received += 1
                except BlockingIOError:
                    pass
    finally:
        selector.close()
        for sock in _flow_sockets():
            sock.setblocking(True)
    return received


def udp_sink_forget_sources() -> None:
    """Forget the source addresses seen: call it when the sockets that sent them are closed,
    since their ports may come back as sources of new flows."""
    if "c_pod" in _STATE:
        _STATE["c_pod"].forget_sources()
    _STATE["sink"][2].clear()


# ---------------------------------------------------------------------------------------
# Flows: open (an Initial flight each), confirm (one short header to the answer's CID), load, close
# ---------------------------------------------------------------------------------------
def _drain(sock: socket.socket, buf: bytearray) -> int:
    """Read what waits on the non-blocking ``sock`` (answers to Initials, anything older: never part
    of a load); the datagrams read."""
    read = 0
    while True:
        try:
            sock.recv_into(buf)
        except BlockingIOError:
            return read
        except ConnectionRefusedError:  # an ICMP error queued on the socket: reported once
            continue
        read += 1


def open_udp_flows(addr: tuple[str, int], flights: list[list[bytes]], batch: int = 20,
                   pause_s: float = 0.01) -> int:
    """Open one more flow socket to ``addr`` per flight, each sending its flight (a real client's
    first Initial); returns the flows now open. Paced at ``batch`` flows per ``pause_s``: a burst
    would overflow the middle box's socket buffer, as it would in life."""
    flows: list[UdpFlow] = _STATE.setdefault("flows", [])
    for i, flight in enumerate(flights):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.connect(addr)
        flows.append(UdpFlow(sock, flight, parse_long_header(flight[0]).scid))
        for datagram in flight:
            sock.send(datagram)
        if (i + 1) % batch == 0:
            time.sleep(pause_s)
    return len(flows)


def resend_initials(first: int = 0, batch: int = 20, pause_s: float = 0.01) -> None:
    """Send the Initial flight of every flow from ``first`` on whose pod has not answered yet again,
    in a new random order and paced: lost Initials (or answers) are retransmitted, as a real client
    does after its PTO."""
    flows = [flow for flow in _flows()[first:] if not flow.answered]
    for i, flow in enumerate(random.sample(flows, len(flows))):
        for datagram in flow.flight:
            try:
                flow.sock.send(datagram)
            except OSError:
                continue
        if (i + 1) % batch == 0:
            time.sleep(pause_s)


def confirm_udp_flows(first: int = 0, size: int = 1200) -> int:
    """Each flow from ``first`` on whose pod's answer has come back (read here, with anything else
    waiting) sends one ``size``-byte short header to its ``cid``, as a client past its handshake
    sends 1-RTT packets to the connection ID the server chose: the middle box confirms the flow.
    Returns the flows from ``first`` on still waiting for their answer."""
    buf = bytearray(65536)
    waiting = 0
    for flow in _flows()[first:]:
        if flow.answered:
            continue
        flow.sock.setblocking(False)
        try:
            if _drain(flow.sock, buf):
                with contextlib.suppress(OSError):  # lost like any datagram: the load's next ones confirm
                    flow.sock.send(short_header(size, flow.cid))
                flow.answered = True
            else:
                waiting += 1
        finally:
            flow.sock.setblocking(True)
    return waiting


def udp_blast(seconds: float, size: int, segments: int = 1) -> tuple[int, float]:
    """Send ``size``-byte short headers (each to its flow's ``cid``) round-robin on every open flow
    for ``seconds``, as fast as the socket calls go: one ``send`` each, or with ``segments`` > 1 that
    many per ``sendmsg`` as one ``UDP_SEGMENT`` batch; returns (datagrams sent, elapsed seconds)."""
    if (binary := _c_peers()) is not None:
        return udp_peers.blast(binary, [(f.sock, f.cid) for f in _flows()], seconds, size, segments)
    flows = _flows()
    if segments > 1:
        gso = [segment_cmsg(size)]
        sends = [functools.partial(f.sock.sendmsg, [short_header(size, f.cid) * segments], gso) for f in flows]
    else:
        sends = [functools.partial(f.sock.send, short_header(size, f.cid)) for f in flows]
    sent = 0
    errors = 0
    clock = time.perf_counter
    started = clock()
    deadline = started + seconds
    rounds_per_check = max(1, 256 // (len(sends) * segments))
    while clock() < deadline:
        for _ in range(rounds_per_check):
            for send in sends:
                try:
                    send()
                except OSError:  # ECONNREFUSED from an earlier ICMP, ENOBUFS
                    errors += segments
            sent += len(sends) * segments
    return sent - errors, clock() - started


def udp_echo_window(seconds: float, size: int, window: int, stall_s: float = ECHO_STALL_S) -> tuple[int, int, float]:
    """A windowed echo on every open flow: ``window`` short headers of ``size`` bytes (to the flow's
    ``cid``) in flight per flow, one more sent for each echo received, for ``seconds``. A flow that
    got no echo for ``stall_s`` (its window lost to a full buffer somewhere) is refilled to
    ``window``, as a sender's loss recovery would. Returns (echoes received, refills, elapsed seconds)."""
    if (binary := _c_peers()) is not None:
        return udp_peers.echo_window(binary, [(f.sock, f.cid) for f in _flows()], seconds, size, window, stall_s)
    flows = _flows()
    socks = [flow.sock for flow in flows]
    datas = [short_header(size, flow.cid) for flow in flows]
    buf = bytearray(65536)
    selector = selectors.DefaultSelector()
    for i, sock in enumerate(socks):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        sock.setblocking(False)
        _drain(sock, buf)  # answered Initials and anything older: not part of the window
        selector.register(sock, selectors.EVENT_READ, i)
    clock = time.perf_counter
    progress = [0.0] * len(socks)

    def fill(i: int, count: int) -> None:
        send, data = socks[i].send, datas[i]
        with contextlib.suppress(OSError):  # ENOBUFS / ECONNREFUSED: counted as lost
            for _ in range(count):
                send(data)

    received = refills = 0
    started = clock()
    deadline = started + seconds
    for i in range(len(socks)):
        fill(i, window)
        progress[i] = started
    try:
        while (now := clock()) < deadline:
            for key, _events in selector.select(min(deadline - now, stall_s)):
                sock, data = socks[key.data], datas[key.data]
                recv, send = sock.recv_into, sock.send
                got = 0
                with contextlib.suppress(BlockingIOError):
                    while True:
                        recv(buf)
                        got += 1
                        with contextlib.suppress(OSError):
                            send(data)
                received += got
                progress[key.data] = clock()
            now = clock()
            for i, last in enumerate(progress):
                if now - last > stall_s:
                    refills += 1
                    fill(i, window)
                    progress[i] = now
    finally:
        elapsed = clock() - started
        selector.close()
        for sock in socks:
            sock.setblocking(True)
    return received, refills, elapsed


def retire_udp_flows() -> None:
    """Stop blasting on the open flows but keep their sockets: a closed socket's port could
    come back for a new flow, which the middle box would take for the old one."""
    _STATE.setdefault("retired", []).extend(_flow_sockets())
    _STATE["flows"] = []


def close_udp_flows() -> None:
    retire_udp_flows()
    for sock in _STATE["retired"]:
        sock.close()
    _STATE["retired"] = []


# ---------------------------------------------------------------------------------------
# QUIC pods and handshaking clients (aioquic, from tests/quic_pods.py)
# ---------------------------------------------------------------------------------------
def start_quic_pod_thread(pod_name: str, host: str, cert_path: str, key_path: str) -> int:
    """An aioquic pod answering ``<pod>:<payload>`` on its own event-loop thread; its port."""
    from router.demo.quic_pods import bound_port, start_quic_pod

    started = threading.Event()
    box: list[int] = []

    def run() -> None:
        loop = asyncio.new_event_loop()
        server = loop.run_until_complete(start_quic_pod(pod_name, host, 0, cert_path, key_path))
        _STATE.setdefault("quic_servers", []).append(server)
        box.append(bound_port(server))
        started.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    if not started.wait(10):
        raise RuntimeError("QUIC pod did not start")
    return box[0]


def quic_handshakes(host: str, port: int, server_name: str, cafile: str, seconds: float,
                    concurrency: int) -> tuple[int, int, float]:
    """Full aioquic connections (handshake, one stream round trip, close), ``concurrency`` at a
    time for ``seconds``; returns (completed, failed, elapsed)."""
    from router.demo.quic_pods import quic_whoami

    async def main() -> tuple[int, int, float]:
        counts = [0, 0]
        started = time.perf_counter()
        deadline = started + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                try:
                    await quic_whoami(host, port, server_name, Path(cafile), timeout_s=5.0)
                    counts[0] += 1
                except (ConnectionError, TimeoutError, OSError):
                    counts[1] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return counts[0], counts[1], time.perf_counter() - started

    return asyncio.run(main())
