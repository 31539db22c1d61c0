"""The README and ``docs/`` say what the tree is: their links resolve, their lists match the code.

The flags and metrics tables have their own tests, beside the parser's and the families'
(``test_config.py``, ``test_metric_families.py``); the alerts' runbook anchors theirs
(``tests/deploy/test_alerts.py``).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from router import constants as c
from tests.support.markdown import DOCS, README, ROOT, anchors, links, pages, prose_lines, table_rows

CHECKED_PAGES = [*pages(), ROOT / "bench" / "README.md"]
"""Every page whose relative links must resolve: the README, ``docs/`` and the bench's README."""

README_COMMANDS = (
    "pip install '.[demo]' && stargate-router demo",
    "pip install -e '.[test]' && pytest",
)
"""The README's two commands, word for word: ``.ci/run`` runs the second, the first is the demo."""

PACKAGES = {
    "router/": ROOT / "router", "router/tcp/": ROOT / "router" / "tcp", "router/udp/": ROOT / "router" / "udp",
    "router/demo/": ROOT / "router" / "demo", "wire/": ROOT / "wire", "quic/": ROOT / "quic",
    "discovery/": ROOT / "discovery",
}
"""The packages docs/architecture.md's module table lists, by the name its rows give them."""


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("page", CHECKED_PAGES, ids=_id)
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    """A link to a file or folder of the repository names one that exists; a ``#fragment`` names a
    heading of its page (the same page for a bare ``#fragment``)."""
    text = page.read_text()
    broken = []
    for target in links(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        path_part, _, fragment = target.partition("#")
        linked = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not linked.exists() or ROOT not in (linked, *linked.parents):
            broken.append(f"{target}: no such file in the repository")
            continue
        if fragment and linked.suffix != ".md":
            broken.append(f"{target}: a fragment on a file that is not Markdown")
        elif fragment and unquote(fragment) not in anchors(linked.read_text()):
            broken.append(f"{target}: {_id(linked)} has no heading with that anchor")
    assert not broken, broken


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in links(README.read_text())}
    assert sorted(p.name for p in DOCS.glob("*.md") if p.resolve() not in linked) == []


def test_the_readme_is_a_front_door() -> None:
    """At most ~200 lines, the two commands word for word, and no dated figure (those live in
    bench/README.md with their command, machine and date)."""
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    for command in README_COMMANDS:
        assert f"{command}\n" in blocks, command
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)


@pytest.mark.parametrize("page", pages(), ids=_id)
def test_no_dated_figures_outside_the_bench(page: Path) -> None:
    """Dated runs are bench/README.md's: a date in the README or docs/ is a figure in the wrong place."""
    dated = [line for line in prose_lines(page.read_text()) if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert not dated, dated


def test_the_module_table_lists_exactly_the_modules() -> None:
    """docs/architecture.md's module table, both ways: each package's row names exactly its Python
    modules and C files (an entry is a module name in code, at the start of the cell or after
    ``; ``)."""
    rows = table_rows((DOCS / "architecture.md").read_text(), "package")
    assert sorted(row[0].strip("`") for row in rows) == sorted(PACKAGES)
    for package, cell in rows:
        directory = PACKAGES[package.strip("`")]
        listed = re.findall(r"(?:^|; )`([\w.]+)`", cell)
        present = [p.stem for p in directory.glob("*.py") if not p.name.startswith("__")]
        present += [p.name for p in (*directory.glob("*.c"), *directory.glob("*.h"))]
        assert len(listed) == len(set(listed)), (package, sorted(m for m in listed if listed.count(m) > 1))
        assert sorted(listed) == sorted(present), (package, sorted(set(present) - set(listed)),
                                                   sorted(set(listed) - set(present)))


def test_every_environment_variable_the_router_reads_is_documented() -> None:
    flags_page = (DOCS / "flags.md").read_text()
    variables = [v for k, v in vars(c).items() if k.endswith("_ENV") and isinstance(v, str)]
    assert variables
    assert [v for v in variables if f"`{v}`" not in flags_page] == []
