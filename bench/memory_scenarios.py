"""Memory: RSS per idle spliced TCP connection and per UDP flow, from ``/proc/<pid>/status``.

VmRSS of the middle box (its whole process tree) before and after opening N idle
connections / flows, divided by N. Kernel memory (socket buffers, pipes) is not in RSS.
The router runs one worker here whatever ``--workers`` says: this is a per-process figure.
TCP connections open with a TLS ClientHello and then stay silent; the router gives back
its splice pipes after ``RELAY_RELEASE_QUIET_S``, so the "after" reading waits past that.
UDP flows each send one real aioquic client Initial (each flow its own), read the pod's answer
(the sink answers each Initial), send one short header to the connection ID it carried (the
router confirms the flow, as after a real handshake) and then stay silent.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bench.context import POD, POD_HOST, SNI, BenchContext, try_start
from bench.procs import Agent, BenchError, Haproxy, Nginx, Router, raise_fd_limit, rss_bytes
from bench.quic_load import client_initials, close_udp_flows, start_udp_sink, udp_sink_forget_sources
from bench.quic_scenarios import check_confirmed, establish_flows
from bench.results import Row, Target
from bench.tcp_load import close_idle, held, open_idle, release_held, start_hold_pod, tls_client_hello
from router.constants import RELAY_RELEASE_QUIET_S

TCP_TARGETS = (Target("router", "<=", 16.0, "<=16 KiB/conn"),)
UDP_TARGETS = (Target("router", "<=", 4.0, "<=4 KiB/flow"),)
WANTED = 10_000
WARMUP = 200
WAVE = 500
FD_RESERVE = 200
"""File descriptors kept free in the middle box for listeners, pipes, logs."""


def _tcp_plan(ctx: BenchContext) -> tuple[int, int, str]:
    """(connections, connections opened per wave, note). A spliced connection holds 2 fds
    in the middle box, plus (router) 2 pipes = 4 fds until it has been quiet for
    RELAY_RELEASE_QUIET_S, so connections open in waves that let the pipes go in between;
    the count is 10,000 unless the open-files hard limit leaves room for fewer."""
    limit = raise_fd_limit()
    wanted = ctx.pick(2_000, WANTED)
    room = limit - FD_RESERVE
    if 6 * (wanted + WARMUP) <= room:
        return wanted, wanted, f"{wanted:,} connections"
    count = min(wanted, (room - 4 * WAVE) // 2 - WARMUP)
    note = f"{count:,} connections opened in waves of {WAVE}"
    if count < wanted:
        note += (f" (open-files hard limit {limit:,}; a spliced connection holds 2 fds, plus 4 "
                 f"for its pipes until {RELAY_RELEASE_QUIET_S:g}s quiet)")
    return count, WAVE, note


def _wait(what: str, check: object, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.05)


def memory_tcp(ctx: BenchContext) -> list[Row]:
    count, wave, note = _tcp_plan(ctx)
    hello = tls_client_hello(SNI)
    pod = ctx.own(Agent("hold-pod"))
    port = pod.call(start_hold_pod, POD_HOST)
    client = ctx.own(Agent("idle-client"))
    router = ctx.own(Router(ctx.workdir, [(POD, POD_HOST, port, 1)]))
    haproxy = try_start(ctx, "haproxy", lambda: Haproxy(
        ctx.workdir, sni_routes=[(SNI, POD_HOST, port)], maxconn=count + WARMUP + 100))
    boxes: dict[str, tuple[int, int]] = {"router": (router.tcp_port, router.pid)}
    if haproxy is not None:
        boxes["haproxy"] = (haproxy.ports[0], haproxy.pid)
    per_conn: dict[str, float] = {}
    for name, (front, pid) in boxes.items():
        ctx.log(f"memory: {count:,} idle TCP connections through {name}")
        addr = ("127.0.0.1", front)
        client.call(open_idle, addr, WARMUP, hello)  # first-use allocations, not per connection
        _wait("warm-up connections", lambda: pod.call(held) >= WARMUP)
        time.sleep(RELAY_RELEASE_QUIET_S + 1.0)
        before = rss_bytes(pid)
        opened = 0
        while opened < count:
            step = min(wave, count - opened)
            client.call(open_idle, addr, step, hello, timeout=600)
            opened += step
            _wait(f"{opened} connections through {name}", lambda n=opened: pod.call(held) >= WARMUP + n)
            if opened < count:
                time.sleep(RELAY_RELEASE_QUIET_S + 0.3)
        time.sleep(RELAY_RELEASE_QUIET_S + 1.0)
        after = rss_bytes(pid)
        per_conn[name] = (after - before) / count / 1024
        client.call(close_idle)
        pod.call(release_held)
        time.sleep(1.0)
    return [Row("memory_tcp_idle_conn", "RSS per idle spliced TCP connection (VmRSS delta / N)", "KiB",
                per_conn.get("router"), "haproxy", per_conn.get("haproxy"), None,
                higher_is_better=False, targets=TCP_TARGETS, note=note)]


def memory_udp(ctx: BenchContext) -> list[Row]:
    """One middle box at a time, flows closed in between: every flow socket (client, router,
    nginx upstream) takes an ephemeral UDP port, and 3 x 10,000 would not fit the range."""
    count = ctx.pick(2_000, WANTED)
    sink = ctx.own(Agent("udp-sink"))
    port = sink.call(start_udp_sink, POD_HOST)
    blaster = ctx.own(Agent("udp-flows"))
    flights = client_initials(SNI, WARMUP + count)  # every flow its own connection IDs (each box reuses them)
    starts: dict[str, Callable[[], Router | Nginx]] = {
        "router": lambda: Router(ctx.workdir, [(POD, POD_HOST, 1, port)]),
        "nginx": lambda: Nginx(ctx.workdir, POD_HOST, port, connections=2 * (count + WARMUP) + 100),
    }
    per_flow: dict[str, float] = {}
    for name, start in starts.items():
        box = try_start(ctx, name, start)
        if box is None:
            continue
        ctx.log(f"memory: {count:,} UDP flows through {name}")
        addr = ("127.0.0.1", box.udp_port if isinstance(box, Router) else box.port)
        establish_flows(blaster, addr, flights[:WARMUP])
        time.sleep(1.0)
        before = rss_bytes(box.pid)
        establish_flows(blaster, addr, flights[WARMUP:], batch=250, timeout_s=60.0)
        time.sleep(1.0)
        after = rss_bytes(box.pid)
        per_flow[name] = (after - before) / count / 1024
        if isinstance(box, Router):
            check_confirmed(box, "memory_udp")
        blaster.call(close_udp_flows)
        box.close()
        sink.call(udp_sink_forget_sources)
    return [Row("memory_udp_flow", "RSS per routed UDP flow (VmRSS delta / N)", "KiB",
                per_flow.get("router"), "nginx", per_flow.get("nginx"), None, higher_is_better=False,
                targets=UDP_TARGETS,
                note=f"{count:,} confirmed flows, each opened by a real aioquic Initial of its own")]
