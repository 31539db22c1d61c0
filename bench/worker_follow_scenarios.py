"""``--workers N``: what following a moved client across workers costs (``router/udp/cid_index.py``,
``router/udp/joins.py``).

Two figures, from ``python -m router --workers 2`` and an echoing pod (``start_udp_sink``):

* a miss: a short header from a new address naming no flow, which the worker that got it looks up
  in the workers' shared connection-ID index (finding nothing) and drops, against the same miss on
  one worker (no index);
* a moved client's datagram: a connection whose client moved to a port the kernel gives the worker
  that does not hold its flow. Its first datagram there is joined to the pod (a flow of that
  worker's own, confirmed by the pod's answer); the rest take that worker's usual path. Its
  established datagrams are the comparison; the figure is solved from two phases, since which
  worker a new port lands on is the kernel's choice: the moved phase's CPU, less its datagrams that
  reached their own worker at the established cost, over the joined connections' datagrams
  (``quic_connections_total{outcome="joined"}`` times the rounds and the move), the join included.

Datagrams of flows a worker holds never reach this code: the established rows (``udp_relay``,
``udp_echo``, ``udp_demux``) measure that path, unchanged.
"""

from __future__ import annotations

import os
import time

from bench import demux_load, follow_load, join_load
from bench.context import POD, POD_HOST, SNI, BenchContext
from bench.procs import Agent, BenchError, Router, cpu_exact
from bench.quic_load import client_initials, start_udp_sink, udp_sink_forget_sources, udp_sink_stats
from bench.results import Row, interleaved, median
from router import constants as c

DATAGRAM_BYTES = 1200
SETTLE_S = 0.3
"""After the last send: the router has read (and echoed) every datagram."""
CONNECTIONS = f"{c.QUIC_CONNECTIONS_TOTAL}_total"


def worker_follow(ctx: BenchContext) -> list[Row]:
    pod, clients = ctx.own(Agent("follow-pod")), ctx.own(Agent("follow-clients"))
    port = pod.call(start_udp_sink, POD_HOST, True)  # echo: the router learns each connection's pod CID
    rows = [(POD, POD_HOST, 1, port)]
    two, one = ctx.own(Router(ctx.workdir, rows, workers=2)), ctx.own(Router(ctx.workdir, rows, workers=1))
    misses = ctx.pick(200, 400)
    connections, rounds = ctx.pick(50, 100), ctx.pick(20, 50)
    ctx.log(f"worker follow: {misses} misses per case; {connections} connections x {rounds} datagrams moved")

    def miss(router: Router) -> float:
        before = cpu_exact(router.pid)
        clients.call(join_load.send_from_new_addresses, ("127.0.0.1", router.udp_port), misses, os.urandom(4),
                     DATAGRAM_BYTES)
        time.sleep(SETTLE_S)
        return (cpu_exact(router.pid) - before) / misses * 1e6

    def moved() -> tuple[float, float]:
        addr = ("127.0.0.1", two.udp_port)
        pod.call(udp_sink_forget_sources)
        flights = client_initials(SNI, connections)
        clients.call(demux_load.open_connections, addr, flights, False)
        deadline = time.monotonic() + 30.0
        while pod.call(udp_sink_stats)[2] < connections:
            if time.monotonic() > deadline:
                raise BenchError(f"only {pod.call(udp_sink_stats)[2]} of {connections} connections opened")
            clients.call(demux_load.resend_initials, flights)
            time.sleep(0.2)
        time.sleep(SETTLE_S)  # the echoed Initials teach the router each connection's CID
        established = _phase(two, pod, clients, rounds)[0]
        joined_before = two.process.metric(CONNECTIONS, outcome="joined")
        before = cpu_exact(two.pid)  # the moves' first datagrams: the joins, on the worker without the flow
        clients.call(follow_load.move, addr, DATAGRAM_BYTES)
        time.sleep(SETTLE_S)
        joining = cpu_exact(two.pid) - before
        cpu = _phase(two, pod, clients, rounds)[0] + joining
        moved_here = int(two.process.metric(CONNECTIONS, outcome="joined") - joined_before)
        clients.call(demux_load.retire)
        if not moved_here:
            raise BenchError("no moved connection landed on the other worker")
        per_established = established / (rounds * connections)
        stayed = (connections - moved_here) * (rounds + 1)  # the move's datagram and the rounds, each
        return (cpu - per_established * stayed) / (moved_here * (rounds + 1)) * 1e6, per_established * 1e6

    try:
        results = interleaved(ctx.rounds, {"two_workers": lambda: miss(two), "one_worker": lambda: miss(one),
                                           "moved": moved})
    finally:
        clients.call(demux_load.close_all)
        clients.call(join_load.close_all)
    note = (f"{DATAGRAM_BYTES} B short headers; misses: {misses} new client addresses per case, each its own "
            f"wake-up; moved: {connections} connections, {rounds} datagrams each, echoed by the pod")
    return [
        Row("worker_follow_miss_cpu", "router CPU per miss (--workers 2: looked up in the shared "
            "connection-ID index, found nowhere, dropped)", "CPU us/datagram", median(results["two_workers"]),
            "one worker (no index)", median(results["one_worker"]), None, higher_is_better=False, note=note),
        Row("worker_follow_moved_cpu", "router CPU per datagram of a moved client the kernel gives the worker "
            "without its flow (joined there, the join included; echo included)", "CPU us/pkt",
            median([r[0] for r in results["moved"]]), "its established datagrams",
            median([r[1] for r in results["moved"]]), None, higher_is_better=False, note=note),
    ]


def _phase(router: Router, pod: Agent, clients: Agent, rounds: int) -> tuple[float, int]:
    """Every connection sends ``rounds`` datagrams: (router CPU seconds, datagrams the pod got)."""
    received = pod.call(udp_sink_stats)[0]
    before = cpu_exact(router.pid)
    clients.call(follow_load.send_each, rounds, DATAGRAM_BYTES)
    time.sleep(SETTLE_S)
    cpu = cpu_exact(router.pid) - before
    return cpu, pod.call(udp_sink_stats)[0] - received
