"""The QUIC edge's per-client limit in process: pending flows hold their client's slot, refused
attempts never cost a pending flow, and every way a pending flow ends gives the slot back."""

from __future__ import annotations

import asyncio
import os
import socket

from discovery.targets import EMPTY_SNAPSHOT
from router import constants as c
from router.extensions import Extensions
from router.metrics import RouterMetrics
from router.outcomes import QuicOutcome
from router.udp.settings import UdpRouterSettings
from tests.support.initial_packets import protected_initial
from tests.support.polling import eventually
from tests.support.quic_frames import crypto_frame
from tests.support.udp_router import running_udp_router

INCOMPLETE_HELLO = crypto_frame(0, b"\x01\x00\x02\x00" + bytes(60))
"""The start of a 512-byte ClientHello: its flow stays pending until it times out."""


def _client(ip: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((ip, 0))
    return sock


async def test_pending_flows_count_and_a_timed_out_one_gives_its_slot_back(extensions: Extensions) -> None:
    """On the pure-Python path and on the C splice."""
    metrics = RouterMetrics()

    def refused() -> float | None:
        labels = {"outcome": QuicOutcome.CLIENT_LIMIT}
        return metrics.registry.get_sample_value(f"{c.QUIC_CONNECTIONS_TOTAL}_total", labels)

    settings = UdpRouterSettings(max_flows_per_client=2, extensions=extensions)
    async with running_udp_router(lambda: EMPTY_SNAPSHOT, settings, metrics) as (router, port):
        clients = [_client("127.0.0.41") for _ in range(3)] + [_client("127.0.0.42")]
        try:
            for sock in clients:
                sock.sendto(protected_initial(INCOMPLETE_HELLO, dcid=os.urandom(8)), ("127.0.0.1", port))
            await eventually(lambda: refused() == 1, what="the third flow of 127.0.0.41 refused")
            assert router.pending_flows == 3  # two of 127.0.0.41, one of 127.0.0.42: none for the refused
            router.sweep(asyncio.get_running_loop().time() + 3600)  # every pending flow times out
            assert router.pending_flows == 0
            clients[2].sendto(protected_initial(INCOMPLETE_HELLO, dcid=os.urandom(8)), ("127.0.0.1", port))
            await eventually(lambda: router.pending_flows == 1, what="a new pending flow after the release")
            assert refused() == 1
        finally:
            for sock in clients:
                sock.close()
