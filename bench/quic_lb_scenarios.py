"""QUIC-LB: what a join costs the router (``--quic-lb-server-id-bytes``).

A join is the first datagram of a client address the router has no flow for, whose connection ID's
server ID names a ready pod: the router opens a flow (a connected socket to the pod, the flow
table's entry, the access record) and forwards the datagram, as it does for a connection that
moved here from another replica. The comparison is the miss that names no pod (a random short
header), which must stay a slice and a dict lookup. Load from ``join_load`` in an ``Agent``.
"""

from __future__ import annotations

import time

from bench import join_load
from bench.context import POD, POD_HOST, BenchContext
from bench.procs import Agent, BenchError, Router, cpu_exact
from bench.quic_load import start_udp_sink, udp_sink_stats
from bench.results import Row, interleaved, median
from router import constants as c
from router.udp.quic_lb import pod_server_id

DATAGRAM_BYTES = 1200
NOBODY = bytes([10, 99, 99, 99])
"""A server ID no pod has."""
NOT_ENCODED = 0b111
"""The config rotation of a connection ID with no server ID: dropped as without QUIC-LB."""
SETTLE_S = 0.2
"""After the last send: the router has read every datagram (it is idle then: no CPU counted)."""


def quic_lb_join(ctx: BenchContext) -> list[Row]:
    """Router CPU per join, against per miss naming nobody; each round from new client addresses,
    within the join bucket (``QUIC_LB_JOIN_BURST``), whose refusals would make the figure a lie."""
    pod, clients = ctx.own(Agent("quic-lb-pod")), ctx.own(Agent("quic-lb-clients"))
    port = pod.call(start_udp_sink, POD_HOST)
    router = ctx.own(Router(ctx.workdir, [(POD, POD_HOST, 1, port)], extra=["--quic-lb-server-id-bytes=4"]))
    addr, pid = ("127.0.0.1", router.udp_port), router.pid
    server_id = pod_server_id(POD_HOST, 4)
    assert server_id is not None
    count = ctx.pick(200, 500)
    if count > c.QUIC_LB_JOIN_BURST / 2:
        raise BenchError(f"{count} joins a round would empty the join bucket")
    ctx.log(f"quic-lb joins: {count} new client addresses per case")

    def case(sid: bytes, rotation: int = 0) -> float:
        time.sleep(count / c.QUIC_LB_JOINS_PER_S)  # the bucket refills: every join of the round is taken
        sources = pod.call(udp_sink_stats)[2]
        before = cpu_exact(pid)
        clients.call(join_load.send_from_new_addresses, addr, count, sid, DATAGRAM_BYTES, rotation)
        deadline = time.monotonic() + 10.0
        while sid == server_id and rotation != NOT_ENCODED and pod.call(udp_sink_stats)[2] < sources + count:
            if time.monotonic() > deadline:
                drops = {r: router.process.metric(f"{c.QUIC_DROPPED_DATAGRAMS_TOTAL}_total", reason=r)
                         for r in ("quic_lb_rate_limited", "quic_lb_refused", "flow_table_full", "not_initial")}
                raise BenchError(f"only {pod.call(udp_sink_stats)[2] - sources} of {count} joins reached the "
                                 f"pod; the router dropped {drops}")
            time.sleep(0.02)
        time.sleep(SETTLE_S)
        return (cpu_exact(pid) - before) / count * 1e6

    try:
        results = interleaved(ctx.rounds, {"join": lambda: case(server_id), "nobody": lambda: case(NOBODY),
                                           "not_encoded": lambda: case(server_id, NOT_ENCODED)})
        joined = router.process.metric(f"{c.QUIC_CONNECTIONS_TOTAL}_total", outcome="joined")
    finally:
        clients.call(join_load.close_all)
    if joined != count * ctx.rounds:
        raise BenchError(f"{joined:.0f} of {count * ctx.rounds} joins opened a flow")
    note = (f"{count} new client addresses per case, one {DATAGRAM_BYTES} B datagram each (each its own "
            "wake-up of the router: the figures include reading it)")
    return [
        Row("quic_lb_join_cpu", "router CPU per QUIC-LB join: a new client address's first short header "
            "routed by its connection ID's server ID (flow, pod socket, send)", "CPU us/join",
            median(results["join"]), "naming no pod (dropped)", median(results["nobody"]), None,
            higher_is_better=False, note=note),
        Row("quic_lb_miss_cpu", "router CPU per miss naming no pod: decode, look up, drop", "CPU us/datagram",
            median(results["nobody"]), "not encoded (0b111: dropped unread)", median(results["not_encoded"]),
            None, higher_is_better=False, note=note),
    ]
