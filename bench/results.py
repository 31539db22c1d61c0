"""One benchmark figure per ``Row``: router, peer and direct values, ratios, target, output.

Ratios are always ``router / peer`` and ``router / direct`` of the reported values, whether
higher or lower is better; ``higher_is_better`` says which, and a row's ``target`` says
what the issue asks of it. Output: a text table, a Markdown table, JSON, PNG bar charts.

``Outputs`` guards the files: every path is checked (its directory created) before the first
scenario runs, so a typo costs seconds, not a whole run; and after the run each output that
cannot be written where asked goes to a scratch file instead, named on stderr.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Target:
    """What the issue asks: ``field`` ('router', 'ratio_vs_peer' or 'ratio_vs_direct') vs ``bound``."""

    field: str
    op: str  # ">=" or "<="
    bound: float
    text: str

    def met(self, row: Row) -> bool | None:
        value: float | None = getattr(row, self.field)
        if value is None:
            return None
        return value >= self.bound if self.op == ">=" else value <= self.bound


@dataclass(frozen=True)
class Row:
    name: str
    metric: str
    unit: str
    router: float | None
    peer_name: str | None = None
    peer: float | None = None
    direct: float | None = None
    higher_is_better: bool = True
    targets: tuple[Target, ...] = ()
    note: str = ""

    @property
    def ratio_vs_peer(self) -> float | None:
        return _ratio(self.router, self.peer)

    @property
    def ratio_vs_direct(self) -> float | None:
        return _ratio(self.router, self.direct)

    def verdict(self) -> str:
        if not self.targets:
            return ""
        results = [t.met(self) for t in self.targets]
        parts = []
        for t, ok in zip(self.targets, results, strict=True):
            parts.append(f"{t.text}: {'n/a' if ok is None else 'met' if ok else 'MISSED'}")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "metric": self.metric,
            "unit": self.unit,
            "router": _clean(self.router),
            "peer": self.peer_name,
        }
        if self.peer_name is not None:
            out[self.peer_name] = _clean(self.peer)
        out.update(
            direct=_clean(self.direct),
            ratio_vs_peer=_clean(self.ratio_vs_peer),
            ratio_vs_direct=_clean(self.ratio_vs_direct),
            higher_is_better=self.higher_is_better,
            target=self.verdict() or None,
            note=self.note or None,
        )
        return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _clean(value: float | None) -> float | None:
    if value is None or math.isnan(value):
        return None
    return round(value, 4)


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def interleaved(rounds: int, cases: dict[str, Callable[[], Any]]) -> dict[str, list[Any]]:
    """Run every case once per round, rotating the order each round so no case always goes
    first (or right after the same neighbour); returns each case's results in round order."""
    names = list(cases)
    results: dict[str, list[Any]] = {n: [] for n in names}
    for r in range(rounds):
        shift = r % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            results[name].append(cases[name]())
    return results


# ---------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------
def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


HEADER = ("scenario", "metric", "unit", "router", "peer", "peer value", "direct",
          "router/peer", "router/direct", "target")


def _cells(row: Row) -> tuple[str, ...]:
    return (row.name, row.metric, row.unit, _fmt(row.router), row.peer_name or "-", _fmt(row.peer),
            _fmt(row.direct), _ratio_text(row.ratio_vs_peer), _ratio_text(row.ratio_vs_direct),
            row.verdict())


def text_table(rows: Sequence[Row]) -> str:
    table = [HEADER, *(_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
             for line in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  {r.name}: {r.note}" for r in rows if r.note]
    return "\n".join(lines + (["notes:", *notes] if notes else []))


def markdown_table(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |")
    notes = [f"- **{r.name}**: {r.note}" for r in rows if r.note]
    return "\n".join(lines + (["", *notes] if notes else []))


def json_document(rows: Sequence[Row], machine: dict[str, Any]) -> str:
    doc = {"machine": machine, "scenarios": [r.to_json() for r in rows]}
    return json.dumps(doc, indent=2) + "\n"


def write_json(path: Path, rows: Sequence[Row], machine: dict[str, Any]) -> None:
    path.write_text(json_document(rows, machine))


def write_plots(directory: Path, rows: Sequence[Row]) -> list[Path]:
    """One bar chart per row (router / peer / direct) and one of all ratios; needs matplotlib."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    colors = {"router": "#1f77b4", "haproxy": "#ff7f0e", "nginx": "#2ca02c", "direct": "#7f7f7f"}
    for row in rows:
        bars = [("router", row.router)]
        if row.peer_name is not None:
            bars.append((row.peer_name, row.peer))
        if row.direct is not None:
            bars.append(("direct", row.direct))
        shown = [(n, v) for n, v in bars if v is not None]
        if not shown:
            continue
        fig, ax = plt.subplots(figsize=(4.5, 3.2))
        ax.bar([n for n, _ in shown], [v for _, v in shown], color=[colors.get(n, "#999") for n, _ in shown])
        for i, (_, v) in enumerate(shown):
            ax.annotate(_fmt(v), (i, v), ha="center", va="bottom", fontsize=8)
        better = "higher" if row.higher_is_better else "lower"
        ax.set_title(f"{row.name}\n{row.metric} ({better} is better)", fontsize=9)
        ax.set_ylabel(row.unit)
        fig.tight_layout()
        path = directory / f"{row.name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    ratio_rows = [r for r in rows if any(v is not None and v > 0 for v in (r.ratio_vs_peer, r.ratio_vs_direct))]
    if ratio_rows:
        fig, ax = plt.subplots(figsize=(8, 0.35 * len(ratio_rows) + 1.5))
        ys = list(range(len(ratio_rows)))
        for offset, label, color, values in (
            (-0.2, "router / peer", "#ff7f0e", [r.ratio_vs_peer for r in ratio_rows]),
            (0.2, "router / direct", "#7f7f7f", [r.ratio_vs_direct for r in ratio_rows]),
        ):
            points = [(y + offset, v) for y, v in zip(ys, values, strict=True) if v is not None and v > 0]
            ax.barh([p[0] for p in points], [p[1] for p in points], height=0.4, label=label, color=color)
        names = [r.name + ("" if r.higher_is_better else " (lower is better)") for r in ratio_rows]
        ax.set_yticks(ys, names, fontsize=8)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks([0.1, 0.2, 0.5, 1, 2, 5], ["0.1", "0.2", "0.5", "1", "2", "5"])
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("router / peer and router / direct (log scale)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = directory / "ratios.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


# ---------------------------------------------------------------------------------------
# Output paths: checked before the run, never losing it after
# ---------------------------------------------------------------------------------------
FALLBACK_PREFIX = "stargate-bench-"
"""Scratch files (in the system temp directory) that take an output its own path refused."""


class OutputPathError(Exception):
    """An output option whose path cannot be written; the message starts with the option."""


@dataclass(frozen=True)
class Outputs:
    """Where ``--json``, ``--markdown`` (files) and ``--plot`` (a directory) write; None: not asked."""

    json: Path | None = None
    markdown: Path | None = None
    plot: Path | None = None

    def asked(self) -> list[tuple[str, Path]]:
        """``(option, path)`` of each output asked for, in the order they are written."""
        return [(f"--{f.name}", path) for f in fields(self) if (path := getattr(self, f.name)) is not None]

    def prepare(self) -> None:
        """Create the directories and prove each path writable, before any scenario runs."""
        for option, path in self.asked():
            try:
                if option == "--plot":
                    _prepare_directory(path)
                    if importlib.util.find_spec("matplotlib") is None:
                        raise OutputPathError("needs matplotlib (pip install '.[bench]')")
                else:
                    _prepare_file(path)
            except (OSError, OutputPathError) as exc:
                raise OutputPathError(f"{option}: {_why(exc)}") from None

    def write(self, rows: Sequence[Row], machine: dict[str, Any]) -> tuple[list[str], list[str]]:
        """Write every output; returns (lines saying what went where, lines saying what failed).

        An output its path refuses goes to a scratch file instead; each failure says where."""
        written: list[str] = []
        failed: list[str] = []
        for option, path in self.asked():
            try:
                _write_output(option, path, rows, machine)
                written.append(f"{option}: wrote {path}")
                continue
            except Exception as exc:  # anything, even a plotting bug: the other outputs still go out
                reason = _why(exc)
            try:
                instead = _scratch_path(option)
                _write_output(option, instead, rows, machine)
                failed.append(f"{option}: could not write {path} ({reason}); wrote it to {instead} instead")
            except Exception as exc:
                failed.append(f"{option}: could not write {path} ({reason}), nor a scratch copy ({_why(exc)})")
        return written, failed


def _write_output(option: str, path: Path, rows: Sequence[Row], machine: dict[str, Any]) -> None:
    if option == "--plot":
        write_plots(path, rows)
    elif option == "--json":
        path.write_text(json_document(rows, machine))
    else:
        path.write_text(markdown_table(rows) + "\n")


def _scratch_path(option: str) -> Path:
    """A new file (a directory for ``--plot``) in the system temp directory."""
    if option == "--plot":
        return Path(tempfile.mkdtemp(prefix=FALLBACK_PREFIX + "plots-"))
    suffix = ".json" if option == "--json" else ".md"
    fd, name = tempfile.mkstemp(prefix=FALLBACK_PREFIX, suffix=suffix)
    os.close(fd)
    return Path(name)


def _prepare_file(path: Path) -> None:
    if path.is_dir():
        raise OutputPathError(f"{path} is a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    with open(path, "ab"):  # appends nothing: proves the file can be opened for writing
        pass
    if not existed:
        path.unlink()


def _prepare_directory(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{path} is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
        pass


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return " ".join(str(exc).split()) or type(exc).__name__
