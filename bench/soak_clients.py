"""The soak's clients, run inside ``Agent`` processes for the whole soak (``bench.soak``).

Real grpcio (a new channel, so a new TCP connection, per call) and real aioquic (a new QUIC
connection per round trip): some from the ephemeral range, some from a small pool of local ports
reused the moment they are free (as a NAT reuses ports, while the router still holds the closed
connection's flow), and some several at once on one socket (``tests.support.shared_socket``, as a
quinn endpoint holds them). Each call returns its counts once ``seconds`` have passed.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import threading
import time
from collections import Counter
from pathlib import Path

import grpc

from router.demo.grpc_pods import WHOAMI as GRPC_WHOAMI
from router.demo.quic_pods import WHOAMI, client_configuration, request

QUIC_TIMEOUT_S = 5.0
GRPC_TIMEOUT_S = 5.0


def _identity(b: bytes) -> bytes:
    return b


def grpc_calls(target: str, pods: list[str], names: list[str], seconds: float, threads: int) -> dict[str, int]:
    """Unary WhoAmI calls, each on a new channel (a new connection), ``threads`` at a time, for
    ``seconds``: {"ok": n, "<status code>": n, "wrong_pod": n}."""
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def run(offset: int) -> None:
        for i in itertools.count(offset):
            if time.monotonic() > deadline:
                return
            pod, name = pods[i % len(pods)], names[i % len(names)]
            options = [("grpc.default_authority", name), ("grpc.use_local_subchannel_pool", 1)]
            try:
                with grpc.insecure_channel(target, options=options) as channel:
                    stub = channel.unary_unary(GRPC_WHOAMI, request_serializer=_identity,
                                               response_deserializer=_identity)
                    answer = stub(b"", timeout=GRPC_TIMEOUT_S)
                outcome = "ok" if answer.decode().startswith(pod) else "wrong_pod"
            except grpc.RpcError as exc:
                outcome = str(exc.code())  # type: ignore[attr-defined]
            with lock:
                counts[outcome] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return dict(counts)


def quic_connections(host: str, port: int, pods: list[str], names: list[str], cafile: str, seconds: float,
                     concurrency: int, reused_ports: list[int]) -> dict[str, int]:
    """aioquic connections (handshake, one stream round trip, close) for ``seconds``: a third from
    ephemeral ports, a third from ``reused_ports``, a third two at once on one socket (to both
    pods): {"ok": n, "<failure>": n}."""
    from tests.support.shared_socket import open_shared_socket

    counts: Counter[str] = Counter()
    free_ports = list(reused_ports)

    async def one(i: int) -> None:
        pod, name = pods[i % len(pods)], names[i % len(names)]
        config = client_configuration(name, Path(cafile))
        local_port = free_ports.pop(0) if i % 3 == 1 and free_ports else 0
        try:
            from aioquic.asyncio import connect

            async with connect(host, port, configuration=config, local_port=local_port) as client:
                answer = await asyncio.wait_for(request(client, WHOAMI), QUIC_TIMEOUT_S)
            counts["ok" if answer.startswith(pod.encode()) else "wrong_pod"] += 1
        finally:
            if local_port:
                free_ports.append(local_port)

    async def two_on_one_socket(i: int) -> None:
        shared = await open_shared_socket(host)
        try:
            for k in range(2):
                pod, name = pods[(i + k) % len(pods)], names[(i + k) % len(names)]
                connection = await asyncio.wait_for(
                    shared.connect((host, port), client_configuration(name, Path(cafile))), QUIC_TIMEOUT_S)
                answer = await asyncio.wait_for(request(connection, WHOAMI), QUIC_TIMEOUT_S)
                counts["ok" if answer.startswith(pod.encode()) else "wrong_pod"] += 1
        finally:
            shared.close()

    async def worker(offset: int, deadline: float) -> None:
        for i in itertools.count(offset, concurrency):
            if time.monotonic() > deadline:
                return
            kind = ("ephemeral", "reused_port", "shared_socket")[i % 3]
            try:
                await (two_on_one_socket(i) if kind == "shared_socket" else one(i))
            except (ConnectionError, TimeoutError) as exc:
                counts[f"{kind}: {type(exc).__name__} {exc}"[:80]] += 1
            except OSError as exc:
                counts["local_port_busy" if exc.errno == errno.EADDRINUSE else f"{kind}: errno {exc.errno}"] += 1

    async def main() -> None:
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(worker(k, deadline) for k in range(concurrency)))

    asyncio.run(main())
    return dict(counts)
