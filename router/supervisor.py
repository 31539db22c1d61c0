"""``--workers N``: N router processes share the listeners; one supervisor keeps them running.

Python routes on one core, so N whole routers bind the same ports with SO_REUSEPORT; the kernel
hashes each 4-tuple to one, so a QUIC flow stays on the worker that routed it. The supervisor routes
nothing: it restarts dead workers (not one exiting 2: its flags cannot work) and serves the public
health port; its ``listening`` line is the only one naming public addresses (tools and tests parse it).

It reads its workers' stderr as bytes to pass on, never for meaning: a worker logs a rejected
hostname word for word, so a client can write anything there. It acts only on descriptors it made
itself (health sockets, control pipes, shared memfds; docs/architecture.md#workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from http import HTTPStatus

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, ProcessCollector, generate_latest

from discovery.backoff import Backoff
from router import constants as c
from router.bind_failure import binding
from router.config import RouterConfig
from router.debug_endpoints import supervisor_routes
from router.flag_values import CONFIG_ERROR_PREFIX, CONFIG_ERROR_STATUS, SocketAddress
from router.health import (
    ProbeHttpServer,
    QueryRoute,
    Route,
    liveness_routes,
    metrics_response,
    readiness_response,
    text_response,
)
from router.metrics_merge import ExpositionError, merge_expositions
from router.shared_client_limits import table_file_for
from router.udp.cid_index import create_index_file
from router.worker_process import (
    LineSplitter,
    WorkerSlot,
    describe_exit,
    parent_death_signal,
    private_health_socket,
    stop_budget_s,
    worker_argv,
)
from router.worker_scrape import HostPort, WorkerClient
from router.worker_seat import WorkerReport, WorkerSeat, decode_report

log = logging.getLogger("router.workers")  # pinned: operators filter logs by this name

# ---------------------------------------------------------------------------
# IO
# ---------------------------------------------------------------------------
def held_address(addr: SocketAddress, kind: socket.SocketKind) -> tuple[SocketAddress, socket.socket]:
    """Binds ``addr`` as a worker will and keeps the socket: a bad address fails here, before any worker
    starts, and port 0 becomes a port no other process can take until every worker has bound it."""
    family = socket.AF_INET6 if ":" in addr.host else socket.AF_INET
    probe = socket.socket(family, kind)
    try:
        if kind == socket.SOCK_STREAM:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        probe.bind((addr.host, addr.port))
    except OSError:
        probe.close()
        raise
    return (addr if addr.port != 0 else SocketAddress(addr.host, int(probe.getsockname()[1]))), probe


class Supervisor:
    """Runs ``config.workers`` router processes until SIGTERM/SIGINT (see the module doc)."""

    def __init__(self, config: RouterConfig, argv: Sequence[str]) -> None:
        self.config = config
        self.argv = list(argv)
        self.slots = [WorkerSlot(i) for i in range(config.workers)]
        self.registry = CollectorRegistry(auto_describe=True)
        self.restarts = Counter(
            c.WORKER_RESTARTS_TOTAL, "Dead worker processes restarted by the supervisor.",
            registry=self.registry,
        )
        ProcessCollector(registry=self.registry)  # merged: CPU and memory of the whole router, its start
        self._retired = ""
        """Counters of dead workers (``cumulative_only`` merge), so merged counters never go down."""
        self._stopping = False
        self._status = 0
        """The exit status: 1 if a keeper crashed, ``CONFIG_ERROR_STATUS`` if a worker could not start."""
        self._config_errors: set[str] = set()
        """The workers' config error lines said so far: N workers failing alike say it once."""
        self._stop = asyncio.Event()
        self._held: list[socket.socket] = []
        """The listeners' ports, bound until every worker has bound them too (``held_address``)."""
        self._preexec = parent_death_signal()
        self.workers = WorkerClient()
        self.cid_index = create_index_file(config.workers, c.QUIC_CID_INDEX_ENTRIES_PER_WORKER, c.QUIC_CID_INDEX_WINDOW)
        """The connection IDs the workers' flows learned (``router.udp.cid_index``), one memfd for the run."""
        self.client_table = table_file_for(
            config.workers, config.max_connections_per_client, config.max_quic_flows_per_client
        )
        """The per-client count table every worker, restarted ones too, is passed (None: no limit on)."""

    # -- lifecycle -----------------------------------------------------------------------
    async def run(self) -> int:
        try:
            return await self._run()
        finally:
            self._let_go()

    async def _run(self) -> int:
        cfg = self.config
        # A BindFailure here reaches the CLI: one line naming the flag, exit 2, no worker started.
        with binding("--listen-addr", cfg.listen_addr):
            grpc, held = held_address(cfg.listen_addr, socket.SOCK_STREAM)
            self._held.append(held)
        with binding("--reverse-tunnel-listen-addr", cfg.reverse_tunnel_listen_addr):
            quic, held = held_address(cfg.reverse_tunnel_listen_addr, socket.SOCK_DGRAM)
            self._held.append(held)
        routes: dict[str, Route] = {**liveness_routes(), "/readyz": self.readyz, "/metrics": self.metrics_route}
        query_routes: dict[str, QueryRoute] = {}
        if cfg.debug_endpoints:
            debug, query_routes = supervisor_routes(self.ask_workers)
            routes.update(debug)
        server = ProbeHttpServer(routes, query_routes)
        with binding("--health-listen-addr", cfg.health_listen_addr):
            health = await server.start(cfg.health_listen_addr.host, cfg.health_listen_addr.port)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        child_argv = worker_argv(self.argv, grpc, quic)
        keepers = [asyncio.create_task(self._keep_running(s, child_argv)) for s in self.slots]
        for keeper in keepers:
            keeper.add_done_callback(self._keeper_done)
        announce = asyncio.create_task(self._announce(grpc, quic, health))
        await self._stop.wait()
        await self._stop_workers(keepers)
        announce.cancel()
        await server.close()
        await self.workers.close()
        os.close(self.cid_index)
        log.info("all workers stopped; exiting")
        return self._status

    def _keeper_done(self, task: asyncio.Task[None]) -> None:
        """A keeper only returns when stopping; if one crashed its slot is unmanaged, so stop all."""
        if task.cancelled() or task.exception() is None:
            return
        log.error("worker keeper failed; stopping", exc_info=task.exception())
        self._status = 1
        self.request_stop()

    def request_stop(self) -> None:
        if not self._stopping:
            log.info("shutdown requested: readiness now failing; stopping %d workers", len(self.slots))
        self._stopping = True
        self._stop.set()

    def _let_go(self) -> None:
        """Close the sockets that kept the listeners' ports for the workers (they hold them now)."""
        for held in self._held:
            held.close()
        self._held.clear()

    async def _announce(self, grpc: SocketAddress, quic: SocketAddress, health: HostPort) -> None:
        """The ``listening`` line once every worker has bound (as a single router logs it)."""
        await asyncio.gather(*(s.first_bound.wait() for s in self.slots))
        self._let_go()
        log.info(
            "listening grpc=%s:%d quic=%s:%d health=%s:%d", grpc.host, grpc.port, quic.host, quic.port,
            *health, extra={"workers": len(self.slots)},
        )

    async def _keep_running(self, slot: WorkerSlot, argv: list[str]) -> None:
        backoff = Backoff(c.WORKER_RESTART_BACKOFF_INITIAL_S, c.WORKER_RESTART_BACKOFF_MAX_S)
        while True:
            started = time.monotonic()
            returncode = await self._run_once(slot, argv)
            if self._stopping:
                return
            if returncode == CONFIG_ERROR_STATUS:  # its line (a flag, a bind) is passed on already
                self._status = CONFIG_ERROR_STATUS
                self.request_stop()
                return
            uptime = time.monotonic() - started
            if uptime >= c.WORKER_STABLE_AFTER_S:
                backoff.reset()
            delay = backoff.next_delay()
            log.warning(
                "worker %d exited with %s after %.1fs; restarting in %.1fs",
                slot.index, describe_exit(returncode), uptime, delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            if self._stopping:
                return
            self.restarts.inc()

    async def _run_once(self, slot: WorkerSlot, argv: list[str]) -> int | None:
        """Run one worker until it exits, relaying its stderr and acting on its control pipe; its exit
        status (None: not started)."""
        try:
            health = private_health_socket()
        except OSError as exc:
            log.error("worker %d has no private health port: %s", slot.index, exc)
            return None
        private_health: HostPort = health.getsockname()[:2]
        control, control_end = os.pipe()
        seat = WorkerSeat(
            slot.index, len(self.slots), health.fileno(), control_end, self.cid_index, self.client_table
        )
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "router", *argv,
                stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                env={**os.environ, c.WORKER_SEAT_ENV: seat.to_env()}, preexec_fn=self._preexec,
                pass_fds=seat.fds(),
            )
        except OSError as exc:
            log.error("worker %d could not be started: %s", slot.index, exc)
            os.close(control)
            return None
        finally:  # the worker holds them now; a restart gets new ones
            health.close()
            os.close(control_end)
        slot.process, slot.generation = proc, slot.generation + 1
        slot.private_health = private_health
        log.info("worker %d started: pid=%d", slot.index, proc.pid)
        if self._stopping:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        reports = asyncio.create_task(self._read_reports(slot, control))
        if proc.stderr is not None:
            splitter = LineSplitter()
            while chunk := await proc.stderr.read(65536):
                self._relay_lines(splitter.feed(chunk))
            self._relay_lines(splitter.flush())
        returncode = await proc.wait()
        await reports  # the pipe ends with the worker: every report it wrote is read
        self._retire(slot)
        return returncode

    async def _read_reports(self, slot: WorkerSlot, fd: int) -> None:
        """Act on what a worker says on its control pipe, until the pipe closes."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=c.WORKER_REPORT_MAX_BYTES, loop=loop)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        try:
            while line := await reader.readline():
                self._act_on(slot, line)
        except (ValueError, OSError) as exc:  # an over-long line: a bug of ours, not routing's
            log.error("worker %d control pipe unreadable: %s", slot.index, exc)
        finally:
            transport.close()

    def _act_on(self, slot: WorkerSlot, line: bytes) -> None:
        decoded = decode_report(line)
        if decoded is None:
            log.error("worker %d sent an unknown report: %r", slot.index, line[:80])
            return
        kind, text = decoded
        if kind is WorkerReport.BOUND:  # its health port answers from now on
            slot.health = slot.private_health
            slot.first_bound.set()
        elif kind is WorkerReport.CONFIG_ERROR and text not in self._config_errors:
            self._config_errors.add(text)
            with contextlib.suppress(OSError, ValueError):
                print(f"{CONFIG_ERROR_PREFIX}{text}", file=sys.stderr, flush=True)

    def _relay_lines(self, lines: list[bytes]) -> None:
        """Re-emit a worker's lines on our stderr as they are; a closed stderr loses logs, never routing."""
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
            for line in lines:
                sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()

    def _retire(self, slot: WorkerSlot) -> None:
        """Bank a dead worker's last counters; drop its gauges and address."""
        if slot.exposition is not None:
            try:
                self._retired = merge_expositions(
                    [self._retired, slot.exposition], cumulative_only=True
                ).decode()
            except ExpositionError as exc:
                log.error("worker %d metrics could not be kept: %s", slot.index, exc)
        slot.process = slot.health = slot.exposition = None

    async def _stop_workers(self, keepers: list[asyncio.Task[None]]) -> None:
        for slot in self.slots:
            if slot.alive and slot.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    slot.process.terminate()
        _done, pending = await asyncio.wait(keepers, timeout=stop_budget_s(self.config))
        if pending:
            for slot in self.slots:
                if slot.alive and slot.process is not None:
                    log.warning("worker %d did not stop in time; killing it", slot.index)
                    with contextlib.suppress(ProcessLookupError):
                        slot.process.kill()
            await asyncio.wait(pending, timeout=c.WORKER_STOP_GRACE_S)

    # -- public health port ----------------------------------------------------------------
    async def is_ready(self) -> bool:
        """Ready while not stopping and every worker is up and answers its own ``/readyz`` 200."""
        if self._stopping:
            return False
        addresses = [s.health for s in self.slots if s.alive]
        if len(addresses) != len(self.slots) or None in addresses:
            return False
        results = await self.workers.fetch_all([a for a in addresses if a is not None], "/readyz")
        return not self._stopping and all(isinstance(r, tuple) and r[0] == 200 for r in results)

    async def metrics(self) -> bytes:
        """Every worker's exposition fetched concurrently, merged with the supervisor's and the retired."""
        live: list[tuple[WorkerSlot, int, HostPort]] = [
            (s, s.generation, s.health) for s in self.slots if s.alive and s.health is not None
        ]
        results = await self.workers.fetch_all([h for _s, _g, h in live], "/metrics")
        for (slot, generation, _h), result in zip(live, results, strict=True):
            if isinstance(result, BaseException):
                log.debug("worker %d metrics unavailable, using its last scrape: %s", slot.index, result)
            elif result[0] == 200 and slot.generation == generation and slot.alive:
                slot.exposition = result[1].decode("utf-8", "replace")
        texts = [generate_latest(self.registry).decode(), self._retired]
        texts += [s.exposition for s in self.slots if s.exposition is not None]
        return merge_expositions(texts)

    async def ask_workers(self, path: str) -> list[tuple[int, bytes] | BaseException]:
        """GET ``path`` from every live worker at once (the merged debug views)."""
        return await self.workers.fetch_all([s.health for s in self.slots if s.alive and s.health is not None], path)

    async def readyz(self) -> web.Response:
        return readiness_response(await self.is_ready())

    async def metrics_route(self) -> web.Response:
        try:
            return metrics_response(await self.metrics())
        except ExpositionError as exc:
            log.error("cannot merge worker metrics: %s", exc)
            return text_response(HTTPStatus.INTERNAL_SERVER_ERROR, "cannot merge worker metrics\n")


def supervise(config: RouterConfig, argv: list[str]) -> int:
    """Entry point for ``--workers N`` (N > 1): run the supervisor until SIGTERM/SIGINT."""

    async def _main() -> int:
        return await Supervisor(config, argv).run()

    return asyncio.run(_main())
