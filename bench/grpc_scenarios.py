"""gRPC over h2c: unary latency p50/p99, the latency a middle box adds, streaming messages/s.

The router routes by ``:authority``; HAProxy in TCP mode cannot read it (it would need
HTTP mode, i.e. terminating HTTP/2), so its frontend forwards everything to the one pod.
Each round runs the three paths one after another with a fresh channel each.
"""

from __future__ import annotations

from functools import partial

from bench.context import POD, POD_HOST, SNI, BenchContext, try_start
from bench.grpc_load import start_grpc_pod, stream_rate, unary_latencies
from bench.procs import Agent, Haproxy, Router
from bench.results import Row, Target, interleaved, median

ADDED_TARGETS = (Target("ratio_vs_peer", "<=", 1.0, "<= haproxy's added p50"),)
HAPROXY_NOTE = "HAProxy in TCP mode to one backend: it cannot route by :authority without terminating h2"
STREAM_MESSAGE_BYTES = 64


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def grpc_unary_and_streaming(ctx: BenchContext) -> list[Row]:
    pod = ctx.own(Agent("grpc-pod"))
    port = pod.call(start_grpc_pod, POD, POD_HOST)
    client = ctx.own(Agent("grpc-client"))
    router = ctx.own(Router(ctx.workdir, [(POD, POD_HOST, port, 1)], workers=ctx.workers))
    haproxy = try_start(ctx, "haproxy", lambda: Haproxy(ctx.workdir, plain_routes=[(POD_HOST, port)]))
    targets = {"router": f"127.0.0.1:{router.tcp_port}", "direct": f"{POD_HOST}:{port}"}
    if haproxy is not None:
        targets["haproxy"] = f"127.0.0.1:{haproxy.ports[0]}"
    calls, warmup = ctx.pick(500, 3000), ctx.pick(100, 300)
    messages = ctx.pick(2000, 20000)
    ctx.log(f"grpc: {calls} unary calls and a {messages}-message echo stream per case, {ctx.rounds} rounds")

    def case(target: str) -> tuple[float, float, float]:
        lat = client.call(unary_latencies, target, SNI, calls, warmup)
        rate = client.call(stream_rate, target, SNI, messages, STREAM_MESSAGE_BYTES)
        return _percentile(lat, 0.5), _percentile(lat, 0.99), rate

    results = interleaved(ctx.rounds, {n: partial(case, t) for n, t in targets.items()})

    def med(name: str, i: int) -> float | None:
        return median([r[i] for r in results.get(name, [])])

    p50 = {n: med(n, 0) for n in ("router", "haproxy", "direct")}
    # Added latency per round (same round = same machine state), then the median.
    added = {}
    for name in ("router", "haproxy"):
        if name in results:
            added[name] = median([r[0] - d[0] for r, d in zip(results[name], results["direct"], strict=True)])
    return [
        Row("grpc_unary_p50", "unary WhoAmI latency p50, h2c with :authority", "us",
            p50["router"], "haproxy", p50["haproxy"], p50["direct"], higher_is_better=False,
            note=HAPROXY_NOTE),
        Row("grpc_unary_p99", "unary WhoAmI latency p99", "us", med("router", 1), "haproxy",
            med("haproxy", 1), med("direct", 1), higher_is_better=False),
        Row("grpc_unary_added_p50", "p50 latency added over direct (same round)", "us",
            added.get("router"), "haproxy", added.get("haproxy"), None, higher_is_better=False,
            targets=ADDED_TARGETS),
        Row("grpc_stream_rate", f"bidi echo stream, {STREAM_MESSAGE_BYTES} B messages", "msg/s",
            med("router", 2), "haproxy", med("haproxy", 2), med("direct", 2)),
    ]
