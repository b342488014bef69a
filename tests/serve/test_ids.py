"""Ids in the API's paths: every id the library takes has one segment, and
the segment gives the id back (the page's mirror of the rule is checked in
the browser, in test_page_safety.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnledger.serve import quote_id, unquote_id

_IDS = st.text(st.characters(exclude_categories=["Cs"]), min_size=1)
#: What a segment may hold: unreserved characters, encodeURIComponent's
#: extras, and percent-escapes.
_SEGMENT = re.compile(r"(?:[A-Za-z0-9\-_.~!'()*]|%[0-9A-F]{2})+")


@given(_IDS)
def test_every_id_has_a_segment_that_gives_it_back(value: str) -> None:
    segment = quote_id(value)
    assert _SEGMENT.fullmatch(segment)
    # never a dot segment, in any spelling a URL parser would take as one
    assert segment.lower().replace("%2e", ".") not in (".", "..")
    assert unquote_id(segment) == value


def test_the_escape_covers_dot_segments_and_itself() -> None:
    assert [quote_id(v) for v in (".", "..", "~", "~x", "a~", "...")] == [
        "~.", "~..", "~~", "~~x", "a~", "...",
    ]  # fmt: skip
    assert quote_id("café/1 ?#%") == "caf%C3%A9%2F1%20%3F%23%25"
    assert quote_id("user-42_v1.0") == "user-42_v1.0"  # plain ids travel as they are
    # an escaped character is that character: %7E is "~"
    assert unquote_id("%7E%7Ex") == unquote_id("~~x") == "~x"
    assert unquote_id("caf\u00e9") == "café"  # raw UTF-8, as some clients send it


@pytest.mark.parametrize("segment", ["", "~", ".", "..", "%2e", "%2E%2e", "%FF", "%C3"])
def test_a_segment_no_id_has_is_refused(segment: str) -> None:
    with pytest.raises(ValueError):
        unquote_id(segment)


@pytest.mark.parametrize("value", ["", "\ud800"])
def test_an_id_no_session_can_have_has_no_segment(value: str) -> None:
    with pytest.raises(ValueError):
        quote_id(value)


async def test_routes_see_each_segment_as_it_was_sent() -> None:
    from turnledger.serve._app import _edge

    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])

    edged = _edge(app)
    # an escaped "/" stays in its segment, a "%" is not decoded twice
    sent = "/v1/sessions/a%2Fb%2541/timeline"
    scope = {"type": "http", "path": "/v1/sessions/a/b%41/timeline", "raw_path": sent.encode()}
    await edged(scope, app, app)
    # without raw_path the decoded path is encoded again (only "/" is lost)
    await edged({"type": "http", "path": "/v1/sessions/%41 é/timeline"}, app, app)
    assert seen == [sent, "/v1/sessions/%2541%20%C3%A9/timeline"]
    assert unquote_id(seen[1].split("/")[3]) == "%41 é"
