"""The TCP edge's rejection writer: tell a refused client why, in its own protocol, then close.

A TLS client gets one fatal alert, an h2c client a trailers-only gRPC response (after the
router's SETTINGS, already sent by the peek), each chosen by ``REFUSAL_ANSWERS``. The socket
is then half-closed and read for ``REJECT_LINGER_S`` so the client reads the answer, not a RST.
"""

from __future__ import annotations

import asyncio
import socket

from router import constants as c
from router.log_text import clip_optional
from router.outcomes import ProtocolLabel
from router.routing import REFUSAL_ANSWERS, Refusal, Refused
from router.tcp.poller import poller_for, recv, sendall
from wire.grpc import grpc_rejection
from wire.tls import tls_alert


def rejection_bytes(protocol: ProtocolLabel, refusal: Refusal, stream_id: int, message: str) -> bytes | None:
    """The answer to a refused client, or None when it is only closed (a malformed h2c start)."""
    answer = REFUSAL_ANSWERS[refusal]
    if protocol is ProtocolLabel.TLS:
        return tls_alert(answer.tls_alert) if answer.tls_alert is not None else None
    if answer.grpc_status is None:
        return None
    return grpc_rejection(stream_id, answer.grpc_status, message)


async def answer_and_close(conn: socket.socket, answer: bytes | None) -> tuple[int, int]:
    """Send ``answer`` (if any), half-close, drain the client for a moment, close; never raises
    OSError. Returns ``(bytes sent, bytes read meanwhile)`` for the access line."""
    sent = received = 0
    if answer is None:
        conn.close()
        return sent, received
    poller = poller_for(asyncio.get_running_loop())
    try:
        async with asyncio.timeout(c.REJECT_LINGER_S):
            await sendall(poller, conn, answer)
        sent = len(answer)
        conn.shutdown(socket.SHUT_WR)
        async with asyncio.timeout(c.REJECT_LINGER_S):  # the client's own close, or the linger's end
            while chunk := await recv(poller, conn, 4096):
                received += len(chunk)
    except (OSError, TimeoutError):
        pass
    finally:
        conn.close()
    return sent, received


def refusal_detail(refused: Refused, hostname: str | None) -> str:
    """The grpc-message / log text of a routing refusal (the Rust router's wording); the client's name
    in it is cut at ``LOG_FIELD_MAX_CHARS`` (``clip``), so neither answer nor line grows with it."""
    hostname = clip_optional(hostname)
    if refused.refusal is Refusal.NO_READY_TARGET:
        return "no ready stargate for round-robin"
    if refused.refusal is Refusal.MISSING_NAME:
        return "missing authority"
    if refused.refusal is Refusal.UNKNOWN_NAME:
        return f"unknown authority {hostname!r}"
    return f"target stargate not ready for {hostname!r}"
