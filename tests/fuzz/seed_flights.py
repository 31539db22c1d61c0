"""Real aioquic client first flights (cached): seed material for the TLS targets (their
ClientHellos) and the QUIC targets (whole protected datagrams)."""

from __future__ import annotations

import functools
import ssl

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from quic.packet import QUIC_V1
from tests.support.quic_initial_rewriter import BIG_HELLO_ALPN, open_flight


def _quic_config(server_name: str | None, version: int = QUIC_V1, big: bool = False) -> QuicConfiguration:
    config = QuicConfiguration(
        is_client=True, server_name=server_name, alpn_protocols=["stargate", *(BIG_HELLO_ALPN if big else ())],
        supported_versions=[version],
    )
    config.verify_mode = ssl.CERT_NONE
    return config


@functools.cache
def _flight_cached(server_name: str | None, version: int, big: bool) -> tuple[bytes, ...]:
    conn = QuicConnection(configuration=_quic_config(server_name, version, big))
    conn.connect(("127.0.0.1", 50072), now=0.0)
    return tuple(d for d, _ in conn.datagrams_to_send(now=0.0))


def first_flight(server_name: str | None = "stargate-0.stargate.external", version: int = QUIC_V1,
                 big: bool = False) -> list[bytes]:
    """The datagrams of a client's first flight (``big``: a ClientHello over three datagrams)."""
    return list(_flight_cached(server_name, version, big))


@functools.cache
def quic_hellos() -> tuple[bytes, ...]:
    """The ClientHellos of a normal and a big first flight."""
    return tuple(open_flight(datagrams).crypto for datagrams in (first_flight(), first_flight(big=True)))
