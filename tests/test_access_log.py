"""The access log on its own: one line per ended record, its keys, the rate limit of rejected ones,
the termination and duration metrics, and the live view it keeps."""

from __future__ import annotations

import io
import itertools
import json
import logging
import time
from collections.abc import Iterator

import pytest

from router import constants as c
from router.access_log import AccessLog, AccessRecord
from router.live_view import LiveConnections
from router.logging_setup import JsonFormatter, TextFormatter
from router.metrics import RouterMetrics
from router.outcomes import ProtocolLabel, Termination

ACCESS_KEYS = [
    "event", "protocol", "client", "hostname", "pod", "pod_address", "outcome", "termination",
    "bytes_client_to_pod", "bytes_pod_to_client", "duration_ms", "decision_us",
]
_names = itertools.count()


def captured(formatter: logging.Formatter | None = None) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter or JsonFormatter())
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
    handler.setFormatter(JsonFormatter())
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
    logger, stream = captured(TextFormatter())
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


def test_rejected_lines_are_rate_limited_and_accepted_lines_never_are() -> None:
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
    time.sleep(2 / c.REJECTION_LOG_LINES_PER_S)  # a token again: the next line says how many were held back
    access.end(access.open("h2c", "127.0.0.1:1", 0.0), "unknown_authority", Termination.REJECTED, 0.0)
    assert lines(stream)[-1]["suppressed"] == flood - len(rejected)


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
        "dial_failed", "peek_timeout", "rejected", "flow_takeover",
    }


def test_a_probe_adds_live_counts_to_what_the_record_already_holds() -> None:
    record = AccessRecord("h2c", "127.0.0.1:1", started=5.0, bytes_client_to_pod=24, bytes_pod_to_client=9)
    assert record.current() == (24, 9, 5.0)
    record.probe = lambda: (100, 200, 7.5)
    assert record.current() == (124, 209, 7.5)


@pytest.mark.parametrize("outcome", ["completed", "relay_error"])
def test_accepted_outcomes_bypass_the_limiter(outcome: str) -> None:
    logger, stream = captured()
    access = AccessLog(RouterMetrics(), logger=logger, live=LiveConnections())
    for _ in range(3 * int(c.REJECTION_LOG_LINES_PER_S)):
        access.end(access.open("tls", "127.0.0.1:1", 0.0), outcome, Termination.POD_RESET, 0.0)
    assert len(lines(stream)) == 3 * int(c.REJECTION_LOG_LINES_PER_S)
