"""Run the real router (``python -m router``) as a child process for end-to-end tests.

Every listener binds port 0; the router's startup log line tells the test the ports.

``STARGATE_TEST_ROUTER_WORKERS=N`` runs every such router with ``--workers N`` (unless its args
choose ``--workers`` or the test says why it needs one process): the black-box suite then talks to
the supervisor, whose listening line, ``/readyz`` and merged ``/metrics`` stand for all N workers.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from router.demo.command import endpoints_document

_HOST_PORT = r"(\[[^\]]*\]|[^\s:\[\]\"]+):(\d+)"
"""A listener's ``host:port`` (an IPv6 host in brackets), ending at its digits: in a JSON line a
quote and more fields follow it."""
LISTENING = re.compile(rf"listening grpc={_HOST_PORT} quic={_HOST_PORT} health={_HOST_PORT}")

SUITE_WORKERS_ENV = "STARGATE_TEST_ROUTER_WORKERS"
"""How many worker processes every test's router runs (``--workers N``); unset: the router's default."""


def suite_workers() -> int | None:
    """``N`` of ``STARGATE_TEST_ROUTER_WORKERS``, None when unset or empty."""
    value = os.environ.get(SUITE_WORKERS_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{SUITE_WORKERS_ENV}: expected a positive integer, got {value!r}")
    return int(value)


def chooses_workers(args: Sequence[str]) -> bool:
    """Whether ``args`` set ``--workers`` themselves (``--workers N``, ``--workers=N``)."""
    return any(a == "--workers" or a.startswith("--workers=") for a in args)


def workers_in(args: Sequence[str]) -> int:
    """The ``--workers`` value ``args`` end up with (argparse keeps the last), 1 when absent."""
    workers = "1"
    for i, arg in enumerate(args):
        if arg == "--workers" and i + 1 < len(args):
            workers = args[i + 1]
        elif arg.startswith("--workers="):
            workers = arg.partition("=")[2]
    return int(workers) if workers.isdigit() else 1


def suite_workers_args(args: Sequence[str], one_process: str = "") -> list[str]:
    """What the suite adds to ``args``: ``--workers N`` when asked for, unless ``args`` choose
    ``--workers`` or ``one_process`` gives the reason the test needs a single router process."""
    workers = suite_workers()
    if workers is None or one_process or chooses_workers(args):
        return []
    return ["--workers", str(workers)]


class RouterProcess:
    """A router child process; ``stop()`` sends SIGTERM and returns the exit status."""

    def __init__(
        self, args: Sequence[str], env: dict[str, str] | None = None, module: str = "router", one_process: str = ""
    ) -> None:
        """``module``: what ``python -m`` runs; a wrapper (``tests.support.no_io_uring``) runs the router too.
        ``one_process``: why this test needs one router process whatever ``STARGATE_TEST_ROUTER_WORKERS`` says."""
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("POD_NAMESPACE", "demo")
        self.args = [*args, *suite_workers_args(args, one_process)]
        self.workers = workers_in(self.args)
        """How many router processes serve (1: the router itself; more: a supervisor and its workers)."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *self.args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=full_env,
            text=True,
        )
        self.lines: list[str] = []
        self._listening = threading.Event()
        self.grpc_port = self.quic_port = self.health_port = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            m = LISTENING.search(line)
            if m:
                self.grpc_port, self.quic_port, self.health_port = int(m[2]), int(m[4]), int(m[6])
                self._listening.set()

    def wait_listening(self, timeout: float = 20.0) -> None:
        if not self._listening.wait(timeout):
            raise RuntimeError("router did not start:\n" + "\n".join(self.lines[-30:]))

    def http_get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.health_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def wait_exit(self, timeout: float = 20.0) -> int | None:
        """The exit status once the process ended and its stderr is read to the end; None if it is
        still running after ``timeout`` (a router that should have refused to start)."""
        try:
            status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(timeout)
        return status

    def wait_ready(self, timeout: float = 20.0) -> None:
        self.wait_listening(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.http_get("/readyz")[0] == 200:
                return
            time.sleep(0.05)
        raise RuntimeError("router never became ready:\n" + "\n".join(self.lines[-30:]))

    def all_pids(self) -> list[int]:
        """Every process of this router: the router itself, or the supervisor and its live workers
        (its children), so what one router holds (fds, memory, CPU) is summed over all of them."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            workers = [int(pid) for pid in children.read_text().split()]
        except OSError:
            workers = []
        return [self.proc.pid, *workers]

    def metric(self, name: str, **labels: str) -> float:
        """Value of one series from a live ``/metrics`` scrape (KeyError if absent)."""
        _status, body = self.http_get("/metrics")
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
        for line in body.splitlines():
            if line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            if _canonical(series) == want:
                return float(value)
        raise KeyError(want)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise

    def __enter__(self) -> RouterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


STARTED = re.compile(r"worker (\d+) started: pid=(\d+)")
"""The supervisor's line for each worker process it starts (restarts too)."""
BOUND = re.compile(r"worker (\d+) bound .* private-health=(\S+):(\d+)")
"""A worker's startup line as the supervisor re-emits it: its private health port."""


class Supervised(RouterProcess):
    """The supervisor process, plus what its re-emitted worker lines say about the workers."""

    def pids(self) -> dict[int, int]:
        return {int(m[1]): int(m[2]) for line in list(self.lines) if (m := STARTED.search(line))}

    def private_health(self) -> dict[int, int]:
        return {int(m[1]): int(m[3]) for line in list(self.lines) if (m := BOUND.search(line))}

    def worker_metric(self, port: int, name: str, **labels: str) -> float:
        saved, self.health_port = self.health_port, port
        try:
            return self.metric(name, **labels)
        finally:
            self.health_port = saved

    def wait_for(self, what: str, predicate: object, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if callable(predicate) and predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}:\n" + "\n".join(self.lines[-30:]))


def _canonical(series: str) -> str:
    if "{" not in series:
        return series
    name, _, rest = series.partition("{")
    labels = sorted(p for p in rest.rstrip("}").split(",") if p)
    return name + "{" + ",".join(labels) + "}"


def write_endpoints(path: Path, rows: Sequence[tuple[str, str, int, int]]) -> None:
    """Atomically replace the endpoints file: ``(pod, ip, grpc_port, quic_port)`` rows."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(endpoints_document(rows))
    os.replace(tmp, path)


def router_args(endpoints: Path, *extra: str) -> list[str]:
    return [
        "--listen-addr", "127.0.0.1:0",
        "--reverse-tunnel-listen-addr", "127.0.0.1:0",
        "--health-listen-addr", "127.0.0.1:0",
        "--endpoints-file", str(endpoints),
        "--shutdown-delay-ms", "0",
        "--drain-timeout-ms", "2000",
        *extra,
    ]
