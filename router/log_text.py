"""What a log line may carry of text a client can influence: escaped, quoted and clipped.

Whatever a client sent reaches a log line only through here: no control, format or separator character
goes out raw in either format (each is written as its JSON escape), and a field is cut at
``LOG_FIELD_MAX_CHARS`` with a marker saying how much more there was (docs/security.md).
"""

from __future__ import annotations

import re
from json.encoder import encode_basestring
from typing import Final

from router import constants as c

UNSAFE_CHARACTERS: Final = (
    r"\x00-\x1f\x7f-\x9f"  # Cc: C0 (ESC, BEL, BS, VT, FF, FS-RS...), DEL, C1 (CSI U+009B, NEL U+0085...)
    r"\u2028\u2029"  # Zl, Zp: line and paragraph separators (JavaScript, ``str.splitlines``, some viewers)
    r"\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
    r"\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
    r"\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"  # Cf: bidi, invisible
    r"\ud800-\udfff"  # Cs: lone surrogates (no UTF-8 for them)
)
"""Regex class of characters no line carries raw: Unicode's Cc, Zl, Zp, Cf, Cs (a test holds it to unicodedata)."""

_TEXT_QUOTE_CHARS: Final = frozenset(' "=\\\t\r\n')
"""A text value containing one of these (or an unsafe character) is written as a JSON string literal."""

_QUOTE_CLASS: Final = re.escape("".join(sorted(_TEXT_QUOTE_CHARS)))
_NEEDS_QUOTES: Final = re.compile(f"[{_QUOTE_CLASS}{UNSAFE_CHARACTERS}]").search
_NEEDS_QUOTES_ASCII: Final = re.compile(f"[{_QUOTE_CLASS}\\x00-\\x1f\\x7f]").search
"""The same class for an ASCII text, whose only unsafe characters are C0 and DEL (a fifth of the cost)."""


def needs_quotes(text: str) -> re.Match[str] | None:
    """A match when ``text`` holds one of ``_TEXT_QUOTE_CHARS`` or an unsafe character; a non-empty value
    with none is written bare. One call may scan several values joined."""
    return (_NEEDS_QUOTES_ASCII if text.isascii() else _NEEDS_QUOTES)(text)


_UNSAFE: Final = re.compile(f"[{UNSAFE_CHARACTERS}]")

_SHORT_ESCAPES: Final = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
"""The control characters JSON has a short escape for (as ``json`` writes them)."""


def _escape(match: re.Match[str]) -> str:
    """One unsafe character as JSON writes it escaped: ``\\n``, ``\\u001b``, a surrogate pair beyond the BMP."""
    char = match.group()
    short = _SHORT_ESCAPES.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code > 0xFFFF:
        code -= 0x10000
        return f"\\u{0xD800 | code >> 10:04x}\\u{0xDC00 | code & 0x3FF:04x}"
    return f"\\u{code:04x}"


def escape_unsafe(text: str) -> str:
    """``text`` with every unsafe character written as its JSON escape (the rest untouched)."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def json_quoted(text: str) -> str:
    """``text`` as a JSON string literal with no unsafe character raw: the encoder's own escaping
    (``"``, ``\\``, C0), then the rest of ``UNSAFE_CHARACTERS`` (DEL, C1, separators, format characters)."""
    quoted = encode_basestring(text)
    if quoted.isascii() and "\x7f" not in quoted:  # O(1), then one memchr: the usual case
        return quoted
    return _UNSAFE.sub(_escape, quoted)


def clip(text: str, limit: int = c.LOG_FIELD_MAX_CHARS) -> str:
    """``text`` cut to ``limit`` characters, marked with how many more there were
    (``stargate-0.example:0000[...+15982 chars]``); a shorter one as it is."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}[...+{len(text) - limit} chars]"


def clip_optional(text: str | None) -> str | None:
    """``clip`` for a value that may be missing (a connection that named no host)."""
    return text if text is None or len(text) <= c.LOG_FIELD_MAX_CHARS else clip(text)


def text_value(value: object) -> str:
    """A value as the text format writes it after ``key=``: bare, or a JSON string when empty or when
    ``needs_quotes`` (``render_text`` inlines this rule; tests hold the two together)."""
    text = str(value)
    if not text or needs_quotes(text):
        return json_quoted(text)
    return text


def json_string(value: str | None) -> str:
    """A ``str`` or None as the JSON format writes it (``_JSON``'s escaping), without the encoder's set-up."""
    if value is None:
        return "null"
    quoted = encode_basestring(value)  # json_quoted, inlined: four calls per access line
    if quoted.isascii() and "\x7f" not in quoted:
        return quoted
    return _UNSAFE.sub(_escape, quoted)
