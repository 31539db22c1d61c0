"""The TCP edge's client intake: trusted sources, the PROXY header read off a real socket, slots."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import pytest

from router.tcp.client_intake import ClientIntake, Intake, TrustedSources, read_proxy_header
from tests.support import proxy_headers as ph
from wire.proxy_protocol import ProxyHeaderError

SOCKET_PEER = ("127.0.0.9", 40000)


def test_no_trusted_networks_trusts_no_source() -> None:
    assert not TrustedSources().allows("203.0.113.1") and not TrustedSources().allows("::1")
    assert not TrustedSources().allows("127.0.0.1")


def test_every_source_is_trusted_only_when_named() -> None:
    every = TrustedSources([ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")])
    assert every.allows("203.0.113.1") and every.allows("::1") and every.allows("::ffff:10.1.2.3")


@pytest.mark.parametrize(
    ("host", "allowed"),
    [("10.1.2.3", True), ("::ffff:10.1.2.3", True), ("11.0.0.1", False), ("fd00::1", True),
     ("fe80::1%eth0", False), ("2001:db8::1", False), ("not-an-ip", False)],
)
def test_trusted_sources_match_ipv4_ipv6_and_mapped_peers(host: str, allowed: bool) -> None:
    trusted = TrustedSources([ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8")])
    assert trusted.allows(host) is allowed


async def _intake(*chunks: bytes, close: bool = False) -> Intake:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    try:
        async def send() -> None:
            for chunk in chunks:
                theirs.sendall(chunk)
                await asyncio.sleep(0.01)
            if close:
                theirs.shutdown(socket.SHUT_WR)

        sender = asyncio.ensure_future(send())
        async with asyncio.timeout(5):
            result = await read_proxy_header(ours, SOCKET_PEER)
        await sender
        return result
    finally:
        ours.close()
        theirs.close()


async def test_header_is_removed_and_the_client_first_bytes_kept() -> None:
    header = ph.v2(("198.51.100.4", 5555))
    intake = await _intake(header[:7], header[7:] + b"\x16\x03\x01")
    assert intake == Intake(("198.51.100.4", 5555), b"\x16\x03\x01", via=SOCKET_PEER)
    assert intake.log_fields() == {"peer": "198.51.100.4:5555", "via": "127.0.0.9:40000"}


async def test_local_header_stands_for_the_socket_peer() -> None:
    assert (await _intake(ph.v2(None, local=True))).client == SOCKET_PEER


async def test_missing_or_cut_header_raises_its_error() -> None:
    with pytest.raises(ProxyHeaderError, match="no PROXY header"):
        await _intake(b"PRI * HTTP/2.0\r\n")
    with pytest.raises(ProxyHeaderError, match="closed before"):
        await _intake(b"PROXY TCP4 1.2.3.4", close=True)


async def test_an_untrusted_source_is_refused_before_anything_is_read() -> None:
    intake = ClientIntake(True, [ipaddress.ip_network("10.0.0.0/8")])
    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(ph.v2(("1.2.3.4", 1)))
        with pytest.raises(ProxyHeaderError, match="untrusted"):
            await intake.identify(ours, SOCKET_PEER)
        ours.setblocking(False)
        assert ours.recv(100) == ph.v2(("1.2.3.4", 1))  # still unread
    finally:
        ours.close()
        theirs.close()


async def test_without_proxy_protocol_the_client_is_the_socket_peer_and_slots_are_counted() -> None:
    intake = ClientIntake(False, max_per_client=1)
    first, second = socket.socket(), socket.socket()
    try:
        assert await intake.identify(first, SOCKET_PEER) == Intake(SOCKET_PEER, b"")
        assert (await intake.identify(second, ("127.0.0.9", 1))).within_limit is False
        intake.slots.release(first)
        assert (await intake.identify(second, ("127.0.0.9", 2))).within_limit is True
        intake.slots.release(second)
        assert len(intake.slots) == 0
    finally:
        first.close()
        second.close()
