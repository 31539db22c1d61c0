"""The flow-table flood's helper-process side (``bench.flow_table_flood``); each function runs in an ``Agent``.

* ``start_legit_pod`` / ``start_flood_pod``: the pods, each on its own event-loop thread. The
  legitimate clients' pod (``stargate-0``) is a real aioquic QUIC-LB pod. The flood's (``stargate-1``)
  is, for Initials, an echo: each datagram answered once with itself, as a pod answers an Initial
  with its own (the router's cost is the same), without an aioquic handshake's ~1 ms of CPU per
  Initial on the same two cores; for joins, a real aioquic QUIC-LB pod, which ignores a short header
  it has no connection for (an echo of one would confirm the join).
* ``flood``: an opening burst of one table's worth, then a steady rate, each datagram from a source
  address of its own (``tests.support.flow_table_flood``).
* ``legit``: real aioquic connections to ``stargate-0`` (a name round trip and a transfer compared
  byte for byte), a few lanes one after another.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
from pathlib import Path
from typing import Any

from router.demo.quic_pods import bound_port
from tests.support.flow_table_flood import (
    PODS,
    SERVER_ID_BYTES,
    FloodForge,
    FloodSender,
    Legit,
    aioquic_lanes,
)
from tests.support.quic_lb_pods import PodCids, start_quic_lb_pod

LEGIT_POD = "stargate-0"
FLOOD_POD = "stargate-1"
PRIME_RATE_PER_S = 2_000
"""The opening burst's pace: a table of 256 in 0.13 s, well within the router's socket buffer."""
POD_IDLE_TIMEOUT_S = 5.0
"""The aioquic pods' ``max_idle_timeout``: what a connection the flood opened costs a pod, bounded."""
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
"""The echo pod's buffers: the router's own (``QUIC_SOCKET_BUFFER_BYTES``), so the pod drops nothing first."""
_STATE: dict[str, Any] = {}


def _serve(start: Any) -> int:
    """Run the coroutine function ``start`` (returning a server) on a new event-loop thread; its port."""
    started = threading.Event()
    box: list[int] = []

    def run() -> None:
        loop = asyncio.new_event_loop()
        server = loop.run_until_complete(start())
        _STATE.setdefault("servers", []).append(server)
        box.append(bound_port(server))
        started.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    if not started.wait(10):
        raise RuntimeError("pod did not start")
    return box[0]


def _aioquic_pod(pod: str, cert_path: str, key_path: str) -> int:
    cids = PodCids(PODS[pod], SERVER_ID_BYTES)
    return _serve(lambda: start_quic_lb_pod(pod, PODS[pod], cert_path, key_path, cids, POD_IDLE_TIMEOUT_S))


def start_legit_pod(cert_path: str, key_path: str) -> int:
    return _aioquic_pod(LEGIT_POD, cert_path, key_path)


def _echo(sock: socket.socket) -> None:
    while True:
        data, addr = sock.recvfrom(65536)
        sock.sendto(data, addr)


def start_flood_pod(kind: str, cert_path: str, key_path: str) -> int:
    """``stargate-1`` for the flood of ``kind``: an echo for Initials, an aioquic pod for joins."""
    if kind == "joins":
        return _aioquic_pod(FLOOD_POD, cert_path, key_path)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.bind((PODS[FLOOD_POD], 0))
    _STATE["echo"] = sock
    threading.Thread(target=_echo, args=(sock,), daemon=True).start()
    return int(sock.getsockname()[1])


def flood(router: tuple[str, int], kind: str, prime: int, rate_per_s: float, seconds: float,
          seed: int) -> tuple[int, float]:
    """``prime`` datagrams at ``PRIME_RATE_PER_S``, then ``rate_per_s`` for ``seconds``, naming
    ``stargate-1``; returns (datagrams sent after the burst, seconds they took)."""
    forge = FloodForge(random.Random(seed), (FLOOD_POD,), fresh_scids=True)
    make = forge.join if kind == "joins" else forge.initial
    sender = FloodSender()

    async def run() -> tuple[int, float]:
        if prime:
            await sender.run(make, router, PRIME_RATE_PER_S, prime / PRIME_RATE_PER_S)
        primed = sender.sent
        if rate_per_s <= 0:
            await asyncio.sleep(seconds)
            return 0, seconds
        took = await sender.run(make, router, rate_per_s, seconds)
        return sender.sent - primed, took

    return asyncio.run(run())


def legit(port: int, cafile: str, delay_s: float, seconds: float, lanes: int,
          transfer_bytes: int) -> dict[str, Any]:
    """After ``delay_s``, aioquic connections to ``stargate-0`` on ``lanes`` lanes for ``seconds``:
    {"ok", "failed": {reason: count}, "p50_ms", "p99_ms"} (the latencies of those that worked; None: none did)."""
    result = Legit()

    async def run() -> None:
        await asyncio.sleep(delay_s)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, stop.set)
        await aioquic_lanes(port, Path(cafile), result, stop, lanes, transfer_bytes, pods=(LEGIT_POD,))

    asyncio.run(run())
    ordered = sorted(result.seconds)
    failed: dict[str, int] = {}
    for reason in result.failed:
        failed[reason[:80]] = failed.get(reason[:80], 0) + 1
    return {"ok": sum(result.ok.values()), "failed": failed,
            "p50_ms": ordered[len(ordered) // 2] * 1000 if ordered else None,
            "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000 if ordered else None}
