"""QUIC tunnels that outlive their replica: two router processes behind a UDP balancer that sends
each new client address to the next replica (as a Gateway does once its session expired), with
real aioquic pods that issue QUIC-LB connection IDs and a real aioquic client.

A connection whose datagrams reach a replica that never saw it is routed there by the server ID in
its connection ID; a transfer completes byte for byte through a rolling restart (SIGTERM to the
replica holding the flow, mid-transfer, then to the next one); and the connection keeps working
through connection IDs no router saw (the pod's NEW_CONNECTION_ID ones, which the client switches
to). Without QUIC-LB the same move is dropped and counted at the new replica, never misrouted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aioquic.asyncio import connect

from router.demo.pki import DemoPki
from router.demo.quic_pods import client_configuration, request
from router.extensions import Extensions
from tests.support.access_peers import access_lines
from tests.support.names import host as sni
from tests.support.polling import eventually
from tests.support.quic_lb_pods import CID_BYTES, fetch, payload
from tests.support.quic_lb_replicas import Replicas, keeping_alive, replicas
from tests.support.shared_socket import open_shared_socket

pytestmark = pytest.mark.timeout(120)
"""Every test here runs on the pure-Python path and on the C splice."""

QUIC_LB = "--quic-lb-server-id-bytes=4"
TRANSFER_BYTES = 3 * 1024 * 1024


async def _session_expired(r: Replicas) -> None:
    await eventually(lambda: not r.balancer.sessions, what="the balancer to forget the idle session")


@pytest.mark.parametrize(
    ("flags", "self_encoded"), [((QUIC_LB,), True), ((QUIC_LB, f"--quic-cid-length={CID_BYTES}"), False)],
    ids=["self_encoded_length", "configured_length"],
)
async def test_a_connection_moved_to_a_replica_that_never_saw_it_is_routed_by_its_server_id(
    pki: DemoPki, tmp_path: Path, extensions: Extensions, flags: tuple[str, ...], self_encoded: bool
) -> None:
    async with replicas(pki, tmp_path, extensions, *flags, self_encoded=self_encoded) as r:
        a, b = r.routers
        config = client_configuration(sni("stargate-1"), pki.ca_path)
        async with connect(*r.front, configuration=config) as client:
            assert await request(client, b"via a") == b"stargate-1:via a"
            await _session_expired(r)
            assert await request(client, b"via b") == b"stargate-1:via b"
            assert r.balancer.picked == [r.address(a), r.address(b)]
            client._quic.change_connection_id()  # one the pod issued in NEW_CONNECTION_ID: no router saw it
            assert await request(client, b"new cid") == b"stargate-1:new cid"
        assert (await r.outcome(a, "accepted"), await r.outcome(a, "joined")) == (1, 0)
        assert (await r.outcome(b, "accepted"), await r.outcome(b, "joined")) == (0, 1)  # one flow, both CIDs
        assert await r.dropped(b, "quic_lb_unknown_server") == 0
        r.terminate(b)
        assert await r.exit_status(b) == 0
        joined = [line for line in access_lines(b) if line["protocol"] == "quic"]
        assert [(x["hostname"], x["pod"], x["outcome"]) for x in joined] == [(None, "stargate-1", "completed")]


async def test_a_transfer_completes_byte_exact_through_a_rolling_restart_of_every_replica(
    pki: DemoPki, tmp_path: Path, extensions: Extensions
) -> None:
    async with replicas(pki, tmp_path, extensions, QUIC_LB) as r:
        a, b = r.routers
        config = client_configuration(sni("stargate-0"), pki.ca_path)
        async with connect(*r.front, configuration=config) as client:
            with keeping_alive(client):
                assert await request(client, b"hello") == b"stargate-0:hello"

                async def roll_a() -> None:  # the replica that routed the flow goes, mid-transfer
                    r.terminate(a)

                assert await fetch(client, TRANSFER_BYTES, roll_a) == payload(TRANSFER_BYTES)
                assert await r.exit_status(a) == 0
                a2 = await r.start_router()  # the rollout's new replica: it never saw the connection

                async def roll_b() -> None:  # the next one goes, and the client takes a CID no router saw
                    assert (await r.outcome(b, "accepted"), await r.outcome(b, "joined")) == (0, 1)
                    client._quic.change_connection_id()
                    r.terminate(b)

                assert await fetch(client, TRANSFER_BYTES + 1, roll_b) == payload(TRANSFER_BYTES + 1)
                assert await request(client, b"after") == b"stargate-0:after"
        assert r.balancer.picked == [r.address(a), r.address(b), r.address(a2)]
        assert await r.exit_status(b) == 0
        assert (await r.outcome(a2, "accepted"), await r.outcome(a2, "joined")) == (0, 1)


async def test_an_endpoints_connections_to_two_pods_move_together_and_each_reaches_its_own_pod(
    pki: DemoPki, tmp_path: Path, extensions: Extensions
) -> None:
    """One client socket (a quinn ``Endpoint``) with a connection to each pod: the replica they move
    to sees one new address whose datagrams name two pods. The first to speak opens a flow there;
    the other's connection IDs name the other pod, so it gets its own flow beside it."""
    async with replicas(pki, tmp_path, extensions, QUIC_LB) as r:
        a, b = r.routers
        shared = await open_shared_socket("127.0.0.1")
        try:
            first = await shared.connect(r.front, client_configuration(sni("stargate-0"), pki.ca_path))
            second = await shared.connect(r.front, client_configuration(sni("stargate-1"), pki.ca_path))
            for connection, pod in ((first, "stargate-0"), (second, "stargate-1")):
                assert await request(connection, b"via a") == pod.encode() + b":via a"
            await _session_expired(r)
            for _ in range(2):
                assert await request(second, b"via b") == b"stargate-1:via b"
                assert await request(first, b"via b") == b"stargate-0:via b"
            assert shared.unmatched == 0 and r.balancer.picked == [r.address(a), r.address(b)]
        finally:
            shared.close()
        assert (await r.outcome(a, "accepted"), await r.outcome(b, "joined")) == (2, 2)


async def test_a_quinn_pods_connection_moved_to_a_replica_that_never_saw_it_keeps_working(
    pki: DemoPki, tmp_path: Path, extensions: Extensions, quinn_peer: Path
) -> None:
    """The quinn pod issues its connection IDs with the ``ConnectionIdGenerator`` docs/quic.md shows."""
    async with replicas(pki, tmp_path, extensions, QUIC_LB, quinn=quinn_peer) as r:
        a, b = r.routers
        config = client_configuration(sni("stargate-1"), pki.ca_path)
        async with connect(*r.front, configuration=config) as client:
            assert await request(client, b"via a") == b"stargate-1:via a"
            await _session_expired(r)
            assert await request(client, b"via b") == b"stargate-1:via b"
            client._quic.change_connection_id()
            assert await request(client, b"new cid") == b"stargate-1:new cid"
            assert r.balancer.picked == [r.address(a), r.address(b)]
        assert (await r.outcome(a, "accepted"), await r.outcome(b, "joined")) == (1, 1)


async def test_without_quic_lb_a_moved_connection_is_dropped_and_counted_never_misrouted(
    pki: DemoPki, tmp_path: Path, extensions: Extensions
) -> None:
    async with replicas(pki, tmp_path, extensions) as r:
        b = r.routers[1]
        config = client_configuration(sni("stargate-1"), pki.ca_path, idle_timeout_s=2.0)
        async with connect(*r.front, configuration=config) as client:
            assert await request(client, b"via a") == b"stargate-1:via a"
            await _session_expired(r)
            r.balancer.idle_s = 60.0  # the new session stays on b: a retransmission may not come back to a
            with pytest.raises(TimeoutError):
                await request(client, b"via b", timeout_s=1.0)
            assert r.balancer.picked[1:] == [r.address(b)]
        assert await r.dropped(b, "not_initial") > 0
        assert (await r.outcome(b, "accepted"), await r.outcome(b, "joined")) == (0, 0)
        assert await r.dropped(b, "quic_lb_unknown_server") == 0
