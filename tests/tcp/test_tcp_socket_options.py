"""The TCP edge's per-connection socket work: what the kernel gives for free, and the dial.

The edge sets TCP_NODELAY once on its listener and relies on accepted sockets inheriting
it; the dial creates its socket non-blocking and skips the writability wait when the
handshake already completed. Real loopback sockets, asyncio and uvloop.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from discovery.targets import Target, TargetSnapshot
from router import constants as c
from router.app import RouterApp
from router.config import config_from_args
from router.extensions import Extensions
from router.hostname import HostnameTemplate
from router.metrics import RouterMetrics
from router.tcp.dial import DialError, dial
from router.tcp.edge import TcpRouter, TcpRouterSettings
from router.tcp.poller import poller_for
from tests.support.loops import Runner
from tests.support.polling import eventually, holds
from tests.support.tcp_peers import SynDroppingPod
from tests.support.tls import ssl_client_hello_records

pytestmark = pytest.mark.timeout(30)



def test_accepted_sockets_inherit_tcp_nodelay_from_the_listener() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with socket.create_connection(listener.getsockname(), timeout=5) as client:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
            conn, _ = listener.accept()
            with conn:
                assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_the_edge_listener_sets_tcp_nodelay(run: Runner) -> None:
    async def main() -> None:
        router = TcpRouter(TcpRouterSettings(), HostnameTemplate.parse("{pod_name}.stargate.external", "default"),
                           TargetSnapshot, RouterMetrics())
        await router.start("127.0.0.1", 0)
        try:
            listener = router._acceptor._listener
            assert listener is not None
            assert listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        finally:
            await router.close()

    run(main())


@pytest.mark.parametrize("defer", [True, False])
def test_the_listener_defers_accept_unless_told_not_to(run: Runner, defer: bool) -> None:
    async def main() -> None:
        router = TcpRouter(TcpRouterSettings(defer_accept=defer),
                           HostnameTemplate.parse("{pod_name}.stargate.external", "default"),
                           TargetSnapshot, RouterMetrics())
        await router.start("127.0.0.1", 0)
        try:
            listener = router._acceptor._listener
            assert listener is not None
            deferred = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT)
            assert (deferred > 0) is defer
        finally:
            await router.close()

    run(main())


@pytest.mark.parametrize("flag", ["on", "off"])
def test_the_flag_reaches_the_edge(flag: str) -> None:
    app = RouterApp(config_from_args(["--tcp-defer-accept", flag], environ={"POD_NAMESPACE": "x"}))
    assert app.tcp._settings.defer_accept is (flag == "on")


def test_a_silent_client_is_accepted_once_it_speaks_or_after_the_deferral(run: Runner, extensions: Extensions) -> None:
    """With the accept deferred (the default), a connected client that has sent nothing costs the
    router nothing: no accept, no peek, no record. Its first bytes hand it over at once; a client
    that stays silent is handed over after ``TCP_DEFER_ACCEPT_S`` and cut at the peek timeout."""

    async def main() -> None:
        router = TcpRouter(TcpRouterSettings(peek_timeout_s=0.3, extensions=extensions),
                           HostnameTemplate.parse("{pod_name}.stargate.external", "default"),
                           TargetSnapshot, RouterMetrics())
        host, port = await router.start("127.0.0.1", 0)
        try:
            loop = asyncio.get_running_loop()
            reader, writer = await asyncio.open_connection(host, port)
            silent_reader, silent = await asyncio.open_connection(host, port)
            silent_since = loop.time()
            # both connected, neither accepted: the kernel holds them while they are silent
            await holds(lambda: router.active_connections == 0, 0.3, what="no connection accepted")
            writer.write(ssl_client_hello_records("nobody.stargate.external"))
            answer = await asyncio.wait_for(reader.read(), 2.0)  # accepted, read, refused
            assert answer[:1] == bytes([0x15])  # a TLS alert record (unrecognized_name)
            assert await asyncio.wait_for(silent_reader.read(), c.TCP_DEFER_ACCEPT_S + 5.0) == b""
            # held by the kernel for the deferral, then accepted and cut at the peek timeout
            assert loop.time() - silent_since >= c.TCP_DEFER_ACCEPT_S
            writer.close()
            silent.close()
        finally:
            await router.close()

    run(main())


def test_dial_returns_a_connected_nonblocking_nodelay_socket(run: Runner) -> None:
    async def main() -> None:
        with socket.create_server(("127.0.0.2", 0)) as pod_listener:
            port = pod_listener.getsockname()[1]
            pod = await dial(Target("stargate-0", "127.0.0.2", port, 0), 2.0)
            with pod:
                assert pod.gettimeout() == 0.0
                assert not pod.getblocking()
                assert pod.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                assert pod.getpeername() == ("127.0.0.2", port)
                assert pod.type == socket.SOCK_STREAM
                accepted, _ = pod_listener.accept()
                with accepted:
                    pod.send(b"ping")
                    assert accepted.recv(4) == b"ping"

    run(main())


def test_dial_refused_is_a_dial_error_naming_the_endpoint(run: Runner) -> None:
    async def main() -> None:
        with socket.create_server(("127.0.0.2", 0)) as closed:
            port = closed.getsockname()[1]
        with pytest.raises(DialError, match=rf"dial 127\.0\.0\.2:{port}: Connection refused"):
            await dial(Target("stargate-0", "127.0.0.2", port, 0), 2.0)

    run(main())


def test_dial_to_a_full_backlog_times_out(run: Runner) -> None:
    async def main() -> None:
        pod = SynDroppingPod("127.0.0.2")
        try:
            with pytest.raises(DialError, match=rf"dial 127\.0\.0\.2:{pod.port} timed out"):
                await dial(Target("stargate-0", "127.0.0.2", pod.port, 0), 0.3)
            assert poller_for(asyncio.get_running_loop()).watched == 0  # the wait left no watch behind
        finally:
            pod.close()

    run(main())


def test_a_hello_that_comes_later_is_waited_for_on_the_epoll_set_and_no_wait_outlives_it(
    run: Runner, extensions: Extensions
) -> None:
    """A router at rest without ``--tcp-defer-accept`` (or a client silent for longer than the
    kernel defers it) accepts before the ClientHello arrives: the peek waits on the relay's epoll
    set; the connection is routed once the hello comes, and a client that never sends one is cut
    at the peek timeout. Neither leaves a watch behind."""

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.read(65536))
            await writer.drain()
            writer.close()

        pod = await asyncio.start_server(echo, "127.0.0.2", 0)
        pod_port = pod.sockets[0].getsockname()[1]
        snapshot = TargetSnapshot.of([Target("stargate-0", "127.0.0.2", pod_port, 0)])
        router = TcpRouter(TcpRouterSettings(peek_timeout_s=0.3, defer_accept=False, extensions=extensions),
                           HostnameTemplate.parse("{pod_name}.stargate.external", "default"),
                           lambda: snapshot, RouterMetrics())
        host, port = await router.start("127.0.0.1", 0)
        poller = poller_for(loop)
        try:
            hello = ssl_client_hello_records("stargate-0.stargate.external")
            reader, writer = await asyncio.open_connection(host, port)
            await eventually(lambda: router.active_connections == 1 and poller.watched == 1,
                             what="accepted, peeked, found empty: waiting on the epoll set")
            writer.write(hello)
            assert await reader.readexactly(len(hello)) == hello  # routed to the pod, echoed
            writer.close()
            silent_reader, silent = await asyncio.open_connection(host, port)
            assert await asyncio.wait_for(silent_reader.read(), 2.0) == b""  # cut at the peek timeout
            silent.close()
            await eventually(lambda: not router.active_connections and not poller.watched, interval_s=0.01,
                             what="no connection and no watch left")
        finally:
            await router.close()
            pod.close()

    run(main())
