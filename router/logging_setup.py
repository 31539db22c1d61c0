"""Process-wide logging: one line per event on stderr, as ``text`` or ``json``.

Log pipelines split on newlines, and a client's name must not recolour, clear, retitle or reorder an
operator's screen: no ``UNSAFE_CHARACTERS`` goes out raw, messages and tracebacks included. Each is
written as its JSON escape, so the JSON format gives the original text back exactly. ``extra=`` fields
become keys, so a rejection can be filtered by outcome without parsing the message.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from types import MappingProxyType
from typing import Final, Literal, TextIO

from router import constants as c
from router.log_text import clip, escape_unsafe, json_quoted, needs_quotes

LOG_LEVELS: Final[Mapping[str, int]] = MappingProxyType(
    {
        "trace": logging.DEBUG,
        "debug": logging.DEBUG,
        "info": logging.INFO,
        "warn": logging.WARNING,
        "warning": logging.WARNING,
        "error": logging.ERROR,
        "critical": logging.CRITICAL,
    }
)
"""Accepted ``--log-level`` names: Python's, plus the Rust router's ``trace`` and ``warn``."""

_LEVEL_NAMES: Final[Mapping[int, str]] = MappingProxyType(
    {
        logging.DEBUG: "debug",
        logging.INFO: "info",
        logging.WARNING: "warning",
        logging.ERROR: "error",
        logging.CRITICAL: "critical",
    }
)

EVENT_FIELDS: Final = "_event_fields"
"""``extra={EVENT_FIELDS: {...}}``: a line's fields as one dict, not named ts/level/logger/msg (no record scan)."""

LOG_FLUSH_INTERVAL_S: Final = 0.02
"""On the loop, lines wait at most this long to be written together (see ``_RouterLogHandler``)."""

LOG_BUFFER_BYTES: Final = 64 * 1024
"""Lines buffered before a write even within one loop iteration (a burst of endings)."""

_RESERVED_KEYS: Final = ("ts", "level", "logger", "msg")
"""Keys every line has; an ``extra=`` field with one of these names is written as ``extra_<name>``."""

_RECORD_ATTRIBUTES: Final = frozenset(
    logging.LogRecord("", logging.INFO, "", 0, "", None, None).__dict__
) | {"message", "asctime", "taskName"}
"""Attributes every LogRecord has; anything else on a record came from ``extra=``."""

def parse_log_level(level: str) -> int:
    """The ``logging`` level for a ``--log-level`` name (case-insensitive); ValueError names the flag."""
    number = LOG_LEVELS.get(level.strip().lower())
    if number is None:
        raise ValueError(
            f"--log-level: unknown level {level!r} (expected one of {', '.join(LOG_LEVELS)})"
        )
    return number


_SECOND_CACHE: list[tuple[int, str]] = [(-1, "")]
"""The last whole second rendered: an access line per connection must not pay for strftime each."""


def _timestamp(record: logging.LogRecord) -> str:
    return _timestamp_of(record.created)


def timestamp_now() -> str:
    """The ``ts`` of a line written now (for a line rendered outside a formatter)."""
    return _timestamp_of(time.time())


def _timestamp_of(created: float) -> str:
    second = int(created)
    cached_second, whole = _SECOND_CACHE[0]
    if second != cached_second:
        whole = datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _SECOND_CACHE[0] = (second, whole)
    millis = int((created - second) * 1000)
    return whole + _MILLIS[millis] if millis >= 0 else f"{whole}.{millis:03d}Z"


_MILLIS: Final = tuple(f".{ms:03d}Z" for ms in range(1000))
"""A timestamp's ``.mmmZ`` tail by milliseconds: a lookup instead of formatting an int per line."""


def _level_name(record: logging.LogRecord) -> str:
    return _LEVEL_NAMES.get(record.levelno, record.levelname.lower())


class EventFormatter(logging.Formatter):
    """Both formats: one event's fields in a fixed order, rendered as one line by ``render``."""

    def __init__(self, render: Callable[[dict[str, object]], str], json_lines: bool) -> None:
        super().__init__()
        self.render = render
        """The line for an event's fields (ts, level, logger and msg first)."""
        self.json = json_lines
        """Whether lines are JSON (else text): a line rendered outside the formatter needs to know."""

    def format(self, record: logging.LogRecord) -> str:
        return self.render(self.fields(record))

    def fields(self, record: logging.LogRecord) -> dict[str, object]:
        out: dict[str, object] = {
            "ts": _timestamp(record),
            "level": _level_name(record),
            "logger": record.name,
            "msg": clip(record.getMessage(), c.LOG_MESSAGE_MAX_CHARS),
        }
        event = record.__dict__.get(EVENT_FIELDS)
        if isinstance(event, dict):  # one event's fields, passed whole: no scan of the record
            out.update(event)
        else:
            for key, value in record.__dict__.items():
                if key in _RECORD_ATTRIBUTES or key.startswith("_"):
                    continue
                out[f"extra_{key}" if key in _RESERVED_KEYS else key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return out


_JSON: Final = json.JSONEncoder(ensure_ascii=False, default=str, separators=(",", ":"))
"""One encoder for every line (``json.dumps`` with options builds a new one per call)."""


def render_json(fields: dict[str, object]) -> str:
    """One JSON object; values that JSON cannot hold are written with ``str()``."""
    line = _JSON.encode(fields)
    if line.isascii() and "\x7f" not in line:  # the encoder escaped C0 already
        return line
    return escape_unsafe(line)  # every raw character left is inside a string: escaped there


def render_text(fields: dict[str, object]) -> str:
    """``ts level logger msg key=value ...``; values with spaces, quotes or newlines are quoted."""
    head = f"{fields.pop('ts')} {fields.pop('level')} {fields.pop('logger')} "
    parts = [head + escape_unsafe(str(fields.pop("msg")))]
    for key, value in fields.items():  # text_value inlined: a call per field costs the generic path
        text = str(value)
        if not text or needs_quotes(text):
            text = json_quoted(text)
        parts.append(f"{escape_unsafe(key)}={text}")  # a key is the code's, but never written raw
    return " ".join(parts)


def json_formatter() -> EventFormatter:
    return EventFormatter(render_json, json_lines=True)


def text_formatter() -> EventFormatter:
    return EventFormatter(render_text, json_lines=False)


class _RouterLogHandler(logging.StreamHandler[TextIO]):
    """The handler ``configure_logging`` installs; found and replaced on the next call.

    On the loop's thread lines are flushed in batches (``LOG_FLUSH_INTERVAL_S``): a ``write()`` per access
    line, each waking the log's reader, cost more than the line. Elsewhere a line is flushed at once.
    """

    def __init__(self, stream: TextIO, formatter: EventFormatter) -> None:
        super().__init__(stream)
        self.setFormatter(formatter)
        self._events = formatter
        self.json = formatter.json
        """Whether lines are JSON (else text): a line rendered outside the formatter needs to know."""
        self._batch_loop: asyncio.AbstractEventLoop | None = None
        """The loop whose batch flush is due, if one is."""
        self._batch_thread = -1

    def flush(self) -> None:
        batch = self._batch_loop
        if batch is not None and threading.get_ident() == self._batch_thread and not batch.is_closed():
            return  # the batch due will write it (asking for the running loop costs a getpid())
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            super().flush()
            return
        if batch is None or batch.is_closed():  # none due (or its loop closed before its turn)
            self._batch_loop, self._batch_thread = loop, threading.get_ident()
            loop.call_later(LOG_FLUSH_INTERVAL_S, self._flush_batch)

    def _flush_batch(self) -> None:
        self._batch_loop = None
        super().flush()

    def write_event(self, logger_name: str, msg: str, fields: Mapping[str, object]) -> None:
        """One info line from ready fields, as ``emit`` would write it, without building a LogRecord
        (the access log's line per connection: a record and the handler chain cost more than the line)."""
        line: dict[str, object] = {"ts": _timestamp_of(time.time()), "level": "info", "logger": logger_name, "msg": msg}
        line.update(fields)
        try:
            text = self._events.render(line)
        except Exception:
            self.handleError(logging.makeLogRecord({"name": logger_name, "msg": msg}))
            return
        self.write_line(text, logger_name, msg)

    def write_line(self, text: str, logger_name: str, msg: str) -> None:
        """One line already rendered in this handler's format (no newline), written as ``emit`` would;
        ``logger_name`` and ``msg`` only name it if the write fails."""
        try:
            with self.lock:  # type: ignore[union-attr]  # createLock() made it in __init__
                self.stream.write(text + self.terminator)
                self.flush()
        except Exception:
            self.handleError(logging.makeLogRecord({"name": logger_name, "msg": msg}))


def direct_writer(logger: logging.Logger) -> Callable[[str, Mapping[str, object]], None] | None:
    """``write_event`` bound to ``logger``'s name when the router handler alone would write its info lines
    (no other handler or filter, such as pytest's capture); else None, and the caller logs as usual."""
    handler = direct_handler(logger)
    return None if handler is None else partial(handler.write_event, logger.name)


def direct_handler(logger: logging.Logger) -> _RouterLogHandler | None:
    """The router handler when it alone would write ``logger``'s info lines (see ``direct_writer``);
    else None. For a caller that renders its own line (``write_line``, in the format ``json`` says)."""
    node = logger
    while node.parent is not None:
        if node.handlers or node.filters or not node.propagate:
            return None
        node = node.parent
    handlers = node.handlers
    if node.filters or len(handlers) != 1:
        return None
    handler = handlers[0]
    if not isinstance(handler, _RouterLogHandler) or handler.filters or handler.level > logging.INFO:
        return None
    return handler


def _block_buffered_stderr() -> TextIO:
    """File descriptor 2 without Python's line buffering (the handler decides when to flush);
    ``sys.stderr`` itself when something replaced it (a test's capture)."""
    if sys.stderr is not sys.__stderr__:
        return sys.stderr
    stderr = sys.stderr
    assert stderr is not None
    raw = io.FileIO(stderr.fileno(), "w", closefd=False)
    encoding = getattr(stderr, "encoding", None) or "utf-8"
    return io.TextIOWrapper(io.BufferedWriter(raw, LOG_BUFFER_BYTES), encoding=encoding, errors="backslashreplace")


def configure_logging(
    fmt: Literal["text", "json"], level: str, *, stream: TextIO | None = None
) -> None:
    """Send every log event to ``stream`` (stderr) as one line; a repeated call replaces only the handler
    this installed, leaving others (pytest's) alone."""
    number = parse_log_level(level)
    if fmt == "json":
        formatter = json_formatter()
    elif fmt == "text":
        formatter = text_formatter()
    else:
        raise ValueError(f"--log-format: expected text or json, got {fmt!r}")
    # Neither format shows the caller, thread or process: do not make every record look them up
    # (the logging docs' "Optimization" knobs; a traceback is still formatted from exc_info).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _RouterLogHandler)]:
        root.removeHandler(old)
        old.close()
    handler = _RouterLogHandler(_block_buffered_stderr() if stream is None else stream, formatter)
    root.addHandler(handler)
    root.setLevel(number)
