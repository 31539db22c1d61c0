"""SIGTERM behaviour of the real router process: readiness first, then drain, then exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import socket
import ssl
import time
from pathlib import Path

import grpc

from router.demo.grpc_pods import call_whoami, start_pod
from router.demo.pki import DemoPki
from tests.support.bulk_tls import BulkTlsPod, bulk_tls_client
from tests.support.polling import eventually_blocking
from tests.support.router_process import RouterProcess, router_args, write_endpoints

HOST = "stargate-bulk.stargate.external"


def _drain_args(endpoints: Path, delay_ms: int, drain_ms: int) -> list[str]:
    args = router_args(endpoints)
    for flag, value in (("--shutdown-delay-ms", delay_ms), ("--drain-timeout-ms", drain_ms)):
        args[args.index(flag) + 1] = str(value)
    return args


def test_sigterm_fails_readiness_at_once_and_keeps_serving_during_delay(tmp_path: Path) -> None:
    pod = start_pod("stargate-0", "127.0.0.2")
    try:
        write_endpoints(tmp_path / "e.json", [("stargate-0", pod.address, pod.port, 1)])
        with RouterProcess(_drain_args(tmp_path / "e.json", delay_ms=1500, drain_ms=2000)) as router:
            router.wait_ready()
            router.proc.send_signal(signal.SIGTERM)
            # at once: well inside the 1.5 s shutdown delay, while the router still serves
            eventually_blocking(lambda: router.http_get("/readyz")[0] == 503, 1.0, 0.005, what="readiness failed")
            assert router.http_get("/healthz")[0] == 200
            # still accepting during --shutdown-delay-ms, so in-flight Gateway traffic lands
            target = f"127.0.0.1:{router.grpc_port}"
            opts = [("grpc.default_authority", "stargate-0.stargate.external")]
            with grpc.insecure_channel(target, options=opts) as ch:
                assert call_whoami(ch) == "stargate-0"
            assert router.proc.wait(15) == 0
            # after the exit nothing listens any more
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", router.grpc_port)) != 0
    finally:
        pod.stop()


def test_bulk_transfer_in_flight_during_sigterm_completes_byte_exact(tmp_path: Path, pki: DemoPki) -> None:
    size = 24 * 1024 * 1024
    chunk, pace_s = 256 * 1024, 0.02  # paced both ways so the transfer spans the SIGTERM
    up, down = os.urandom(size), os.urandom(size)

    async def scenario() -> tuple[str, str, int]:
        pod = BulkTlsPod(pki, down, expect_up=size, chunk=chunk, pace_s=pace_s)
        pod_port = await pod.start("127.0.0.2")
        write_endpoints(tmp_path / "e.json", [("stargate-bulk", "127.0.0.2", pod_port, 1)])
        router = RouterProcess(_drain_args(tmp_path / "e.json", delay_ms=200, drain_ms=20000))
        signalled = False

        def sigterm_an_eighth_in(received: int) -> None:
            nonlocal signalled
            if not signalled and received > size // 8:
                router.proc.send_signal(signal.SIGTERM)
                signalled = True

        try:
            await asyncio.to_thread(router.wait_ready)
            got_down = await bulk_tls_client(
                router.grpc_port, pki, HOST, up, size, chunk=chunk, pace_s=pace_s,
                on_progress=sigterm_an_eighth_in,
            )
            await asyncio.wait_for(pod.done.wait(), 20)
            status = await asyncio.to_thread(router.proc.wait, 30)
            assert signalled
            return pod.received.hexdigest(), got_down, status
        finally:
            pod.close()
            if router.proc.poll() is None:
                router.proc.kill()

    got_up, got_down, status = asyncio.run(scenario())
    assert got_up == hashlib.sha256(up).hexdigest()
    assert got_down == hashlib.sha256(down).hexdigest()
    assert status == 0


def test_drain_timeout_cuts_idle_connections_and_exits_0(tmp_path: Path) -> None:
    pod = socket.socket()
    pod.bind(("127.0.0.2", 0))
    pod.listen(8)
    try:
        write_endpoints(tmp_path / "e.json", [("stargate-0", "127.0.0.2", pod.getsockname()[1], 1)])
        with RouterProcess(_drain_args(tmp_path / "e.json", delay_ms=0, drain_ms=1000)) as router:
            router.wait_ready()
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            client = socket.create_connection(("127.0.0.1", router.grpc_port), timeout=10)
            bio_in, bio_out = ssl.MemoryBIO(), ssl.MemoryBIO()
            tls = ctx.wrap_bio(bio_in, bio_out, server_hostname="stargate-0.stargate.external")
            try:
                tls.do_handshake()
            except ssl.SSLWantReadError:
                client.sendall(bio_out.read())  # the ClientHello: routed, then nobody answers
            accepted, _ = pod.accept()
            started = time.monotonic()
            router.proc.send_signal(signal.SIGTERM)
            assert router.proc.wait(15) == 0
            assert time.monotonic() - started < 10
            # the router cut it at the drain deadline (a reset: a cut stream must not look complete)
            with contextlib.suppress(ConnectionResetError):
                assert client.recv(100) == b""
            accepted.close()
            client.close()
    finally:
        pod.close()
