"""gRPC (h2c) pods and clients for the latency scenario; runs inside ``Agent`` processes.

Real grpcio on both ends (``router.demo.grpc_pods``): the client names the pod in
``:authority``, which the router reads from the first HEADERS block.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc

from router.demo.grpc_pods import ECHO, WHOAMI, start_pod

_STATE: dict[str, Any] = {}


def _identity(b: bytes) -> bytes:
    return b


def start_grpc_pod(pod_name: str, host: str) -> int:
    """A grpcio h2c pod in this process; returns its port."""
    pod = start_pod(pod_name, host, max_workers=8)
    _STATE.setdefault("pods", []).append(pod)
    return pod.port


def _channel(target: str, authority: str) -> grpc.Channel:
    # A fresh connection per channel, never one shared with another channel of this process.
    return grpc.insecure_channel(target, options=[("grpc.default_authority", authority),
                                                  ("grpc.use_local_subchannel_pool", 1)])


def unary_latencies(target: str, authority: str, calls: int, warmup: int) -> list[float]:
    """Microseconds of ``calls`` sequential unary WhoAmI calls on one channel (after warm-up)."""
    with _channel(target, authority) as channel:
        stub = channel.unary_unary(WHOAMI, request_serializer=_identity, response_deserializer=_identity)
        for _ in range(warmup):
            stub(b"", timeout=10)
        out = []
        clock = time.perf_counter_ns
        for _ in range(calls):
            t0 = clock()
            stub(b"", timeout=10)
            out.append((clock() - t0) / 1000)
    return out


def stream_rate(target: str, authority: str, messages: int, size: int) -> float:
    """Messages per second echoed on one bidirectional stream (each counted once, on return)."""
    payload = bytes(size)

    def requests() -> Iterator[bytes]:
        for _ in range(messages):
            yield payload

    with _channel(target, authority) as channel:
        stub = channel.stream_stream(ECHO, request_serializer=_identity, response_deserializer=_identity)
        sum(1 for _ in stub(iter([payload]), timeout=10))  # connection and stream warm-up
        started = time.perf_counter()
        got = sum(1 for _ in stub(requests(), timeout=120))
        elapsed = time.perf_counter() - started
    if got != messages:
        raise RuntimeError(f"echo stream returned {got} of {messages} messages")
    return messages / elapsed
