"""A bug that one client's datagrams meet costs those datagrams only, on both datapaths.

No client datagram is known to make the edge raise; this holds the edge to what it does if one
ever does. A fault is injected one step behind the demultiplexing (``ClientDemux._judged`` raises
for datagrams that carry a marker), and a burst of such datagrams from many client addresses
reaches the router in one read around a real aioquic connection's first flight: that connection
completes, and the log carries one traceback a second (``QUIC_DATAGRAM_ERROR_LOG_LINES_PER_S``),
the next line counting the ones suppressed, never one traceback per datagram.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from contextlib import ExitStack
from typing import Any

import pytest
from aioquic.asyncio import QuicConnectionProtocol
from aioquic.quic.connection import QuicConnection

from router import constants as c
from router.demo.pki import DemoPki
from router.demo.quic_pods import WHOAMI, client_configuration, request
from router.extensions import Extensions
from router.udp.flows import Address
from tests.support.names import host as sni
from tests.support.polling import eventually
from tests.support.quic_pods_harness import ROUTER_HOST, T, running

pytestmark = pytest.mark.timeout(30)
"""Every test here runs on the pure-Python path and on the C splice."""

MARKER = b"\x40a datagram that meets a bug"
FAULTY_ADDRESSES = 40


async def test_a_bug_some_datagrams_meet_costs_no_other_datagram_and_logs_a_traceback_a_second(
    pki: DemoPki, extensions: Extensions, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(pki, extensions) as h:
        router = h.router
        reached = router.demux._judged

        def faulty(first: Any, data: bytes, addr: Address, now: float) -> None:
            if data.startswith(MARKER):
                raise RuntimeError("an injected bug")
            reached(first, data, addr, now)

        router.demux._judged = faulty  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        client = QuicConnectionProtocol(QuicConnection(configuration=client_configuration(sni("stargate-1"),
                                                                                          h.cafile)))
        transport, _ = await loop.create_datagram_endpoint(lambda: client, local_addr=(ROUTER_HOST, 0))
        with caplog.at_level(logging.ERROR, logger="router.udp_router"), ExitStack() as stack:
            socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
                     for _ in range(FAULTY_ADDRESSES + 1)]
            to = (ROUTER_HOST, h.port)
            try:
                # no await in between: the router reads them all at its next wake-up, in this order
                for sock in socks[: FAULTY_ADDRESSES // 2]:
                    sock.sendto(MARKER, to)
                client._quic.connect(to, now=loop.time())
                client.transmit()
                for sock in socks[FAULTY_ADDRESSES // 2 : FAULTY_ADDRESSES]:
                    sock.sendto(MARKER, to)
                await asyncio.wait_for(client.wait_connected(), T)
                assert await request(client, WHOAMI, T) == b"stargate-1:" + WHOAMI
                later = time.monotonic() + 1.0 / c.QUIC_DATAGRAM_ERROR_LOG_LINES_PER_S
                router.demux.errors._clock = lambda: later  # the bucket's clock moved on: a token again
                socks[-1].sendto(MARKER, to)
                await eventually(lambda: len([r for r in caplog.records if r.levelno >= logging.ERROR]) >= 2,
                                 what="the next bug's line")
            finally:
                client.close()
                transport.close()
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert [(r.getMessage().startswith("unexpected error handling a quic datagram"), _suppressed(r),
                 r.exc_info is not None) for r in errors] == [(True, 0, True), (True, FAULTY_ADDRESSES - 1, True)]
        assert h.outcome("accepted") == 1


def _suppressed(record: Any) -> int:
    return int(getattr(record, "suppressed", 0))
