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

from router.demo_pki import make_pki
from router.demo_pods import call_whoami, start_pod
from tests.router_process import RouterProcess, router_args, write_endpoints

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
            deadline = time.monotonic() + 1.0
            status = 200
            while status == 200 and time.monotonic() < deadline:
                status = router.http_get("/readyz")[0]
            assert status == 503
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


def test_bulk_transfer_in_flight_during_sigterm_completes_byte_exact(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    size = 24 * 1024 * 1024
    chunk = 256 * 1024

    async def scenario() -> tuple[str, str, str, str, int]:
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(pki.cert_path, pki.key_path)
        up, down = os.urandom(size), os.urandom(size)
        pod_got = hashlib.sha256()
        pod_done = asyncio.Event()

        async def pod_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            async def send() -> None:
                for i in range(0, size, chunk):  # paced so the transfer spans the SIGTERM
                    writer.write(down[i : i + chunk])
                    await writer.drain()
                    await asyncio.sleep(0.02)

            sender = asyncio.create_task(send())
            remaining = size
            while remaining:
                data = await reader.read(1 << 20)
                if not data:
                    break
                pod_got.update(data)
                remaining -= len(data)
            await sender
            writer.close()
            pod_done.set()

        server = await asyncio.start_server(pod_handler, "127.0.0.2", 0, ssl=server_ctx)
        pod_port = server.sockets[0].getsockname()[1]
        write_endpoints(tmp_path / "e.json", [("stargate-bulk", "127.0.0.2", pod_port, 1)])
        router = RouterProcess(_drain_args(tmp_path / "e.json", delay_ms=200, drain_ms=20000))
        try:
            await asyncio.to_thread(router.wait_ready)
            ctx = ssl.create_default_context(cadata=pki.ca_pem.decode())
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", router.grpc_port, ssl=ctx, server_hostname=HOST
            )
            got = hashlib.sha256()

            async def send() -> None:
                for i in range(0, size, chunk):
                    writer.write(up[i : i + chunk])
                    await writer.drain()
                    await asyncio.sleep(0.02)

            sender = asyncio.create_task(send())
            received = 0
            signalled = False
            while received < size:
                data = await asyncio.wait_for(reader.read(1 << 20), 20)
                assert data, f"connection cut after {received} bytes"
                got.update(data)
                received += len(data)
                if not signalled and received > size // 8:
                    router.proc.send_signal(signal.SIGTERM)
                    signalled = True
            await sender
            writer.close()
            await asyncio.wait_for(pod_done.wait(), 20)
            status = await asyncio.to_thread(router.proc.wait, 30)
            return (hashlib.sha256(up).hexdigest(), pod_got.hexdigest(),
                    hashlib.sha256(down).hexdigest(), got.hexdigest(), status)
        finally:
            server.close()
            if router.proc.poll() is None:
                router.proc.kill()

    sent_up, got_up, sent_down, got_down, status = asyncio.run(scenario())
    assert got_up == sent_up
    assert got_down == sent_down
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
