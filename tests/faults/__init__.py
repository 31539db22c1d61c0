"""Fault suite: the router process against hostile clients, failing pods and a misbehaving API.

Loopback only (router on 127.0.0.1, pods on 127.0.0.2+), every loop bounded in count and
time. The pieces the fault modules share live here: probes of the router process
(``/proc`` fds and RSS), hand-built TLS ClientHellos, and small raw TCP pods.
"""

from __future__ import annotations

import os
import resource
import socket
import threading
import time
from collections.abc import Sequence

import grpc

from router import constants as c
from router.demo.grpc_pods import call_whoami
from tests.support.router_process import RouterProcess

GRPC_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (("grpc.use_local_subchannel_pool", 1),)
"""Every channel dials its own connection: grpcio otherwise shares subchannels across channels."""


def h2c_channel(router: RouterProcess, authority: str) -> grpc.Channel:
    """A grpcio h2c channel to the router naming ``authority``, on a connection of its own."""
    return grpc.insecure_channel(
        f"127.0.0.1:{router.grpc_port}",
        options=[("grpc.default_authority", authority), *GRPC_CHANNEL_OPTIONS],
    )


def timed_whoami(router: RouterProcess, authority: str, timeout_s: float = 10.0) -> tuple[str, float]:
    """(the answering pod, or the status code's name; seconds) of one WhoAmI on a new connection."""
    started = time.monotonic()
    with h2c_channel(router, authority) as channel:
        try:
            answer = call_whoami(channel, timeout=timeout_s)
        except grpc.RpcError as err:
            answer = err.code().name
    return answer, time.monotonic() - started


class WhoAmIProbe(threading.Thread):
    """Real grpcio calls through the router, each on a new connection, every ``interval_s``.

    Runs until ``stop()`` or ``max_calls``; ``results`` holds (start time, answer, seconds).
    """

    def __init__(
        self, router: RouterProcess, authority: str, interval_s: float = 0.2, max_calls: int = 1000,
    ) -> None:
        super().__init__(daemon=True, name=f"probe-{authority}")
        self.router, self.authority = router, authority
        self.interval_s, self.max_calls = interval_s, max_calls
        self.results: list[tuple[float, str, float]] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set() and len(self.results) < self.max_calls:
            started = time.monotonic()
            answer, elapsed = timed_whoami(self.router, self.authority)
            self.results.append((started, answer, elapsed))
            self._stopping.wait(self.interval_s)

    def stop(self, timeout_s: float = 15.0) -> list[tuple[float, str, float]]:
        self._stopping.set()
        self.join(timeout_s)
        return self.results

    def failures(self, expected: str) -> list[tuple[float, str, float]]:
        return [r for r in self.results if r[1] != expected]

    @property
    def max_latency_s(self) -> float:
        return max((r[2] for r in self.results), default=0.0)


# ---------------------------------------------------------------------------
# The router process, seen from outside
# ---------------------------------------------------------------------------
def raise_nofile_limit() -> int:
    """Lift this process's RLIMIT_NOFILE soft limit to the hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_fds(pid: int) -> int:
    """File descriptors the process holds now."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid: int) -> int:
    """Resident set size of the process in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def settle_fds(pid: int, at_most: int, timeout_s: float = 10.0) -> int:
    """Wait (bounded) until the process holds at most ``at_most`` fds; returns the last count."""
    deadline = time.monotonic() + timeout_s
    count = open_fds(pid)
    while count > at_most and time.monotonic() < deadline:
        time.sleep(0.05)
        count = open_fds(pid)
    return count


def outcome_count(router: RouterProcess, protocol: str, outcome: str) -> float:
    """``stargate_k8s_router_grpc_connections_total{protocol,outcome}`` from a live scrape."""
    return router.metric(c.GRPC_CONNECTIONS_TOTAL + "_total", protocol=protocol, outcome=outcome)


def outcome_counts(router: RouterProcess) -> dict[tuple[str, str], float]:
    """Every (protocol, outcome) series of the TCP connection counter, from one scrape."""
    _status, body = router.http_get("/metrics")
    prefix = c.GRPC_CONNECTIONS_TOTAL + "_total{"
    counts: dict[tuple[str, str], float] = {}
    for line in body.splitlines():
        if not line.startswith(prefix):
            continue
        series, _, value = line.rpartition(" ")
        labels = dict(
            part.split("=", 1) for part in series[len(prefix) : -1].split(",") if "=" in part
        )
        counts[labels["protocol"].strip('"'), labels["outcome"].strip('"')] = float(value)
    return counts


def moved(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict[str, float]:
    """The series that changed between two scrapes, as ``protocol/outcome -> delta``."""
    return {f"{p}/{o}": after[p, o] - before.get((p, o), 0.0)
            for p, o in after if after[p, o] != before.get((p, o), 0.0)}


# ---------------------------------------------------------------------------
# TLS ClientHellos built by hand (real clients refuse to send hostile names)
# ---------------------------------------------------------------------------
TLS_RECORD_MAX_FRAGMENT = 2**14
"""A handshake message longer than this is split over several records (RFC 8446 section 5.1)."""


def _vector(length_bytes: int, body: bytes) -> bytes:
    return len(body).to_bytes(length_bytes, "big") + body


def extension(ext_type: int, body: bytes) -> bytes:
    return ext_type.to_bytes(2, "big") + _vector(2, body)


def sni_extension(*names: bytes, name_type: int = 0) -> bytes:
    """server_name (RFC 6066 section 3) listing ``names``, every one with ``name_type``."""
    entries = b"".join(bytes([name_type]) + _vector(2, name) for name in names)
    return extension(0, _vector(2, entries))


def alpn_extension(*protocols: bytes) -> bytes:
    return extension(16, _vector(2, b"".join(_vector(1, p) for p in protocols)))


def client_hello(extensions: Sequence[bytes]) -> bytes:
    """A syntactically valid TLS 1.2-style ClientHello carrying ``extensions``, as records."""
    body = (
        b"\x03\x03" + os.urandom(32) + _vector(1, os.urandom(32))
        + _vector(2, b"\x13\x01\xc0\x2f") + _vector(1, b"\x00")
        + _vector(2, b"".join(extensions))
    )
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return tls_records(handshake)


def tls_records(handshake: bytes) -> bytes:
    """Handshake bytes wrapped in as many handshake records as they need."""
    out = bytearray()
    for i in range(0, len(handshake), TLS_RECORD_MAX_FRAGMENT):
        fragment = handshake[i : i + TLS_RECORD_MAX_FRAGMENT]
        out += b"\x16\x03\x01" + _vector(2, fragment)
    return bytes(out)


def append_extension(record: bytes, ext: bytes) -> bytes:
    """A one-record ClientHello (e.g. from a real ``ssl`` client) with ``ext`` appended."""
    handshake = bytearray(record[5:])
    pos = 4 + 2 + 32
    pos += 1 + handshake[pos]  # legacy_session_id
    pos += 2 + int.from_bytes(handshake[pos : pos + 2], "big")  # cipher_suites
    pos += 1 + handshake[pos]  # legacy_compression_methods
    ext_len = int.from_bytes(handshake[pos : pos + 2], "big") + len(ext)
    handshake[pos : pos + 2] = ext_len.to_bytes(2, "big")
    handshake += ext
    handshake[1:4] = (len(handshake) - 4).to_bytes(3, "big")
    return tls_records(bytes(handshake))


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


# ---------------------------------------------------------------------------
# A raw pod that only counts what reaches it
# ---------------------------------------------------------------------------
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
