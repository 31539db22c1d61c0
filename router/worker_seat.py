"""What the ``--workers`` supervisor hands one worker: its place and the descriptors it made for it.

A worker learns nothing about its siblings or supervisor from text another process could write: the
supervisor makes every channel and passes the descriptors (``pass_fds``), ``WORKER_SEAT_ENV`` saying
which is which: ``health`` (a loopback socket it bound), ``control`` (a pipe only it reads; stderr is
logs, never read for meaning), ``cid_index`` and ``client_table`` (memfds kept across restarts). No
name in any namespace reaches them, so no other process in the pod can read what the workers share or
speak for one (docs/architecture.md#workers). A malformed seat is a ``SeatError`` (one line, exit 2),
never a silent single-process router among workers.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from router import constants as c
from router.flag_values import ConfigError


class SeatError(ConfigError):
    """``WORKER_SEAT_ENV`` is set but does not describe a usable seat."""


@dataclass(frozen=True, slots=True)
class WorkerSeat:
    """One worker's place among ``count`` and the descriptors the supervisor passed it."""

    index: int
    count: int
    health_fd: int
    control_fd: int
    cid_index_fd: int
    client_table_fd: int | None = None

    def __post_init__(self) -> None:
        if not 2 <= self.count <= c.MAX_WORKERS or not 0 <= self.index < self.count:
            raise SeatError(f"{c.WORKER_SEAT_ENV}: worker {self.index!r} of {self.count!r} is not a seat")
        if len(set(self.fds())) != len(self.fds()) or min(self.fds()) < 3:
            raise SeatError(f"{c.WORKER_SEAT_ENV}: descriptors must be distinct and above stderr")

    def fds(self) -> tuple[int, ...]:
        """Every descriptor of the seat: what the supervisor passes to the worker."""
        table = () if self.client_table_fd is None else (self.client_table_fd,)
        return (self.health_fd, self.control_fd, self.cid_index_fd, *table)

    def to_env(self) -> str:
        return json.dumps({
            "index": self.index, "count": self.count, "health": self.health_fd, "control": self.control_fd,
            "cid_index": self.cid_index_fd, "client_table": self.client_table_fd,
        }, separators=(",", ":"))

    @classmethod
    def from_env(cls, text: str) -> WorkerSeat:
        try:
            raw = json.loads(text)
            fields = (raw["index"], raw["count"], raw["health"], raw["control"], raw["cid_index"])
            table = raw["client_table"]
        except (ValueError, TypeError, KeyError):
            raise SeatError(f"{c.WORKER_SEAT_ENV}: not a seat: {text[:200]!r}") from None
        if not (all(type(v) is int for v in fields) and (table is None or type(table) is int)):
            raise SeatError(f"{c.WORKER_SEAT_ENV}: descriptors must be integers: {text[:200]!r}")
        index, count, health, control, cid_index = fields
        return cls(index, count, health, control, cid_index, table)


def seat_from_environ(env: Mapping[str, str] | None = None) -> WorkerSeat | None:
    """This process's seat among the supervisor's workers; None when the operator started it."""
    text = (os.environ if env is None else env).get(c.WORKER_SEAT_ENV)
    return None if text is None else WorkerSeat.from_env(text)


class WorkerReport(StrEnum):
    """What a worker writes on its control pipe: one line, ``<kind> <text>``."""

    BOUND = "bound"
    """Every listener is bound: the supervisor may say ``listening`` once all workers have."""
    CONFIG_ERROR = "config-error"
    """The worker exits 2 after this; its text is said once by the supervisor for all workers."""


def encode_report(kind: WorkerReport, text: str = "") -> bytes:
    """One control line; the text is cut at ``WORKER_REPORT_MAX_BYTES`` and kept on one line."""
    line = f"{kind} {text}".replace("\n", " ").encode("utf-8", "replace")
    return line[: c.WORKER_REPORT_MAX_BYTES - 1] + b"\n"


def decode_report(line: bytes) -> tuple[WorkerReport, str] | None:
    """``(kind, text)`` of one control line; None for anything else (a worker of another version)."""
    kind, _, text = line.rstrip(b"\n").decode("utf-8", "replace").partition(" ")
    try:
        return WorkerReport(kind), text
    except ValueError:
        return None


def report(seat: WorkerSeat, kind: WorkerReport, text: str = "") -> None:
    """Tell the supervisor ``kind``; a gone supervisor is not this worker's failure."""
    with contextlib.suppress(OSError):
        os.write(seat.control_fd, encode_report(kind, text))
