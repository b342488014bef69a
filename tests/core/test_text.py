"""The characters shown as escapes wherever stored text is shown (the
terminal and the timeline page), and how."""

from __future__ import annotations

import unicodedata

from turnledger.text import INVISIBLE_RANGES, visible

#: Unicode's bidirectional formatting classes: embeddings, overrides, isolates.
_BIDI_FORMATTING = {"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"}


def test_every_control_and_bidirectional_character_is_escaped() -> None:
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        c = chr(code)
        shown = visible(c)
        must = (
            unicodedata.category(c) == "Cc"
            or unicodedata.bidirectional(c) in _BIDI_FORMATTING
            or c in "\u200e\u200f\u061c\u2028\u2029"  # the marks, and the separators
        )
        assert (shown != c) == must, hex(code)
        if must:
            assert shown == (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def test_the_ranges_are_the_escaped_set_and_lines_keep_tab_and_newline() -> None:
    inside = {c for lo, hi in INVISIBLE_RANGES for c in range(lo, hi + 1)}
    assert {c for c in range(0x3000) if visible(chr(c)) != chr(c)} == inside
    assert visible("invoice_\u202efdp.exe") == "invoice_\\u202efdp.exe"
    assert visible("a\tb\nc\r\x1b[2J") == "a\\x09b\\x0ac\\x0d\\x1b[2J"
    assert visible("a\tb\nc\r\x1b[2J", lines=True) == "a\tb\nc\\x0d\\x1b[2J"
