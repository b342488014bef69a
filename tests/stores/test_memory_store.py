import enum
import json
import math
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from turnledger import StoreError
from turnledger.adapters.stores.memory import json_copy
from turnledger.events import EventStore, StoredEvent
from turnledger.events._exact_json import loads_exact
from turnledger.testing import EventStoreContract, MemoryStore


class TestMemoryStore(EventStoreContract):
    supports_reopen = False  # a new MemoryStore is empty

    async def open_store(self, path: Path) -> EventStore:
        return MemoryStore()


class _Color(enum.IntEnum):
    RED = 1


class _Name(str):
    pass


def _round_trip(value: Any) -> Any:
    return loads_exact(json.JSONEncoder(allow_nan=False).encode(value))


def _same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (1 == 1.0 == True is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b) and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**1990, max_value=2**2010),
    st.floats(),
    st.text(),
    st.sampled_from([_Color.RED, _Name("x"), 10**700, -(2**2000), 2**2000 - 1]),
)
_keys = st.one_of(st.text(), st.integers(-3, 3), st.booleans(), st.none(), st.floats(0, 2))
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(_keys, inner, max_size=4),
    ),
    max_leaves=12,
)


def _outcome(fn: Any, value: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(value)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


@given(_values)
def test_the_payload_copy_is_the_json_round_trip(value: Any) -> None:
    fast, slow = _outcome(json_copy, value), _outcome(_round_trip, value)
    assert fast[0] == slow[0]
    if fast[0] == "ok":
        assert _same(fast[1], slow[1])
    else:
        assert fast == slow


def test_the_payload_copy_shares_no_container_and_refuses_what_json_refuses() -> None:
    inner = {"b": [1, 2.5, None]}
    payload: dict[str, Any] = {"a": inner, "n": -0.0}
    copied = json_copy(payload)
    assert copied == payload and copied is not payload
    assert copied["a"] is not inner and copied["a"]["b"] is not inner["b"]
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    for bad in (cyclic, {"x": math.nan}, {"x": math.inf}, {"x": object()}, {(1,): 1}):
        with pytest.raises((TypeError, ValueError)):
            json_copy(bad)
    deep: Any = 1
    for _ in range(100):
        deep = [deep]
    assert json_copy(deep) == deep
    # A dict takes its own path from the top: its nesting is counted too.
    deep_dict: Any = 1
    for _ in range(100):
        deep_dict = {"k": deep_dict}
    assert _same(json_copy(deep_dict), _round_trip(deep_dict))


@given(st.lists(_values, min_size=1, max_size=3), st.booleans())
def test_an_append_keeps_the_round_trip_of_each_payload_or_refuses_the_batch(
    payloads: list[Any], first: bool
) -> None:
    # Batches of one take a path of their own; each batch is all or nothing.
    async def main() -> None:
        store = MemoryStore()
        version = 0
        if not first:
            version = await store.append("s", [StoredEvent("s", 1, "t", 1, {}, 0.0)], 0)
        batch = [
            StoredEvent("s", version + k, "tag", 2, p, 5.0) for k, p in enumerate(payloads, start=1)
        ]
        expected = [_outcome(_round_trip, p) for p in payloads]
        refused = [e for e in expected if e[0] != "ok"]
        if refused:
            with pytest.raises(StoreError, match="not JSON-able"):
                await store.append("s", batch, version)
            assert len(await store.read("s")) == version
            assert len(await store.read_all()) == version
            return
        assert await store.append("s", batch, version) == version + len(batch)
        held = (await store.read("s"))[version:]
        assert held == await store.read_all(version)
        assert [(e.session_id, e.seq, e.position) for e in held] == [
            ("s", version + k, version + k) for k in range(1, len(batch) + 1)
        ]
        for got, sent, (_ok, want) in zip(held, batch, expected, strict=True):
            assert (got.tag, got.schema_version, got.recorded_at) == ("tag", 2, 5.0)
            assert _same(got.payload, want)
            assert got.payload is not sent.payload or not isinstance(want, dict | list)

    trio.run(main)
