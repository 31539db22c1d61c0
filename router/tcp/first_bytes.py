"""The TCP edge's first bytes: TLS ClientHello or h2c request, until the hostname. Sans-IO.

Anything else, or a malformed start, is ``Rejected``: answered in its protocol and closed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from router.outcomes import GrpcOutcome, ProtocolLabel
from router.routing import REFUSAL_ANSWERS, Refusal
from wire import h2c, tls
from wire.client_hello import ClientHelloInfo, parse_client_hello
from wire.h2_frames import H2PeekError
from wire.h2c import H2Request, H2RequestReader, looks_like_h2c
from wire.tls import ClientHelloReader, TlsPeekError, looks_like_tls

PEEK_READ_BYTES: Final = max(tls.MAX_PEEK_BYTES, h2c.MAX_PEEK_BYTES)
"""One read of a connection's first bytes takes whatever either reader may look at."""


class Rejected(Exception):
    """The connection is answered (per ``REFUSAL_ANSWERS``) and closed."""

    def __init__(self, refusal: Refusal, detail: str, pod: str | None = None) -> None:
        super().__init__(detail)
        self.refusal = refusal
        self.pod = pod

    @property
    def outcome(self) -> GrpcOutcome:
        outcome = REFUSAL_ANSWERS[self.refusal].grpc_outcome
        assert outcome is not None, f"{self.refusal} is not a TCP refusal"
        return outcome


@dataclass(slots=True)
class Peeked:
    """What the first bytes say: the protocol, every byte read so far, the hostname."""

    protocol: ProtocolLabel
    buffered: bytes
    hostname: str | None
    h2_request: H2Request | None = None
    tls_hello: ClientHelloInfo | None = None
    received: int = 0
    """Bytes read from the client while peeking (the access line's count starts with them)."""
    answered: int = 0
    """Bytes the router itself sent the client while peeking (h2c: its SETTINGS)."""
    closed_early: bool = False
    """The client closed before naming a host (its access line says ``client_close``)."""


class FirstBytes:
    """The first bytes of a connection until its hostname. Updates ``progress`` (the protocol as soon as
    the bytes say TLS, the bytes read, an early close); ``settings_due``: the h2c preface arrived and the
    router's SETTINGS must be sent (once) before the client goes on."""

    __slots__ = ("_buffered", "_h2", "_parse_hello", "_settings_sent", "_tls", "progress", "settings_due")

    def __init__(
        self, progress: Peeked, parse_hello: Callable[[bytes], ClientHelloInfo] = parse_client_hello
    ) -> None:
        self.progress = progress
        self._parse_hello = parse_hello
        self._buffered = bytearray()
        self._tls: ClientHelloReader | None = None
        self._h2: H2RequestReader | None = None
        self._settings_sent = False
        self.settings_due = False

    def feed(self, data: bytes) -> Peeked | None:
        """The peek's result once complete, else None; raises ``Rejected`` for bad first bytes."""
        if not data:
            self.progress.closed_early = True
            raise Rejected(Refusal.MALFORMED, "connection closed before the hostname")
        self.progress.received += len(data)
        buffered = self._buffered
        whole = data if not buffered else None  # the first read is all there is: no copies of it
        buffered += data
        tls, h2 = self._tls, self._h2
        if tls is None and h2 is None:
            data = whole if whole is not None else bytes(buffered)
            if looks_like_tls(data):
                tls = self._tls = ClientHelloReader(parse=self._parse_hello)
                self.progress.protocol = ProtocolLabel.TLS
            elif looks_like_h2c(data):
                h2 = self._h2 = H2RequestReader()
            else:
                raise Rejected(Refusal.MALFORMED, "neither TLS nor HTTP/2 prior knowledge")
        try:
            if tls is not None:
                hello = tls.feed(data)
                if hello is not None:
                    read = whole if whole is not None else bytes(buffered)
                    return Peeked(ProtocolLabel.TLS, read, hello.server_name, tls_hello=hello)
            elif h2 is not None:
                request = h2.feed(data)
                if not self._settings_sent and h2.saw_preface:
                    self._settings_sent = self.settings_due = True
                if request is not None:
                    read = whole if whole is not None else bytes(buffered)
                    return Peeked(ProtocolLabel.H2C, read, request.authority, h2_request=request)
        except (TlsPeekError, H2PeekError) as exc:
            raise Rejected(Refusal.MALFORMED, str(exc)) from None
        return None
