"""QUIC-LB pods for the tests: real aioquic servers whose every connection ID names the pod.

A QUIC-LB pod issues connection IDs of the plaintext layout of draft-ietf-quic-load-balancers
(``router/udp/quic_lb.py`` reads them): a first octet (config rotation in its top three bits, the
length minus one or random bits in its low five), the pod's server ID (the last N bytes of its
address), then a random nonce. aioquic draws a server connection's IDs with ``os.urandom`` in two
places: its first one in ``QuicConnection.__init__`` and the later ones (sent in NEW_CONNECTION_ID
frames) in ``_replenish_connection_ids``. ``start_quic_lb_pod`` gives each new connection, before
its first datagram, IDs of the QUIC-LB layout in both places (``issue_quic_lb_cids``).

The pods answer one request per stream: ``bytes <n>`` gets ``n`` bytes of ``payload(n)`` (a
transfer to check byte for byte); anything else ``<pod>:<request>``, as the demo pods do.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aioquic.asyncio import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer, serve
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from router.demo.quic_pods import ALPN
from router.udp.quic_lb import SELF_ENCODED_LENGTH_MASK, pod_server_id

CID_BYTES = 12
"""The pods' connection ID length: a first octet, a 4-byte server ID and a 7-byte nonce."""
CHUNK_BYTES = 64 * 1024
REQUEST_BYTES = 1024


def quic_lb_cid(
    server_id: bytes, nonce: bytes, rotation: int = 0, *, self_encoded: bool = False, random_bits: int = 0
) -> bytes:
    """A connection ID of the plaintext QUIC-LB layout: first octet (``rotation``, then the length
    minus one if ``self_encoded``, else ``random_bits``), server ID, nonce."""
    low = (len(server_id) + len(nonce)) if self_encoded else random_bits
    return bytes([rotation << 5 | low & SELF_ENCODED_LENGTH_MASK]) + server_id + nonce


class PodCids:
    """A pod's connection ID generator: its server ID, ``length`` bytes in all, random nonces."""

    def __init__(self, address: str, server_id_bytes: int, length: int = CID_BYTES, self_encoded: bool = True):
        server_id = pod_server_id(address, server_id_bytes)
        assert server_id is not None and length >= 1 + server_id_bytes + 4
        self.server_id, self.length, self.self_encoded = server_id, length, self_encoded
        self.issued: list[bytes] = []
        """Every connection ID it made, in order."""

    def __call__(self) -> bytes:
        nonce = os.urandom(self.length - 1 - len(self.server_id))
        cid = quic_lb_cid(self.server_id, nonce, random.randrange(7), self_encoded=self.self_encoded,
                          random_bits=random.getrandbits(5))
        self.issued.append(cid)
        return cid


def issue_quic_lb_cids(connection: QuicConnection, cids: PodCids) -> None:
    """Make a server connection that has read nothing yet issue ``cids``' connection IDs only."""
    first = connection._host_cids[0]
    first.cid = connection.host_cid = connection._local_initial_source_connection_id = cids()
    random_ones = connection._replenish_connection_ids

    def replenish() -> None:  # aioquic's own, then its new (unsent) random IDs replaced by ours
        random_ones()
        for issued in connection._host_cids:
            if not issued.was_sent and issued.cid not in cids.issued:
                issued.cid = cids()

    connection._replenish_connection_ids = replenish  # type: ignore[method-assign]


def payload(n: int) -> bytes:
    """What a pod sends for ``bytes <n>``: the same bytes every time, none periodic."""
    return random.Random(n).randbytes(n)


def _answer(pod_name: str) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], None]:
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.read(REQUEST_BYTES)
        if request.startswith(b"bytes "):
            data = payload(int(request.split()[1]))
            for at in range(0, len(data), CHUNK_BYTES):
                writer.write(data[at : at + CHUNK_BYTES])
                await writer.drain()
        else:
            writer.write(pod_name.encode() + b":" + request)
        writer.write_eof()

    def on_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(handle(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    return on_stream


async def start_quic_lb_pod(
    pod_name: str, host: str, cert_path: str | Path, key_path: str | Path, cids: PodCids,
    idle_timeout_s: float = 30.0,
) -> QuicServer:
    """A QUIC-LB pod ``pod_name`` on ``host`` (any port: ``router.demo.quic_pods.bound_port``)."""
    config = QuicConfiguration(is_client=False, alpn_protocols=[ALPN], idle_timeout=idle_timeout_s)
    config.connection_id_length = cids.length
    config.load_cert_chain(str(cert_path), str(key_path))

    def create_protocol(connection: QuicConnection, **kwargs: Any) -> QuicConnectionProtocol:
        issue_quic_lb_cids(connection, cids)
        return QuicConnectionProtocol(connection, **kwargs)

    return await serve(host, 0, configuration=config, create_protocol=create_protocol,
                       stream_handler=_answer(pod_name))


async def fetch(
    client: QuicConnectionProtocol, n: int, midway: Callable[[], Awaitable[None]] | None = None,
    timeout_s: float = 20.0,
) -> bytes:
    """Ask for ``n`` bytes on a new stream and read them all; ``midway`` runs once, when half came."""
    reader, writer = await client.create_stream()
    writer.write(b"bytes %d" % n)
    writer.write_eof()
    got = bytearray()

    async def read_all() -> None:
        nonlocal midway
        while chunk := await reader.read(CHUNK_BYTES):
            got.extend(chunk)
            if midway is not None and len(got) >= n // 2:
                step, midway = midway, None
                await step()

    await asyncio.wait_for(read_all(), timeout_s)
    return bytes(got)
