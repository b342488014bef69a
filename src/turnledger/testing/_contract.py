"""The event store contract: a pytest base class every store must pass.

Subclass it (no ``Test`` prefix, so pytest does not collect the base) and
override :meth:`EventStoreContract.open_store`::

    class TestMyStore(EventStoreContract):
        supports_reopen = True

        async def open_store(self, path):
            return await MyStore.open(path / "events.db")

``supports_reopen`` has no default: a subclass that gives ``open_store``
and does not say whether its store keeps its events across ``aclose()`` is
refused when it is defined. Uses the real clock (stores do real I/O); every
test runs under a timeout. A test that does not apply is skipped with its
reason.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
import trio

from .._errors import (
    CodecError,
    ConcurrencyConflict,
    StoreCorrupted,
    StoreError,
    UnknownEventTag,
    UnknownSession,
)
from ..events import (
    DEFAULT_CODEC,
    WIRE_TAGS,
    Event,
    EventStore,
    PayloadNotJSON,
    RequestId,
    StoredEvent,
    TurnCommitted,
    TurnSubmitted,
    Usage,
    session_hash,
)
from ._samples import sample_events

__all__ = ["EventStoreContract"]


def _batch(
    session_id: str, events: list[Event], after: int, t0: float = 1.7e9
) -> list[StoredEvent]:
    return [
        DEFAULT_CODEC.encode(ev, session_id=session_id, seq=after + i, recorded_at=t0 + i / 8)
        for i, ev in enumerate(events, start=1)
    ]


class _Raising:
    """A decoder whose every method raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def decode(self, stored: StoredEvent) -> None:
        raise self.error

    def decode_rows(
        self, session_id: str, rows: Iterable[tuple[int, str, int, str | bytes]]
    ) -> list[None]:
        raise self.error


class EventStoreContract:
    """Tests every :class:`~turnledger.events.EventStore` must pass."""

    pytestmark = pytest.mark.trio

    #: Whether the store keeps its events across ``aclose()`` and a new
    #: :meth:`open_store` of the same folder. No default: every store says.
    supports_reopen: ClassVar[bool]
    #: Seconds each test may take.
    timeout: ClassVar[float] = 30.0
    #: Whether the store erases (:meth:`~turnledger.events.EventStore.erase`);
    #: ``False`` skips the erasure tests (the store refuses with StoreError).
    supports_erase: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.open_store is not EventStoreContract.open_store and not isinstance(
            getattr(cls, "supports_reopen", None), bool
        ):
            raise TypeError(
                f"{cls.__name__} must say whether its store survives reopening: "
                "set supports_reopen = True or False"
            )

    async def open_store(self, path: Path) -> EventStore:
        """Open (or reopen) the store kept under the folder ``path``."""
        raise TypeError(f"{type(self).__name__} must override open_store()")

    async def settle(self, store: EventStore) -> None:
        """Wait until ``store.read_all`` shows every append that has returned.
        Stores whose feed lags behind commits (PostgreSQL's shows a commit
        once every older write transaction on the server has ended) override
        this; the default waits for nothing."""
        await trio.lowlevel.checkpoint()

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[EventStore]:
        with trio.fail_after(self.timeout):
            s = await self.open_store(tmp_path)
        try:
            yield s
        finally:
            with trio.fail_after(self.timeout):
                await s.aclose()

    # -- round trip and order ----------------------------------------------

    async def test_round_trip_of_every_wire_tag(self, store: EventStore) -> None:
        events = sample_events()
        assert {type(e) for e in events} == set(WIRE_TAGS)
        batch = _batch("s-1", events, 0)
        with trio.fail_after(self.timeout):
            version = await store.append("s-1", batch, 0)
            got = await store.read("s-1")
        assert version == len(events)
        assert got == batch  # envelope fields and payloads, byte for byte
        assert [DEFAULT_CODEC.decode(g) for g in got] == events
        assert all(isinstance(g.recorded_at, float) for g in got)

    async def test_read_after_and_order(self, store: EventStore) -> None:
        events = sample_events()
        with trio.fail_after(self.timeout):
            await store.append("s-1", _batch("s-1", events[:3], 0), 0)
            await store.append("s-1", _batch("s-1", events[3:], 3), 3)
            got = await store.read("s-1", after=2)
            nothing = await store.read("unknown")
            everything = await store.read("s-1", after=-1)
            await self.settle(store)
            feed = await store.read_all(after=-1)
            typed = await store.read_decoded("s-1", DEFAULT_CODEC, after=-1)
        assert [g.seq for g in got] == list(range(3, len(events) + 1))
        assert nothing == []
        assert [g.seq for g in everything] == list(range(1, len(events) + 1))  # after < 0: all
        assert feed == everything
        assert typed == events

    async def test_empty_append_is_a_no_op(self, store: EventStore) -> None:
        with trio.fail_after(self.timeout):
            assert await store.append("s-1", [], 0) == 0
            assert await store.read("s-1") == []
            assert await store.read_all() == []
            assert await store.session_ids() == []

    # -- the replay path: read_decoded ----------------------------------------

    async def test_read_decoded_matches_read_and_decode(self, store: EventStore) -> None:
        events = sample_events()
        with trio.fail_after(self.timeout):
            await store.append("s-1", _batch("s-1", events[:3], 0), 0)
            await store.append("s-1", _batch("s-1", events[3:], 3), 3)
            stored = await store.read("s-1")
            typed = await store.read_decoded("s-1", DEFAULT_CODEC)
            tail = await store.read_decoded("s-1", DEFAULT_CODEC, after=2)
            nothing = await store.read_decoded("unknown", DEFAULT_CODEC)
        assert typed == [DEFAULT_CODEC.decode(s) for s in stored] == events
        assert tail == events[2:]
        assert nothing == []

    async def test_read_decoded_many_folds_each_session(self, store: EventStore) -> None:
        events = sample_events()
        folded: list[str] = []

        def fold(sid: str, evs: list[Event]) -> list[Event]:
            folded.append(sid)
            return evs

        with trio.fail_after(self.timeout):
            await store.append("a", _batch("a", events, 0), 0)
            await store.append("b", _batch("b", events[:2], 0), 0)
            many = await store.read_decoded_many(["b", "unknown", "a", "b"], DEFAULT_CODEC, fold)
            one_by_one = {
                sid: await store.read_decoded(sid, DEFAULT_CODEC) for sid in ("b", "unknown", "a")
            }
            counts = await store.read_decoded_many(["a", "b"], DEFAULT_CODEC, lambda s, e: len(e))
            none = await store.read_decoded_many([], DEFAULT_CODEC, fold)
        assert folded == ["b", "unknown", "a"]  # once each, in the order asked
        assert list(many) == ["b", "unknown", "a"]
        assert many == one_by_one == {"b": events[:2], "unknown": [], "a": events}
        assert counts == {"a": len(events), "b": 2}
        assert none == {}

    async def test_read_decoded_passes_decoder_value_errors_on(self, store: EventStore) -> None:
        # Only PayloadNotJSON means damage; a decoder's own ValueError is its
        # caller's business, whichever method the store uses.
        picky = _Raising(ValueError("request id too long"))
        with trio.fail_after(self.timeout):
            await store.append("s-1", _batch("s-1", sample_events()[:2], 0), 0)
            with pytest.raises(ValueError, match=r"^request id too long$") as raised:
                await store.read_decoded("s-1", picky)
            assert type(raised.value) is ValueError
            with pytest.raises(ValueError, match=r"^request id too long$") as raised:
                await store.read_decoded_many(["s-1"], picky, lambda s, e: e)
            assert type(raised.value) is ValueError

    async def test_a_decoder_finding_damage_is_a_store_error(self, store: EventStore) -> None:
        # PayloadNotJSON from either decoder method means damage, whichever
        # method the store uses: StoreCorrupted, naming the event.
        finder = _Raising(PayloadNotJSON("the payload is not JSON: found by the decoder"))
        with trio.fail_after(self.timeout):
            await store.append("s-1", _batch("s-1", sample_events()[:2], 0), 0)
            with pytest.raises(StoreCorrupted, match=r"session 's-1' seq 1: .*by the decoder"):
                await store.read_decoded("s-1", finder)
            with pytest.raises(StoreCorrupted, match=r"session 's-1' seq 1: .*by the decoder"):
                await store.read_decoded_many(["s-1"], finder, lambda s, e: e)

    async def test_read_decoded_many_passes_fold_errors_on(self, store: EventStore) -> None:
        def fold(sid: str, evs: list[Event]) -> int:
            raise LookupError(f"cannot fold {sid}")

        with trio.fail_after(self.timeout):
            await store.append("a", _batch("a", sample_events()[:1], 0), 0)
            with pytest.raises(LookupError, match="cannot fold a"):
                await store.read_decoded_many(["a"], DEFAULT_CODEC, fold)
            # and the store still reads
            assert len(await store.read_decoded("a", DEFAULT_CODEC)) == 1

    async def test_read_decoded_is_exact(self, store: EventStore) -> None:
        # Integers beyond 64 bits (a fast JSON parser may round them to
        # floats) and a lone surrogate (which some parsers refuse) come back
        # exactly as read() + decode() gives them.
        events: list[Event] = [
            TurnSubmitted(RequestId("r-1"), "\ud800 lone", 2**64, 2**70, -(2**63) - 1),
            TurnCommitted(RequestId("r-1"), "big", "stop", Usage(2**64 - 1, 2**64, 10**30)),
        ]
        with trio.fail_after(self.timeout):
            await store.append("s-1", _batch("s-1", events, 0), 0)
            stored = await store.read("s-1")
            typed = await store.read_decoded("s-1", DEFAULT_CODEC)
        assert typed == [DEFAULT_CODEC.decode(s) for s in stored] == events
        submitted = typed[0]
        assert isinstance(submitted, TurnSubmitted) and type(submitted.turns_dropped) is int

    async def test_read_decoded_passes_codec_errors_on(self, store: EventStore) -> None:
        unknown = StoredEvent("s-1", 1, "from_the_future", 1, {"x": 1}, 1.7e9)
        with trio.fail_after(self.timeout):
            await store.append("s-1", [unknown], 0)
            with pytest.raises(UnknownEventTag, match=r"'s-1' seq 1: .*from_the_future"):
                await store.read_decoded("s-1", DEFAULT_CODEC)
            with pytest.raises(UnknownEventTag, match=r"'s-1' seq 1: .*from_the_future"):
                await store.read_decoded_many(["s-1"], DEFAULT_CODEC, lambda s, e: e)
        missing = StoredEvent("s-2", 1, "stream_started", 1, {"request_ix": "r"}, 1.7e9)
        with trio.fail_after(self.timeout):
            await store.append("s-2", [missing], 0)
            with pytest.raises(CodecError, match=r"'s-2' seq 1: stream_started"):
                await store.read_decoded("s-2", DEFAULT_CODEC)

    async def test_read_decoded_with_a_decoder_of_ones_own(self, store: EventStore) -> None:
        # Stores are domain-agnostic: any EventDecoder works, whichever of
        # its two methods the store uses.
        class Raw:
            def decode(self, stored: StoredEvent) -> tuple[int, str, Any]:
                return stored.seq, stored.tag, dict(stored.payload)

            def decode_rows(
                self, session_id: str, rows: Iterable[tuple[int, str, int, str | bytes]]
            ) -> list[tuple[int, str, Any]]:
                return [(seq, tag, json.loads(text)) for seq, tag, _, text in rows]

        batch = _batch("s-1", sample_events(), 0)
        with trio.fail_after(self.timeout):
            await store.append("s-1", batch, 0)
            got = await store.read_decoded("s-1", Raw(), after=1)
        assert got == [(e.seq, e.tag, e.payload) for e in batch[1:]]

    # -- concurrency and atomicity -----------------------------------------

    async def test_stale_expected_version_conflicts(self, store: EventStore) -> None:
        events = sample_events()
        with trio.fail_after(self.timeout):
            await store.append("s-1", _batch("s-1", events[:2], 0), 0)
            with pytest.raises(ConcurrencyConflict):
                await store.append("s-1", _batch("s-1", events[2:4], 0), 0)
            with pytest.raises(ConcurrencyConflict):
                await store.append("s-1", _batch("s-1", events[2:4], 1), 1)
            with pytest.raises(ConcurrencyConflict):
                await store.append("s-1", _batch("s-1", events[2:4], 5), 5)
            got = await store.read("s-1")
        assert [g.seq for g in got] == [1, 2]

    async def test_two_appenders_one_wins(self, store: EventStore) -> None:
        events = sample_events()
        results: list[str] = []

        async def appender(name: str) -> None:
            try:
                await store.append("s-1", _batch("s-1", events[:3], 0), 0)
                results.append(name)
            except ConcurrencyConflict:
                results.append("conflict")

        with trio.fail_after(self.timeout):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(appender, "a")
                nursery.start_soon(appender, "b")
            got = await store.read("s-1")
        assert sorted(results) in (["a", "conflict"], ["b", "conflict"])
        assert [g.seq for g in got] == [1, 2, 3]

    async def test_bad_batch_writes_nothing(self, store: EventStore) -> None:
        events = sample_events()
        good = _batch("s-1", events[:2], 0)
        bad_payload: dict[str, Any] = {"request_id": "r", "outcome": math.nan}
        bad = StoredEvent("s-1", 3, "completion_ignored", 1, bad_payload, 1.7e9)
        with trio.fail_after(self.timeout):
            with pytest.raises(StoreError):
                await store.append("s-1", [*good, bad], 0)
            assert await store.read("s-1") == []
            assert await store.read_all() == []
            # and the stream is still usable at version 0
            assert await store.append("s-1", good, 0) == 2

    async def test_batch_with_broken_seq_is_refused(self, store: EventStore) -> None:
        batch = _batch("s-1", sample_events()[:3], 0)
        broken = [batch[0], batch[2]]
        with trio.fail_after(self.timeout):
            with pytest.raises(ValueError):
                await store.append("s-1", broken, 0)
            assert await store.read("s-1") == []

    async def test_a_session_id_that_is_not_text_is_refused(self, store: EventStore) -> None:
        lone = "s-\ud800"
        batch = _batch(lone, sample_events()[:1], 0)
        with trio.fail_after(self.timeout):
            for sid in (lone, ""):
                with pytest.raises(ValueError):
                    await store.append(sid, [attrs.evolve(e, session_id=sid) for e in batch], 0)
            assert await store.read_all() == []

    # -- the global feed -----------------------------------------------------

    async def test_global_feed_order(self, store: EventStore) -> None:
        events = sample_events()
        with trio.fail_after(self.timeout):
            await store.append("a", _batch("a", events[:2], 0), 0)
            await store.append("b", _batch("b", events[:1], 0), 0)
            await store.append("a", _batch("a", events[2:3], 2), 2)
            await self.settle(store)
            feed = await store.read_all()
            tail = await store.read_all(after=feed[1].position or 0)
            first_two = await store.read_all(limit=2)
            ids = await store.session_ids()
        assert [(e.session_id, e.seq) for e in feed] == [("a", 1), ("a", 2), ("b", 1), ("a", 3)]
        positions = [e.position for e in feed]
        assert all(isinstance(p, int) for p in positions)
        assert positions == sorted(p or 0 for p in positions) and len(set(positions)) == 4
        assert [(e.session_id, e.seq) for e in tail] == [("b", 1), ("a", 3)]
        assert first_two == feed[:2]
        assert ids == ["a", "b"]

    # -- erasure ---------------------------------------------------------------

    @pytest.fixture
    def erasable(self) -> None:
        if not self.supports_erase:
            pytest.skip(f"{type(self).__name__}: the store does not erase")

    async def _three_sessions(self, store: EventStore) -> list[Event]:
        events = sample_events()
        await store.append("a", _batch("a", events[:2], 0), 0)
        await store.append("b", _batch("b", events[:3], 0), 0)
        await store.append("a", _batch("a", events[2:4], 2), 2)
        await store.append("c", _batch("c", events[:1], 0), 0)
        return events

    async def test_erase_leaves_the_session_unknown(
        self, store: EventStore, erasable: None
    ) -> None:
        with trio.fail_after(self.timeout):
            events = await self._three_sessions(store)
            await self.settle(store)
            before = await store.read_all()
            b, c = await store.read("b"), await store.read("c")
            record = await store.erase("a")
            await self.settle(store)
            feed = await store.read_all()
            gone = await store.read("a")
            gone_typed = await store.read_decoded("a", DEFAULT_CODEC)
            many = await store.read_decoded_many(["a", "b"], DEFAULT_CODEC, lambda s, e: len(e))
            ids = await store.session_ids()
            records = await store.erasures()
            # The others go on, and the erased id can start afresh.
            assert await store.append("b", _batch("b", events[3:4], 3), 3) == 4
            assert await store.append("a", _batch("a", events[:1], 0), 0) == 1
            await self.settle(store)
            after = await store.read_all()
        assert gone == [] and gone_typed == [] and many == {"a": 0, "b": 3}
        assert ids == ["b", "c"]
        assert [(e.session_id, e.seq) for e in feed] == [
            (e.session_id, e.seq) for e in before if e.session_id != "a"
        ]
        assert [e for e in feed if e.session_id == "b"] == b
        assert [e for e in feed if e.session_id == "c"] == c
        assert record.session_hash == session_hash("a") and record.session_hash != "a"
        assert (record.events, record.kept) == (4, 0)
        assert records == [record]
        positions = [e.position or 0 for e in after]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        assert [(e.session_id, e.seq) for e in after][-2:] == [("b", 4), ("a", 1)]

    async def test_erasing_an_unknown_session_changes_nothing(
        self, store: EventStore, erasable: None
    ) -> None:
        with trio.fail_after(self.timeout):
            await self._three_sessions(store)
            await self.settle(store)
            before = await store.read_all()
            with pytest.raises(UnknownSession):
                await store.erase("nobody")
            await self.settle(store)
            assert await store.read_all() == before
            assert await store.erasures() == []

    async def test_erase_keeping_the_newest_events(self, store: EventStore, erasable: None) -> None:
        with trio.fail_after(self.timeout):
            events = await self._three_sessions(store)
            old = await store.read("a")
            keep = [attrs.evolve(e, seq=i, position=None) for i, e in enumerate(old[2:], 1)]
            record = await store.erase("a", keep)
            got = await store.read("a")
            assert await store.append("a", _batch("a", events[4:5], 2), 2) == 3
            await self.settle(store)
            ids = await store.session_ids()
            feed = await store.read_all()
        assert (record.events, record.kept) == (4, 2)
        assert [(e.seq, e.tag, e.payload) for e in got] == [
            (i, e.tag, e.payload) for i, e in enumerate(old[2:], 1)
        ]
        assert set(ids) == {"a", "b", "c"}
        assert [e.seq for e in feed if e.session_id == "a"] == [1, 2, 3]

    async def test_erase_lasts_across_reopening(
        self, tmp_path: Path, reopenable: None, erasable: None
    ) -> None:
        with trio.fail_after(self.timeout):
            s = await self.open_store(tmp_path)
            try:
                events = await self._three_sessions(s)
                await s.erase("c")  # the newest event of the feed
            finally:
                await s.aclose()
            s = await self.open_store(tmp_path)
            try:
                assert await s.read("c") == []
                assert len(await s.erasures()) == 1
                await s.append("c", _batch("c", events[:1], 0), 0)
                await self.settle(s)
                feed = await s.read_all()
            finally:
                await s.aclose()
        positions = [e.position or 0 for e in feed]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)

    # -- durability ----------------------------------------------------------

    @pytest.fixture
    def reopenable(self) -> None:
        # A skip from a synchronous fixture keeps its reason; one raised
        # inside a trio test is reported without it.
        if not self.supports_reopen:
            pytest.skip(f"{type(self).__name__}: the store does not survive reopening")

    async def test_reopen_keeps_everything(self, tmp_path: Path, reopenable: None) -> None:
        events = sample_events()
        batch = _batch("s-1", events, 0)
        with trio.fail_after(self.timeout):
            s = await self.open_store(tmp_path)
            await s.append("s-1", batch, 0)
            await s.aclose()
            s = await self.open_store(tmp_path)
            try:
                got = await s.read("s-1")
                with pytest.raises(ConcurrencyConflict):
                    await s.append("s-1", _batch("s-1", events[:1], 0), 0)
                assert await s.append("s-1", _batch("s-1", events[:1], len(events)), len(events))
            finally:
                await s.aclose()
        assert got == batch
