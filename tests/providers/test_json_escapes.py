"""Duplicate keys hidden by a colon written as an escape.

The duplicate-key check counts the colons of the text against those of the
canonical form; a colon inside a string written ``\\u003a`` (or ``\\u003A``:
JSON hex digits have either case) is one the text does not show, and it can
make up for the key a duplicate lost. Such a text goes to the exact parse.
"""

from __future__ import annotations

import pytest

from turnledger import DecodeError
from turnledger.wire import loads_object, loads_strict


@pytest.mark.parametrize("escape", ["\\u003a", "\\u003A"], ids=["lower", "upper"])
@pytest.mark.parametrize("parse", [loads_strict, loads_object], ids=["strict", "object"])
def test_an_escaped_colon_cannot_make_up_for_a_lost_key(escape: str, parse: object) -> None:
    # Three colons in the text; the canonical form {"a":2,"b":":"} has three
    # too (its colon in a string is raw): only the exact parse sees "a" twice.
    text = '{"a":1,"a":2,"b":"' + escape + '"}'
    assert text.count(":") == 3
    with pytest.raises(DecodeError, match="duplicate key"):
        parse(text)  # type: ignore[operator]


@pytest.mark.parametrize("escape", ["\\u003a", "\\u003A"], ids=["lower", "upper"])
def test_an_escaped_colon_without_a_duplicate_is_a_colon(escape: str) -> None:
    assert loads_object('{"a":1,"b":"' + escape + '"}') == {"a": 1, "b": ":"}
