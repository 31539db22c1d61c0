"""The access log: one line per TCP connection and per QUIC flow, written when it ends (docs/operating.md).

A connection's fate must be answerable from the log alone, like HAProxy's tcplog. The metrics count
every end, also with ``--access-log off``; only lines are budgeted (accepted ones ``ACCESS_LOG_LINES_PER_S``
per process, rejected ones the rejection limiter), and the next line written says how many were held back.
A client's only text in a line, ``hostname``, is cut at ``LOG_FIELD_MAX_CHARS`` by the edge and never
carries a character a terminal acts on raw (``logging_setup``).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Final

from router import constants as c
from router.access_record import ACCESS_MESSAGE, AccessRecord, LineValues, Outcome
from router.live_view import LiveConnections
from router.log_limiter import RateLimitedLog
from router.log_text import json_string, needs_quotes, text_value
from router.logging_setup import EVENT_FIELDS, direct_handler, timestamp_now
from router.metrics import RouterMetrics
from router.outcomes import DroppedLog, GrpcOutcome, ProtocolLabel, Termination

ACCEPTED_OUTCOMES: Final = frozenset({GrpcOutcome.COMPLETED, GrpcOutcome.RELAY_ERROR})
"""Outcomes of a connection that reached its pod: their lines have the access log's own budget."""

def render_text_line(head: str, ts: str, values: LineValues) -> str:
    """An accepted connection's text line, byte for byte ``render_text``'s (tests pin it), in one f-string:
    the generic formatter costs more than the rest of ``end``. ``protocol``, ``outcome`` and ``termination``
    go bare, so they must be enum values (plain ``[a-z0-9_]`` words); ``head`` is ``text_head(logger name)``."""
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
    """An accepted connection's JSON line, byte for byte ``render_json``'s (same escaping, ``repr`` of numbers);
    ``head`` is ``json_head(logger name)``, the enum values bare as in ``render_text_line``."""
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
        lines_per_s: float = c.ACCESS_LOG_LINES_PER_S,
    ) -> None:
        """``lines_per_s``: the accepted connections' budget (lines a second, and at once)."""
        self.enabled = enabled
        self.live = live if live is not None else LiveConnections()
        self._log = logger if logger is not None else logging.getLogger(c.ACCESS_LOGGER_NAME)
        dropped = metrics.dropped_lines(DroppedLog.ACCESS)
        self._accepted = RateLimitedLog(self._log, lines_per_s, dropped=dropped)
        self._rejected = RateLimitedLog(self._log, dropped=dropped)
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
            accepted = self._accepted
            if not accepted.admit():  # over the budget: counted, not even built
                return
            handler = direct_handler(self._log)
            if accepted.suppressed:  # the first line after some were held back says how many
                fields = record.fields(outcome, termination, now)
                accepted.write(logging.INFO, ACCESS_MESSAGE, extra={EVENT_FIELDS: fields})
            elif handler is not None:  # the usual case: the line rendered here, no dict, no LogRecord
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

    @property
    def suppressed_accepted(self) -> int:
        """Accepted connections' lines held back since the last one written."""
        return self._accepted.suppressed
