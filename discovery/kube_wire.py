"""The Kubernetes API's wire format for EndpointSlice list and watch, as pure functions over bytes.

Untrusted input raises only ``KubeApiResponseError``.
"""

from __future__ import annotations

import email.utils
import json
from dataclasses import dataclass
from typing import Any

EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


class KubeApiResponseError(ValueError):
    """A list body or watch line that is not what the API server sends."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One line of a watch stream."""

    type: str
    object: dict[str, Any]
    resource_version: str | None
    status_code: int | None = None
    """For ERROR events: the Status code (410 = the resourceVersion is gone)."""


def parse_watch_event(line: bytes | str) -> WatchEvent:
    """Parse one newline-delimited JSON watch event."""
    data = _json_object(line, "watch event")
    event_type, obj = data.get("type"), data.get("object")
    if not isinstance(event_type, str) or event_type not in EVENT_TYPES:
        raise KubeApiResponseError(f"watch event has unknown type {event_type!r:.40}")
    if not isinstance(obj, dict):
        raise KubeApiResponseError(f"{event_type} event has no object")
    if event_type == "ERROR":
        code = obj.get("code")
        return WatchEvent(event_type, obj, None, code if type(code) is int else None)
    resource_version = _resource_version(obj)
    if event_type == "BOOKMARK" and resource_version is None:
        raise KubeApiResponseError("BOOKMARK event has no resourceVersion")
    return WatchEvent(event_type, obj, resource_version)


def parse_slice_list(body: bytes | str) -> tuple[list[dict[str, Any]], str]:
    """The items and resourceVersion of an EndpointSliceList."""
    data = _json_object(body, "list")
    items = data.get("items")
    if items is None:
        items = []
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise KubeApiResponseError("list items must be a list of objects")
    resource_version = _resource_version(data)
    if resource_version is None:
        raise KubeApiResponseError("list has no metadata.resourceVersion")
    return items, resource_version


def _json_object(text: bytes | str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise KubeApiResponseError(f"{what} is not JSON: {exc!s:.80}") from None
    if not isinstance(data, dict):
        raise KubeApiResponseError(f"{what} is not a JSON object")
    return data


def _resource_version(obj: dict[str, Any]) -> str | None:
    metadata = obj.get("metadata")
    value = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
    return value if isinstance(value, str) and value else None


class ApiStatusError(Exception):
    """The API server answered with an error status (or an ERROR event other than 410)."""

    def __init__(self, status: int, detail: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.retry_after_s = retry_after_s
        """The server's ``Retry-After`` in seconds, when it sent a usable one."""


def status_detail(body: bytes) -> str:
    """The message of a Kubernetes Status body, or the start of whatever came instead."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body[:200].decode("utf-8", "replace")
    message = data.get("message") if isinstance(data, dict) else None
    return str(message)[:200] if message is not None else str(data)[:200]


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` asks for (delay-seconds, or an HTTP-date against ``now``, the wall clock;
    a past date is 0), None if unusable."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(min(int(text[:12]), 10**9))  # bounded: a 10 kB digit string is no problem
    if now is None:
        return None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)
