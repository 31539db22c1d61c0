"""Initial flood: garbage, truncated and valid-looking Initials from 200 source ports, with real
aioquic handshakes in parallel.

What must hold while the flood runs (issue "Hardening"):

* legitimate handshakes (aioquic client -> router -> aioquic pod, one stream round trip)
  still succeed, >= 99 %;
* pending (not yet routed) flows never exceed ``max_pending_flows`` (nor
  ``max_pending_flows_per_address`` from one address), and each holds at most its datagram
  budget plus one ClientHello's worth of CRYPTO reassembly;
* no reply is larger than the datagram that provoked it (checked exactly in process, where
  every send is paired with the datagram being handled, and from the outside by matching
  each reply's DCID to the attempt it answers);
* the drop counters account for the datagrams: every flood datagram the router read is
  either counted under a ``quic_dropped_datagrams_total`` reason or answered with a
  CONNECTION_CLOSE (a Version Negotiation answer is counted as a ``not_initial`` drop too).

Default run: 10,000 datagrams in process, 5,000 against the real router process;
``-m slow``: 100,000 each. Each router runs on the pure-Python path and on the C splice. Every
figure is printed (``pytest -s``) for bench/README.md.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from aioquic.asyncio import connect

from discovery.targets import TargetSnapshot
from quic.initial_keys import client_initial_keys, encrypt_initial
from quic.initial_sniffer import InitialSniffer
from quic.packet import QUIC_V1, QuicPacketError
from router import constants as c
from router.demo.pki import DemoPki
from router.demo.quic_pods import WHOAMI, client_configuration, request
from router.extensions import Extensions
from router.hostname import HostnameTemplate
from router.metrics import RouterMetrics
from router.outcomes import QuicDropReason
from router.udp.edge import UdpRouter
from router.udp.flow_limits import FlowLimits
from router.udp.settings import UdpRouterSettings
from tests.support.initial_packets import protected_initial
from tests.support.names import host as sni
from tests.support.polling import eventually
from tests.support.quic_flood_forge import SNI_UNKNOWN, FloodForge, check_replies, first_hello
from tests.support.quic_flood_harness import (
    HANDSHAKE_TIMEOUT_S,
    LEGIT_PORTS,
    ROUTER_HOST,
    WINDOW,
    FloodSockets,
    Legit,
    ProcessSamples,
    RouterAudit,
    dropped_counts,
    kernel_drops,
    kernel_queued,
    quic_pods,
    sample_process,
    send_flood,
    whoami,
)
from tests.support.quic_frames import crypto_frame
from tests.support.router_probes import CHART_PEAK_RSS_KIB, peak_rss_kib, rss_kib
from tests.support.router_process import RouterProcess, extensions_env, router_args, write_endpoints
from tests.support.udp_router import running_udp_router
from wire.client_hello import MAX_TLS_CLIENT_HELLO_BYTES


async def _flood_in_process(
    pki: DemoPki, extensions: Extensions, datagrams: int, min_handshakes: int, legit_floor: float | None = 0.99,
    rate_per_s: int = 2_500, **overrides: Any
) -> tuple[RouterAudit, dict[str, float], Legit]:
    """Flood an in-process router (default settings but a 1 s pending timeout, so the table
    drains quickly; ``overrides`` change more) while real handshakes run; check and print."""
    loop = asyncio.get_running_loop()
    rng = random.Random(datagrams)
    limits = FlowLimits(**{"pending_flow_timeout_s": 1.0, **overrides})
    settings = UdpRouterSettings(limits=limits, extensions=extensions)
    metrics = RouterMetrics()
    async with quic_pods(pki) as targets:
        snapshot = TargetSnapshot.of(list(targets.values()))
        async with running_udp_router(lambda: snapshot, settings, metrics) as (router, port):
            flood = FloodSockets(loop)
            audit = RouterAudit(router, metrics, flood.addresses)
            forge = FloodForge(rng)
            legit, stop, idle = Legit(), asyncio.Event(), Legit()
            try:
                for i in range(8):  # the same handshakes without a flood, for comparison
                    started = time.perf_counter()
                    await whoami(port, f"stargate-{i % 2}", pki.ca_path)
                    idle.seconds.append(time.perf_counter() - started)
                    idle.ok += 1
                legit_task = loop.create_task(legit.run(port, pki.ca_path, stop))
                # at rate_per_s, and never more than WINDOW ahead of the router
                sent, flood_seconds = await send_flood(flood, forge, rng, port, datagrams, legit, min_handshakes,
                                                       rate_per_s, 8, lambda sent: sent - audit.processed)
                stop.set()
                await asyncio.wait_for(legit_task, 60)
                listener = {(ROUTER_HOST, port)}
                await eventually(lambda: audit.processed + kernel_drops(listener) >= sent, 10,
                                 what="the router to read")
                await eventually(lambda: router.pending_flows == 0, 5, what="pending flows to expire")
                await eventually(lambda: kernel_queued(flood.addresses) == 0, what="late replies read")
                assert await whoami(port, "stargate-1", pki.ca_path) == "stargate-1"
            finally:
                flood.close()

    drops = dropped_counts(metrics)
    replies = check_replies(flood.all_replies(), forge)
    answers_sent = len(audit.answers)
    vn_sent = sum(1 for _, _, vn in audit.answers if vn)
    largest_ratio = max((a / p for a, p, _ in audit.answers), default=0.0)
    flow_bound = settings.limits.max_pending_bytes_per_flow + MAX_TLS_CLIENT_HELLO_BYTES
    print(
        f"\nin-process flood: {sent} datagrams sent from {len(flood.sockets)} ports in {flood_seconds:.1f} s "
        f"({sent / flood_seconds:.0f}/s); read by the router {audit.processed}, kernel drops "
        f"{kernel_drops({(ROUTER_HOST, port)})}\n  {legit.summary()} (without a flood: {idle.summary()})\n"
        f"  drops {({k: int(v) for k, v in drops.items() if v})} (of legit clients {audit.legit_drops:.0f}), "
        f"answers {answers_sent} "
        f"(VN {replies.vn}, CONNECTION_CLOSE {replies.closes}, at most {replies.most_answers} per attempt), "
        f"largest answer/provoking {largest_ratio:.3f}\n"
        f"  pending flows max {audit.max_pending} (bound {settings.limits.max_pending_flows}), "
        f"per flow max {audit.max_flow_bytes} B (bound {flow_bound}), all pending max {audit.max_pending_bytes} B"
    )
    assert legit.total >= min_handshakes
    if legit_floor is not None:
        assert legit.ok >= legit_floor * legit.total, legit.failed[:5]
    assert audit.max_pending <= settings.limits.max_pending_flows
    assert audit.max_flow_bytes <= flow_bound
    assert audit.max_pending_bytes <= settings.limits.max_pending_flows * flow_bound
    assert audit.orphans == 0 and all(a <= p for a, p, _ in audit.answers)
    assert replies.violations == []
    assert replies.vn + replies.closes == len(flood.all_replies())
    assert sum(drops.values()) - audit.legit_drops + answers_sent - vn_sent == audit.processed
    assert len(flood.all_replies()) + kernel_drops(flood.addresses) >= answers_sent
    return audit, drops, legit


async def test_initial_flood_in_process(pki: DemoPki, extensions: Extensions) -> None:
    await _flood_in_process(pki, extensions, datagrams=10_000, min_handshakes=100)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_initial_flood_in_process_100k(pki: DemoPki, extensions: Extensions) -> None:
    await _flood_in_process(pki, extensions, datagrams=100_000, min_handshakes=1_000)


async def test_a_full_pending_table_stays_bounded_and_recovers(pki: DemoPki, extensions: Extensions) -> None:
    """200 ports against a 64-flow pending table: the bound holds, the excess is counted, and once
    the flood stops the table drains and handshakes succeed again. While the table is full a new
    client's Initial evicts the oldest pending flow (a spoofed one: legitimate flows are decided in one
    round trip), so legitimate clients still get through (>= 95 %; before eviction some timed out)."""
    audit, drops, _ = await _flood_in_process(
        pki, extensions, datagrams=5_000, min_handshakes=12, legit_floor=0.95, rate_per_s=2_000, max_pending_flows=64
    )
    assert audit.max_pending == 64 and drops["pending_full"] > 0


async def test_an_oversized_initial_holds_no_pending_slot(extensions: Extensions) -> None:
    """A valid Initial bigger than a pending flow may buffer (UDP allows 65,527 bytes) is dropped
    once, and leaves no empty pending flow behind to hold a slot until the timeout."""
    metrics = RouterMetrics()
    template = HostnameTemplate.parse(c.DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE, "default")
    router = UdpRouter(UdpRouterSettings(extensions=extensions), template, TargetSnapshot, metrics)
    _, port = await router.start(ROUTER_HOST, 0)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        hello = first_hello(SNI_UNKNOWN)
        oversized = protected_initial(crypto_frame(0, hello[:100]), dcid=os.urandom(8), scid=os.urandom(8),
                                      size=c.QUIC_MAX_PENDING_BYTES_PER_FLOW + 1000)
        sock.sendto(oversized, (ROUTER_HOST, port))
        await eventually(lambda: dropped_counts(metrics)["pending_full"] == 1, 5, what="the oversized Initial's drop")
        assert router.pending_flows == 0
        router.sweep(asyncio.get_running_loop().time() + 60)
        assert sum(dropped_counts(metrics).values()) == 1
    finally:
        sock.close()
        await router.close()


def test_a_lone_crypto_piece_far_into_the_stream_costs_no_big_buffer() -> None:
    """CRYPTO past the largest ClientHello can never complete one: refused, not reassembled."""
    dcid = os.urandom(8)
    for offset, fits in ((MAX_TLS_CLIENT_HELLO_BYTES - 100, True), (MAX_TLS_CLIENT_HELLO_BYTES + 100, False)):
        sniffer = InitialSniffer()
        datagram = protected_initial(crypto_frame(offset, b"x" * 100), dcid=dcid, scid=os.urandom(8), size=1200)
        if fits:
            assert sniffer.feed(datagram) is None
            assert len(sniffer._crypto._buf) <= MAX_TLS_CLIENT_HELLO_BYTES
        else:
            with pytest.raises(QuicPacketError):
                sniffer.feed(datagram)


async def test_pending_memory_per_address_is_bounded(extensions: Extensions) -> None:
    """Worst case per source address, measured with tracemalloc: 16 datagrams of 2 KiB (the
    per-flow budget) whose CRYPTO pieces spread over the whole ClientHello range, never complete."""
    metrics = RouterMetrics()
    template = HostnameTemplate.parse(c.DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE, "default")
    settings = UdpRouterSettings(limits=FlowLimits(pending_flow_timeout_s=60.0), extensions=extensions)
    router = UdpRouter(settings, template, TargetSnapshot, metrics)
    _, port = await router.start(ROUTER_HOST, 0)
    loop = asyncio.get_running_loop()
    flood = FloodSockets(loop)
    per_flow = c.QUIC_MAX_PENDING_DATAGRAMS_PER_FLOW
    size = c.QUIC_MAX_PENDING_BYTES_PER_FLOW // per_flow
    flights = []
    for sock in flood.sockets:
        dcid, scid = os.urandom(8), os.urandom(8)
        keys = client_initial_keys(QUIC_V1, dcid)
        pieces = [crypto_frame(400 + 1000 * i, os.urandom(900)) for i in range(per_flow)]  # never from 0
        flights.append((sock, [encrypt_initial(QUIC_V1, dcid, scid, pn, piece + bytes(size - 43 - len(piece)), keys)
                               for pn, piece in enumerate(pieces)]))
    audit = RouterAudit(router, metrics, flood.addresses)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for pn in range(per_flow):
            for i, (sock, flight) in enumerate(flights):
                sock.sendto(flight[pn], (ROUTER_HOST, port))
                if i % WINDOW == WINDOW - 1 or i == len(flights) - 1:
                    sent = pn * len(flights) + i + 1
                    await eventually(lambda n=sent: audit.processed == n, 10, what="the router to read")
        grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
        flood.close()
        held = [p.buffered_bytes for p in router.table.pending_flows()]
        await router.close()
    per_address = grown / len(flights)
    bound = c.QUIC_MAX_PENDING_BYTES_PER_FLOW + MAX_TLS_CLIENT_HELLO_BYTES
    print(f"\npending memory: {len(flights)} addresses, {per_address / 1024:.1f} KiB each (datagram budget "
          f"{c.QUIC_MAX_PENDING_BYTES_PER_FLOW // 1024} KiB + CRYPTO {MAX_TLS_CLIENT_HELLO_BYTES // 1024} KiB); "
          f"at {c.QUIC_MAX_PENDING_FLOWS} pending flows: {per_address * c.QUIC_MAX_PENDING_FLOWS / 2**20:.0f} MiB")
    assert len(held) == len(flights) and max(held) <= c.QUIC_MAX_PENDING_BYTES_PER_FLOW
    assert per_address <= bound + 8 * 1024  # + the flow's objects, keys and reassembler bookkeeping


async def test_a_new_connection_from_a_reused_address_reaches_its_named_pod(
    pki: DemoPki, extensions: Extensions
) -> None:
    """The first client's socket closes and its port is reused at once, while its flow is still
    established (the router cannot see the encrypted close): the new connection names another pod
    and reaches it, a flow of its own beside the old one, which ends at its own idle timeout."""
    async with quic_pods(pki) as targets:
        snapshot = TargetSnapshot.of(list(targets.values()))
        template = HostnameTemplate.parse(c.DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE, "default")
        metrics = RouterMetrics()
        router = UdpRouter(UdpRouterSettings(extensions=extensions), template, lambda: snapshot, metrics)
        _, port = await router.start(ROUTER_HOST, 0)
        try:
            local_port = next(LEGIT_PORTS)
            for pod in ("stargate-0", "stargate-1"):
                config = client_configuration(sni(pod), pki.ca_path)
                async with connect(ROUTER_HOST, port, configuration=config, local_port=local_port) as client:
                    answer = await asyncio.wait_for(request(client, WHOAMI), HANDSHAKE_TIMEOUT_S)
                assert answer.partition(b":")[0].decode() == pod
            outcomes = {o: metrics.registry.get_sample_value(f"{c.QUIC_CONNECTIONS_TOTAL}_total", {"outcome": o})
                        for o in ("accepted", "completed", "target_unavailable")}
            assert outcomes == {"accepted": 2, "completed": 0, "target_unavailable": 0}
            assert router.active_flows == 2
        finally:
            await router.close()


# ---------------------------------------------------------------------------
# The real router process
# ---------------------------------------------------------------------------
async def _flood_router_process(
    pki: DemoPki, extensions: Extensions, workdir: Path, datagrams: int, rate_per_s: int, min_handshakes: int
) -> None:
    loop = asyncio.get_running_loop()
    rng = random.Random(datagrams + 1)
    async with quic_pods(pki) as targets:
        endpoints = workdir / "endpoints.json"
        write_endpoints(endpoints, [(t.pod_name, t.address, 1, t.quic_port) for t in targets.values()])
        with RouterProcess(router_args(endpoints), env=extensions_env(extensions)) as proc:
            await asyncio.to_thread(proc.wait_ready)
            port = proc.quic_port
            rss_before = rss_kib(proc.all_pids())
            flood = FloodSockets(loop)
            forge = FloodForge(rng)
            legit, stop, sampling = Legit(), asyncio.Event(), asyncio.Event()
            samples = ProcessSamples()
            try:
                legit_task = loop.create_task(legit.run(port, pki.ca_path, stop))
                sampler = loop.create_task(sample_process(proc, samples, sampling))
                # open loop at rate_per_s, in 10 ms bursts
                sent, flood_seconds = await send_flood(flood, forge, rng, port, datagrams, legit, min_handshakes,
                                                        rate_per_s, max(1, rate_per_s // 100))
                stop.set()
                await asyncio.wait_for(legit_task, 60)

                async def none_pending() -> bool:
                    return await asyncio.to_thread(proc.metric, c.PENDING_FLOWS) == 0

                await eventually(none_pending, c.QUIC_PENDING_FLOW_TIMEOUT_MS / 1000 + 10, 0.1,
                                 what="every pending flow expired")
                await eventually(lambda: kernel_queued(flood.addresses) == 0, what="late replies read")
                sampling.set()
                await sampler
                assert await asyncio.to_thread(proc.metric, c.PENDING_FLOWS) == 0
                drops = {r: await asyncio.to_thread(
                    proc.metric, f"{c.QUIC_DROPPED_DATAGRAMS_TOTAL}_total", reason=r) for r in QuicDropReason}
                listener_drops = kernel_drops({(ROUTER_HOST, port)})
                flood_drops = kernel_drops(flood.addresses)
                replies = check_replies(flood.all_replies(), forge)
                assert await whoami(port, "stargate-0", pki.ca_path) == "stargate-0"
                peak_rss = peak_rss_kib(proc.all_pids())
            finally:
                flood.close()
            assert proc.stop() == 0
            log_lines = len(proc.lines)
    counted = sum(drops.values()) + replies.closes
    print(
        f"\nrouter-process flood: {sent} datagrams from {len(flood.sockets)} ports in {flood_seconds:.1f} s "
        f"({sent / flood_seconds:.0f}/s); kernel drops at the router {listener_drops}, at the flood sockets "
        f"{flood_drops}\n  {legit.summary()}\n  drops {({k: int(v) for k, v in drops.items() if v})}, "
        f"replies VN {replies.vn} CONNECTION_CLOSE {replies.closes}; counted {int(counted)} of {sent}\n"
        f"  pending gauge max {samples.max_pending:.0f} (bound {c.QUIC_MAX_PENDING_FLOWS}), "
        f"RSS {rss_before} KiB -> max {samples.max_rss_kib} KiB (VmHWM {peak_rss} KiB); {log_lines} router log lines"
    )
    assert peak_rss < CHART_PEAK_RSS_KIB
    assert legit.total >= min_handshakes and legit.ok >= 0.99 * legit.total, legit.failed[:5]
    pending_bound = min(c.QUIC_MAX_PENDING_FLOWS, len(flood.sockets) * c.QUIC_MAX_PENDING_FLOWS_PER_ADDRESS)
    assert samples.max_pending <= pending_bound
    assert replies.violations == []
    assert sent - listener_drops - flood_drops <= counted <= sent
    flow_bound_kib = (c.QUIC_MAX_PENDING_BYTES_PER_FLOW + MAX_TLS_CLIENT_HELLO_BYTES) // 1024
    assert samples.max_rss_kib - rss_before <= pending_bound * flow_bound_kib + 32 * 1024


async def test_initial_flood_against_the_router_process(
    pki: DemoPki, extensions: Extensions, tmp_path: Path
) -> None:
    await _flood_router_process(pki, extensions, tmp_path, datagrams=5_000, rate_per_s=2_500, min_handshakes=40)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_initial_flood_against_the_router_process_100k(
    pki: DemoPki, extensions: Extensions, tmp_path: Path
) -> None:
    await _flood_router_process(pki, extensions, tmp_path, datagrams=100_000, rate_per_s=4_000, min_handshakes=400)
