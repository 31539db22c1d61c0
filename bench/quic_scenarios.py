"""QUIC scenarios: SNI extraction cost, handshakes/s, UDP relay packets/s (1 and 100 flows),
client to pod (the worker's upload) and pod to client (its download).

The peer is nginx's ``stream`` UDP proxy with one worker. It cannot route QUIC by SNI
(``ssl_preread`` reads TLS over TCP only), so it forwards every flow to the one pod, with
a session (an upstream socket) per client address, as the router has a flow per address.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from bench import demux_load, udp_peers
from bench.context import POD, POD_HOST, SNI, BenchContext, try_start
from bench.procs import Agent, BenchError, Nginx, Router, call_all, cpu_exact, cpu_seconds
from bench.quic_load import (
    client_initials,
    confirm_udp_flows,
    count_flow_datagrams,
    open_udp_flows,
    quic_handshakes,
    resend_initials,
    retire_udp_flows,
    start_quic_pod_thread,
    start_udp_sink,
    udp_blast,
    udp_echo_window,
    udp_sink_blast,
    udp_sink_forget_sources,
    udp_sink_stats,
    use_c_peers,
)
from bench.results import Row, Target, interleaved, median
from quic.initial_sniffer import InitialSniffer
from quic.packet import parse_long_header
from router import constants as c
from router.demo.pki import make_pki
from router.extensions import choose
from router.outcomes import Termination

UDP_TARGETS = (Target("ratio_vs_peer", ">=", 1.0, ">=1.0x nginx"),)
MANY_FLOW_TARGETS = (Target("ratio_vs_peer", ">=", 1.3, ">=1.3x nginx"),)
"""Issue 14: with 100 flows (and for the windowed echo) the router should clearly beat nginx."""
ECHO_WINDOW = 64
"""Datagrams in flight per flow in ``udp_echo``: a QUIC sender's congestion window of 1200-byte packets."""
NGINX_NOTE = "nginx stream UDP proxy to one pod: it cannot route QUIC by SNI"
DATAGRAM_BYTES = 1200
HANDSHAKE_CLIENTS = 2
HANDSHAKE_CONCURRENCY = 4
"""Per client process; aioquic handshakes are CPU-bound in Python at both ends."""
DEMUX_CONNECTIONS = 10
"""Connections of the ``udp_demux`` load: a worker's quinn endpoint holding one per pod it serves."""
GSO_SEGMENTS = 10
"""Datagrams per GSO send of the GSO-sending peer (the pod in ``udp_download_gso``, the clients in
``udp_relay_gso``): a bulk sender's batch (quinn and s2n-quic send GSO batches; aioquic one
datagram per call)."""


def quic_sniff(ctx: BenchContext) -> list[Row]:
    flights = client_initials(SNI, 64)
    datagrams = [f[0] for f in flights]
    native = choose().initials  # the reading the router would use here
    for d in datagrams:
        info = InitialSniffer(native=native).feed(d, parse_long_header(d, 0, native))
        if info is None or info.server_name != SNI:
            raise BenchError(f"sniffer did not find the SNI in a one-datagram Initial: {info}")
    reps = ctx.pick(20, 100)
    per_batch = []
    for _ in range(ctx.pick(5, 15)):
        started = time.perf_counter()
        for _ in range(reps):
            for d in datagrams:  # as the edge reads a new address's first datagram
                InitialSniffer(native=native).feed(d, parse_long_header(d, 0, native))
        per_batch.append((time.perf_counter() - started) / (reps * len(datagrams)) * 1e6)
    ctx.log(f"quic sniff: {len(per_batch)} batches of {reps * len(datagrams)} Initials")
    return [Row("quic_initial_sniff", "SNI from one real aioquic client Initial (long header, keys, "
                "decrypt, parse) as the edge reads it", "us/Initial", median(per_batch),
                higher_is_better=False)]


def quic_handshake(ctx: BenchContext) -> list[Row]:
    pki = make_pki(ctx.workdir / "pki")
    pod = ctx.own(Agent("quic-pod"))
    port = pod.call(start_quic_pod_thread, POD, POD_HOST, str(pki.cert_path), str(pki.key_path))
    clients = [ctx.own(Agent(f"quic-client-{i}")) for i in range(HANDSHAKE_CLIENTS)]
    router = ctx.own(Router(ctx.workdir, [(POD, POD_HOST, 1, port)], workers=ctx.workers))
    nginx = try_start(ctx, "nginx", lambda: Nginx(ctx.workdir, POD_HOST, port))
    endpoints: dict[str, tuple[tuple[str, int], int | None]] = {
        "router": (("127.0.0.1", router.udp_port), router.pid), "direct": ((POD_HOST, port), None)}
    if nginx is not None:
        endpoints["nginx"] = (("127.0.0.1", nginx.port), nginx.pid)
    seconds = ctx.pick(0.7, 3.0)
    ctx.log(f"quic handshakes: {HANDSHAKE_CLIENTS}x{HANDSHAKE_CONCURRENCY} concurrent, {seconds}s per case")

    def case(addr: tuple[str, int], pid: int | None) -> tuple[float, float | None]:
        # The scheduler's nanoseconds, not /proc's 10 ms ticks: a case costs a box ~0.1 s of CPU,
        # which ticks would count to +-10%.
        before = cpu_exact(pid) if pid is not None else 0.0
        answers = call_all(clients, quic_handshakes, [(addr[0], addr[1], SNI, str(pki.ca_path), seconds,
                                                       HANDSHAKE_CONCURRENCY)] * len(clients))
        done, failed = sum(a[0] for a in answers), sum(a[1] for a in answers)
        if failed > done // 20:
            raise BenchError(f"quic handshakes via {addr}: {failed} failed, {done} completed")
        cpu = (cpu_exact(pid) - before) / max(done, 1) * 1e6 if pid is not None else None
        return done / max(a[2] for a in answers), cpu

    results = interleaved(ctx.rounds, {n: partial(case, *e) for n, e in endpoints.items()})

    def med(name: str, i: int) -> float | None:
        return median([r[i] for r in results.get(name, []) if r[i] is not None])

    return [
        Row("quic_handshake_rate", "aioquic handshake + 1 stream round trip + close", "handshakes/s",
            med("router", 0), "nginx", med("nginx", 0), med("direct", 0),
            note=NGINX_NOTE + "; aioquic client and pod CPU bound it"),
        Row("quic_handshake_cpu", "middle-box CPU per QUIC connection", "CPU us/conn",
            med("router", 1), "nginx", med("nginx", 1), None, higher_is_better=False),
    ]


def establish_flows(clients: Agent, addr: tuple[str, int], flights: list[list[bytes]], batch: int = 500,
                    timeout_s: float = 30.0) -> None:
    """Open one flow to ``addr`` per flight (the client's Initial) and wait until each one's pod
    answered and its client sent one short header to the connection ID the answer carried: through
    the router, a confirmed flow (``router/udp/handshake_watch.py``), as a real client's is after its
    handshake. Initials not answered are re-sent, as a client's PTO would."""
    base = clients.call(open_udp_flows, addr, [])
    for first in range(0, len(flights), batch):
        clients.call(open_udp_flows, addr, flights[first : first + batch])
        deadline = time.monotonic() + timeout_s
        next_resend = time.monotonic() + 0.5
        while waiting := clients.call(confirm_udp_flows, base + first, DATAGRAM_BYTES):
            now = time.monotonic()
            if now > deadline:
                opened = len(flights[first : first + batch])
                raise BenchError(f"{waiting} of {opened} UDP flows to {addr} had no answer from the pod")
            if now > next_resend:
                clients.call(resend_initials, base + first)
                next_resend = now + 0.5
            time.sleep(0.01)


def unconfirmed_endings(router: Router) -> int:
    """The router's flows ended unconfirmed so far (``handshake_timeout`` and ``evicted``): a load
    flow among them was never confirmed, so its datagrams took the slow path while it lived."""
    ended = 0.0
    for termination in (Termination.HANDSHAKE_TIMEOUT, Termination.EVICTED):
        with contextlib.suppress(KeyError):  # no such flow yet: the series is not exported
            ended += router.process.metric(f"{c.TERMINATIONS_TOTAL}_total", protocol="quic",
                                           termination=termination.value)
    return int(ended)


def check_confirmed(router: Router, what: str) -> None:
    """Fail ``what`` if the router ended any flow unconfirmed: its figures would be the slow path's.
    What the counters can tell: a flow still unconfirmed ``--quic-handshake-timeout-ms`` (10 s) after
    it opened, or evicted; a scenario shorter than that is held to its shape by
    ``tests/bench/test_bench_udp_quic_shape.py`` instead (a router with a 300 ms timeout)."""
    if ended := unconfirmed_endings(router):
        raise BenchError(f"{what}: the router ended {ended} flows unconfirmed (handshake_timeout or evicted): "
                         "the load's flows are not QUIC-shaped, their datagrams took the slow path")


Endpoints = dict[str, tuple[tuple[str, int], int | None]]
"""Name -> (address the client flows send to, pid whose CPU is measured or None)."""


def _udp_setup(ctx: BenchContext, echo: bool = False) -> tuple[Agent, Agent, Router, Endpoints, float, str]:
    """The UDP pod (a counting sink that answers each Initial and can also send, or ``echo`` every
    datagram back), the client agent, the router, the router / nginx / direct endpoints, the seconds
    per case, and which peers (C where a compiler is found, bench/udp_peers.c: the Python ones cost
    more CPU than the middle box, on the same cores). Each case opens its flows with Initials of
    its own (``client_initials``): every connection has its own connection IDs, as in life."""
    peers = None if ctx.python_peers else udp_peers.build()
    which = udp_peers.describe(peers)
    ctx.log(f"udp loads: {which}")
    sink, clients = ctx.own(Agent("udp-pod")), ctx.own(Agent("udp-clients"))
    call_all([sink, clients], use_c_peers, [(peers,), (peers,)])
    port = sink.call(start_udp_sink, POD_HOST, echo)
    router = ctx.own(Router(ctx.workdir, [(POD, POD_HOST, 1, port)], workers=ctx.workers))
    nginx = try_start(ctx, "nginx", lambda: Nginx(ctx.workdir, POD_HOST, port))
    endpoints: Endpoints = {
        "router": (("127.0.0.1", router.udp_port), router.pid), "direct": ((POD_HOST, port), None)}
    if nginx is not None:
        endpoints["nginx"] = (("127.0.0.1", nginx.port), nginx.pid)
    return sink, clients, router, endpoints, ctx.pick(0.5, 2.0), which


def udp_relay(ctx: BenchContext) -> list[Row]:
    """Client -> pod: the clients send one datagram per call (as aioquic does), and at 100 flows
    also GSO batches of ``GSO_SEGMENTS`` (the router's listener has GRO on with the C splice)."""
    sink, blaster, router, endpoints, seconds, peers = _udp_setup(ctx)
    rows = []
    for flows, segments in ((1, 1), (100, 1), (100, GSO_SEGMENTS)):
        name = f"udp_relay_{'gso_' if segments > 1 else ''}{flows}flow"
        shape = f", GSO batches of {segments}" if segments > 1 else ""
        ctx.log(f"udp relay: {flows} flow(s), {DATAGRAM_BYTES} B datagrams{shape}, {seconds}s per case")
        results = interleaved(ctx.rounds, {
            n: _udp_case(blaster, sink, addr, pid, flows, seconds, segments)
            for n, (addr, pid) in endpoints.items()})

        def med(name: str, i: int, results: dict[str, list[Any]] = results) -> float | None:
            return median([r[i] for r in results.get(name, []) if r[i] is not None])

        offered = med("direct", 2)
        rows += [
            Row(f"{name}_pps", f"{DATAGRAM_BYTES} B datagrams delivered to the pod, "
                f"{flows} flow(s){shape}", "pkt/s", med("router", 0), "nginx", med("nginx", 0), med("direct", 0),
                targets=UDP_TARGETS + (MANY_FLOW_TARGETS if flows > 1 and segments == 1 else ()),
                note=f"one sender offered ~{offered or 0:,.0f} pkt/s; {peers}"),
            Row(f"{name}_mbps", f"payload delivered, {flows} flow(s){shape}", "MB/s",
                _mb(med("router", 0)), "nginx", _mb(med("nginx", 0)), _mb(med("direct", 0))),
            Row(f"{name}_cpu", f"middle-box CPU per delivered datagram, {flows} flow(s){shape}",
                "CPU us/pkt", med("router", 1), "nginx", med("nginx", 1), None, higher_is_better=False),
        ]
    check_confirmed(router, "udp_relay")
    return rows


def _mb(pps: float | None) -> float | None:
    return pps * DATAGRAM_BYTES / 1e6 if pps is not None else None


def _udp_case(blaster: Agent, sink: Agent, addr: tuple[str, int], pid: int | None, flows: int, seconds: float,
              segments: int = 1) -> Callable[[], tuple[float, float | None, float]]:
    def case() -> tuple[float, float | None, float]:
        establish_flows(blaster, addr, client_initials(SNI, flows))
        time.sleep(0.1)
        before = sink.call(udp_sink_stats)[0]
        cpu_before = cpu_seconds(pid) if pid is not None else 0.0
        sent, elapsed = blaster.call(udp_blast, seconds, DATAGRAM_BYTES, segments)
        time.sleep(0.2)  # let queued datagrams drain through the middle box
        delivered = sink.call(udp_sink_stats)[0] - before
        cpu = (cpu_seconds(pid) - cpu_before) / max(delivered, 1) * 1e6 if pid is not None else None
        blaster.call(retire_udp_flows)
        return delivered / elapsed, cpu, sent / elapsed

    return case


def udp_download(ctx: BenchContext) -> list[Row]:
    """Pod -> client: the pod sends one datagram per call (as aioquic does), and at 100 flows also
    GSO batches of ``GSO_SEGMENTS`` (as quinn does; the router's GRO pod socket takes each as
    one read, nginx's reads them one by one)."""
    sink, clients, router, endpoints, seconds, peers = _udp_setup(ctx)
    rows = []
    for flows, segments in ((1, 1), (100, 1), (100, GSO_SEGMENTS)):
        name = f"udp_download_{'gso_' if segments > 1 else ''}{flows}flow"
        shape = f", GSO batches of {segments}" if segments > 1 else ""
        ctx.log(f"udp download: {flows} flow(s), {DATAGRAM_BYTES} B datagrams{shape}, {seconds}s per case")
        results = interleaved(ctx.rounds, {
            n: _download_case(sink, clients, addr, pid, flows, seconds, segments)
            for n, (addr, pid) in endpoints.items()})

        def med(name: str, i: int, results: dict[str, list[Any]] = results) -> float | None:
            return median([r[i] for r in results.get(name, []) if r[i] is not None])

        rows += [
            Row(f"{name}_pps", f"{DATAGRAM_BYTES} B pod datagrams delivered to the client, "
                f"{flows} flow(s){shape}", "pkt/s", med("router", 0), "nginx", med("nginx", 0), med("direct", 0),
                targets=UDP_TARGETS + (MANY_FLOW_TARGETS if flows > 1 and segments == 1 else ()),
                note=f"one pod offered ~{med('direct', 2) or 0:,.0f} pkt/s; {peers}"),
            Row(f"{name}_cpu", f"middle-box CPU per delivered pod datagram, {flows} flow(s){shape}",
                "CPU us/pkt", med("router", 1), "nginx", med("nginx", 1), None, higher_is_better=False),
        ]
    check_confirmed(router, "udp_download")
    return rows


def _download_case(sink: Agent, clients: Agent, addr: tuple[str, int], pid: int | None, flows: int,
                   seconds: float, segments: int = 1) -> Callable[[], tuple[float, float | None, float]]:
    def case() -> tuple[float, float | None, float]:
        sink.call(udp_sink_forget_sources)  # the pod sends only to this case's flows
        establish_flows(clients, addr, client_initials(SNI, flows))  # each flow's one short header confirms it
        time.sleep(0.1)
        cpu_before = cpu_seconds(pid) if pid is not None else 0.0
        clients.submit(count_flow_datagrams, seconds + 0.3)
        sent, elapsed = sink.call(udp_sink_blast, seconds, DATAGRAM_BYTES, segments)
        delivered = clients.result()
        cpu = (cpu_seconds(pid) - cpu_before) / max(delivered, 1) * 1e6 if pid is not None else None
        clients.call(retire_udp_flows)
        return delivered / elapsed, cpu, sent / elapsed

    return case


def udp_echo(ctx: BenchContext) -> list[Row]:
    """QUIC-shaped traffic both ways: each flow keeps ``ECHO_WINDOW`` datagrams in flight to an
    echoing pod and sends one more per echo, like a sender clocked by its acknowledgements."""
    pod, clients, router, endpoints, seconds, peers = _udp_setup(ctx, echo=True)
    rows = []
    for flows in (1, 100):
        ctx.log(f"udp echo: {flows} flow(s) x {ECHO_WINDOW} in flight, {DATAGRAM_BYTES} B, {seconds}s per case")
        results = interleaved(ctx.rounds, {
            n: _echo_case(pod, clients, addr, pid, flows, seconds)
            for n, (addr, pid) in endpoints.items()})

        def med(name: str, i: int, results: dict[str, list[Any]] = results) -> float | None:
            return median([r[i] for r in results.get(name, []) if r[i] is not None])

        refills = sum(r[2] for rs in results.values() for r in rs)
        rows += [
            Row(f"udp_echo_{flows}flow_pps", f"{DATAGRAM_BYTES} B datagrams echoed back to the client, "
                f"{flows} flow(s) x {ECHO_WINDOW} in flight", "pkt/s", med("router", 0), "nginx",
                med("nginx", 0), med("direct", 0), targets=MANY_FLOW_TARGETS,
                note=f"each echo crosses the middle box twice; {refills} window refills after losses in all "
                     f"cases; {peers}"),
            Row(f"udp_echo_{flows}flow_cpu", f"middle-box CPU per relayed datagram (either way), {flows} flow(s)",
                "CPU us/pkt", med("router", 1), "nginx", med("nginx", 1), None, higher_is_better=False),
        ]
    check_confirmed(router, "udp_echo")
    return rows


def _echo_case(pod: Agent, clients: Agent, addr: tuple[str, int], pid: int | None, flows: int,
               seconds: float) -> Callable[[], tuple[float, float | None, int]]:
    def case() -> tuple[float, float | None, int]:
        pod.call(udp_sink_forget_sources)
        establish_flows(clients, addr, client_initials(SNI, flows))
        time.sleep(0.1)
        cpu_before = cpu_seconds(pid) if pid is not None else 0.0
        echoes, refills, elapsed = clients.call(udp_echo_window, seconds, DATAGRAM_BYTES, ECHO_WINDOW)
        cpu = (cpu_seconds(pid) - cpu_before) / max(2 * echoes, 1) * 1e6 if pid is not None else None
        clients.call(retire_udp_flows)
        time.sleep(0.1)  # the last window drains
        return echoes / elapsed, cpu, refills

    return case


def udp_demux(ctx: BenchContext) -> list[Row]:
    """``DEMUX_CONNECTIONS`` connections on one client address, which the router tells apart by the
    DCID of each datagram, against the same connections each from its own address (one flow per
    address: no look at the DCID). Both blasts come from the Python client (``demux_load``), at the
    same offered rate, to the echoing pod: the figure is the router's CPU per datagram."""
    pod, clients, router, endpoints, seconds, peers = _udp_setup(ctx, echo=True)
    addr, pid = endpoints["router"]
    ctx.log(f"udp demux: {DEMUX_CONNECTIONS} connections on one address vs one address each, {seconds}s per case")
    results = interleaved(ctx.rounds, {
        name: _demux_case(pod, clients, addr, pid, shared, seconds)
        for name, shared in (("one_address", True), ("own_addresses", False))})

    def med(name: str, i: int) -> float | None:
        return median([r[i] for r in results.get(name, []) if r[i] is not None])

    check_confirmed(router, "udp_demux")
    note = (f"Python client, {DATAGRAM_BYTES} B short headers offered at ~{med('one_address', 2) or 0:,.0f} pkt/s, "
            f"echoed by the pod ({peers})")
    return [
        Row(f"udp_demux_{DEMUX_CONNECTIONS}conn_pps", f"datagrams delivered to the pod, {DEMUX_CONNECTIONS} "
            "connections on one client address", "pkt/s", med("one_address", 0), "one address each",
            med("own_addresses", 0), None, note=note),
        Row(f"udp_demux_{DEMUX_CONNECTIONS}conn_cpu", f"middle-box CPU per datagram (its echo included), "
            f"{DEMUX_CONNECTIONS} connections on one client address", "CPU us/pkt", med("one_address", 1),
            "one address each", med("own_addresses", 1), None, higher_is_better=False),
    ]


def _demux_case(pod: Agent, clients: Agent, addr: tuple[str, int], pid: int | None, shared: bool,
                seconds: float) -> Callable[[], tuple[float, float | None, float]]:
    def case() -> tuple[float, float | None, float]:
        flights = client_initials(SNI, DEMUX_CONNECTIONS)  # new connections every case
        pod.call(udp_sink_forget_sources)
        clients.call(demux_load.open_connections, addr, flights, shared)
        deadline = time.monotonic() + 30.0
        while pod.call(udp_sink_stats)[2] < DEMUX_CONNECTIONS:  # each connection's flow reached the pod
            if time.monotonic() > deadline:
                raise BenchError(f"only {pod.call(udp_sink_stats)[2]} of {DEMUX_CONNECTIONS} connections opened")
            clients.call(demux_load.resend_initials, flights)
            time.sleep(0.2)
        time.sleep(0.2)  # the echoed Initials teach the router each connection's CID
        clients.call(demux_load.confirm, DATAGRAM_BYTES)  # one short header each to it: confirmed
        time.sleep(0.05)
        before = pod.call(udp_sink_stats)[0]
        cpu_before = cpu_seconds(pid) if pid is not None else 0.0
        sent, elapsed = clients.call(demux_load.blast, seconds, DATAGRAM_BYTES)
        time.sleep(0.2)
        delivered = pod.call(udp_sink_stats)[0] - before
        cpu = (cpu_seconds(pid) - cpu_before) / max(delivered, 1) * 1e6 if pid is not None else None
        clients.call(demux_load.retire)
        return delivered / elapsed, cpu, sent / elapsed

    return case
