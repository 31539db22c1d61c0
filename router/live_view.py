"""The live view behind ``--debug-endpoints``: what the router thinks the pods are, and who is connected.

Like HAProxy's ``show sess``, answered from the process's own state. Pure (no sockets, time passed in);
the shapes are documented in docs/operating.md ("The live view"). Bounded: a flood of flows costs it at
most ``LIVE_VIEW_MAX_ENTRIES`` records, and a worker's malformed answer never makes a merge raise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from typing import Any
from urllib.parse import parse_qs

from discovery.targets import Target
from router import constants as c
from router.access_record import AccessRecord

LIMIT_DEFAULT = 100
"""Connections ``/debug/connections`` lists without ``?limit=``: a screenful, newest first."""
LIMIT_MAX = 10_000
"""Largest ``?limit=``: about 2 MB of JSON, still quick to build on the event loop."""
LIMIT_MAX_DIGITS = len(str(LIMIT_MAX))
"""A longer ``?limit=`` is refused unconverted: ``int()`` of thousands of digits costs quadratic time."""


class LimitError(ValueError):
    """A ``?limit=`` that is not a whole number from 1 to ``LIMIT_MAX``; its text is the client's answer."""


class LiveConnections:
    """Records of the live connections and flows, oldest first (a dict keeps insertion order).

    Bounded: past ``max_entries`` a record is counted in ``total`` but not listed, so a flood of
    pending QUIC flows costs the view no more than its bound.
    """

    def __init__(self, max_entries: int = c.LIVE_VIEW_MAX_ENTRIES) -> None:
        self._records: dict[AccessRecord, None] = {}
        self._max = max_entries
        self._unlisted = 0

    def add(self, record: AccessRecord) -> None:
        if len(self._records) < self._max:
            self._records[record] = None
            record.listed = True
        else:
            self._unlisted += 1

    def discard(self, record: AccessRecord) -> None:
        """Forget a record that ended (idempotent only through ``AccessLog.end``'s own guard)."""
        if record.listed:
            self._records.pop(record, None)
            record.listed = False
        elif self._unlisted:
            self._unlisted -= 1

    @property
    def total(self) -> int:
        return len(self._records) + self._unlisted

    def records(self) -> tuple[AccessRecord, ...]:
        """The listed records, oldest first."""
        return tuple(self._records)

    def view(self, limit: int, now: float) -> dict[str, Any]:
        """The ``/debug/connections`` answer: the ``limit`` newest, with their current byte counts."""
        newest = islice(reversed(self._records), max(0, limit))
        return {"total": self.total, "connections": [connection_entry(r, now) for r in newest]}


def connection_entry(record: AccessRecord, now: float) -> dict[str, Any]:
    up, down, last = record.current()
    return {
        "protocol": record.protocol,
        "client": record.client,
        "hostname": record.hostname,
        "pod": record.pod,
        "age_s": round(max(0.0, now - record.started), 3),
        "idle_s": round(max(0.0, now - last), 3),
        "bytes_client_to_pod": up,
        "bytes_pod_to_client": down,
    }


def parse_limit(query: str) -> int:
    """``limit`` from a query string (the default when absent), else ``LimitError``. ASCII digits only:
    ``str.isdigit`` alone also accepts "²" (which ``int()`` refuses) and "१" (which it takes)."""
    values = parse_qs(query, keep_blank_values=True).get("limit")
    if not values:
        return LIMIT_DEFAULT
    text = values[-1]
    if not (0 < len(text) <= LIMIT_MAX_DIGITS and text.isascii() and text.isdigit()) or not 1 <= int(text) <= LIMIT_MAX:
        raise LimitError(f"limit: expected a whole number from 1 to {LIMIT_MAX}")
    return int(text)


def _port(port: int) -> int | None:
    return port if 0 < port < 65536 else None


def targets_view(
    targets: Iterable[Target], source: str, ready: bool, last_sync_age_s: float | None
) -> dict[str, Any]:
    """The ``/debug/targets`` answer for a routing snapshot (a port the pod lacks is null)."""
    rows = sorted(targets, key=lambda t: t.pod_name)
    return {
        "source": source,
        "ready": ready,
        "last_sync_age_s": None if last_sync_age_s is None else round(last_sync_age_s, 3),
        "targets": [
            {"pod": t.pod_name, "address": t.address, "grpc_port": _port(t.grpc_port),
             "quic_port": _port(t.quic_port)}
            for t in rows
        ],
    }


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_connections_view(answer: object) -> bool:
    """Whether a worker's ``/debug/connections`` answer has the shape ``merge_connections`` reads;
    one that has not is left out, so no answer can make the merge raise."""
    if not isinstance(answer, dict) or not isinstance(answer.get("total"), int):
        return False
    entries = answer.get("connections")
    return isinstance(entries, list) and all(isinstance(e, dict) and _is_number(e.get("age_s")) for e in entries)


def is_targets_view(answer: object) -> bool:
    """Whether a worker's ``/debug/targets`` answer has the shape ``merge_targets`` reads."""
    if not isinstance(answer, dict):
        return False
    age, targets = answer.get("last_sync_age_s"), answer.get("targets")
    return ((age is None or _is_number(age)) and isinstance(targets, list)
            and all(isinstance(t, dict) and isinstance(t.get("pod"), str) for t in targets))


def merge_connections(views: Sequence[Mapping[str, Any]], limit: int) -> dict[str, Any]:
    """One ``/debug/connections`` answer from every worker's: totals summed, the newest ``limit``."""
    entries = [entry for view in views for entry in view.get("connections", ())]
    entries.sort(key=lambda e: e.get("age_s", 0.0))
    return {"total": sum(int(v.get("total", 0)) for v in views), "connections": entries[:limit]}


def merge_targets(views: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One ``/debug/targets`` answer from every worker's: ready only if all are, the stalest sync,
    and the union of their targets (workers watch the same source, so they agree once synced)."""
    by_pod: dict[str, Any] = {}
    for view in views:
        for target in view.get("targets", ()):
            by_pod.setdefault(target["pod"], target)
    ages = [v.get("last_sync_age_s") for v in views]
    return {
        "source": views[0].get("source") if views else None,
        "ready": bool(views) and all(v.get("ready") for v in views),
        "last_sync_age_s": None if not ages or None in ages else max(float(a) for a in ages if a is not None),
        "targets": [by_pod[pod] for pod in sorted(by_pod)],
    }
