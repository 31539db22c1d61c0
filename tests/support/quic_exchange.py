"""One QUIC stream between a real aioquic client and a real aioquic pod, through a router under test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from aioquic.asyncio import connect, serve
from aioquic.quic.configuration import QuicConfiguration

from router.demo.pki import DemoPki
from router.demo.quic_pods import ALPN, client_configuration

ROUTER_HOST, POD_HOST = "127.0.0.1", "127.0.0.2"
SNI = "stargate-0.stargate.external"
TIMEOUT_S = 5.0


@asynccontextmanager
async def answering_pod(pki: DemoPki, respond: Callable[[bytes], bytes]) -> AsyncIterator[int]:
    """A real aioquic pod on ``POD_HOST`` that answers each stream with ``respond(all it read)``;
    yields its port."""
    tasks: set[asyncio.Task[None]] = set()

    def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def serve_stream() -> None:
            writer.write(respond(await reader.read()))
            writer.write_eof()

        tasks.add(asyncio.get_running_loop().create_task(serve_stream()))

    config = QuicConfiguration(is_client=False, alpn_protocols=[ALPN])
    config.load_cert_chain(str(pki.cert_path), str(pki.key_path))
    server = await serve(POD_HOST, 0, configuration=config, stream_handler=handler)
    try:
        yield server._transport.get_extra_info("sockname")[1]
    finally:
        server.close()


async def quic_exchange(
    pki: DemoPki,
    request: bytes,
    answer: bytes,
    router_to: Callable[[int], AbstractAsyncContextManager[int]],
) -> tuple[bytes, bytes]:
    """The client sends ``request`` on one stream to the router that ``router_to(pod_port)``
    runs (yielding its port on ``ROUTER_HOST``); the pod on ``POD_HOST`` answers ``answer``.
    Returns (what the pod read, what the client read)."""
    received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def respond(data: bytes) -> bytes:
        received.set_result(data)
        return answer

    async with answering_pod(pki, respond) as pod_port, router_to(pod_port) as port:
        client_config = client_configuration(SNI, Path(pki.ca_path))
        async with connect(ROUTER_HOST, port, configuration=client_config) as client:
            reader, writer = await client.create_stream()
            writer.write(request)
            writer.write_eof()
            got = await asyncio.wait_for(reader.read(), TIMEOUT_S)
        return await asyncio.wait_for(received, TIMEOUT_S), got
