"""Several QUIC connections on one client socket, as QUIC itself allows: real quinn and aioquic
endpoints through the router to real aioquic pods, each connection reaching the pod it named,
told apart by connection ID, following the endpoint when it rebinds; a spoofed Initial from a
live client's address gets its own fate; flows end when their connections' idle timeouts say."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from aioquic.asyncio import connect
from aioquic.quic.connection import QuicConnection
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from router import constants as c
from router.demo.pki import DemoPki
from router.demo.quic_pods import WHOAMI, client_configuration, request
from router.extensions import Extensions
from tests.support.names import host as sni
from tests.support.polling import eventually
from tests.support.quic_pods_harness import ROUTER_HOST, Harness, T, running
from tests.support.shared_socket import open_shared_socket

pytestmark = pytest.mark.timeout(60)
"""Every test here runs on the pure-Python path and on the C splice."""

PODS = ("stargate-0", "stargate-1")


def _terminations(h: Harness, termination: str) -> float:
    return h.count(f"{c.TERMINATIONS_TOTAL}_total", protocol="quic", termination=termination)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- several connections on one socket ----------------------------------------------------
@pytest.mark.parametrize("at_once", [False, True], ids=["one_by_one", "at_once"])
@pytest.mark.parametrize("order", [PODS, PODS[::-1]], ids=["0_then_1", "1_then_0"])
async def test_a_quinn_endpoint_holds_connections_to_two_pods_through_its_rebinding(
    pki: DemoPki, extensions: Extensions, tmp_path: Path, quinn_peer: Path, order: tuple[str, str], at_once: bool
) -> None:
    ca = tmp_path / "ca.der"
    ca.write_bytes(x509.load_pem_x509_certificate(pki.ca_pem).public_bytes(Encoding.DER))
    names = [sni(pod) for pod in order]
    async with running(pki, extensions) as h:
        peer = await asyncio.create_subprocess_exec(
            str(quinn_peer), f"{ROUTER_HOST}:{h.port}", str(ca), *(["--at-once"] if at_once else []), *names,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(peer.communicate(), 40)
        assert peer.returncode == 0, err.decode()
        lines = out.decode().split("\n")
        for phase in ("before", "after"):
            for pod, name in zip(order, names, strict=True):
                assert f"{phase} {name} {pod}:{phase}-{name}" in lines
        ports = {line.split()[1]: line.split()[2] for line in lines if line.startswith("port ")}
        assert ports["before"] != ports["after"]  # one socket, rebound: both connections moved
        assert h.outcome("accepted") == 2 and h.outcome("target_unavailable") == 0
        assert h.dropped("not_initial") == 0


async def test_an_aioquic_endpoint_holds_connections_to_two_pods_on_one_socket_through_its_rebinding(
    pki: DemoPki, extensions: Extensions,
) -> None:
    async with running(pki, extensions) as h:
        shared = await open_shared_socket(ROUTER_HOST)
        try:
            first = await asyncio.wait_for(
                shared.connect((ROUTER_HOST, h.port), client_configuration(sni("stargate-0"), h.cafile)), T)
            assert await request(first, b"a") == b"stargate-0:a"
            second = await asyncio.wait_for(
                shared.connect((ROUTER_HOST, h.port), client_configuration(sni("stargate-1"), h.cafile)), T)
            for round_ in (b"b", b"c"):
                assert await request(second, round_) == b"stargate-1:" + round_
                assert await request(first, round_) == b"stargate-0:" + round_
            assert h.router.active_flows == 2
            await shared.rebind(ROUTER_HOST)
            assert await request(second, b"moved") == b"stargate-1:moved"
            assert await request(first, b"moved") == b"stargate-0:moved"
            assert shared.unmatched == 0 and h.router.active_flows == 2
        finally:
            shared.close()
        assert h.outcome("accepted") == 2 and h.dropped("not_initial") == 0


async def test_clients_reusing_a_local_port_reach_their_own_pods_while_the_first_flow_lives(
    pki: DemoPki, extensions: Extensions
) -> None:
    """One after the other from one local port, each while the flows before it are still there
    (their clients closed, the router cannot see that): each reaches the pod it named."""
    async with running(pki, extensions) as h:
        shared = await open_shared_socket(ROUTER_HOST)
        local_port = shared.port
        shared.close()
        for pod in ("stargate-0", "stargate-1", "stargate-0"):
            config = client_configuration(sni(pod), h.cafile)
            async with connect(ROUTER_HOST, h.port, configuration=config, local_port=local_port) as client:
                assert await asyncio.wait_for(request(client, WHOAMI), T) == pod.encode() + b":" + WHOAMI
        assert h.outcome("accepted") == 3 and h.router.active_flows == 3
        assert h.outcome("target_unavailable") == 0


@pytest.mark.parametrize(("spoofed_name", "fate"), [
    (sni("stargate-1"), "accepted"),
    ("nobody.example.org", "unknown_sni"),
], ids=["routable", "refused"])
async def test_a_spoofed_initial_from_a_live_clients_address_gets_its_own_fate_and_cuts_nothing(
    pki: DemoPki, extensions: Extensions, spoofed_name: str, fate: str
) -> None:
    """Another connection's first flight sent from a live client's own socket (as an off-path
    attacker spoofing that address would): it is sniffed, routed or refused on its own; the pod's
    or the router's answer reaches the live client, which drops it (not its connection IDs); the
    live connection keeps working, to its own pod."""
    async with running(pki, extensions) as h:
        config = client_configuration(sni("stargate-0"), h.cafile)
        async with connect(ROUTER_HOST, h.port, configuration=config) as live:
            assert await request(live, b"before") == b"stargate-0:before"
            spoof = QuicConnection(configuration=client_configuration(spoofed_name, h.cafile))
            spoof.connect((ROUTER_HOST, h.port), now=0.0)
            for datagram, _ in spoof.datagrams_to_send(now=0.0):  # aioquic's socket is dual-stack IPv6
                live._transport.sendto(datagram, (f"::ffff:{ROUTER_HOST}", h.port))  # type: ignore[union-attr]
            await eventually(lambda: h.outcome(fate) == (2 if fate == "accepted" else 1), what="the spoof's fate")
            for payload in (b"during", b"after"):
                assert await request(live, payload) == b"stargate-0:" + payload
            assert h.router.active_flows == (2 if fate == "accepted" else 1)


# -- flows end with their connections -----------------------------------------------------
async def test_forty_closed_connections_that_advertised_two_seconds_leave_no_flow_or_fd_behind(
    pki: DemoPki, extensions: Extensions,
) -> None:
    """Each client advertises max_idle_timeout 2 s and closes: its flow ends within three PTOs plus
    the grace (``QUIC_IDLE_PROBE_TIMEOUT_MS``, ``QUIC_IDLE_GRACE_MS``), with its pod socket."""
    async with running(pki, extensions) as h:
        before = _open_fds()

        async def one(i: int) -> None:
            config = client_configuration(sni(PODS[i % 2]), h.cafile, idle_timeout_s=2.0)
            async with connect(ROUTER_HOST, h.port, configuration=config) as client:
                assert (await request(client, WHOAMI)).startswith(PODS[i % 2].encode())

        for batch in range(4):
            await asyncio.wait_for(asyncio.gather(*(one(batch * 10 + i) for i in range(10))), 3 * T)
        # Every flow is live or already ended at its own timeout: on a loaded machine the four
        # batches can take longer than a first batch's 4 s expiry, so some may have ended already.
        assert h.outcome("accepted") == 40
        assert h.router.active_flows + _terminations(h, "quic_idle_timeout") == 40
        bound = 3 * c.QUIC_IDLE_PROBE_TIMEOUT_MS / 1000 + c.QUIC_IDLE_GRACE_MS / 1000
        await eventually(lambda: h.router.active_flows == 0, timeout_s=bound + 3, what="every flow to end")
        assert _terminations(h, "quic_idle_timeout") == 40 and _terminations(h, "idle_timeout") == 0
        assert h.outcome("completed") == 40 and _open_fds() <= before


async def test_a_client_that_advertises_no_idle_timeout_keeps_the_relay_bound(
    pki: DemoPki, extensions: Extensions
) -> None:
    """A client advertising 2 s ends at its own timeout; one advertising none (0) is still there
    then and ends at ``--relay-idle-timeout-ms`` (here 6 s), under the older label."""
    async with running(pki, extensions, idle_timeout_s=6.0, probe_timeout_s=0.3, idle_grace_s=0.3) as h:

        async def connection(idle_s: float) -> None:
            config = client_configuration(sni("stargate-0"), h.cafile, idle_timeout_s=idle_s)
            async with connect(ROUTER_HOST, h.port, configuration=config) as client:
                assert await request(client, WHOAMI) == b"stargate-0:" + WHOAMI

        await connection(2.0)
        await connection(0.0)
        await eventually(lambda: _terminations(h, "quic_idle_timeout") == 1, timeout_s=5.0, what="the 2 s flow")
        assert h.router.active_flows == 1 and _terminations(h, "idle_timeout") == 0
        await eventually(lambda: _terminations(h, "idle_timeout") == 1, timeout_s=8.0, what="the relay bound")
        assert h.router.active_flows == 0

