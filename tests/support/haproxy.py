"""Debian's HAProxy in front of the router, as a Gateway would be: TCP mode, PROXY header on.

Two frontends on loopback, each a plain TCP pass-through to the router's gRPC listener:
``v2_port`` sends ``send-proxy-v2``, ``v1_port`` sends ``send-proxy``. HAProxy binds its
backend connections' source to ``source_ip`` (another loopback address, 127.0.0.9 by
default), so the router's socket peer is HAProxy's address while the header names the
client (127.0.0.1): tests can tell the two apart.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import TracebackType

from bench.procs import PeerProcess, free_port, haproxy_binary

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


def haproxy_available() -> bool:
    return haproxy_binary() is not None


class HaproxyFront(PeerProcess):
    """HAProxy run as a child until ``close`` (or the ``with`` block ends); the bench's start and stop."""

    def __init__(self, router_port: int, *, router_host: str = "127.0.0.1", source_ip: str = "127.0.0.9") -> None:
        binary = haproxy_binary()
        if binary is None:
            raise RuntimeError("haproxy is not installed")
        self.source_ip = source_ip
        self.v2_port, self.v1_port = free_port(), free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="haproxy-front-")
        self.config = Path(self._dir.name) / "haproxy.cfg"
        self.config.write_text(CONFIG.format(
            v2_port=self.v2_port, v1_port=self.v1_port, router_host=router_host,
            router_port=router_port, source_ip=source_ip,
        ))
        self._start([binary, "-db", "-q", "-f", str(self.config)], [self.v2_port, self.v1_port], False, "haproxy")

    def port(self, version: int) -> int:
        """The frontend that sends PROXY ``version`` (1 or 2)."""
        return self.v2_port if version == 2 else self.v1_port

    def close(self) -> None:
        super().close()
        self._dir.cleanup()

    def __enter__(self) -> HaproxyFront:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
