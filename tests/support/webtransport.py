"""WebTransport over HTTP/3 peers on aioquic: a pod that accepts sessions and a worker that opens one.

A worker's WebTransport tunnel is an HTTP/3 connection (ALPN ``h3``): an extended CONNECT
(``:protocol webtransport``) opens the session, then the session's streams carry the tunnel.
The pod answers the CONNECT with 200 and each bidirectional session stream with
``<pod_name>:<payload>``, so one session proves the handshake, the CONNECT and which pod the
router picked. Both sides are aioquic's own HTTP/3 stack (``H3Connection`` with WebTransport
on); the worker reads its session stream's answer as raw QUIC stream data, since aioquic's
HTTP/3 layer parses a client-opened stream's replies as HTTP/3 frames.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer, serve
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import HeadersReceived, WebTransportStreamDataReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, QuicEvent, StreamDataReceived

SESSION_TIMEOUT_S = 5.0
"""Bound on a whole session (handshake, CONNECT, one stream round trip)."""

MAX_DATAGRAM_FRAME_BYTES = 65_536
"""WebTransport over HTTP/3 needs HTTP/3 datagrams, so both sides offer QUIC DATAGRAM frames."""

WHOAMI = b"whoami"


class WebTransportPod(QuicConnectionProtocol):
    """Accepts every extended CONNECT for ``webtransport`` and answers each session stream."""

    pod_name = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._h3: H3Connection | None = None
        self._received: dict[int, bytes] = {}

    def quic_event_received(self, event: QuicEvent) -> None:
        if self._h3 is None:
            self._h3 = H3Connection(self._quic, enable_webtransport=True)
        for h3_event in self._h3.handle_event(event):
            if isinstance(h3_event, HeadersReceived):
                headers = dict(h3_event.headers)
                status = b"200" if (headers.get(b":method"), headers.get(b":protocol")) == (
                    b"CONNECT", b"webtransport") else b"400"
                self._h3.send_headers(h3_event.stream_id, [(b":status", status)], end_stream=status != b"200")
            elif isinstance(h3_event, WebTransportStreamDataReceived):
                data = self._received.pop(h3_event.stream_id, b"") + h3_event.data
                if h3_event.stream_ended:
                    self._quic.send_stream_data(h3_event.stream_id, self.pod_name.encode() + b":" + data, True)
                else:
                    self._received[h3_event.stream_id] = data
        self.transmit()


def _configuration(is_client: bool, **kwargs: Any) -> QuicConfiguration:
    return QuicConfiguration(
        is_client=is_client, alpn_protocols=H3_ALPN, max_datagram_frame_size=MAX_DATAGRAM_FRAME_BYTES, **kwargs
    )


async def start_webtransport_pod(
    pod_name: str, host: str, port: int, cert_path: str | Path, key_path: str | Path
) -> QuicServer:
    """Serve WebTransport sessions as ``pod_name`` on ``host:port`` (0 = any)."""
    config = _configuration(False)
    config.load_cert_chain(str(cert_path), str(key_path))
    protocol = type(f"WebTransportPod_{pod_name}", (WebTransportPod,), {"pod_name": pod_name})
    return await serve(host, port, configuration=config, create_protocol=protocol)


class WebTransportWorker(QuicConnectionProtocol):
    """Opens one session, one bidirectional stream on it, and keeps the peer's close reason."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic, enable_webtransport=True)
        self.close_reason = ""
        self._session: dict[int, asyncio.Future[int]] = {}
        self._stream: dict[int, tuple[bytearray, asyncio.Future[bytes]]] = {}

    async def open_session(self, authority: str, path: str = "/tunnel") -> int:
        """Send the extended CONNECT; the session ID once the pod answered 200."""
        session_id = self._quic.get_next_available_stream_id()
        answered = self._session[session_id] = asyncio.get_running_loop().create_future()
        self.h3.send_headers(session_id, [
            (b":method", b"CONNECT"), (b":protocol", b"webtransport"), (b":scheme", b"https"),
            (b":authority", authority.encode()), (b":path", path.encode()),
        ])
        self.transmit()
        status = await answered
        if status != 200:
            raise ConnectionError(f"CONNECT answered {status}")
        return session_id

    async def stream_round_trip(self, session_id: int, payload: bytes) -> bytes:
        """One bidirectional session stream: ``payload`` and FIN out, the pod's answer back."""
        stream_id = self.h3.create_webtransport_stream(session_id)
        answer = asyncio.get_running_loop().create_future()
        self._stream[stream_id] = (bytearray(), answer)
        self._quic.send_stream_data(stream_id, payload, end_stream=True)
        self.transmit()
        return await answer

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ConnectionTerminated):
            self.close_reason = event.reason_phrase
        if isinstance(event, StreamDataReceived) and event.stream_id in self._stream:
            buffer, answer = self._stream[event.stream_id]
            buffer += event.data
            if event.end_stream and not answer.done():
                answer.set_result(bytes(buffer))
            return
        for h3_event in self.h3.handle_event(event):
            if isinstance(h3_event, HeadersReceived) and h3_event.stream_id in self._session:
                future = self._session[h3_event.stream_id]
                if not future.done():
                    future.set_result(int(dict(h3_event.headers).get(b":status", b"0")))
        super().quic_event_received(event)


async def webtransport_whoami(host: str, port: int, server_name: str, cafile: str | Path) -> str:
    """Open a WebTransport session to ``server_name`` through ``host:port``; the pod that answered.

    A refused attempt raises ``ConnectionError`` carrying the peer's CONNECTION_CLOSE reason phrase.
    """

    async def run() -> str:
        config = _configuration(True, server_name=server_name)
        config.load_verify_locations(cafile=str(cafile))
        made: list[WebTransportWorker] = []

        def factory(*args: Any, **kwargs: Any) -> WebTransportWorker:
            made.append(WebTransportWorker(*args, **kwargs))
            return made[-1]

        try:
            async with connect(host, port, configuration=config, create_protocol=factory) as client:
                assert isinstance(client, WebTransportWorker)
                session_id = await client.open_session(server_name)
                answer = await client.stream_round_trip(session_id, WHOAMI)
        except ConnectionError as exc:
            reason = made[-1].close_reason if made else ""
            raise ConnectionError(reason or str(exc)) from None
        name, sep, echoed = answer.partition(b":")
        if not sep or echoed != WHOAMI:
            raise ConnectionError(f"unexpected answer {answer!r}")
        return name.decode()

    return await asyncio.wait_for(run(), SESSION_TIMEOUT_S)
