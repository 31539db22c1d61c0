"""The router process seen from outside, for the fault suite: real gRPC calls through it, its fds,
RSS and CPU time from ``/proc`` (summed over a supervisor and its workers), and its connection
counters from a live scrape."""

from __future__ import annotations

import os
import queue
import resource
import threading
import time
from collections.abc import Iterator, Sequence

import grpc

from router import constants as c
from router.demo.grpc_pods import ECHO, call_whoami
from tests.support.polling import becomes_true_blocking
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


Pids = int | Sequence[int]
"""One process, or every process of one router (``RouterProcess.all_pids()``): a probe sums over them."""


def _each(pids: Pids) -> Sequence[int]:
    return (pids,) if isinstance(pids, int) else pids


def open_fds(pids: Pids) -> int:
    """File descriptors the processes hold now."""
    return sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in _each(pids))


CHART_PEAK_RSS_KIB = 200 * 1024
"""The Rust router's chart limits the container to 256 MiB: the router's peak RSS stays under
~200 MiB, leaving the rest to the kernel's socket memory (charged to the same cgroup)."""


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def rss_kib(pids: Pids) -> int:
    """Resident set size of the processes in KiB."""
    return sum(_status_kib(pid, "VmRSS") for pid in _each(pids))


def peak_rss_kib(pids: Pids) -> int:
    """The highest resident set size each process ever had, summed, in KiB (``VmHWM``): no sample
    misses a peak, and the sum of the peaks is never below what the processes held at once."""
    return sum(_status_kib(pid, "VmHWM") for pid in _each(pids))


def settle_fds(pids: Pids, at_most: int, timeout_s: float = 10.0) -> int:
    """Wait (bounded) until the processes hold at most ``at_most`` fds; returns the last count."""
    becomes_true_blocking(lambda: open_fds(pids) <= at_most, timeout_s, 0.05)
    return open_fds(pids)


TCP_LISTEN, TCP_TIME_WAIT = "0A", "06"
"""``/proc/net/tcp`` states that hold no connection's socket open: a listener, a closed one's wait."""


def open_tcp_connections(*ports: int) -> int:
    """Loopback TCP sockets with one of ``ports`` at either end that are still open (not a listener,
    not TIME-WAIT): a connection whose two ends are both closed counts no more (``/proc/net/tcp``)."""
    wanted = {f"{port:04X}" for port in ports}
    with open("/proc/net/tcp") as table:
        next(table)
        return sum(
            1 for line in table
            if (f := line.split())[3] not in (TCP_LISTEN, TCP_TIME_WAIT)
            and (f[1].rpartition(":")[2] in wanted or f[2].rpartition(":")[2] in wanted)
        )


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


def cpu_seconds(pids: Pids) -> float:
    """CPU time (user + system) the processes have used so far."""
    ticks = 0
    for pid in _each(pids):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def echo_stream(channel: grpc.Channel) -> tuple[queue.Queue[bytes | None], Iterator[bytes]]:
    """An open bidirectional Echo call: put messages (None ends it), iterate the replies."""
    outbox: queue.Queue[bytes | None] = queue.Queue()

    def requests() -> Iterator[bytes]:
        while (message := outbox.get(timeout=30)) is not None:
            yield message

    echo = channel.stream_stream(ECHO, request_serializer=bytes, response_deserializer=bytes)
    return outbox, echo(requests(), timeout=30)
