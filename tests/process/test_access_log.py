"""The access log on its own: one line per ended record, its keys, the rate limit of rejected ones,
the termination and duration metrics, and the live view it keeps."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import logging
import random
import re
import time
from collections.abc import Iterator

import pytest

from router import constants as c
from router.access_log import (
    AccessLog,
    json_head,
    render_json_line,
    render_text_line,
    text_head,
)
from router.access_record import ACCESS_MESSAGE, AccessRecord, LineValues
from router.live_view import LiveConnections
from router.log_text import clip, clip_optional
from router.logging_setup import (
    EVENT_FIELDS,
    configure_logging,
    direct_handler,
    json_formatter,
    render_json,
    render_text,
    text_formatter,
)
from router.metrics import RouterMetrics
from router.outcomes import GrpcOutcome, ProtocolLabel, QuicOutcome, Termination

ACCESS_KEYS = [
    "event", "protocol", "client", "hostname", "pod", "pod_address", "outcome", "termination",
    "bytes_client_to_pod", "bytes_pod_to_client", "duration_ms", "decision_us",
]
_names = itertools.count()


def captured(formatter: logging.Formatter | None = None) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter or json_formatter())
    logger = logging.getLogger(f"test.access.{next(_names)}")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, stream


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def sample(metrics: RouterMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


@pytest.fixture
def router_access_stream() -> Iterator[io.StringIO]:
    """The real ``router.access`` logger, written to a buffer for one test."""
    logger = logging.getLogger(c.ACCESS_LOGGER_NAME)
    saved = (logger.handlers, logger.propagate, logger.level)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter())
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.INFO)
    yield stream
    logger.handlers, logger.propagate = saved[0], saved[1]
    logger.setLevel(saved[2])


def test_an_accepted_connection_writes_one_line_with_every_documented_key(
    router_access_stream: io.StringIO,
) -> None:
    stream = router_access_stream
    metrics = RouterMetrics()
    access = AccessLog(metrics)
    record = access.open("h2c", "127.0.0.1:40000", now=10.0)
    record.hostname, record.pod, record.pod_address = "sg-0.stargate.external", "sg-0", "127.0.0.2:50051"
    record.decided_at = 10.000250
    record.bytes_client_to_pod, record.bytes_pod_to_client = 812, 1405
    access.end(record, "completed", Termination.CLIENT_CLOSE, now=10.5)
    access.end(record, "completed", Termination.CLIENT_CLOSE, now=11.0)  # a second end is ignored
    [line] = lines(stream)
    assert line["logger"] == c.ACCESS_LOGGER_NAME == "router.access"
    assert (line["level"], line["msg"]) == ("info", "access")
    assert [k for k in line if k not in ("ts", "level", "logger", "msg")] == ACCESS_KEYS
    assert line["event"] == "access"
    assert (line["protocol"], line["client"], line["pod"], line["pod_address"]) == (
        "h2c", "127.0.0.1:40000", "sg-0", "127.0.0.2:50051")
    assert (line["outcome"], line["termination"]) == ("completed", "client_close")
    assert (line["bytes_client_to_pod"], line["bytes_pod_to_client"]) == (812, 1405)
    assert line["duration_ms"] == 500.0
    assert line["decision_us"] == 250
    assert sample(metrics, "stargate_k8s_router_terminations_total", protocol="h2c",
                  termination="client_close") == 1
    assert sample(metrics, "stargate_k8s_router_connection_duration_seconds_count", protocol="h2c") == 1
    assert sample(metrics, "stargate_k8s_router_connection_duration_seconds_sum", protocol="h2c") == 0.5
    assert access.live.total == 0


def test_unknown_fields_are_json_null_and_text_lines_carry_the_same_keys() -> None:
    logger, stream = captured(text_formatter())
    access = AccessLog(RouterMetrics(), logger=logger)
    record = access.open("tls", "[::1]:5000", now=1.0)
    access.end(record, "peek_timeout", Termination.PEEK_TIMEOUT, now=6.0)
    text = stream.getvalue().strip()
    for key in ACCESS_KEYS:
        assert f" {key}=" in text
    assert "termination=peek_timeout" in text and "client=[::1]:5000" in text

    logger, stream = captured()
    access = AccessLog(RouterMetrics(), logger=logger)
    access.end(access.open("quic", "127.0.0.1:1", now=1.0), "missing_sni", Termination.REJECTED, now=1.0)
    [line] = lines(stream)
    assert line["hostname"] is None and line["pod"] is None and line["pod_address"] is None
    assert line["decision_us"] is None


def test_rejected_lines_are_rate_limited_and_accepted_lines_do_not_share_their_limit() -> None:
    logger, stream = captured()
    metrics = RouterMetrics()
    access = AccessLog(metrics, logger=logger)
    flood = 10 * int(c.REJECTION_LOG_LINES_PER_S)
    for i in range(flood):
        access.end(access.open("h2c", f"127.0.0.1:{i}", 0.0), "unknown_authority", Termination.REJECTED, 0.0)
    for i in range(flood):
        access.end(access.open("h2c", f"127.0.0.1:{i}", 0.0), "completed", Termination.POD_CLOSE, 0.0)
    written = lines(stream)
    rejected = [w for w in written if w["outcome"] == "unknown_authority"]
    assert 0 < len(rejected) <= c.REJECTION_LOG_LINES_PER_S + 1
    assert len([w for w in written if w["outcome"] == "completed"]) == flood
    assert access.suppressed == flood - len(rejected)
    # the metrics count every one, written or not
    assert sample(metrics, "stargate_k8s_router_terminations_total", protocol="h2c", termination="rejected") == flood
    assert sample(metrics, c.LOG_LINES_DROPPED_TOTAL + "_total", log="access") == flood - len(rejected)
    later = time.monotonic() + 2 / c.REJECTION_LOG_LINES_PER_S
    access._rejected._clock = lambda: later  # the limiter's clock moved on: a token again (no sleep)
    access.end(access.open("h2c", "127.0.0.1:1", 0.0), "unknown_authority", Termination.REJECTED, 0.0)
    assert lines(stream)[-1]["suppressed"] == flood - len(rejected)


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_accepted_lines_beyond_their_budget_are_dropped_counted_and_reported(fmt: str) -> None:
    """The budget the router runs with, ``ACCESS_LOG_LINES_PER_S``, small here: a burst of endings
    writes that many lines, counts the rest in ``log_lines_dropped_total{log="access"}``, and the first
    line written after says how many it stands for. Through the router's own handler (the direct line)."""
    metrics = RouterMetrics()
    with _router_logging_alone(fmt) as stream:
        assert direct_handler(logging.getLogger(c.ACCESS_LOGGER_NAME)) is not None
        access = AccessLog(metrics, lines_per_s=50)
        ends = 400
        for i in range(ends):
            record = access.open("tls", f"127.0.0.1:{i}", 0.0)
            record.hostname, record.pod = "sg-0.stargate.external", "sg-0"
            access.end(record, "completed" if i % 2 else "relay_error", Termination.POD_CLOSE, 1.0)
        written = stream.getvalue().splitlines()
        dropped = sample(metrics, c.LOG_LINES_DROPPED_TOTAL + "_total", log="access")
        assert 50 <= len(written) < 60 and len(written) + dropped == ends  # (the loop itself refills a little)
        assert access.suppressed_accepted == dropped
        later = time.monotonic() + 0.05
        access._accepted._clock = lambda: later  # the budget's clock moved on: tokens again (no sleep)
        access.end(access.open("h2c", "127.0.0.1:1", 0.0), "completed", Termination.CLIENT_CLOSE, 1.0)
        last = stream.getvalue().splitlines()[-1]
    assert (json.loads(last)["suppressed"] == dropped if fmt == "json"
            else last.endswith(f" suppressed={int(dropped)}")), last
    assert access.suppressed_accepted == 0
    assert sample(metrics, "stargate_k8s_router_terminations_total", protocol="tls", termination="pod_close") == ends


def test_a_hostname_is_cut_with_a_marker_and_no_line_grows_with_it() -> None:
    assert clip("a" * c.LOG_FIELD_MAX_CHARS) == "a" * c.LOG_FIELD_MAX_CHARS
    long_name = "stargate-0.stargate.external:" + "0" * 15_000
    cut = clip(long_name)
    assert cut == long_name[: c.LOG_FIELD_MAX_CHARS] + f"[...+{len(long_name) - c.LOG_FIELD_MAX_CHARS} chars]"
    assert clip_optional(None) is None and clip_optional("x") == "x" and clip_optional(long_name) == cut
    logger, stream = captured()
    logger.info("rejected: %s", long_name, extra={"hostname": cut})
    [line] = lines(stream)
    assert len(line["msg"]) == c.LOG_MESSAGE_MAX_CHARS + len(f"[...+{15_029 + 10 - c.LOG_MESSAGE_MAX_CHARS} chars]")
    assert line["hostname"] == cut


def test_access_log_off_writes_nothing_but_still_counts() -> None:
    logger, stream = captured()
    metrics = RouterMetrics()
    access = AccessLog(metrics, enabled=False, logger=logger)
    access.end(access.open("quic", "127.0.0.1:9", 0.0), "completed", Termination.IDLE_TIMEOUT, 300.0)
    assert stream.getvalue() == ""
    assert sample(metrics, "stargate_k8s_router_terminations_total", protocol="quic",
                  termination="idle_timeout") == 1


def test_every_termination_of_every_protocol_is_exported_at_zero() -> None:
    metrics = RouterMetrics()
    for protocol in ProtocolLabel:
        assert sample(metrics, "stargate_k8s_router_connection_duration_seconds_count", protocol=protocol) == 0
        for termination in Termination:
            assert sample(metrics, "stargate_k8s_router_terminations_total",
                          protocol=protocol, termination=str(termination)) == 0


def test_the_termination_set_is_the_documented_one() -> None:
    assert {str(t) for t in Termination} >= {
        "client_close", "client_reset", "pod_close", "pod_reset", "idle_timeout", "drain",
        "dial_failed", "peek_timeout", "rejected", "quic_idle_timeout",
    }


def test_a_probe_adds_live_counts_to_what_the_record_already_holds() -> None:
    record = AccessRecord("h2c", "127.0.0.1:1", started=5.0, bytes_client_to_pod=24, bytes_pod_to_client=9)
    assert record.current() == (24, 9, 5.0)
    record.probe = lambda: (100, 200, 7.5)
    assert record.current() == (124, 209, 7.5)


@pytest.mark.parametrize("outcome", ["completed", "relay_error"])
def test_accepted_outcomes_bypass_the_rejection_limiter(outcome: str) -> None:
    logger, stream = captured()
    access = AccessLog(RouterMetrics(), logger=logger, live=LiveConnections())
    for _ in range(3 * int(c.REJECTION_LOG_LINES_PER_S)):
        access.end(access.open("tls", "127.0.0.1:1", 0.0), outcome, Termination.POD_RESET, 0.0)
    assert len(lines(stream)) == 3 * int(c.REJECTION_LOG_LINES_PER_S)


# The accepted connection's line is rendered by ``render_text_line`` / ``render_json_line``, not by
# the formatters: they must write exactly the formatters' bytes for any value a record can hold.
_CLEAN = ["10.0.0.7:53114", "[::1]:5000", "sg-0.stargate.external", "ünïcödé", "😀", "\ufffd", "x"]
_DIRTY = ["", " ", 'say "hi"', "a=b", "back\\slash", "tab\there", "cr\rlf\n", "\x00\x1f", "\\",
          "\x1b[2J\x07", "del\x7f", "nel\x85csi\x9b", "\u2028\u2029", "rlo\u202e\u2066", "tag\U000e0041", "\ud800"]
_TS = "2025-01-02T03:04:05.678Z"
_LOGGER_NAMES = [c.ACCESS_LOGGER_NAME, 'odd "name" \\ é']


def _generic_lines(logger_name: str, fields: dict[str, object]) -> tuple[str, str]:
    line = {"ts": _TS, "level": "info", "logger": logger_name, "msg": ACCESS_MESSAGE, **fields}
    return render_text(dict(line)), render_json(dict(line))


def _records() -> Iterator[tuple[AccessRecord, GrpcOutcome | QuicOutcome | str, Termination, float]]:
    """Records with every kind of value in every field: clean and quoting-needing strings (each
    alone among clean ones, then mixed at random), None, big and odd numbers, a live probe."""
    rng = random.Random(14)
    texts: list[tuple[str, str | None, str | None, str | None]] = [(_CLEAN[0], _CLEAN[2], "sg-0", _CLEAN[1])]
    for dirty in _DIRTY:
        for at in range(4):
            row: list[str | None] = [_CLEAN[0], _CLEAN[2], "sg-0", _CLEAN[1]]
            row[at] = dirty
            texts.append((str(row[0]), row[1], row[2], row[3]))
    pool: list[str | None] = [*_CLEAN, *_DIRTY, None]
    texts += [(rng.choice(_CLEAN + _DIRTY), rng.choice(pool), rng.choice(pool), rng.choice(pool)) for _ in range(300)]
    durations = [0.0, 0.0512, 1e-9, 0.0004999, 3600.123456789, 1e12]
    outcomes: list[GrpcOutcome | QuicOutcome | str] = [GrpcOutcome.COMPLETED, QuicOutcome.RELAY_ERROR, "completed"]
    for i, (client, hostname, pod, pod_address) in enumerate(texts):
        started = rng.choice([0.0, 1000.0, 1.75e9])
        record = AccessRecord(
            list(ProtocolLabel)[i % 3], client, started, hostname, pod, pod_address,
            decided_at=None if i % 4 == 0 else started + rng.choice([0.0, 0.00014, 2.5]),
            bytes_client_to_pod=rng.choice([0, 812, 2**70]), bytes_pod_to_client=rng.choice([0, 1405]),
        )
        if i % 5 == 0:
            record.probe = lambda: (100, 200, 0.0)
        termination = list(Termination)[i % len(Termination)]
        yield record, outcomes[i % 3], termination, started + durations[i % len(durations)]


@pytest.mark.parametrize("logger_name", _LOGGER_NAMES)
def test_the_access_renderers_write_the_formatters_bytes_for_every_record(logger_name: str) -> None:
    count = 0
    for record, outcome, termination, now in _records():
        text, json_line = _generic_lines(logger_name, record.fields(outcome, termination, now))
        values = record.values(outcome, termination, now)
        assert render_text_line(text_head(logger_name), _TS, values) == text
        assert render_json_line(json_head(logger_name), _TS, values) == json_line
        count += 1
    assert count > 300


@pytest.mark.parametrize("duration", [float("inf"), float("-inf"), float("nan"), -0.0, 1.5e300, 5e-324])
@pytest.mark.parametrize("decision", [None, 0, -3, 2**64])
def test_the_access_renderers_match_the_formatters_on_odd_numbers(duration: float, decision: int | None) -> None:
    values: LineValues = (ProtocolLabel.QUIC, "[::1]:1", None, "", 'p"', GrpcOutcome.RELAY_ERROR,
                          Termination.DRAIN, 0, -1, duration, decision)
    fields = {"event": ACCESS_MESSAGE, **dict(zip(ACCESS_KEYS[1:], values, strict=True))}
    fields["termination"] = str(Termination.DRAIN)
    text, json_line = _generic_lines(c.ACCESS_LOGGER_NAME, fields)
    assert render_text_line(text_head(c.ACCESS_LOGGER_NAME), _TS, values) == text
    assert render_json_line(json_head(c.ACCESS_LOGGER_NAME), _TS, values) == json_line


@contextlib.contextmanager
def _router_logging_alone(fmt: str) -> Iterator[io.StringIO]:
    """``configure_logging`` to a buffer, with pytest's capture handlers set aside meanwhile (the
    fast path rightly steps aside for them) and the root restored after."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    out = io.StringIO()
    configure_logging(fmt, "info", stream=out)  # type: ignore[arg-type]
    for handler in saved:
        root.removeHandler(handler)
    try:
        yield out
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in saved:
            root.addHandler(handler)
        root.setLevel(level)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_fast_path_writes_the_line_the_logger_would(fmt: str) -> None:
    """``AccessLog.end`` through the router handler (no dict, no LogRecord) and the logging call with
    the record's fields give the same lines, timestamps aside."""
    logger = logging.getLogger(c.ACCESS_LOGGER_NAME)
    with _router_logging_alone(fmt) as out:
        assert direct_handler(logger) is not None  # the fast path is the one taken below
        access = AccessLog(RouterMetrics())
        expected = 0
        for record, outcome, termination, now in itertools.islice(_records(), 60):
            fields = record.fields(outcome, termination, now)
            access.live.add(record)
            access.end(record, outcome, termination, now)
            logger.info(ACCESS_MESSAGE, extra={EVENT_FIELDS: fields})
            expected += 2
    written = [re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", "TS", line)
               for line in out.getvalue().split("\n")[:-1]]  # not splitlines: \u2028 and \x1f stay in a line
    assert len(written) == expected
    for fast, slow in zip(written[::2], written[1::2], strict=True):
        assert fast == slow
