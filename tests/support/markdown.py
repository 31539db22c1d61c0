"""Reading the project's Markdown as GitHub renders it: headings and their anchors, links, tables.

Pure text in, facts out, for the tests that hold the README and ``docs/`` to the code. Fenced code
blocks are skipped throughout: a ``# comment`` in a shell or YAML block is no heading, and a link in
a code block is no link.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6}) +(.+?)\s*#*\s*$")
_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_INLINE_CODE = re.compile(r"`[^`]*`")


def prose_lines(text: str) -> Iterator[str]:
    """The lines outside fenced code blocks."""
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield line


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading (before numbering repeats)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def headings(text: str) -> list[str]:
    """Every heading's text, in order."""
    return [m.group(2) for line in prose_lines(text) if (m := _HEADING.match(line))]


def anchors(text: str) -> set[str]:
    """Every anchor of a page: a repeated heading's second anchor gets ``-1``, as on GitHub."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in headings(text):
        anchor = github_anchor(heading)
        found.add(anchor if not seen[anchor] else f"{anchor}-{seen[anchor]}")
        seen[anchor] += 1
    return found


def links(text: str) -> list[str]:
    """The targets of every inline link outside code (spans and blocks)."""
    return [target for line in prose_lines(text) for target in _LINK.findall(_INLINE_CODE.sub("", line))]


def table_rows(text: str, first_header: str) -> list[list[str]]:
    """The body rows of every table whose header row starts with the cell ``first_header``, each
    as its cells (stripped). A cell holds no ``|`` outside inline code here."""
    rows: list[list[str]] = []
    in_table = False
    for line in prose_lines(text):
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [cell.strip() for cell in _split_cells(line)]
        if not in_table:
            in_table = cells[0] == first_header
            continue
        if set("".join(cells)) <= set("-: "):  # the header's rule
            continue
        rows.append(cells)
    return rows


def _split_cells(line: str) -> list[str]:
    """A table row's cells: split on ``|`` outside inline code."""
    cells: list[str] = []
    cell: list[str] = []
    in_code = False
    for char in line.strip().strip("|"):
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            cells.append("".join(cell))
            cell = []
        else:
            cell.append(char)
    cells.append("".join(cell))
    return cells


def pages() -> list[Path]:
    """The README and every page under ``docs/``."""
    return [README, *sorted(DOCS.glob("*.md"))]
