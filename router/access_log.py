"""The access log: one line per TCP connection and per QUIC flow, written when it ends.

"What happened to this worker's connection?" must be answerable from the log alone, like
HAProxy's tcplog line with its termination state. An edge opens an ``AccessRecord`` when a
connection is accepted (or a QUIC flow's first Initial arrives), fills in what it learns
(hostname, pod, the decision time, byte counts) and hands it to ``AccessLog.end`` with the
outcome (the counter's label) and a ``Termination`` (who ended it and how). ``end`` counts
the termination and the duration in Prometheus, drops the record from the live view and
writes the line through the process logging (``--log-format text|json``) at info:

    {"ts":..., "level":"info", "logger":"router.access", "msg":"access", "event":"access",
     "protocol":"h2c", "client":"10.0.0.7:53114", "hostname":"stargate-0.stargate.external",
     "pod":"stargate-0", "pod_address":"10.1.2.3:50051", "outcome":"completed",
     "termination":"client_close", "bytes_client_to_pod":812, "bytes_pod_to_client":1405,
     "duration_ms":51.2, "decision_us":140}

An accepted connection's line, the one per connection, is rendered straight from the record's
``values`` by ``render_text_line``/``render_json_line`` when the router's handler alone writes it (no
dict, no LogRecord); tests hold those to the formatters' bytes.

Lines of accepted connections (outcome ``completed`` or ``relay_error``) are never dropped;
lines of rejected ones pass the rejection rate limiter, so a flood cannot flood the log. The
metrics are counted either way, also with ``--access-log off``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from router import constants as c
from router.live_view import LiveConnections
from router.log_limiter import RateLimitedLog
from router.logging_setup import EVENT_FIELDS, direct_handler, json_string, needs_quotes, text_value, timestamp_now
from router.metrics import RouterMetrics
from router.outcomes import GrpcOutcome, ProtocolLabel, QuicFlowOutcome, Termination

Outcome = GrpcOutcome | QuicFlowOutcome | None
"""The counter's outcome label of a connection or flow; None for a flow that never got one (a QUIC
flow whose ClientHello never completed, a TCP connection cut by the drain before its decision)."""

ACCEPTED_OUTCOMES: Final = frozenset({GrpcOutcome.COMPLETED, GrpcOutcome.RELAY_ERROR})
"""Outcomes of a connection that reached its pod: their lines are never rate limited."""

ACCESS_MESSAGE: Final = "access"
"""The ``msg`` (and ``event``) of every access line, to filter them with one match."""


@dataclass(slots=True, eq=False)
class AccessRecord:
    """What the router knows about one connection or flow; the live view reads it while it lives.

    Byte counts are what the client sent (including the bytes read to find the hostname) and
    what it was sent (including anything the router itself answered). While a relay runs,
    ``probe`` adds its live counts and last activity, so a long stream shows them growing.
    """

    protocol: ProtocolLabel
    """``h2c``, ``tls`` or ``quic`` (a TCP connection counts as h2c until its bytes say TLS)."""
    client: str
    """``ip:port`` or ``[v6]:port``."""
    started: float
    """Monotonic time of accept (TCP) or of the flow's first datagram (QUIC)."""
    hostname: str | None = None
    pod: str | None = None
    pod_address: str | None = None
    """``ip:port`` of the pod once dialled."""
    decided_at: float | None = None
    """Monotonic time of the routing decision."""
    bytes_client_to_pod: int = 0
    bytes_pod_to_client: int = 0
    last_active: float = 0.0
    probe: Callable[[], tuple[int, int, float]] | None = None
    """Live ``(client_to_pod, pod_to_client, last_active)`` of a running relay, added to the counts."""
    listed: bool = False
    """Listed in the live view (false only past its bound, where it is merely counted)."""
    ended: bool = False

    def current(self) -> tuple[int, int, float]:
        """Byte counts and last activity now (the probe's live part included)."""
        up, down, last = self.bytes_client_to_pod, self.bytes_pod_to_client, self.last_active
        if self.probe is not None:
            live_up, live_down, live_last = self.probe()
            up, down, last = up + live_up, down + live_down, max(last, live_last)
        return up, down, max(last, self.started)

    def settle(self) -> None:
        """Fold the probe's live counts into the record for good (its relay is gone)."""
        self.bytes_client_to_pod, self.bytes_pod_to_client, self.last_active = self.current()
        self.probe = None

    def values(self, outcome: Outcome, termination: Termination, now: float) -> LineValues:
        """The access line's values after ``event``, in the line's order (one computation for the
        dict of the generic path and the access renderers alike)."""
        up, down = self.bytes_client_to_pod, self.bytes_pod_to_client
        if self.probe is not None:  # a relay still running (a drain's cut): its live counts too
            up, down, _last = self.current()
        decided = self.decided_at
        return (
            self.protocol, self.client, self.hostname, self.pod, self.pod_address, outcome, termination,
            up, down, round((now - self.started) * 1000.0, 3),
            None if decided is None else round((decided - self.started) * 1e6),
        )

    def fields(self, outcome: Outcome, termination: Termination, now: float) -> dict[str, Any]:
        """The access line's keys, in their documented order."""
        protocol, client, hostname, pod, pod_address, _, _, up, down, duration, decision = self.values(
            outcome, termination, now
        )
        return {
            "event": ACCESS_MESSAGE,
            "protocol": protocol,
            "client": client,
            "hostname": hostname,
            "pod": pod,
            "pod_address": pod_address,
            "outcome": outcome,
            "termination": str(termination),
            "bytes_client_to_pod": up,
            "bytes_pod_to_client": down,
            "duration_ms": duration,
            "decision_us": decision,
        }


LineValues = tuple[
    ProtocolLabel, str, str | None, str | None, str | None, Outcome, Termination, int, int, float, int | None
]
"""``AccessRecord.values``: protocol, client, hostname, pod, pod_address, outcome, termination,
bytes_client_to_pod, bytes_pod_to_client, duration_ms, decision_us."""


def render_text_line(head: str, ts: str, values: LineValues) -> str:
    """An accepted connection's text line, byte for byte ``TextFormatter``'s, in one f-string (the
    generic formatter's dict, dispatch per field and join cost more than the rest of ``end``).

    ``head`` is ``text_head(logger name)``. ``protocol``, ``outcome`` and ``termination`` are written
    bare: ``end`` found them among the enums' values (plain ``[a-z0-9_]`` words) before calling; the
    four free strings are checked for quoting with one scan, and quoted one by one only if needed.
    """
    protocol, client, hostname, pod, pod_address, outcome, termination, up, down, duration, decision = values
    texts: tuple[object, ...] = (client, hostname, pod, pod_address)
    if "" in texts or needs_quotes(f"{client}{hostname}{pod}{pod_address}"):  # else all four are bare
        texts = tuple(map(text_value, texts))
    return (
        f"{ts}{head}{protocol!s} client={texts[0]!s} hostname={texts[1]!s}"
        f" pod={texts[2]!s} pod_address={texts[3]!s} outcome={outcome!s}"
        f" termination={termination!s} bytes_client_to_pod={up!s} bytes_pod_to_client={down!s}"
        f" duration_ms={duration!s} decision_us={decision!s}"
    )


def render_json_line(head: str, ts: str, values: LineValues) -> str:
    """An accepted connection's JSON line, byte for byte ``JsonFormatter``'s (same string escaping,
    ``repr`` of numbers), in one f-string; ``head`` is ``json_head(logger name)``, and the enum
    values are plain words as in ``render_text_line``."""
    protocol, client, hostname, pod, pod_address, outcome, termination, up, down, duration, decision = values
    return (
        f'{{"ts":"{ts}{head}{protocol!s}","client":{json_string(client)},"hostname":{json_string(hostname)}'
        f',"pod":{json_string(pod)},"pod_address":{json_string(pod_address)},"outcome":"{outcome!s}"'
        f',"termination":"{termination!s}","bytes_client_to_pod":{up!r},"bytes_pod_to_client":{down!r}'
        f',"duration_ms":{float.__repr__(duration) if math.isfinite(duration) else json.dumps(duration)}'
        f',"decision_us":{"null" if decision is None else repr(decision)}}}'
    )


def text_head(logger_name: str) -> str:
    """What a text access line holds between ``ts`` and the protocol's value."""
    return f" info {logger_name} {ACCESS_MESSAGE} event={ACCESS_MESSAGE} protocol="


def json_head(logger_name: str) -> str:
    """What a JSON access line holds between ``ts``'s value and the protocol's value."""
    return (f'","level":"info","logger":{json_string(logger_name)},"msg":{json_string(ACCESS_MESSAGE)}'
            f',"event":{json_string(ACCESS_MESSAGE)},"protocol":"')


class AccessLog:
    """Opens and ends ``AccessRecord``s: live view, termination metrics, and the access line."""

    def __init__(
        self,
        metrics: RouterMetrics,
        *,
        enabled: bool = True,
        live: LiveConnections | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.enabled = enabled
        self.live = live if live is not None else LiveConnections()
        self._log = logger if logger is not None else logging.getLogger(c.ACCESS_LOGGER_NAME)
        self._rejected = RateLimitedLog(self._log)
        self._ends = {
            (p, t): metrics.terminations.labels(protocol=p, termination=t)
            for p in ProtocolLabel for t in Termination
        }
        self._durations = {p: metrics.connection_duration.labels(protocol=p) for p in ProtocolLabel}
        self._text_head, self._json_head = text_head(self._log.name), json_head(self._log.name)

    def open(self, protocol: ProtocolLabel, client: str, now: float) -> AccessRecord:
        """A new connection or flow: its record, listed in the live view until it ends."""
        record = AccessRecord(protocol, client, now)
        self.live.add(record)
        return record

    def end(self, record: AccessRecord, outcome: Outcome, termination: Termination, now: float) -> None:
        """The connection or flow is over: count it, unlist it, write its line (exactly once)."""
        if record.ended:
            return  # a second end would count twice
        record.ended = True
        self.live.discard(record)
        self._ends[record.protocol, termination].inc()
        self._durations[record.protocol].observe(max(0.0, now - record.started))
        if not self.enabled or not self._log.isEnabledFor(logging.INFO):
            return
        if outcome in ACCEPTED_OUTCOMES:
            handler = direct_handler(self._log)
            if handler is not None:  # the usual case: the line rendered here, no dict, no LogRecord
                values = record.values(outcome, termination, now)
                try:
                    if handler.json:
                        line = render_json_line(self._json_head, timestamp_now(), values)
                    else:
                        line = render_text_line(self._text_head, timestamp_now(), values)
                except Exception:  # as in any handler: a line that fails is reported, never raised
                    handler.handleError(logging.makeLogRecord({"name": self._log.name, "msg": ACCESS_MESSAGE}))
                    return
                handler.write_line(line, self._log.name, ACCESS_MESSAGE)
            else:
                self._log.info(ACCESS_MESSAGE, extra={EVENT_FIELDS: record.fields(outcome, termination, now)})
        elif self._rejected.admit():  # a flood's lines are not even built
            fields = record.fields(outcome, termination, now)
            self._rejected.write(logging.INFO, ACCESS_MESSAGE, extra={EVENT_FIELDS: fields})

    @property
    def suppressed(self) -> int:
        """Rejected connections' lines held back since the last one written."""
        return self._rejected.suppressed
