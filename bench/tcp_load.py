"""TCP load generators and pods; every function here runs inside an ``Agent`` process.

The client side of the TLS scenarios opens each connection with a real TLS ClientHello
(made by Python's ``ssl`` for the pod's SNI) and then sends raw bytes; the pods are plain
byte sinks / echo servers that never speak TLS. Router and HAProxy do exactly their
production work on such a connection (peek the ClientHello, pick the pod by SNI, splice)
while no cipher runs at the endpoints, whose CPU would otherwise dominate the measurement.
Pods serve from background threads, so an agent keeps answering calls meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import threading
import time
from typing import Any

BLOCK = 1024 * 1024
_STATE: dict[str, Any] = {}


def tls_client_hello(server_name: str) -> bytes:
    """The first flight of a real TLS 1.3 client for ``server_name`` (one ClientHello record)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def _listener(host: str, backlog: int = 4096) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(backlog)
    return sock


def _serve_threads(listener: socket.socket, handle: Any) -> None:
    def accept_forever() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_forever, daemon=True).start()


# ---------------------------------------------------------------------------------------
# Bulk: a sink pod that counts bytes and a pump client
# ---------------------------------------------------------------------------------------
def _sink_connection(conn: socket.socket) -> None:
    buf = bytearray(BLOCK)
    total = 0
    with conn:
        try:
            while n := conn.recv_into(buf):
                total += n
            conn.sendall(struct.pack("!Q", total))
        except OSError:
            return


def start_bulk_sink(host: str) -> int:
    """A pod that reads each connection to EOF, then answers the byte count (8 bytes)."""
    listener = _listener(host)
    _serve_threads(listener, _sink_connection)
    return int(listener.getsockname()[1])


def _pump(sock: socket.socket, prefix: bytes, nbytes: int, results: list[int]) -> None:
    block = memoryview(bytes(range(256)) * (BLOCK // 256))
    try:
        sock.sendall(prefix)
        left = nbytes
        while left > 0:
            chunk = block[: min(left, BLOCK)]
            sock.sendall(chunk)
            left -= len(chunk)
        sock.shutdown(socket.SHUT_WR)
        ack = b""
        while len(ack) < 8:
            more = sock.recv(8 - len(ack))
            if not more:
                break
            ack += more
        results.append(struct.unpack("!Q", ack)[0] if len(ack) == 8 else -1)
    except OSError:
        results.append(-1)
    finally:
        sock.close()


def bulk_send(addr: tuple[str, int], conns: int, nbytes: int, prefix: bytes) -> float:
    """Push ``nbytes`` (after ``prefix``) on each of ``conns`` connections; seconds until the
    sink acknowledged every byte. Raises if any connection lost bytes."""
    socks = [socket.create_connection(addr, timeout=30) for _ in range(conns)]
    results: list[int] = []
    threads = [threading.Thread(target=_pump, args=(s, prefix, nbytes, results)) for s in socks]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    expected = len(prefix) + nbytes
    if sorted(results) != [expected] * conns:
        raise RuntimeError(f"bulk: sink acknowledged {results}, expected {expected} per connection")
    return elapsed


# ---------------------------------------------------------------------------------------
# New connections: an echo pod and a closed-loop client at fixed concurrency
# ---------------------------------------------------------------------------------------
class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def eof_received(self) -> bool:
        return False  # close our side too


def _run_loop_forever(started: threading.Event, box: list[Any], setup: Any) -> None:
    import uvloop

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    box.append(loop.run_until_complete(setup()))
    started.set()
    loop.run_forever()


def start_echo_pod(host: str) -> int:
    """A uvloop echo server (one thread) on ``host``; returns its port."""
    async def setup() -> int:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Echo, host, 0, backlog=4096)
        _STATE.setdefault("servers", []).append(server)
        return int(server.sockets[0].getsockname()[1])

    started, box = threading.Event(), list[int]()
    threading.Thread(target=_run_loop_forever, args=(started, box, setup), daemon=True).start()
    started.wait(10)
    return int(box[0])


async def _connect_echo_close(loop: asyncio.AbstractEventLoop, addr: tuple[str, int], message: bytes,
                              buf: bytearray) -> None:
    sock = socket.socket()
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, addr)
        await loop.sock_sendall(sock, message)
        got = 0
        view = memoryview(buf)
        while got < len(message):
            n = await loop.sock_recv_into(sock, view)
            if not n:
                raise ConnectionError(f"closed after {got} of {len(message)} bytes")
            got += n
    finally:
        sock.close()


def connection_rate(addr: tuple[str, int], seconds: float, concurrency: int, message: bytes
                    ) -> tuple[int, int, float]:
    """Connect, send ``message``, read its echo, close; ``concurrency`` at a time for
    ``seconds``. Returns (completed, failed, elapsed seconds)."""
    import uvloop

    async def main() -> tuple[int, int, float]:
        loop = asyncio.get_running_loop()
        counts = [0, 0]
        started = time.perf_counter()
        deadline = started + seconds

        async def worker() -> None:
            buf = bytearray(len(message) + 4096)
            while time.perf_counter() < deadline:
                try:
                    await _connect_echo_close(loop, addr, message, buf)
                    counts[0] += 1
                except OSError:
                    counts[1] += 1
                    await asyncio.sleep(0.001)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return counts[0], counts[1], time.perf_counter() - started

    return uvloop.run(main())


# ---------------------------------------------------------------------------------------
# Idle connections (memory): a pod that holds what it accepts, a client that opens many
# ---------------------------------------------------------------------------------------
def start_hold_pod(host: str) -> int:
    """A pod that accepts and keeps every connection without reading; ``held()`` counts."""
    listener = _listener(host, backlog=65535)
    held: list[socket.socket] = []
    _STATE["held"] = held

    def accept_forever() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError as exc:
                _STATE["hold_error"] = str(exc)
                time.sleep(0.01)
                continue
            held.append(conn)

    threading.Thread(target=accept_forever, daemon=True).start()
    return int(listener.getsockname()[1])


def held() -> int:
    return len(_STATE.get("held", ()))


def release_held() -> None:
    for sock in _STATE.get("held", []):
        sock.close()
    _STATE.get("held", []).clear()


def open_idle(addr: tuple[str, int], count: int, prefix: bytes) -> int:
    """Open ``count`` connections that send ``prefix`` and then stay idle; returns how many."""
    socks: list[socket.socket] = _STATE.setdefault("idle", [])
    for _ in range(count):
        sock = socket.create_connection(addr, timeout=30)
        sock.sendall(prefix)
        socks.append(sock)
    return len(socks)


def close_idle() -> None:
    for sock in _STATE.get("idle", []):
        sock.close()
    _STATE.get("idle", []).clear()
