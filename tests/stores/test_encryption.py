"""Encryption at rest, on every durable store: no content byte at rest, rows
bound to their place, plaintext refused, wrong keys typed, rotation without
rewriting events, and reading without the key says so."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
from pathlib import Path

import pytest
import trio

from turnledger.adapters.encryption import (
    ContentEncrypted,
    DecryptionFailed,
    EncryptedStore,
    PlaintextRefused,
    StaticKeys,
    WrappedKey,
    WrongKey,
    keys_from_file,
    new_key_line,
    rotate_keys,
)
from turnledger.adapters.stores import open_store, store_kind
from turnledger.events import DEFAULT_CODEC, Event, StoredEvent, session_hash
from turnledger.testing import sample_events

CANARY = "zebra-canary-7f3a"


def canary_events() -> list[Event]:
    """One event of every tag, every text field carrying the canary."""
    out = []
    originals = sample_events()
    for ev in originals:
        tag, version, payload = DEFAULT_CODEC.to_payload(ev)
        text = json.dumps(payload).replace("Java", CANARY)
        out.append(DEFAULT_CODEC.from_payload(tag, version, json.loads(text)))
    carried = [CANARY in repr(new) for old, new in zip(originals, out, strict=True)]
    assert carried == ["Java" in repr(old) for old in originals] and sum(carried) >= 8
    return out


def stored(session_id: str, events: list[Event]) -> list[StoredEvent]:
    return [
        DEFAULT_CODEC.encode(e, session_id=session_id, seq=i, recorded_at=1.7e9 + i)
        for i, e in enumerate(events, 1)
    ]


def key(kid: str, fill: int) -> StaticKeys:
    return StaticKeys({kid: bytes([fill]) * 32}, kid)


K1 = key("k1", 1)


@pytest.fixture(params=["sqlite", "journal", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        dsn: str = request.getfixturevalue("pg_dsn")
        return dsn
    return str(tmp_path / ("events.db" if request.param == "sqlite" else "events.jsonl"))


def pg_bytes(dsn: str) -> bytes:
    """Every column of every row of every table of the test's schema, as text."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            )
        ]
        assert "turnledger_events" in tables and "turnledger_data_keys" in tables
        out = b""
        for t in tables:
            for (row,) in conn.execute(f'SELECT t::text FROM "{t}" t'):
                out += row.encode("utf-8", "surrogatepass") + b"\n"
    return out


def at_rest(target: str) -> bytes:
    if store_kind(target) == "postgres":
        return pg_bytes(target)
    folder = Path(target).parent
    return b"".join(p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file())


async def test_no_content_at_rest_and_everything_reads_back(target: str) -> None:
    events = canary_events()
    with trio.fail_after(30):
        store = await open_store(target, keys=K1)
        assert isinstance(store, EncryptedStore)
        try:
            for sid in ("secret", "other"):
                await store.append(sid, stored(sid, events), 0)
        finally:
            await store.aclose()
        raw = at_rest(target)
        assert CANARY.encode() not in raw
        assert b"Java" not in raw.replace(b"\\", b"")  # nor the nested text
        assert len(raw) > 1000  # the scan saw the rows

        store = await open_store(target, keys=K1)
        try:
            for sid in ("secret", "other"):
                assert await store.read(sid) == stored(sid, events)
                assert await store.read_decoded(sid, DEFAULT_CODEC) == events
                assert await store.read_decoded(sid, DEFAULT_CODEC, after=5) == events[5:]
            many = await store.read_decoded_many(
                ["other", "secret", "nobody"], DEFAULT_CODEC, lambda s, evs: len(evs)
            )
            assert many == {"other": len(events), "secret": len(events), "nobody": 0}
            expected = [e.payload for e in stored("secret", events)]
            # (PostgreSQL's feed shows rows once every older write transaction
            # on the server has ended: wait for them.)
            with trio.fail_after(20):
                while True:
                    feed = await store.read_all()
                    got = [e.payload for e in feed if e.session_id == "secret"]
                    if len(got) == len(expected):
                        break
                    await trio.sleep(0.05)
            assert got == expected
            assert sorted(await store.session_ids()) == ["other", "secret"]
        finally:
            await store.aclose()

        # Without the key: the store says the content is encrypted.
        store = await open_store(target)
        try:
            assert sorted(await store.session_ids()) == ["other", "secret"]
            with pytest.raises(ContentEncrypted, match="encrypted") as caught:
                await store.read_decoded("secret", DEFAULT_CODEC)
            assert "$enc" not in str(caught.value)
        finally:
            await store.aclose()


async def test_a_ciphertext_moved_to_another_place_is_refused(tmp_path: Path) -> None:
    events = canary_events()
    db = str(tmp_path / "e.db")
    with trio.fail_after(30):
        store = await open_store(db, keys=K1)
        assert isinstance(store, EncryptedStore)
        try:
            await store.append("a", stored("a", events[:3]), 0)
            await store.append("b", stored("b", events[:3]), 0)
            raw_a = await store.inner.read("a")
            # seq 2 of "a" copied to seq 4 of "a": same key, same tag, other seq.
            moved = StoredEvent("a", 4, raw_a[1].tag, raw_a[1].schema_version,
                                raw_a[1].payload, 1.0)  # fmt: skip
            await store.inner.append("a", [moved], 3)
            with pytest.raises(DecryptionFailed, match=r"'a' seq 4"):
                await store.read_decoded("a", DEFAULT_CODEC)
            with pytest.raises(DecryptionFailed):
                await store.read("a", after=3)
            # seq 2 of "a" copied to seq 4 of "b": another session.
            stolen = StoredEvent("b", 4, raw_a[1].tag, raw_a[1].schema_version,
                                 raw_a[1].payload, 1.0)  # fmt: skip
            await store.inner.append("b", [stolen], 3)
            with pytest.raises(DecryptionFailed, match=r"'b' seq 4"):
                await store.read_decoded("b", DEFAULT_CODEC)
            # the same ciphertext under another tag at its own place
            raw_b = await store.inner.read("b")
            retagged = StoredEvent("b", 5, "turn_rejected", 1, raw_b[2].payload, 1.0)
            await store.inner.append("b", [retagged], 4)
            with pytest.raises(DecryptionFailed, match=r"seq 5"):
                await store.read("b", after=4)
            # a session whose rows are all in place still reads
            await store.append("c", stored("c", events[:3]), 0)
            assert await store.read_decoded("c", DEFAULT_CODEC) == events[:3]
        finally:
            await store.aclose()

    # A wrapped data key copied onto another session does not unwrap there.
    ring = sqlite3.connect(db + ".keys")
    with ring:
        (blob,) = ring.execute("SELECT wrapped FROM data_keys WHERE session_id='a'").fetchone()
        ring.execute("UPDATE data_keys SET wrapped=? WHERE session_id='b'", (blob,))
    ring.close()
    store = await open_store(db, keys=K1)
    try:
        with pytest.raises(WrongKey):
            await store.read("b")
    finally:
        await store.aclose()


async def test_a_row_copied_from_another_store_is_refused(tmp_path: Path) -> None:
    events = canary_events()
    with trio.fail_after(30):
        one = await open_store(str(tmp_path / "one.db"), keys=K1)
        two = await open_store(str(tmp_path / "two.db"), keys=K1)
        assert isinstance(one, EncryptedStore) and isinstance(two, EncryptedStore)
        try:
            await one.append("s", stored("s", events[:2]), 0)
            await two.append("s", stored("s", events[:1]), 0)
            (row,) = await one.inner.read("s", after=1)
            await two.inner.append("s", [row], 1)
            with pytest.raises(DecryptionFailed):
                await two.read("s")
        finally:
            await one.aclose()
            await two.aclose()


async def test_a_plaintext_row_in_an_encrypted_store_is_refused(target: str) -> None:
    events = canary_events()
    with trio.fail_after(30):
        store = await open_store(target, keys=K1)
        assert isinstance(store, EncryptedStore)
        try:
            await store.append("s", stored("s", events[:2]), 0)
            plain = stored("s", events[:3])[2]
            await store.inner.append("s", [plain], 2)  # written behind the layer's back
            with pytest.raises(PlaintextRefused, match=r"seq 3"):
                await store.read_decoded("s", DEFAULT_CODEC)
            with pytest.raises(PlaintextRefused, match=r"seq 3"):
                await store.read("s")
            # (PostgreSQL's feed shows a row once every older write
            # transaction on the server has ended: wait for it.)
            with trio.fail_after(20):
                while True:
                    try:
                        await store.read_all()
                    except PlaintextRefused:
                        break
                    await trio.sleep(0.05)
            # a session written plaintext before encryption was turned on
            await store.inner.append("old", stored("old", events[:1]), 0)
            with pytest.raises(PlaintextRefused):
                await store.read("old")
            # an already-sealed payload offered to append is not sealed twice
            sealed = (await store.inner.read("s"))[1]
            with pytest.raises(Exception, match="plaintext"):
                await store.append("s", [StoredEvent("s", 4, sealed.tag, sealed.schema_version,
                                                     sealed.payload, 1.0)], 3)  # fmt: skip
        finally:
            await store.aclose()


async def test_a_wrong_key_is_a_typed_error_never_garbage(target: str) -> None:
    events = canary_events()
    with trio.fail_after(30):
        store = await open_store(target, keys=K1)
        try:
            await store.append("s", stored("s", events), 0)
        finally:
            await store.aclose()
        # The right id with the wrong bytes: refused when the store opens,
        # before a new session's key could be wrapped with it.
        with pytest.raises(WrongKey, match="does not unwrap"):
            await open_store(target, keys=key("k1", 2))
        # Another key altogether: every read of the old sessions says so.
        store = await open_store(target, keys=key("k9", 1))
        try:
            with pytest.raises(WrongKey, match="not provided"):
                await store.read_decoded("s", DEFAULT_CODEC)
            with pytest.raises(WrongKey, match="not provided"):
                await store.read("s")
            with pytest.raises(WrongKey, match="not provided"):
                await store.append("s", stored("s", events[:1]), len(events))
        finally:
            await store.aclose()
        store = await open_store(target, keys=K1)  # the right key still reads it all
        try:
            assert await store.read_decoded("s", DEFAULT_CODEC) == events
        finally:
            await store.aclose()


async def test_rotation_keeps_every_session_readable_without_rewriting_events(
    target: str, tmp_path: Path
) -> None:
    events = canary_events()
    sids = [f"s{i}" for i in range(5)]
    with trio.fail_after(60):
        store = await open_store(target, keys=K1)
        assert isinstance(store, EncryptedStore)
        try:
            for sid in sids:
                await store.append(sid, stored(sid, events[:4]), 0)
            before = {sid: await store.inner.read(sid) for sid in sids}
        finally:
            await store.aclose()

        k2_line = new_key_line("k2")
        k1_line = "k1:" + base64.b64encode(bytes([1]) * 32).decode()
        both = tmp_path / "both.keys"
        both.write_text(f"# new key first\n{k2_line}\n{k1_line}\n")
        store = await open_store(target, keys=keys_from_file(both))
        assert isinstance(store, EncryptedStore)
        try:
            assert await rotate_keys(store) == len(sids)
            assert await rotate_keys(store) == 0  # done already
            # a session started after rotation, under the new key
            await store.append("late", stored("late", events[:2]), 0)
        finally:
            await store.aclose()

        only_new = tmp_path / "new.keys"
        only_new.write_text(k2_line + "\n")
        store = await open_store(target, keys=keys_from_file(only_new))
        assert isinstance(store, EncryptedStore)
        try:
            for sid in sids:
                assert await store.read_decoded(sid, DEFAULT_CODEC) == events[:4]
                assert await store.inner.read(sid) == before[sid]  # events untouched
            assert await store.read_decoded("late", DEFAULT_CODEC) == events[:2]
        finally:
            await store.aclose()

        store = await open_store(target, keys=K1)  # the old key alone no longer opens them
        try:
            with pytest.raises(WrongKey):
                await store.read("s0")
        finally:
            await store.aclose()


async def test_forget_shreds_one_session_and_leaves_the_others(target: str) -> None:
    events = canary_events()
    with trio.fail_after(30):
        store = await open_store(target, keys=K1)
        assert isinstance(store, EncryptedStore)
        try:
            await store.append("gone", stored("gone", events), 0)
            await store.append("kept", stored("kept", events), 0)
            assert await store.forget("gone") is True
            assert await store.forget("gone") is False
        finally:
            await store.aclose()
        store = await open_store(target, keys=K1)
        try:
            with pytest.raises(WrongKey, match="no data key"):
                await store.read("gone")
            assert await store.read_decoded("kept", DEFAULT_CODEC) == events
        finally:
            await store.aclose()


def test_key_files_and_variables_say_what_is_wrong(tmp_path: Path) -> None:
    from turnledger.adapters.encryption import keys_from_env

    bad = tmp_path / "bad.keys"
    for text, match in [
        ("", "no key"),
        ("k1 nocolon", "not ID:BASE64"),
        ("k1:not base64!", "not base64"),
        ("k1:" + base64.b64encode(b"short").decode(), "32"),
        (new_key_line("k1") + "\n" + new_key_line("k1"), "twice"),
    ]:
        bad.write_text(text)
        with pytest.raises(ValueError, match=match) as caught:
            keys_from_file(bad)
        assert "base64" not in text or text.split(":")[-1] not in str(caught.value) or not text
    with pytest.raises(ValueError, match="cannot read"):
        keys_from_file(tmp_path / "missing")
    os.environ.pop("TL_TEST_KEYS", None)
    with pytest.raises(ValueError, match="not set"):
        keys_from_env("TL_TEST_KEYS")
    line_a, line_b = new_key_line("a"), new_key_line("b")
    os.environ["TL_TEST_KEYS"] = f"{line_a},{line_b}"
    try:
        keys = keys_from_env("TL_TEST_KEYS")
    finally:
        del os.environ["TL_TEST_KEYS"]
    assert keys.current_kek_id() == "a" and set(keys.keys) == {"a", "b"}
    assert "keys=" not in repr(keys) and line_a.split(":")[1] not in repr(keys)


async def test_snapshots_of_an_encrypted_store_are_sealed(target: str) -> None:
    from turnledger.adapters.stores import snapshots_beside
    from turnledger.runtime._snapshots import recover_state
    from turnledger.sessions import CommittedResult, open_hub, replay
    from turnledger.testing import ScriptedProvider

    class Log:
        def __init__(self) -> None:
            self.events: list[tuple[str, dict[str, object]]] = []

        def warning(self, event: str, **kw: object) -> None:
            self.events.append((event, kw))

        debug = warning

    with trio.fail_after(60):
        store = await open_store(target, keys=K1)
        snaps = await snapshots_beside(target)
        try:
            async with open_hub(
                store, ScriptedProvider(), model="m", snapshots=snaps, snapshot_every=4
            ) as hub:
                for i in range(4):
                    result = await (await hub.submit("s", f"{CANARY} {i}")).outcome()
                    assert isinstance(result, CommittedResult) and CANARY in result.answer
                with trio.fail_after(10):
                    while (await snaps.latest("s")) is None:
                        await trio.sleep(0.01)
            assert isinstance(store, EncryptedStore)
            sealed = store.seal_snapshots(snaps)
            full = replay(await store.read_decoded("s", DEFAULT_CODEC))
            log = Log()
            state, used = await recover_state(store, "s", sealed, log)
            assert used >= 4 and state == full and [e for e, _ in log.events] == ["snapshot_used"]
            # A snapshot with an older part: both parts sealed, the older one
            # opened when it is read.
            from turnledger.sessions._snapshot import take_snapshot

            events = await store.read("s")
            split = take_snapshot("s", full, events[-1].tag, events[-1].recorded_at, newest=1)
            assert split.older and CANARY.encode() in split.older
            await sealed.save(split)
            state, used = await recover_state(store, "s", sealed, Log())
            assert used == split.version and state.turns._off() == len(full.turns) - 1
            assert state == full and state.turns._off() == 0
            raw = at_rest(target)
            assert CANARY.encode() not in raw and len(raw) > 1000
            # Crypto-shredding covers the snapshot: without the key it is ignored.
            await store.forget("s")
            log = Log()
            with pytest.raises(WrongKey):
                await recover_state(store, "s", sealed, log)
            assert log.events[0][0] == "snapshot_ignored"
            assert "checksum" in str(log.events[0][1]["reason"])
        finally:
            await snaps.aclose()
            await store.aclose()


async def test_erasure_shreds_the_key_first_then_the_rows(target: str) -> None:
    """With the store port's erase (the lifecycle's erasure), an encrypted
    store destroys the session's data key before its rows go."""
    events = canary_events()
    with trio.fail_after(60):
        store = await open_store(target, keys=K1)
        assert isinstance(store, EncryptedStore)
        try:
            if not hasattr(store.inner, "erase"):
                pytest.skip("this store has no erase() yet (the erasure branch adds it)")
            for sid in ("secret", "other"):
                await store.append(sid, stored(sid, events), 0)
            forgotten: list[str] = []
            ring = store.ring
            assert ring is not None
            real_begin = ring.begin_erasure

            async def spy(session_id: str) -> bool:
                forgotten.append(session_id)
                assert await store.inner.read(session_id)  # the rows are still there
                return await real_begin(session_id)

            ring.begin_erasure = spy  # type: ignore[method-assign]
            await store.erase("secret")
            assert forgotten == ["secret"]
            assert await ring.pending_erasures() == []  # ended once the rows went
            assert await store.inner.read("secret") == []
            assert await store.read("secret") == []
            assert await store.read_decoded("other", DEFAULT_CODEC) == events
            assert await ring.get_many(["secret", "other"]) == {
                "other": (await ring.get_many(["other"]))["other"]
            }
        finally:
            await store.aclose()
        raw = at_rest(target)
        assert CANARY.encode() not in raw


async def test_an_erasure_cut_after_the_key_is_finished_by_the_next_writer(
    target: str,
) -> None:
    """A process killed between destroying the key and removing the rows
    leaves a record in the key ring; the next store opened with keys for
    writing removes the rows, so the session is erased, never listed with
    rows no key opens. A read-only open leaves the record alone."""
    events = canary_events()
    with trio.fail_after(60):
        store = await open_store(target, keys=K1)
        assert isinstance(store, EncryptedStore) and store.ring is not None
        try:
            for sid in ("secret", "other"):
                await store.append(sid, stored(sid, events), 0)
            assert await store.ring.begin_erasure("secret")  # what the kill leaves
        finally:
            await store.aclose()
        if store_kind(target) != "postgres":
            peek = await open_store(target, keys=K1, read_only=True)
            assert isinstance(peek, EncryptedStore) and peek.ring is not None
            try:
                assert await peek.ring.pending_erasures() == ["secret"]
                assert "secret" in await peek.session_ids()
            finally:
                await peek.aclose()
        store = await open_store(target, keys=K1)
        assert isinstance(store, EncryptedStore) and store.ring is not None
        try:
            assert await store.ring.pending_erasures() == []
            assert await store.session_ids() == ["other"]
            assert await store.read("secret") == []
            assert await store.read_decoded("other", DEFAULT_CODEC) == events
            assert [r.session_hash for r in await store.erasures()] == [session_hash("secret")]
        finally:
            await store.aclose()


async def test_erasing_an_unknown_session_leaves_no_record(target: str) -> None:
    from turnledger import UnknownSession

    with trio.fail_after(60):
        store = await open_store(target, keys=K1)
        assert isinstance(store, EncryptedStore) and store.ring is not None
        try:
            await store.append("other", stored("other", canary_events()), 0)
            with pytest.raises(UnknownSession):
                await store.erase("nobody")
            assert await store.ring.pending_erasures() == []
            assert await store.session_ids() == ["other"]
            assert await store.erasures() == []
        finally:
            await store.aclose()


async def test_a_journal_opens_each_sealed_event_once_and_forgets_it_on_erasure(
    tmp_path: Path,
) -> None:
    """The sealed journal keeps what it opened (as the plaintext journal
    keeps its events parsed); an event erased and written anew under the
    same id and seq is read as the new one, never the kept one."""
    path = tmp_path / "events.jsonl"
    events = canary_events()
    with trio.fail_after(60):
        store = await open_store(path, keys=K1)
        assert isinstance(store, EncryptedStore)
        try:
            await store.append("s", stored("s", events), 0)
            first = await store.read_decoded("s", DEFAULT_CODEC)
            again = await store.read_decoded("s", DEFAULT_CODEC)
            assert first == again == events
            assert all(a is b for a, b in zip(first, again, strict=True))  # kept, not reopened
            assert await store.read("s") == await store.read("s")
            await store.erase("s")
            assert await store.read_decoded("s", DEFAULT_CODEC) == []
            other = events[:1]
            await store.append("s", stored("s", other), 0)
            assert await store.read_decoded("s", DEFAULT_CODEC) == other
            many = await store.read_decoded_many(["s", "s"], DEFAULT_CODEC, lambda s, e: e)
            assert many == {"s": other}
        finally:
            await store.aclose()


async def test_a_key_read_with_the_rows_leaves_the_cache_on_forget_and_erasure(
    target: str,
) -> None:
    """After a fresh open, a session's data key is read and unwrapped with
    its first read (on SQLite and PostgreSQL on the store's reader thread,
    through the ring's blocking read, not its async one) and kept; forgetting
    or erasing the session evicts it, so its ciphertext no longer opens in
    this process either."""
    events = canary_events()
    with trio.fail_after(60):
        store = await open_store(target, keys=K1)
        try:
            for sid in ("forgotten", "erased", "kept"):
                await store.append(sid, stored(sid, events), 0)
        finally:
            await store.aclose()
        store = await open_store(target, keys=K1)
        assert isinstance(store, EncryptedStore) and store.ring is not None
        try:
            if store._held is None:  # rows read on the store's thread: keys with them

                async def no_hop(session_ids: object) -> dict[str, object]:
                    raise AssertionError("the key should come with the rows")

                store.ring.get_many = no_hop  # type: ignore[method-assign,assignment]
            for sid in ("forgotten", "erased", "kept"):
                assert await store.read_decoded(sid, DEFAULT_CODEC) == events
            assert sorted(store._aeads) == ["erased", "forgotten", "kept"]
            assert await store.forget("forgotten") is True
            assert "forgotten" not in store._aeads
            with pytest.raises(WrongKey, match="no data key"):
                await store.read_decoded("forgotten", DEFAULT_CODEC)
            with pytest.raises(WrongKey, match="no data key"):
                await store.read_decoded_many(["forgotten"], DEFAULT_CODEC, lambda s, e: e)
            await store.erase("erased")
            assert "erased" not in store._aeads
            assert await store.read_decoded("erased", DEFAULT_CODEC) == []
            assert await store.read_decoded("kept", DEFAULT_CODEC) == events
            many = await store.read_decoded_many(["kept"], DEFAULT_CODEC, lambda s, e: e)
            assert many == {"kept": events}
        finally:
            await store.aclose()


async def test_a_key_fetched_while_it_is_destroyed_is_not_kept(tmp_path: Path) -> None:
    """A read that fetched a session's data key just before an erasure or a
    forget destroyed it opens its own rows, but the key is not cached: the
    next read finds no key."""
    path = tmp_path / "events.db"
    events = canary_events()
    with trio.fail_after(60):
        store = await open_store(path, keys=K1)
        assert isinstance(store, EncryptedStore) and store.ring is not None
        try:
            for sid in ("a", "b"):
                await store.append(sid, stored(sid, events), 0)
        finally:
            await store.aclose()
        store = await open_store(path, keys=K1)
        assert isinstance(store, EncryptedStore) and store.ring is not None
        ring = store.ring
        # Opening checked the current key on one session's key (and kept it).
        (s,) = [sid for sid in ("a", "b") if sid not in store._aeads]
        try:
            real = ring.get_many_blocking  # type: ignore[attr-defined]
            destroyed = trio.lowlevel.current_trio_token()

            def racing(session_ids: list[str]) -> object:
                found = real(session_ids)
                # The forget runs to its end (on the event loop) between
                # this read of the ring and the caching of the key.
                assert trio.from_thread.run(store.forget, s, trio_token=destroyed) is True
                return found

            ring.get_many_blocking = racing  # type: ignore[attr-defined]
            assert await store.read_decoded(s, DEFAULT_CODEC) == events
            ring.get_many_blocking = real  # type: ignore[attr-defined]
            assert s not in store._aeads
            with pytest.raises(WrongKey, match="no data key"):
                await store.read_decoded(s, DEFAULT_CODEC)
            assert await store.read_decoded(s.translate({97: 98, 98: 97}), DEFAULT_CODEC) == events
        finally:
            await store.aclose()


class _Kms:
    """A provider that unwraps elsewhere (no ``unwraps_in_memory``), as a KMS."""

    def __init__(self, inner: StaticKeys) -> None:
        self.inner = inner
        self.unwrapped = 0

    def current_kek_id(self) -> str:
        return self.inner.current_kek_id()

    def wrap(self, data_key: bytes, context: bytes) -> WrappedKey:
        return self.inner.wrap(data_key, context)

    def unwrap(self, wrapped: WrappedKey, context: bytes) -> bytes:
        self.unwrapped += 1
        return self.inner.unwrap(wrapped, context)


async def test_a_provider_that_does_not_unwrap_in_memory_is_called_apart(
    tmp_path: Path,
) -> None:
    """A KMS-like provider is not called from the store's reader thread: its
    keys are loaded (read and unwrapped in one worker-thread call) before
    the rows are read, once per session and process; a wrong key is still a
    typed error."""
    path = tmp_path / "events.db"
    events = canary_events()
    kms = _Kms(K1)
    with trio.fail_after(60):
        store = await open_store(path, keys=kms)
        try:
            for sid in ("a", "b"):
                await store.append(sid, stored(sid, events), 0)
        finally:
            await store.aclose()
        kms = _Kms(K1)
        store = await open_store(path, keys=kms)
        assert isinstance(store, EncryptedStore) and not store._fetch_with_rows
        assert kms.unwrapped == 1  # the open checked the current key on one session's key
        try:
            for _ in range(2):
                for sid in ("a", "b"):
                    assert await store.read_decoded(sid, DEFAULT_CODEC) == events
            assert kms.unwrapped == 2  # the other session's key, once
        finally:
            await store.aclose()
        with pytest.raises(WrongKey, match="does not unwrap"):
            await open_store(path, keys=_Kms(key("k1", 9)), read_only=True)


FIXTURES = Path(__file__).parent.parent / "fixtures"


def payload_kinds(db: Path) -> dict[str, list[tuple[int, str]]]:
    """Each session's ``(seq, SQLite type of the payload)``, in order."""
    conn = sqlite3.connect(db)
    try:
        out: dict[str, list[tuple[int, str]]] = {}
        for sid, seq, kind in conn.execute(
            "SELECT session_id, seq, typeof(payload) FROM events ORDER BY position"
        ):
            out.setdefault(sid, []).append((seq, kind))
        return out
    finally:
        conn.close()


async def test_a_store_sealed_as_hex_text_still_reads(tmp_path: Path) -> None:
    """A store written by 806c8e7 (tests/fixtures/make_sealed_806c8e7.py),
    whose rows hold their ciphertext as hex in JSON text, reads as it did;
    new rows are sealed as bytes beside them; old and new rows stay bound
    to their place."""
    db = tmp_path / "sealed.db"
    db.write_bytes((FIXTURES / "sealed_806c8e7.db").read_bytes())
    Path(f"{db}.keys").write_bytes((FIXTURES / "sealed_806c8e7.db.keys").read_bytes())
    written = json.loads((FIXTURES / "sealed_806c8e7.expected.json").read_text("utf-8"))
    old = {  # the events as this release decodes them (upcast if need be)
        sid: [DEFAULT_CODEC.from_payload(tag, v, payload) for _, tag, v, payload in rows]
        for sid, rows in written.items()
    }
    events, plain = old["old-a"], old["old-b"]
    n = len(events)
    assert n >= 10 and len(plain) == n
    assert sum(CANARY in repr(e) for e in events) >= 8
    assert payload_kinds(db) == {
        s: [(i, "text") for i in range(1, n + 1)] for s in ("old-a", "old-b")
    }
    with trio.fail_after(30):
        store = await open_store(db, keys=K1)
        assert isinstance(store, EncryptedStore)
        try:
            assert await store.read_decoded("old-a", DEFAULT_CODEC) == events
            assert await store.read_decoded("old-b", DEFAULT_CODEC) == plain
            opened = await store.read("old-a")
            assert [[e.seq, e.tag, e.schema_version, e.payload] for e in opened] == written["old-a"]
            assert [DEFAULT_CODEC.decode(e) for e in opened] == events
            feed = await store.read_all()
            assert [DEFAULT_CODEC.decode(e) for e in feed] == events + plain
            # New rows: sealed as bytes, after the old ones, in the same session.
            more = [
                DEFAULT_CODEC.encode(e, session_id="old-a", seq=n + i, recorded_at=1.8e9)
                for i, e in enumerate(events[:3], 1)
            ]
            await store.append("old-a", more, n)
            await store.append("new", stored("new", events), 0)
            assert await store.read_decoded("old-a", DEFAULT_CODEC) == events + events[:3]
            assert await store.read_decoded("new", DEFAULT_CODEC) == events
            many = await store.read_decoded_many(["old-a", "new"], DEFAULT_CODEC, lambda s, e: e)
            assert many == {"old-a": events + events[:3], "new": events}
        finally:
            await store.aclose()
    kinds = payload_kinds(db)
    assert kinds["old-a"] == [(i, "text") for i in range(1, n + 1)] + [
        (n + i, "blob") for i in range(1, 4)
    ]
    assert kinds["new"] == [(i, "blob") for i in range(1, n + 1)]
    assert CANARY.encode() not in db.read_bytes()

    # Without the key, old and new rows alike say that the content is encrypted.
    locked = await open_store(db)
    try:
        for sid in ("old-a", "new"):
            with pytest.raises(ContentEncrypted):
                await locked.read_decoded(sid, DEFAULT_CODEC)
            with pytest.raises(ContentEncrypted):
                await locked.read(sid)
    finally:
        await locked.aclose()

    # A row moved to another place is refused, in either format.
    conn = sqlite3.connect(db)
    with conn:
        for sid in ("old-b", "new"):  # seq 2's payload written over seq 3's (same tags or not)
            (p2,) = conn.execute(
                "SELECT payload FROM events WHERE session_id=? AND seq=2", (sid,)
            ).fetchone()
            conn.execute("UPDATE events SET payload=? WHERE session_id=? AND seq=3", (p2, sid))
    conn.close()
    store = await open_store(db, keys=K1)
    try:
        for sid in ("old-b", "new"):
            with pytest.raises(DecryptionFailed, match=rf"'{sid}' seq 3"):
                await store.read_decoded(sid, DEFAULT_CODEC)
            with pytest.raises(DecryptionFailed, match=rf"'{sid}' seq 3"):
                await store.read(sid)
        assert await store.read_decoded("old-a", DEFAULT_CODEC) == events + events[:3]
    finally:
        await store.aclose()


async def test_sealed_bytes_read_without_the_layer_say_they_are_encrypted(
    tmp_path: Path,
) -> None:
    """The bare SQLite store, given sealed bytes rows: its envelopes carry
    the hex form, and a decoder without the key refuses them as encrypted,
    never as damage."""
    from turnledger.adapters.stores import SQLiteStore

    db = tmp_path / "e.db"
    events = canary_events()
    with trio.fail_after(30):
        store = await open_store(db, keys=K1)
        try:
            await store.append("s", stored("s", events[:3]), 0)
        finally:
            await store.aclose()
        bare = await SQLiteStore.open(db)
        try:
            envelopes = await bare.read("s")
            assert [list(e.payload) for e in envelopes] == [["$enc"]] * 3
            hexes = [e.payload["$enc"] for e in envelopes]
            assert all(type(h) is str and bytes.fromhex(h) for h in hexes)
            with pytest.raises(ContentEncrypted):
                await bare.read_decoded("s", DEFAULT_CODEC)
        finally:
            await bare.aclose()
