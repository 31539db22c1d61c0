"""What a fuzz target is, and what every target shares: the input conventions, the invariant
error, and input-derived chunking (so that a crash replays exactly)."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router import constants as c
from router.hostname import HostnameTemplate, is_pod_label
from tests.support.tls import u16

SEPARATOR = b"\xfe\xfd\xfc\xfb"
"""Splits one fuzz input into several datagrams / payloads (rare in real traffic)."""
CORPUS_DIR = Path(__file__).parent / "corpus"
"""Extra seed inputs kept in the repository, ``<target>-*``: the endpoints target's, and the inputs
``run_fuzz --save-corpus`` kept for the native targets because each found a new outcome."""
CRASHES_DIR = Path(__file__).parent / "crashes"
"""Saved crash inputs, ``<target>--<signature>--<sha1>.bin``, replayed by the regression tests."""
TEMPLATE = HostnameTemplate.parse(c.DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE, "demo")
"""The hostname match every parsed name goes through next, as in the router."""


class FuzzInvariantError(AssertionError):
    """A parser returned without error but broke one of its promises: a crash too."""


def check(ok: bool, what: str) -> None:
    """Raise ``FuzzInvariantError`` unless ``ok``."""
    if not ok:
        raise FuzzInvariantError(what)


@dataclass(frozen=True)
class FuzzTarget:
    """One parser under fuzzing: how to run an input, what may escape, where to start."""

    name: str
    run: Callable[[bytes], str]
    """Runs one input; returns a short outcome label (new labels grow the corpus)."""
    allowed: tuple[type[BaseException], ...]
    seeds: Callable[[], list[bytes]]
    max_len: int
    dictionary: tuple[bytes, ...] = ()
    structured: Callable[[bytes, random.Random], bytes | None] | None = None
    """Optional structure-aware mutator (parse, change a node, re-serialise)."""
    reaches_c: bool = False
    """Runs C code when the extensions are built (``tests/sanitize/run`` fuzzes these under ASan/UBSan)."""


def route_name(name: str, template: HostnameTemplate = TEMPLATE) -> str | None:
    """What the router does next with a parsed ``:authority`` or SNI: the template's match. It must not
    raise; a name longer than any authority (``MAX_AUTHORITY_LENGTH``) names no pod and is never
    remembered; a pod it names is one DNS label, and a remembered answer is the one a match gives."""
    pod = template.pod_name_for(name)
    if len(name) > c.MAX_AUTHORITY_LENGTH:
        check(pod is None, f"a name of {len(name)} characters named pod {pod!r}")
        check(name not in template._names, f"a name of {len(name)} characters was remembered")
    elif pod is not None:
        check(is_pod_label(pod), f"{pod!r} is not a pod label")
        check(template._match(name) == pod, "the remembered answer is not the match's")
    return pod


def pieces(data: bytes) -> list[bytes]:
    """``data`` cut at points derived from its own bytes, so a crash replays exactly."""
    rng = random.Random(zlib.crc32(data))
    out, pos = [], 0
    while pos < len(data):
        step = rng.choice((1, 2, 3, 5, 9, 17, 64, 300, 4096))
        out.append(data[pos : pos + step])
        pos += step
    return out


def feed_all(reader: Any, chunks: Sequence[bytes], error: type[Exception]) -> tuple[object, ...]:
    """("done", the last result) of feeding every chunk, or ("error", the parser's own error)."""
    result: object = None
    try:
        for chunk in chunks:
            result = reader.feed(chunk)
    except error as exc:
        return ("error", exc)
    return ("done", result)


def tweak(data: bytes, rng: random.Random) -> bytes:
    """One small byte-level change (the engine's mutator does the heavy stacking)."""
    buf = bytearray(data)
    pos = rng.randrange(len(buf) + 1)
    roll = rng.random()
    if roll < 0.3 and buf:
        buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
    elif roll < 0.55:
        buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
    elif roll < 0.8:
        del buf[pos : pos + rng.randint(1, 8)]
    elif len(buf) >= 2:
        at = rng.randrange(len(buf) - 1)
        buf[at : at + 2] = u16(int.from_bytes(buf[at : at + 2], "big") + rng.choice((-2, -1, 1, 2, 0x8000)))
    return bytes(buf)
