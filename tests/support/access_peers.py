"""Peers for the access-log and live-view tests: raw TCP pods that end connections in a chosen way,
a raw client that counts every byte it sent and received, and readers of the router's access lines.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from typing import Any

from tests.support.h2 import h2c_grpc_request
from tests.support.polling import eventually_blocking
from tests.support.router_process import RouterProcess

LINGER_RESET = struct.pack("ii", 1, 0)
"""SO_LINGER {on, 0}: close() sends RST instead of FIN."""


def access_lines(router: RouterProcess, since: int = 0) -> list[dict[str, Any]]:
    """The router's access lines so far (``--log-format json``), from its log line ``since`` on."""
    out = []
    for line in router.lines[since:]:
        if '"logger":"router.access"' in line:
            out.append(json.loads(line))
    return out


def wait_access(router: RouterProcess, count: int = 1, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Wait until the router wrote at least ``count`` access lines; all of them."""
    eventually_blocking(lambda: len(access_lines(router)) >= count, timeout_s,
                        what=lambda: f"{count} access lines, got {access_lines(router)}")
    return access_lines(router)


def h2c_request(authority: str) -> bytes:
    """A client's first bytes: preface, SETTINGS and one gRPC request naming ``authority``."""
    return h2c_grpc_request(authority)[1]


SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
"""What a client answers to the router's SETTINGS; the router strips it (the pod never sent one)."""


class RawPod:
    """A TCP pod on ``address`` that serves each connection with ``mode``:

    * ``echo``: echo until the client's EOF, then FIN;
    * ``close_first``: read ``expect`` bytes, send ``b"bye"`` and FIN, then wait for the EOF;
    * ``reset``: read ``expect`` bytes, then RST;
    * ``hold``: accept and never read or answer (closed at ``close``).
    """

    def __init__(self, address: str, mode: str, expect: int = 1) -> None:
        self.mode, self.expect = mode, expect
        self._listener = socket.create_server((address, 0))
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self.held: list[socket.socket] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.held.append(conn)
            if self.mode != "hold":
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket, size: int) -> bytes:
        data = bytearray()
        while len(data) < size and (chunk := conn.recv(65536)):
            data += chunk
        return bytes(data)

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        with contextlib.suppress(OSError):
            if self.mode == "echo":
                while chunk := conn.recv(65536):
                    conn.sendall(chunk)
                conn.shutdown(socket.SHUT_WR)
            elif self.mode == "close_first":
                self._read(conn, self.expect)
                conn.sendall(b"bye")
                conn.shutdown(socket.SHUT_WR)
                while conn.recv(65536):
                    pass
            elif self.mode == "reset":
                self._read(conn, self.expect)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
            conn.close()

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._listener.close()
        for sock in self.held:
            sock.close()


class CountingClient:
    """A raw TCP client to the router that counts what it sent and received."""

    def __init__(self, router: RouterProcess, timeout_s: float = 10.0) -> None:
        self.log_from = len(router.lines)
        """The router's log lines before this connection: an earlier connection from the same
        (reused) port is not this one."""
        self.sock = socket.create_connection(("127.0.0.1", router.grpc_port), timeout=timeout_s)
        ip, port = self.sock.getsockname()[:2]
        self.address = f"{ip}:{port}"
        """The client's address as the router's access line names it."""
        self.sent = 0
        self.received = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)
        self.sent += len(data)

    def read(self, size: int) -> bytes:
        """Read until ``size`` more bytes arrived (or EOF)."""
        want = len(self.received) + size
        while len(self.received) < want and (chunk := self.sock.recv(65536)):
            self.received += chunk
        return bytes(self.received[want - size:])

    def read_to_eof(self) -> bytes:
        with contextlib.suppress(ConnectionResetError):
            while chunk := self.sock.recv(65536):
                self.received += chunk
        return bytes(self.received)

    def reset(self) -> None:
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        self.sock.close()

    def close(self) -> None:
        self.sock.close()


H2C_SETTINGS_BYTES = 9
"""The router's own empty SETTINGS frame (a 9-byte frame header), sent to an h2c client before
its first HEADERS: part of what the client was sent."""
