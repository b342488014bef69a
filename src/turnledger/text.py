"""Which characters a reader would be shown an effect of instead of the
character itself, and how they are written so that they are seen.

One set, for every place that shows stored text: the command line (a
terminal acts on them) and the timeline page (a browser reorders text
around them). Pure: no I/O.
"""

from __future__ import annotations

import re

__all__ = ["INVISIBLE_RANGES", "visible"]

#: Inclusive code point ranges: C0 controls, DEL, C1 controls (``\x9b``
#: starts an escape sequence on some terminals), the line and paragraph
#: separators, and the bidirectional controls (Unicode's Bidi_Control set:
#: marks, embeddings, overrides, isolates) that reorder what is shown.
#: The page gets this table as data and builds the same pattern from it.
INVISIBLE_RANGES: tuple[tuple[int, int], ...] = (
    (0x00, 0x1F),
    (0x7F, 0x9F),
    (0x061C, 0x061C),
    (0x200E, 0x200F),
    (0x2028, 0x2029),
    (0x202A, 0x202E),
    (0x2066, 0x2069),
)


def _pattern(keep: str = "") -> re.Pattern[str]:
    codes = (c for lo, hi in INVISIBLE_RANGES for c in range(lo, hi + 1) if chr(c) not in keep)
    return re.compile("[" + "".join(re.escape(chr(c)) for c in codes) + "]")


_ONE_LINE = _pattern()
#: The same, but tab (``\x09``) and newline (``\x0a``) stay.
_MULTI_LINE = _pattern("\t\n")


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, lines: bool = False) -> str:
    """``text`` with every character of :data:`INVISIBLE_RANGES` shown as an
    escape (``\\x1b``, ``\\r``, ``\\u202e``...). With ``lines``, newlines and
    tabs stay (an answer shown as it was written)."""
    return (_MULTI_LINE if lines else _ONE_LINE).sub(_escape, text)
