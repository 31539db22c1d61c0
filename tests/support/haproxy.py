"""Debian's HAProxy in front of the router, as a Gateway would be: TCP mode, PROXY header on.

Two frontends on loopback, each a plain TCP pass-through to the router's gRPC listener:
``v2_port`` sends ``send-proxy-v2``, ``v1_port`` sends ``send-proxy``. HAProxy binds its
backend connections' source to ``source_ip`` (another loopback address, 127.0.0.9 by
default), so the router's socket peer is HAProxy's address while the header names the
client (127.0.0.1): tests can tell the two apart.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

HAPROXY_BINARY = "/usr/sbin/haproxy"
"""Debian's package (``apt-get install haproxy``)."""

START_TIMEOUT_S = 10.0
"""HAProxy binds in milliseconds; longer means it failed (its stderr is in the error)."""

CONFIG = """global
    maxconn 256
defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend proxy_v2
    bind 127.0.0.1:{v2_port}
    default_backend router_v2
frontend proxy_v1
    bind 127.0.0.1:{v1_port}
    default_backend router_v1
backend router_v2
    server router {router_host}:{router_port} send-proxy-v2 source {source_ip}
backend router_v1
    server router {router_host}:{router_port} send-proxy source {source_ip}
"""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def listening_tcp_ports() -> set[int]:
    """IPv4 ports in LISTEN state, from ``/proc/net/tcp``: probing by connecting would send
    HAProxy, and so the router, a connection the test did not ask for."""
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A":
            ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


def haproxy_available() -> bool:
    return Path(shutil.which("haproxy") or HAPROXY_BINARY).exists()


class HaproxyFront:
    """HAProxy run as a child until ``close`` (or the ``with`` block ends)."""

    def __init__(self, router_port: int, *, router_host: str = "127.0.0.1", source_ip: str = "127.0.0.9") -> None:
        self.source_ip = source_ip
        self.v2_port, self.v1_port = free_port(), free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="haproxy-front-")
        self.config = Path(self._dir.name) / "haproxy.cfg"
        self.config.write_text(CONFIG.format(
            v2_port=self.v2_port, v1_port=self.v1_port, router_host=router_host,
            router_port=router_port, source_ip=source_ip,
        ))
        binary = shutil.which("haproxy") or HAPROXY_BINARY
        self.proc = subprocess.Popen(
            [binary, "-db", "-q", "-f", str(self.config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            self._wait_bound()
        except BaseException:
            self.close()
            raise

    def port(self, version: int) -> int:
        """The frontend that sends PROXY ``version`` (1 or 2)."""
        return self.v2_port if version == 2 else self.v1_port

    def _wait_bound(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = {self.v2_port, self.v1_port}
        while pending:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}: {err[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not bind {sorted(pending)} in {START_TIMEOUT_S} s")
            pending -= listening_tcp_ports()
            time.sleep(0.02)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self._dir.cleanup()

    def __enter__(self) -> HaproxyFront:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
