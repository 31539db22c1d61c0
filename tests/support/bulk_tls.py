"""Both ends of a byte-exact bulk transfer over real TLS, routed by SNI through the router.

The pod is a plain TLS peer (no gRPC) that sends ``down`` while hashing what it receives;
the client sends ``up`` while hashing what it receives. Both directions run at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import Callable

from router.demo.pki import DemoPki
from tests.support.polling import deliberate_pause

CHUNK = 1 << 20


async def _send(writer: asyncio.StreamWriter, data: bytes, chunk: int, pace_s: float) -> None:
    for i in range(0, len(data), chunk):
        writer.write(data[i : i + chunk])
        await writer.drain()
        if pace_s:
            await deliberate_pause(pace_s, "a paced sender: the gap between chunks is the load's shape")


class BulkTlsPod:
    """A TLS server on ``host`` that streams ``down`` and hashes ``expect_up`` bytes of input."""

    def __init__(self, pki: DemoPki, down: bytes, expect_up: int, chunk: int = CHUNK, pace_s: float = 0.0) -> None:
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._ctx.load_cert_chain(pki.cert_path, pki.key_path)
        self._down, self._expect_up, self._chunk, self._pace_s = down, expect_up, chunk, pace_s
        self.received = hashlib.sha256()
        self.done = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self, host: str) -> int:
        self._server = await asyncio.start_server(self._handle, host, 0, ssl=self._ctx)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sender = asyncio.create_task(_send(writer, self._down, self._chunk, self._pace_s))
        remaining = self._expect_up
        while remaining:
            data = await reader.read(CHUNK)
            if not data:
                break
            self.received.update(data)
            remaining -= len(data)
        await sender
        writer.close()
        self.done.set()


async def bulk_tls_client(
    port: int,
    pki: DemoPki,
    server_name: str,
    up: bytes,
    down_size: int,
    *,
    chunk: int = CHUNK,
    pace_s: float = 0.0,
    on_progress: Callable[[int], None] | None = None,
) -> str:
    """Send ``up`` while receiving ``down_size`` bytes; returns the sha256 of what was received."""
    ctx = ssl.create_default_context(cadata=pki.ca_pem.decode())
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=server_name)
    got = hashlib.sha256()
    sender = asyncio.create_task(_send(writer, up, chunk, pace_s))
    received = 0
    while received < down_size:
        data = await asyncio.wait_for(reader.read(CHUNK), 20)
        if not data:
            raise ConnectionError(f"connection cut after {received} of {down_size} bytes")
        got.update(data)
        received += len(data)
        if on_progress is not None:
            on_progress(received)
    await sender
    writer.close()
    return got.hexdigest()
