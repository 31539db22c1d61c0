"""The processes of a benchmark: helper agents, the router, HAProxy and nginx.

Everything listens on loopback. Each middle box is started once per scenario and left
idle while another one is measured, so a scenario compares all of them in the same run.
CPU and RSS are read from ``/proc`` for the middle box's whole process tree (nginx and a
multi-worker router are several processes).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from router.constants import QUIC_SOCKET_BUFFER_BYTES, SPLICE_PIPE_BYTES
from tests.support.router_process import RouterProcess, router_args, write_endpoints

NGINX_STREAM_MODULE = "/usr/lib/nginx/modules/ngx_stream_module.so"
START_TIMEOUT_S = 20.0
HAPROXY_BINARY = "/usr/sbin/haproxy"
"""Debian's package (``apt-get install haproxy``), where PATH does not name one."""
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    """A benchmark step failed (a process did not start, a count did not match)."""


def raise_fd_limit() -> int:
    """Lift the soft open-files limit to the hard one (children inherit it); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ---------------------------------------------------------------------------------------
# /proc readers
# ---------------------------------------------------------------------------------------
def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo.extend(int(c) for c in task.read_text().split())
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid``'s process tree so far (children that exited count
    once waited for: a C load generator run per load)."""
    return sum(cpu_split(pid))


def cpu_exact(pid: int) -> float:
    """User + system CPU seconds of ``pid``'s process tree, to the nanosecond: the scheduler's run
    time of each live thread (``/proc/PID/task/*/schedstat``). ``/proc/PID/stat`` counts 10 ms ticks,
    which is +-5% on a few seconds of handshakes; threads that exited meanwhile are not counted."""
    total = 0
    for p in process_tree(pid):
        for task in Path(f"/proc/{p}/task").glob("*/schedstat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(task.read_text().split()[0])
    return total / 1e9


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid``'s process tree, with its members' children that
    exited and were waited for (``cutime`` / ``cstime``), so a child's time is not lost when it ends."""
    user = system = 0
    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            user += int(fields[11]) + int(fields[13])
            system += int(fields[12]) + int(fields[14])
    return user / CLK_TCK, system / CLK_TCK


def udp_drops(pid: int) -> int:
    """Datagrams the kernel dropped so far at the UDP sockets of ``pid``'s process tree (a full
    receive buffer): the ``drops`` column of ``/proc/net/udp`` and ``udp6`` for their inodes. A
    socket closed meanwhile takes its count with it, so compare sockets that live through."""
    inodes: set[str] = set()
    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{p}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    total = 0
    for table in ("udp", "udp6"):
        with contextlib.suppress(OSError):
            for fields in _proc_net_rows(table):
                if len(fields) > 9 and fields[9] in inodes:
                    total += int(fields[-1])
    return total


def syscall_counts(pid: int, load: Callable[[], int]) -> tuple[dict[str, int], int]:
    """System calls of ``pid``'s process tree (``strace -c -f``) while ``load()`` runs, by name,
    and what ``load`` returned (the connections or datagrams it made, to divide by)."""
    out = Path(tempfile.mkdtemp()) / "strace.txt"
    tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", str(out)], stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached to every thread before the load starts
    done = load()
    time.sleep(0.3)
    tracer.terminate()
    tracer.wait()
    counts = {}
    for line in out.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[3].isdigit() and fields[-1] != "total":
            counts[fields[-1]] = int(fields[3])
    return counts, done


def rss_bytes(pid: int) -> int:
    """Sum of VmRSS over ``pid``'s process tree."""
    total = 0
    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def free_port(kind: int = socket.SOCK_STREAM, host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _proc_net_rows(table: str) -> Iterator[list[str]]:
    """The socket rows of ``/proc/net/TABLE`` (``tcp``, ``udp``, ``udp6``...), split into fields."""
    for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
        yield line.split()


def _bound_ports(table: str, listening_only: bool) -> set[int]:
    ports = set()
    for parts in _proc_net_rows(table):
        if listening_only and parts[3] != "0A":
            continue
        ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def wait_bound(ports: Sequence[int], udp: bool, proc: subprocess.Popen[Any], what: str) -> None:
    """Wait until every port listens (TCP) or is bound (UDP), without connecting to it."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise BenchError(f"{what} exited with status {proc.returncode}: {err[-2000:]}")
        bound = _bound_ports("udp", False) if udp else _bound_ports("tcp", True)
        if set(ports) <= bound:
            return
        time.sleep(0.02)
    raise BenchError(f"{what} did not bind {list(ports)}")


# ---------------------------------------------------------------------------------------
# Agents: helper processes that run load generators and pods
# ---------------------------------------------------------------------------------------
def haproxy_binary() -> str | None:
    """HAProxy's path, or None where it is not installed (callers skip or refuse)."""
    binary = shutil.which("haproxy") or HAPROXY_BINARY
    return binary if Path(binary).exists() else None


def _agent_main(conn: Connection) -> None:
    raise_fd_limit()
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        fn, args = message
        try:
            conn.send(("ok", fn(*args)))
        except BaseException:  # reported to the parent, which raises
            conn.send(("error", traceback.format_exc()))


class Agent:
    """A spawned Python process that runs module-level functions one call at a time.

    Pods keep serving from background threads between calls; load generators are calls.
    """

    def __init__(self, name: str) -> None:
        ctx = mp.get_context("spawn")
        self.name = name
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_agent_main, args=(child,), name=name, daemon=True)
        self.proc.start()
        child.close()
        self._busy = False

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._busy:
            raise BenchError(f"agent {self.name} is busy")
        self._busy = True
        self._conn.send((fn, args))

    def result(self, timeout: float = 300.0) -> Any:
        if not self._conn.poll(timeout):
            raise BenchError(f"agent {self.name} did not answer within {timeout:.0f}s")
        status, value = self._conn.recv()
        self._busy = False
        if status != "ok":
            raise BenchError(f"agent {self.name} failed:\n{value}")
        return value

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = 300.0) -> Any:
        self.submit(fn, *args)
        return self.result(timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send(None)
        self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2)


def call_all(agents: Sequence[Agent], fn: Callable[..., Any], args: Sequence[Sequence[Any]],
             timeout: float = 300.0) -> list[Any]:
    """Run ``fn`` on every agent at once (``args[i]`` for agent i); results in order."""
    for agent, a in zip(agents, args, strict=True):
        agent.submit(fn, *a)
    return [agent.result(timeout) for agent in agents]


# ---------------------------------------------------------------------------------------
# Middle boxes
# ---------------------------------------------------------------------------------------
class Router:
    """``python -m router`` with an endpoints file; ``workers`` > 1 uses ``--workers``."""

    kind = "router"

    def __init__(self, workdir: Path, rows: Sequence[tuple[str, str, int, int]], workers: int = 1,
                 extra: Sequence[str] = (), env: dict[str, str] | None = None) -> None:
        self.endpoints = workdir / f"endpoints-{os.getpid()}-{id(self)}.json"
        write_endpoints(self.endpoints, rows)
        args = router_args(self.endpoints, "--connect-timeout-ms", "2000", *extra)
        if workers > 1:
            args += ["--workers", str(workers)]
        self.workers = workers
        self.process = RouterProcess(args, env=env)
        try:
            self.process.wait_ready(START_TIMEOUT_S)
        except RuntimeError as exc:
            self.close()
            raise BenchError(f"router ({workers} workers) did not start: {exc}") from None
        self.tcp_port = self.process.grpc_port
        self.udp_port = self.process.quic_port

    @property
    def pid(self) -> int:
        return self.process.proc.pid

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.process.stop(timeout=10)
        with contextlib.suppress(Exception):
            self.process.__exit__(None, None, None)


@contextlib.contextmanager
def router_from(
    tree: Path | None, workdir: Path, rows: Sequence[tuple[str, str, int, int]], extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Iterator[Router]:
    """A router from source ``tree`` (None: this one; ``python -m router`` imports from its cwd),
    with ``env`` added to its environment, closed on exit: the profiles compare two trees round by round."""
    saved_cwd, saved_path = os.getcwd(), os.environ.get("PYTHONPATH")
    if tree is not None:
        os.chdir(tree)
        os.environ["PYTHONPATH"] = str(tree)
    try:
        router = Router(workdir, rows, extra=extra, env=env)
    finally:
        os.chdir(saved_cwd)
        if saved_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved_path
    try:
        yield router
    finally:
        router.close()


class PeerProcess:
    """A peer middle box (HAProxy, nginx) run as a child until ``close``."""

    proc: subprocess.Popen[bytes]

    def _start(self, argv: list[str], ports: Sequence[int], udp: bool, what: str) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_bound(ports, udp, self.proc, what)
        except BenchError:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

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


HAPROXY_GLOBAL = """global
    nbthread {threads}
    maxconn {maxconn}
    maxpipes {maxpipes}
{tune}{log_global}defaults
    mode tcp
{splice}{log_defaults}    timeout connect 5s
    timeout client 10m
    timeout server 10m
"""

HAPROXY_LOG_GLOBAL = "    log stdout format raw local0 info\n"
HAPROXY_LOG_DEFAULTS = "    log global\n    option tcplog\n"
"""A line per connection on stdout (``log_connections``), as the router's access log writes one."""

SPLICE_AUTO = "    option splice-auto\n"
"""What the issue asks for; HAProxy 2.6 then mostly copies (its heuristics rarely splice)."""
SPLICE_FORCED = "    option splice-request\n    option splice-response\n"
"""Always splice, both ways: HAProxy's best bulk configuration (with ``tune.pipesize``)."""

HAPROXY_SNI_FRONTEND = """frontend tls_{port}
    bind 127.0.0.1:{port}
    tcp-request inspect-delay 5s
    tcp-request content accept if {{ req.ssl_hello_type 1 }}
    use_backend pod_{port} if {{ req.ssl_sni -i {sni} }}
backend pod_{port}
    server pod {pod_host}:{pod_port}
"""

HAPROXY_PLAIN_FRONTEND = """frontend tcp_{port}
    bind 127.0.0.1:{port}
    default_backend pod_{port}
backend pod_{port}
    server pod {pod_host}:{pod_port}
"""


class Haproxy(PeerProcess):
    """HAProxy in TCP mode: SNI-routed (``req.ssl_sni``) or plain frontends to one pod each;
    ``option splice-auto`` unless ``forced_splice``; no log unless ``log_connections`` (then
    ``option tcplog`` lines on stdout, the router's access log's counterpart)."""

    kind = "haproxy"

    def __init__(self, workdir: Path, sni_routes: Sequence[tuple[str, str, int]] = (),
                 plain_routes: Sequence[tuple[str, int]] = (), threads: int = 1,
                 maxconn: int = 4096, forced_splice: bool = False, log_connections: bool = False) -> None:
        binary = haproxy_binary()
        if binary is None:
            raise BenchError("haproxy not installed")
        # HAProxy refuses to start if 2 fds per connection plus 2 per pipe exceed the limit;
        # its default is maxconn/4 pipes (a connection without one copies instead).
        fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        maxpipes = max(16, min(maxconn // 4, (fd_limit - 2 * maxconn - 200) // 2))
        text = HAPROXY_GLOBAL.format(
            threads=threads, maxconn=maxconn, maxpipes=maxpipes,
            # The same pipe size as the router's (SPLICE_PIPE_BYTES) when splicing always.
            tune=f"    tune.pipesize {SPLICE_PIPE_BYTES}\n" if forced_splice else "",
            splice=SPLICE_FORCED if forced_splice else SPLICE_AUTO,
            log_global=HAPROXY_LOG_GLOBAL if log_connections else "",
            log_defaults=HAPROXY_LOG_DEFAULTS if log_connections else "",
        )
        self.ports: list[int] = []
        for sni, host, port in sni_routes:
            front = free_port()
            self.ports.append(front)
            text += HAPROXY_SNI_FRONTEND.format(port=front, sni=sni, pod_host=host, pod_port=port)
        for host, port in plain_routes:
            front = free_port()
            self.ports.append(front)
            text += HAPROXY_PLAIN_FRONTEND.format(port=front, pod_host=host, pod_port=port)
        fd, name = tempfile.mkstemp(prefix="haproxy-", suffix=".cfg", dir=workdir)
        os.close(fd)
        self.config = Path(name)
        self.config.write_text(text)
        quiet = [] if log_connections else ["-q"]  # -q silences the log lines on stdout too
        self._start([binary, "-db", *quiet, "-f", str(self.config)], self.ports, False, "haproxy")



NGINX_CONFIG = """daemon off;
master_process on;
worker_processes 1;
worker_rlimit_nofile {nofile};
error_log {dir}/error.log error;
pid {dir}/nginx.pid;
load_module {module};
events {{
    worker_connections {connections};
}}
stream {{
    server {{
        listen 127.0.0.1:{port} udp rcvbuf={buffer} sndbuf={buffer};
        proxy_pass {pod_host}:{pod_port};
        proxy_timeout 10m;
    }}
}}
"""


class Nginx(PeerProcess):
    """nginx ``stream`` UDP proxy, one worker, to one pod (it cannot route by QUIC SNI)."""

    kind = "nginx"

    def __init__(self, workdir: Path, pod_host: str, pod_port: int, connections: int = 4096) -> None:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(binary).exists() or not Path(NGINX_STREAM_MODULE).exists():
            raise BenchError("nginx with the stream module not installed")
        self.dir = Path(tempfile.mkdtemp(prefix="nginx-", dir=workdir))
        self.port = free_port(socket.SOCK_DGRAM)
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        (self.dir / "nginx.conf").write_text(NGINX_CONFIG.format(
            nofile=nofile, dir=self.dir, module=NGINX_STREAM_MODULE, connections=connections,
            port=self.port, pod_host=pod_host, pod_port=pod_port, buffer=QUIC_SOCKET_BUFFER_BYTES,
        ))
        self._start(
            [binary, "-e", "stderr", "-p", str(self.dir), "-c", str(self.dir / "nginx.conf")],
            [self.port], True, "nginx",
        )



def python_version() -> str:
    return sys.version.split()[0]


def tool_version(argv: Sequence[str]) -> str:
    """First line a tool prints for its version flag (stdout or stderr), or 'absent'."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "absent"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else "absent"
