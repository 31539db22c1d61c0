"""Raw TCP peers of the router for the fault suite: pods that count, drop SYNs, blackhole,
reset, echo, flood or check integrity, and a client read that is bounded in time and size.

Every pod binds a loopback pod address (127.0.0.2+); the router dials it like a real pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import random
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from tests.support.access_peers import RawPod
from tests.support.tls import client_hello, sni_extension

T = TypeVar("T")


def read_to_eof(sock: socket.socket, timeout_s: float = 5.0, limit: int = 1 << 20) -> bytes:
    """Everything the peer sends until it closes (a reset ends it too); bounded in time and size."""
    sock.settimeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    out = bytearray()
    while len(out) < limit and time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    return bytes(out)


class CountingPod:
    """A TCP listener on a pod address that counts accepted connections and closes each at once.

    Proof that a rejected name was never routed: its count does not move.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self._listener = socket.create_server((address, 0), backlog=256)
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._accepted = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name=f"pod-{address}", daemon=True)
        self._thread.start()

    @property
    def accepted(self) -> int:
        with self._lock:
            return self._accepted

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._accepted += 1
            conn.close()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._listener.close()


def closed_port(address: str) -> int:
    """A port on ``address`` that nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


TCP_SYN_SENT = "02"
"""The state column of ``/proc/net/tcp`` for a connect whose SYN is not answered yet."""


class SynDroppingPod:
    """A pod address whose accept queue is full (backlog 0, one queued connection): SYNs are dropped."""

    def __init__(self, address: str) -> None:
        self._listener = socket.create_server((address, 0), backlog=0)
        self.port: int = self._listener.getsockname()[1]
        self._filler = socket.create_connection((address, self.port), timeout=2)
        self._remote = f"{int.from_bytes(socket.inet_aton(address), 'little'):08X}:{self.port:04X}"

    def dials_waiting(self) -> int:
        """Connections to this pod in SYN-SENT (``/proc/net/tcp``): dialled, their SYN dropped."""
        with open("/proc/net/tcp") as table:
            next(table)
            return sum(1 for line in table if (f := line.split())[2] == self._remote and f[3] == TCP_SYN_SENT)

    def close(self) -> None:
        self._filler.close()
        self._listener.close()


class ResettingProxy:
    """A pod address forwarding to a real grpcio pod until ``reset_all`` RSTs every connection."""

    def __init__(self, address: str, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._writers: list[asyncio.StreamWriter] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="resetting-proxy", daemon=True)
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._handle, address, 0))
        self.port: int = self._server.sockets[0].getsockname()[1]

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def reset_all(self) -> int:
        async def reset() -> int:
            count = len(self._writers) // 2
            for writer in self._writers:
                with contextlib.suppress(OSError):
                    writer.get_extra_info("socket").setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                writer.transport.abort()
            self._writers.clear()
            return count

        return self._call(reset())

    def close(self) -> None:
        self.reset_all()
        self._server.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class BlackholePod(RawPod):
    """Accepts and then never reads or answers; keeps every connection until ``close``."""

    def __init__(self, address: str) -> None:
        super().__init__(address, "hold")
        for sock in self.held:
            sock.close()


STREAM_HEADER = struct.Struct("!QQ")
"""After the ClientHello record: stream id, bytes the pod is to send back."""


class IntegrityPods:
    """Raw pods behind TLS-SNI routing: skip the ClientHello record, then a raw byte stream.

    Per connection the pod hashes what it receives until EOF and, at the same time, sends the
    random bytes the header asks for, then half-closes; it records both digests by stream id.
    """

    def __init__(self) -> None:
        self.results: dict[int, tuple[str, str, str]] = {}
        """stream id -> (pod name, sha256 received, sha256 sent)."""
        self.servers: list[asyncio.Server] = []
        self.rows: list[tuple[str, str, int, int]] = []

    async def start(self, pods: list[tuple[str, str]]) -> None:
        for name, address in pods:
            server = await asyncio.start_server(
                functools.partial(self._serve, name), address, 0, limit=1 << 20, backlog=1024
            )
            self.servers.append(server)
            self.rows.append((name, address, server.sockets[0].getsockname()[1], 1))

    async def _serve(self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            record_header = await reader.readexactly(5)
            await reader.readexactly(int.from_bytes(record_header[3:5], "big"))
            stream_id, down_size = STREAM_HEADER.unpack(await reader.readexactly(STREAM_HEADER.size))
            down = os.urandom(down_size)

            async def send() -> None:
                for i in range(0, len(down), 64 * 1024):
                    writer.write(down[i : i + 64 * 1024])
                    await writer.drain()
                writer.write_eof()

            sender = asyncio.create_task(send())
            got = hashlib.sha256()
            while chunk := await reader.read(1 << 20):
                got.update(chunk)
            await sender
            self.results[stream_id] = (name, got.hexdigest(), hashlib.sha256(down).hexdigest())
        finally:
            writer.close()

    def close(self) -> None:
        for server in self.servers:
            server.close()


async def integrity_client(
    port: int, stream_id: int, pod: str, server_name: str, up_size: int, down_size: int, pod_first: bool,
    rng: random.Random,
) -> tuple[str, str, str]:
    """One stream routed by ``server_name`` to ``pod``; returns (pod, sha256 sent, sha256 received)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    try:
        writer.write(client_hello([sni_extension(server_name.encode())]) + STREAM_HEADER.pack(stream_id, down_size))
        up = os.urandom(up_size)
        got = hashlib.sha256()

        async def receive() -> None:
            while chunk := await reader.read(1 << 20):
                got.update(chunk)

        async def send() -> None:
            pos = 0
            while pos < len(up):
                step = rng.randint(1, 256 * 1024)
                writer.write(up[pos : pos + step])
                await writer.drain()
                pos += step
            writer.write_eof()

        if pod_first:  # the pod->client half closes first; client->pod keeps flowing afterwards
            await receive()
            await send()
        else:
            await asyncio.gather(send(), receive())
        return pod, hashlib.sha256(up).hexdigest(), got.hexdigest()
    finally:
        writer.close()


async def echo_pod(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A raw pod that sends back every byte it reads, then half-closes."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.write_eof()
    except OSError:
        pass
    finally:
        writer.close()


async def flooding_pod(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Skips the ClientHello record, then writes as fast as the router takes it (until cut)."""
    chunk = os.urandom(256 * 1024)
    try:
        record_header = await reader.readexactly(5)
        await reader.readexactly(int.from_bytes(record_header[3:5], "big"))
        for _ in range(4096):  # at most 1 GiB per connection; flow control stops it far earlier
            writer.write(chunk)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()
