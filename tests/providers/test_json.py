"""Layer 3: SSE data / NDJSON lines -> strict JSON."""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnledger import DecodeError
from turnledger.adapters.providers import (
    OllamaLineValidator,
    OpenAIStreamDecoder,
    loads_object,
    loads_strict,
)
from turnledger.events import Usage
from turnledger.testing import openai_sse_chunks, sse_event


def _stdlib_has_duplicates(text: str) -> bool:
    found = False

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal found
        d = dict(pairs)
        found = found or len(d) != len(pairs)
        return d

    json.loads(text, object_pairs_hook=hook)
    return found


ACCEPTED = {
    '{"a":1}': {"a": 1},
    ' \t\r\n{"a" : [1, 2.5, -0, 1e-3, true, false, null]} \n': {
        "a": [1, 2.5, 0, 0.001, True, False, None]
    },
    '{"a:b":"c:d","e":"\\":"}': {"a:b": "c:d", "e": '":'},
    '{"k":"\\u003a"}': {"k": ":"},
    '{"emoji":"\\ud83c\\udf31","raw":"🌱"}': {"emoji": "🌱", "raw": "🌱"},
    '{"a":{"a":{"a":1}}}': {"a": {"a": {"a": 1}}},  # same key, different objects
    '"just a string"': "just a string",
    "[]": [],
    '{"s":"[[[[[[[[[[[[[[[[[[[[{{{{{{{{{{"}': {"s": "[[[[[[[[[[[[[[[[[[[[{{{{{{{{{{"},
}


@pytest.mark.parametrize("text", ACCEPTED.keys())
def test_accepts_strict_json(text: str) -> None:
    assert loads_strict(text) == ACCEPTED[text]


REFUSED = {
    "duplicate": '{"a":1,"a":2}',
    "duplicate_nested": '{"x":{"b":1,"b":1}}',
    "duplicate_in_array": '[{"b":1},{"c":1,"c":2}]',
    "duplicate_with_spaces": '{"a" : 1 , "a" : 2}',
    "duplicate_hiding_colons": '{"a":{"k":"1:2:3"},"a":"x"}',
    "duplicate_with_colon_escape": '{"a":"\\u003a","a":1}',
    "duplicate_escaped_key": '{"a":1,"\\u0061":2}',
    "trailing_object": '{"a":1}{"b":2}',
    "trailing_text": '{"a":1} x',
    "trailing_comma": '{"a":1,}',
    "nan": '{"a":NaN}',
    "infinity": '{"a":Infinity}',
    "minus_infinity": '{"a":-Infinity}',
    "overflow": '{"a":1e999}',
    "lone_surrogate": '{"a":"\\ud800"}',
    "lone_low_surrogate": '{"a":"\\udc00x"}',
    "single_quotes": "{'a':1}",
    "comment": '{"a":1 /* no */}',
    "leading_zero": '{"a":01}',
    "control_char": '{"a":"\x01"}',
    "bom": '\ufeff{"a":1}',
    "empty": "",
    "depth_17_arrays": "[" * 17 + "]" * 17,
    "depth_17_objects": '{"a":' * 17 + "1" + "}" * 17,
    "depth_17_mixed": '[{"a":' * 8 + "[]" + "}]" * 8,
    "very_deep": "[" * 5000 + "]" * 5000,
}


@pytest.mark.parametrize("text", REFUSED.values(), ids=REFUSED.keys())
def test_refuses(text: str) -> None:
    with pytest.raises(DecodeError) as info:
        loads_strict(text)
    assert info.value.reason == "malformed"


def test_depth_16_is_allowed_and_the_limit_is_configurable() -> None:
    assert loads_strict("[" * 16 + "]" * 16) is not None
    assert loads_strict('{"a":' * 15 + "[]" + "}" * 15) is not None
    with pytest.raises(DecodeError, match="deeper than 3"):
        loads_strict("[[[[]]]]", max_depth=3)
    assert loads_strict("[[[]]]", max_depth=3) == [[[]]]


def test_messages_never_quote_the_input() -> None:
    with pytest.raises(DecodeError) as info:
        loads_strict('{"secret-token-123": 1, "secret-token-123": 2}')
    assert "secret" not in str(info.value)
    with pytest.raises(DecodeError) as info:
        loads_strict('{"a": secret}')
    assert "secret" not in str(info.value)


# JSON values, with keys that exercise colons, quotes and escapes.
KEYS = st.text(alphabet=st.sampled_from('ab:"\\é🌱 '), max_size=4)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.integers(-(10**40), 10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.sampled_from('x:"\\{[é🌱\n'), max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=12,
)


def _depth(v: Any) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


@given(JSON, st.booleans(), st.booleans())
def test_round_trips_whatever_the_writer(value: Any, ascii_only: bool, spaced: bool) -> None:
    text = json.dumps(
        value, ensure_ascii=ascii_only, separators=(", ", " : ") if spaced else (",", ":")
    )
    if _depth(value) > 16:
        with pytest.raises(DecodeError):
            loads_strict(text)
        return
    parsed = loads_strict(text)
    assert json.dumps(parsed, sort_keys=True) == json.dumps(value, sort_keys=True) or (
        # floats may differ in the last digit between parsers
        isinstance(value, float) and math.isclose(parsed, value)
    )


@given(st.dictionaries(KEYS, JSON, min_size=1, max_size=4), st.data())
def test_a_duplicated_key_is_always_found(obj: dict[str, Any], data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(sorted(obj)))
    value = data.draw(JSON)
    body = json.dumps(obj, ensure_ascii=data.draw(st.booleans()))
    dup = body[:-1] + ("," if obj else "") + json.dumps(key) + ":" + json.dumps(value) + "}"
    assert _stdlib_has_duplicates(dup)
    with pytest.raises(DecodeError):
        loads_strict(dup, max_depth=64)


@given(st.text(max_size=60))
def test_arbitrary_text_raises_only_decode_error(text: str) -> None:
    with contextlib.suppress(DecodeError):
        loads_strict(text)


@given(st.text(alphabet=st.sampled_from('{}[]:,"\\u003a 01tfn'), max_size=40))
def test_json_like_noise_agrees_with_the_stdlib_on_duplicates(text: str) -> None:
    try:
        value = loads_strict(text, max_depth=64)
    except DecodeError:
        return
    assert not _stdlib_has_duplicates(text)
    assert value == json.loads(text)


# -- integers stay exact ------------------------------------------------------------

BIG = 123456789012345678901234567890

EXACT = [
    '{"n":123456789012345678901234567890}',
    '{"n": 123456789012345678901234567890}',  # not the canonical form
    '{"n":123456789012345678901234567890,"k":"\\u003a"}',
    "[-9223372036854775809, 18446744073709551616, 18446744073709551615]",
    "-123456789012345678901234567890",
    '{"a":[1,{"b":-123456789012345678901234567890}],"c":2.5}',
    "1" + "0" * 300,
]


@pytest.mark.parametrize("text", EXACT)
def test_integers_beyond_64_bits_stay_exact(text: str) -> None:
    value = loads_strict(text)
    assert value == json.loads(text)
    assert json.dumps(value) == json.dumps(json.loads(text))  # ints, not floats


@pytest.mark.parametrize(
    "text",
    [
        '{"n":123456789012345678901234567890,"n":1}',  # duplicate key
        '{"n":123456789012345678901234567890, "n" : 1}',
        '{"n":123456789012345678901234567890,"\\u006e":1}',
        '{"n":123456789012345678901234567890,"x":NaN}',
        '{"n":123456789012345678901234567890} x',  # trailing data
        '{"n":123456789012345678901234567890}{"m":1}',
        '{"n":123456789012345678901234567890,"s":"\\ud800"}',  # lone surrogate
        '{"n":123456789012345678901234567890,"x":1e999}',
        '{"n":0123456789012345678901234567890}',  # leading zero
        "1" + "0" * 400,  # too long for a double, as 1e999
        '{"n":123456789012345678901234567890,"d":' + "[" * 17 + "]" * 17 + "}",
    ],
)
def test_exact_integers_keep_every_strictness_rule(text: str) -> None:
    with pytest.raises(DecodeError):
        loads_strict(text)


def test_a_huge_usage_count_is_not_malformed() -> None:
    usage = sse_event({"choices": [], "usage": {"prompt_tokens": BIG, "completion_tokens": 2}})
    chunks = openai_sse_chunks("hi", done=False)
    decoder = OpenAIStreamDecoder()
    for chunk in [*chunks, usage, b"data: [DONE]\n\n"]:
        decoder.feed(chunk)
    assert decoder.finish().usage == Usage(BIG, 2, BIG + 2)
    line = json.dumps({"done": True, "done_reason": "stop", "eval_count": BIG})
    validator = OllamaLineValidator()
    validator.feed(line)
    assert validator.finish().usage == Usage(None, BIG, None)


def test_invalid_utf8_next_to_a_huge_integer_is_still_refused() -> None:
    decoder = OpenAIStreamDecoder()
    decoder.feed(b'data: {"choices":[],"usage":{"prompt_tokens":%d,"x":"\xff"}}\n\n' % BIG)
    with pytest.raises(DecodeError, match="invalid UTF-8"):
        decoder.finish()


# -- provider chunks are objects --------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["[]", "[{}]", '"text"', "1", "12345678901234567890123", "null", "true"]
)
def test_loads_object_refuses_a_top_level_value_that_is_not_an_object(text: str) -> None:
    assert loads_strict(text) == json.loads(text)
    with pytest.raises(DecodeError, match="where an object belongs"):
        loads_object(text)


def test_loads_object_applies_the_strict_rules() -> None:
    assert loads_object('{"a":[1,2],"n":123456789012345678901234567890}') == {
        "a": [1, 2],
        "n": BIG,
    }
    for text in ['{"a":1,"a":2}', '{"a":1} x', '{"a":' * 17 + "1" + "}" * 17]:
        with pytest.raises(DecodeError):
            loads_object(text)


# -- duplicates at any depth, and the depth bound -------------------------------------

# An object as the list of its pairs, so a key may repeat at any depth.
_Pairs = list[tuple[str, Any]]
_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(alphabet=st.sampled_from('x:"\\{é🌱 '), max_size=5)
)
_TREE = st.recursive(
    _LEAF,
    lambda inner: (
        st.lists(inner, max_size=3).map(lambda v: ("list", v))
        | st.lists(st.tuples(st.sampled_from(["a", "b", "c:", "é"]), inner), max_size=4).map(
            lambda v: ("object", v)
        )
    ),
    max_leaves=14,
)


def _write(node: Any, ascii_only: bool, spaced: bool, escape_colons: bool) -> str:
    def string(s: str) -> str:
        text = json.dumps(s, ensure_ascii=ascii_only)
        return text.replace(":", "\\u003a") if escape_colons else text

    comma, colon = (" , ", " : ") if spaced else (",", ":")
    if isinstance(node, tuple) and node[0] == "list":
        return "[" + comma.join(_write(v, ascii_only, spaced, escape_colons) for v in node[1]) + "]"
    if isinstance(node, tuple) and node[0] == "object":
        pairs: _Pairs = node[1]
        return (
            "{"
            + comma.join(
                string(k) + colon + _write(v, ascii_only, spaced, escape_colons) for k, v in pairs
            )
            + "}"
        )
    if isinstance(node, str):
        return string(node)
    return json.dumps(node)


@given(_TREE, st.booleans(), st.booleans(), st.booleans())
def test_duplicate_keys_are_refused_at_any_depth_whatever_the_writer(
    tree: Any, ascii_only: bool, spaced: bool, escape_colons: bool
) -> None:
    # Keys that repeat in nested objects, colons in keys and strings (raw or
    # escaped as \u003a), whitespace: refused exactly when the standard
    # library sees a duplicate, and otherwise the same value.
    text = _write(tree, ascii_only, spaced, escape_colons)
    if _depth(json.loads(text)) > 16:
        return
    if _stdlib_has_duplicates(text):
        with pytest.raises(DecodeError, match="duplicate"):
            loads_strict(text)
    else:
        assert loads_strict(text) == json.loads(text)


def test_the_depth_limit_holds_at_the_bound() -> None:
    deep = '{"a":' * 16 + "1" + "}" * 16
    assert loads_object(deep)
    with pytest.raises(DecodeError, match="deeper than 16"):
        loads_object('{"a":' + deep + "}")
    with pytest.raises(DecodeError, match="deeper than 3"):
        loads_object('{"a":[{"b":[1]}]}', max_depth=3)
    assert loads_object('{"a":[{"b":[1]}]}', max_depth=4)
