"""TCP scenarios: bulk throughput (1 and 8 connections), new-connection rate, 2-worker speedup.

Every connection starts with a real TLS ClientHello for ``stargate-0.stargate.external``
(see ``tcp_load``), so the router and HAProxy both route by SNI (HAProxy: ``req.ssl_sni``)
and then splice; "direct" is the same client talking to the pod itself.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from bench.context import POD, POD_HOST, SNI, BenchContext, try_start
from bench.procs import Agent, Haproxy, Router, call_all, cpu_seconds
from bench.results import Row, Target, interleaved, median
from bench.tcp_load import bulk_send, connection_rate, start_bulk_sink, start_echo_pod, tls_client_hello

Endpoint = tuple[tuple[str, int], int | None]
"""(address a client dials, pid of the middle box there or None for direct)."""

BULK_TARGETS = (Target("ratio_vs_peer", ">=", 1.0, ">=1.0x haproxy"),
                Target("ratio_vs_direct", ">=", 0.8, ">=0.8x direct"))
RATE_TARGETS = (Target("ratio_vs_peer", ">=", 0.5, ">=0.5x haproxy"),)
SPEEDUP_TARGETS = (Target("router", ">=", 1.7, ">=1.7x with 2 workers"),)
FORCED_NOTE = ("HAProxy's best bulk setup; the issue's option splice-auto mostly copies on HAProxy 2.6 "
               "(see the _cpu rows)")
ECHO_POD = "stargate-1"
RATE_CONCURRENCY = 16
RATE_CLIENTS = 2
ECHO_BYTES = 1024


def _endpoints(router: Router | None, haproxy: Haproxy | None, direct: tuple[str, int],
               router_name: str = "router", haproxy_name: str = "haproxy") -> dict[str, Endpoint]:
    found: dict[str, Endpoint] = {"direct": (direct, None)}
    if router is not None:
        found[router_name] = (("127.0.0.1", router.tcp_port), router.pid)
    if haproxy is not None:
        found[haproxy_name] = (("127.0.0.1", haproxy.ports[0]), haproxy.pid)
    return found


def _measured(endpoint: Endpoint, run: Callable[[tuple[str, int]], tuple[float, float]]
              ) -> Callable[[], tuple[float, float | None]]:
    """A case returning (rate, middle-box CPU seconds per unit of work or None for direct)."""
    addr, pid = endpoint

    def case() -> tuple[float, float | None]:
        before = cpu_seconds(pid) if pid is not None else 0.0
        rate, work = run(addr)
        if pid is None:
            return rate, None
        return rate, (cpu_seconds(pid) - before) / work

    return case


def _medians(results: dict[str, list[tuple[float, float | None]]], name: str, index: int) -> float | None:
    values = [r[index] for r in results.get(name, []) if r[index] is not None]
    return median(values)  # type: ignore[arg-type]


def _bulk_runner(client: Agent, conns: int, nbytes: int, hello: bytes
                 ) -> Callable[[tuple[str, int]], tuple[float, float]]:
    def run(addr: tuple[str, int]) -> tuple[float, float]:
        seconds = client.call(bulk_send, addr, conns, nbytes, hello)
        total = conns * nbytes
        return total / seconds / 1e6, total / (1 << 30)

    return run


def _rate_runner(clients: list[Agent], seconds: float, message: bytes
                 ) -> Callable[[tuple[str, int]], tuple[float, float]]:
    def run(addr: tuple[str, int]) -> tuple[float, float]:
        per_client = RATE_CONCURRENCY // len(clients)
        answers = call_all(clients, connection_rate, [(addr, seconds, per_client, message)] * len(clients))
        done = sum(a[0] for a in answers)
        failed = sum(a[1] for a in answers)
        if failed > done // 100:
            raise RuntimeError(f"connection rate to {addr}: {failed} failed, {done} completed")
        return done / max(a[2] for a in answers), max(done, 1)

    return run


def _bulk_sizes(ctx: BenchContext) -> tuple[tuple[int, int], ...]:
    mib = 1 << 20
    return ((1, ctx.pick(256, 2048) * mib), (8, ctx.pick(32, 256) * mib))


def tcp_bulk(ctx: BenchContext) -> list[Row]:
    hello = tls_client_hello(SNI)
    sink = ctx.own(Agent("bulk-sink"))
    port = sink.call(start_bulk_sink, POD_HOST)
    client = ctx.own(Agent("bulk-client"))
    router = ctx.own(Router(ctx.workdir, [(POD, POD_HOST, port, 1)], workers=ctx.workers))
    haproxy = try_start(ctx, "haproxy", lambda: Haproxy(ctx.workdir, sni_routes=[(SNI, POD_HOST, port)]))
    forced = try_start(ctx, "haproxy (forced splice)", lambda: Haproxy(
        ctx.workdir, sni_routes=[(SNI, POD_HOST, port)], forced_splice=True))
    endpoints = _endpoints(router, haproxy, (POD_HOST, port))
    endpoints.update(_endpoints(None, forced, (POD_HOST, port), haproxy_name="haproxy_forced"))
    note = f"{ctx.workers} router worker(s)" if ctx.workers > 1 else ""
    rows = []
    for conns, nbytes in _bulk_sizes(ctx):
        ctx.log(f"tcp bulk: {conns} connection(s) x {nbytes >> 20} MiB, {ctx.rounds} rounds")
        run = _bulk_runner(client, conns, nbytes, hello)
        results = interleaved(ctx.rounds, {n: _measured(e, run) for n, e in endpoints.items()})
        router_rate, router_cpu = _medians(results, "router", 0), _medians(results, "router", 1)
        rows += [
            Row(f"tcp_bulk_{conns}conn", f"throughput, {conns} connection(s), client->pod", "MB/s",
                router_rate, "haproxy", _medians(results, "haproxy", 0), _medians(results, "direct", 0),
                targets=BULK_TARGETS, note=note),
            Row(f"tcp_bulk_{conns}conn_cpu", f"middle-box CPU per GiB relayed, {conns} connection(s)",
                "CPU s/GiB", router_cpu, "haproxy", _medians(results, "haproxy", 1), None,
                higher_is_better=False),
            Row(f"tcp_bulk_{conns}conn_vs_forced_splice", "throughput vs HAProxy splicing always "
                "(splice-request/response, 1 MiB pipes)", "MB/s", router_rate, "haproxy",
                _medians(results, "haproxy_forced", 0), _medians(results, "direct", 0),
                targets=BULK_TARGETS[:1], note=FORCED_NOTE),
            Row(f"tcp_bulk_{conns}conn_cpu_vs_forced_splice", "middle-box CPU per GiB vs HAProxy "
                "splicing always", "CPU s/GiB", router_cpu, "haproxy",
                _medians(results, "haproxy_forced", 1), None, higher_is_better=False),
        ]
    return rows


def conn_rate(ctx: BenchContext) -> list[Row]:
    message = tls_client_hello(SNI) + bytes(ECHO_BYTES)
    pod = ctx.own(Agent("echo-pod"))
    port = pod.call(start_echo_pod, POD_HOST)
    clients = [ctx.own(Agent(f"rate-client-{i}")) for i in range(RATE_CLIENTS)]
    router = ctx.own(Router(ctx.workdir, [(POD, POD_HOST, port, 1)], workers=ctx.workers))
    haproxy = try_start(ctx, "haproxy", lambda: Haproxy(ctx.workdir, sni_routes=[(SNI, POD_HOST, port)]))
    endpoints = _endpoints(router, haproxy, (POD_HOST, port))
    seconds = ctx.pick(1.0, 3.0)
    ctx.log(f"new connections: concurrency {RATE_CONCURRENCY}, {seconds}s per case, {ctx.rounds} rounds")
    run = _rate_runner(clients, seconds, message)
    results = interleaved(ctx.rounds, {n: _measured(e, run) for n, e in endpoints.items()})
    cpu_us = {n: (v * 1e6 if v is not None else None) for n in endpoints
              for v in [_medians(results, n, 1)]}
    return [
        Row("conn_rate", f"TLS ClientHello peek + dial + {ECHO_BYTES} B echo + close, "
            f"concurrency {RATE_CONCURRENCY}", "conn/s",
            _medians(results, "router", 0), "haproxy", _medians(results, "haproxy", 0),
            _medians(results, "direct", 0), targets=RATE_TARGETS),
        Row("conn_rate_cpu", "middle-box CPU per connection", "CPU us/conn", cpu_us.get("router"),
            "haproxy", cpu_us.get("haproxy"), None, higher_is_better=False),
    ]


def workers_speedup(ctx: BenchContext) -> list[Row]:
    """Router with 1 and 2 workers (HAProxy with 1 and 2 threads) on bulk 8-conn and conn rate.

    Pod ``stargate-0`` is the bulk sink, ``stargate-1`` the echo pod; each middle box knows both.
    """
    sink = ctx.own(Agent("bulk-sink"))
    sink_port = sink.call(start_bulk_sink, POD_HOST)
    echo = ctx.own(Agent("echo-pod"))
    echo_port = echo.call(start_echo_pod, POD_HOST)
    clients = [ctx.own(Agent(f"client-{i}")) for i in range(RATE_CLIENTS)]
    echo_sni = SNI.replace(POD, ECHO_POD, 1)
    pods = [(POD, POD_HOST, sink_port, 1), (ECHO_POD, POD_HOST, echo_port, 1)]
    sni_routes = [(SNI, POD_HOST, sink_port), (echo_sni, POD_HOST, echo_port)]
    routers: dict[int, Router | None] = {}
    haproxies: dict[int, Haproxy | None] = {}
    for n in (1, 2):
        routers[n] = try_start(ctx, f"router --workers {n}", partial(Router, ctx.workdir, pods, workers=n))
        haproxies[n] = try_start(ctx, f"haproxy nbthread {n}",
                                 partial(Haproxy, ctx.workdir, sni_routes=sni_routes, threads=n))
    note = "" if routers[2] is not None else "router --workers 2 did not start: no 2-worker figures"
    ctx.log("workers: bulk 8 connections, router 1 vs 2 workers, haproxy 1 vs 2 threads")
    conns, nbytes = _bulk_sizes(ctx)[1]
    bulk = _bulk_runner(clients[0], conns, nbytes, tls_client_hello(SNI))
    rows = _speedup_rows(ctx, "tcp_bulk_8conn", "MB/s", bulk, routers, haproxies, 0, (POD_HOST, sink_port),
                         note)
    ctx.log("workers: new-connection rate, router 1 vs 2 workers, haproxy 1 vs 2 threads")
    rate = _rate_runner(clients, ctx.pick(1.0, 3.0), tls_client_hello(echo_sni) + bytes(ECHO_BYTES))
    rows += _speedup_rows(ctx, "conn_rate", "conn/s", rate, routers, haproxies, 1, (POD_HOST, echo_port),
                          note)
    return rows


def _speedup_rows(ctx: BenchContext, base: str, unit: str,
                  run: Callable[[tuple[str, int]], tuple[float, float]],
                  routers: dict[int, Router | None], haproxies: dict[int, Haproxy | None], front: int,
                  direct: tuple[str, int], note: str) -> list[Row]:
    endpoints: dict[str, Endpoint] = {"direct": (direct, None)}
    for n in (1, 2):
        router, haproxy = routers[n], haproxies[n]
        if router is not None:
            endpoints[f"router{n}"] = (("127.0.0.1", router.tcp_port), router.pid)
        if haproxy is not None:
            endpoints[f"haproxy{n}"] = (("127.0.0.1", haproxy.ports[front]), haproxy.pid)
    results = interleaved(ctx.rounds, {n: _measured(e, run) for n, e in endpoints.items()})
    r1, r2 = _medians(results, "router1", 0), _medians(results, "router2", 0)
    h1, h2 = _medians(results, "haproxy1", 0), _medians(results, "haproxy2", 0)
    return [
        Row(f"{base}_2workers", f"{base} with router --workers 2 vs HAProxy nbthread 2", unit,
            r2, "haproxy", h2, _medians(results, "direct", 0), note=note),
        Row(f"{base}_speedup", "2 workers / 1 worker (HAProxy: 2 threads / 1 thread)", "x",
            r2 / r1 if r1 and r2 else None, "haproxy", h2 / h1 if h1 and h2 else None, None,
            targets=SPEEDUP_TARGETS, note=note),
    ]
