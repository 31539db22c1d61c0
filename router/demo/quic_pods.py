"""Stargate-like QUIC pods for the tests and the demo: real aioquic servers that say who they are.

A client opens a bidirectional stream, sends a payload and FIN; the pod answers
``<pod_name>:<payload>`` and FIN. So one round trip proves the handshake, both directions
of a stream, and which pod the router picked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer, serve
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, QuicEvent
from aioquic.quic.packet import QuicProtocolVersion

ALPN = "stargate-whoami"
"""ALPN both sides offer; any value works since the router only reads the SNI."""

WHOAMI = b"whoami"
REQUEST_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 64 * 1024

QUIC_V1 = int(QuicProtocolVersion.VERSION_1)
QUIC_V2 = int(QuicProtocolVersion.VERSION_2)


StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], None]


async def read_to_end(reader: asyncio.StreamReader, limit: int = MAX_REQUEST_BYTES) -> bytes:
    """A stream's bytes up to its end (at most ``limit``): one ``read`` may return a first part only."""
    received = bytearray()
    while len(received) < limit and (chunk := await reader.read(limit - len(received))):
        received += chunk
    return bytes(received)


def _answer(pod_name: str) -> StreamHandler:
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            payload = await asyncio.wait_for(read_to_end(reader), REQUEST_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            writer.close()
            return
        writer.write(pod_name.encode() + b":" + payload)
        writer.write_eof()

    def on_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(handle(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    return on_stream


async def start_quic_pod(
    pod_name: str,
    host: str,
    port: int,
    cert_path: str | Path,
    key_path: str | Path,
    *,
    retry: bool = False,
    idle_timeout_s: float = 30.0,
    versions: tuple[int, ...] | None = None,
) -> QuicServer:
    """Serve ``pod_name`` on ``host:port`` (0 = any: see ``bound_port``); ``server.close()`` stops it.
    ``retry``: validate addresses with Retry; ``versions``: those accepted (others get the pod's VN)."""
    config = QuicConfiguration(is_client=False, alpn_protocols=[ALPN], idle_timeout=idle_timeout_s)
    if versions is not None:
        config.supported_versions = list(versions)
    config.load_cert_chain(str(cert_path), str(key_path))
    return await serve(host, port, configuration=config, stream_handler=_answer(pod_name), retry=retry)


def bound_port(server: QuicServer) -> int:
    """The UDP port a pod started with ``port=0`` listens on."""
    transport = server._transport
    assert transport is not None
    return int(transport.get_extra_info("sockname")[1])


def client_configuration(
    server_name: str | None,
    cafile: str | Path,
    version: int = QUIC_V1,
    idle_timeout_s: float = 30.0,
    extra_alpn: tuple[str, ...] = (),
) -> QuicConfiguration:
    """Client settings: trust the test CA, offer our ALPN then ``extra_alpn`` (long names make the
    ClientHello span several Initial datagrams), start with ``version``."""
    config = QuicConfiguration(
        is_client=True,
        alpn_protocols=[ALPN, *extra_alpn],
        server_name=server_name,
        idle_timeout=idle_timeout_s,
        supported_versions=[version, *(v for v in (QUIC_V1, QUIC_V2) if v != version)],
    )
    config.load_verify_locations(cafile=str(cafile))
    return config


async def request(
    client: QuicConnectionProtocol, payload: bytes, timeout_s: float = REQUEST_TIMEOUT_S
) -> bytes:
    """One stream round trip on an open connection: ``payload`` out, the pod's whole answer back (up
    to its end of stream: a path being validated sends it in several packets)."""
    reader, writer = await client.create_stream()
    writer.write(payload)
    writer.write_eof()

    return await asyncio.wait_for(read_to_end(reader), timeout_s)


class _ReasonRecordingProtocol(QuicConnectionProtocol):
    """Keeps the peer's CONNECTION_CLOSE reason phrase, which aioquic's ``connect`` drops."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.close_reason = ""

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ConnectionTerminated):
            self.close_reason = event.reason_phrase
        super().quic_event_received(event)


async def quic_whoami(
    host: str,
    port: int,
    server_name: str | None,
    cafile: str | Path,
    version: int = QUIC_V1,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> str:
    """Connect, ask the pod its name on one stream, close; the pod name it answered."""

    async def run() -> str:
        config = client_configuration(server_name, cafile, version)
        made: list[_ReasonRecordingProtocol] = []

        def factory(*args: Any, **kwargs: Any) -> _ReasonRecordingProtocol:
            made.append(_ReasonRecordingProtocol(*args, **kwargs))
            return made[-1]

        try:
            async with connect(host, port, configuration=config, create_protocol=factory) as client:
                answer = await request(client, WHOAMI, timeout_s)
        except ConnectionError as exc:
            reason = made[-1].close_reason if made else ""
            raise ConnectionError(reason or str(exc)) from None
        name, sep, echoed = answer.partition(b":")
        if not sep or echoed != WHOAMI:
            raise ConnectionError(f"unexpected answer {answer!r}")
        return name.decode()

    return await asyncio.wait_for(run(), timeout_s)
