"""Forks through a real hub: a loopback OpenAI-compatible server over HTTP on
127.0.0.1 and a real SQLite file (and, for snapshots, a SQLite snapshot file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnledger import (
    ReplayError,
    SessionExists,
    UnknownSession,
    UnknownTurn,
)
from turnledger.adapters.providers import OpenAIChat
from turnledger.adapters.stores import open_store, snapshots_beside
from turnledger.events import DEFAULT_CODEC, SessionForked, SessionStarted
from turnledger.sessions import CommittedResult, open_hub, replay_sessions, replay_stored
from turnledger.testing import open_loopback_server, openai_stream_reply

pytestmark = pytest.mark.loopback


def _pairs(turns: object) -> list[tuple[str, str]]:
    return [(t.question, t.answer) for t in turns]  # type: ignore[attr-defined]


async def _rows(store: object, sid: str) -> list[tuple[int, str, object]]:
    return [(e.seq, e.tag, e.payload) for e in await store.read(sid)]  # type: ignore[attr-defined]


async def test_a_fork_shares_the_prefix_and_goes_on_by_itself(tmp_path: Path) -> None:
    answers = ["a0", "a1", "a2", "f2", "a3", "g1"]
    path = tmp_path / "forks.db"
    store = await open_store(path)
    try:
        async with (
            open_loopback_server([openai_stream_reply(a) for a in answers]) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m", system="sys") as hub,
        ):
            for i in range(3):
                r = await (await hub.submit("s", f"q{i}", subject="p-1")).outcome()
                assert isinstance(r, CommittedResult)
            before = await _rows(store, "s")
            forked = await hub.fork("s", "f", at_turn=2)
            assert forked == SessionForked("s", len(before), "main", 2)  # type: ignore[arg-type]
            # two rows, nothing of the history in them
            rows = await store.read("f")
            assert [e.tag for e in rows] == ["session_started", "session_forked"]
            assert "q0" not in str([e.payload for e in rows])
            assert _pairs(await hub.history("f")) == [("q0", "a0"), ("q1", "a1")]
            r = await (await hub.submit("f", "fq2")).outcome()
            assert isinstance(r, CommittedResult) and r.answer == "f2"
            # the fork's request carried the shared turns, then its question
            sent = [m["content"] for m in server.exchanges[3].json()["messages"]]
            assert sent == ["sys", "q0", "a0", "q1", "a1", "fq2"]
            # the source goes on unchanged, its earlier events byte-identical
            r = await (await hub.submit("s", "q3")).outcome()
            assert isinstance(r, CommittedResult) and r.answer == "a3"
            after = await _rows(store, "s")
            assert after[: len(before)] == before
            assert _pairs(await hub.history("f")) == [("q0", "a0"), ("q1", "a1"), ("fq2", "f2")]
            # a fork of the fork, at its first turn (the default: all of them)
            await hub.fork("f", "g", at_turn=1)
            r = await (await hub.submit("g", "gq1")).outcome()
            assert isinstance(r, CommittedResult) and r.answer == "g1"
            live = {sid: await hub.state(sid) for sid in ("s", "f", "g")}
            assert live["f"].fork is not None and live["s"].fork is None
            assert live["f"].config.subject == "p-1"  # type: ignore[union-attr]
    finally:
        await store.aclose()

    # reopened: the store's replays (one and many) and a new hub agree
    store = await open_store(path)
    try:
        for sid in ("s", "f", "g"):
            assert await replay_stored(store, sid) == live[sid]
        assert await replay_sessions(store, ["g", "s", "f"]) == live
        async with (
            open_loopback_server([openai_stream_reply("f3")]) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m", system="sys") as hub,
        ):
            assert await hub.history("g") == (*live["f"].turns[:1], live["g"].turns[-1])
            r = await (await hub.submit("f", "fq3")).outcome()
            assert isinstance(r, CommittedResult)
            sent = [m["content"] for m in server.exchanges[0].json()["messages"]]
            assert sent == ["sys", "q0", "a0", "q1", "a1", "fq2", "f2", "fq3"]
    finally:
        await store.aclose()


async def test_bad_fork_input_is_a_typed_error_and_writes_nothing(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "bad.db")
    try:
        async with (
            open_loopback_server([openai_stream_reply("a0"), openai_stream_reply("b0")]) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m") as hub,
        ):
            await (await hub.submit("s", "q0")).outcome()
            await (await hub.submit("t", "q0")).outcome()
            before = {sid: await _rows(store, sid) for sid in ("s", "t")}
            with pytest.raises(UnknownSession):
                await hub.fork("nobody", "f")
            for bad in (-1, 2, 7):
                with pytest.raises(UnknownTurn, match="a fork keeps 0 to 1"):
                    await hub.fork("s", "f", at_turn=bad)
            with pytest.raises(UnknownTurn):
                await hub.fork("s", "f", at_turn="1")  # type: ignore[arg-type]
            with pytest.raises(SessionExists):
                await hub.fork("s", "t")
            with pytest.raises(SessionExists):
                await hub.fork("s", "s")
            assert sorted(await store.session_ids()) == ["s", "t"]
            assert {sid: await _rows(store, sid) for sid in ("s", "t")} == before
            await hub.fork("s", "f", at_turn=0)  # a fork of no turns is allowed
            assert await hub.history("f") == ()
    finally:
        await store.aclose()


async def test_erasing_a_source_erases_its_forks_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "erase.db"
    store = await open_store(path)
    try:
        async with (
            open_loopback_server([openai_stream_reply(f"a{i}") for i in range(3)]) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m") as hub,
        ):
            await (await hub.submit("s", "canary question")).outcome()
            await (await hub.submit("other", "q")).outcome()
            await hub.fork("s", "f")
            await hub.fork("f", "g")
            await (await hub.submit("g", "g question")).outcome()
            record = await hub.erase("s")
            assert record.events == 4  # started, submitted, stream started, committed
            assert sorted(await store.session_ids()) == ["other"]
            assert len(await store.erasures()) == 3
            for sid in ("s", "f", "g"):
                assert await hub.history(sid) == ()
            assert len(await hub.history("other")) == 1
            with pytest.raises(UnknownSession):
                await hub.erase("s")
    finally:
        await store.aclose()
    assert b"canary question" not in path.read_bytes()


async def test_a_fork_whose_source_is_gone_does_not_replay(tmp_path: Path) -> None:
    # Erased behind the hub's back (the store port alone does not know forks):
    # the shared turns are not found anywhere, and reading the fork says so.
    store = await open_store(tmp_path / "gone.db")
    try:
        async with (
            open_loopback_server([openai_stream_reply("a0")]) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m") as hub,
        ):
            await (await hub.submit("s", "q0")).outcome()
            await hub.fork("s", "f")
        await store.erase("s")
        with pytest.raises(ReplayError, match="erased"):
            await replay_stored(store, "f")
        with pytest.raises(ReplayError, match="erased"):
            await replay_sessions(store, ["f"])
    finally:
        await store.aclose()


async def test_forks_are_not_snapshotted_and_their_source_is_read_through(
    tmp_path: Path,
) -> None:
    path = tmp_path / "snap.db"
    store = await open_store(path)
    snapshots = await snapshots_beside(path)
    try:
        async with (
            open_loopback_server([openai_stream_reply(f"a{i}") for i in range(6)]) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m", snapshots=snapshots, snapshot_every=2) as hub,
        ):
            for i in range(3):
                await (await hub.submit("s", f"q{i}")).outcome()
            await hub.fork("s", "f")
            for i in range(3):
                await (await hub.submit("f", f"fq{i}")).outcome()
            live = await hub.state("f")
        assert await snapshots.latest("s") is not None
        assert await snapshots.latest("f") is None
        assert await replay_stored(store, "f") == live
    finally:
        await snapshots.aclose()
        await store.aclose()


async def test_the_fork_copies_the_source_settings(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "settings.db")
    try:
        async with (
            open_loopback_server([openai_stream_reply("a0")]) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m", system="hub sys") as hub,
        ):
            await hub.open_session("s", system="own sys", subject="p-9")
            await (await hub.submit("s", "q0")).outcome()
            await hub.fork("s", "f")
        started = DEFAULT_CODEC.decode((await store.read("f"))[0])
        assert isinstance(started, SessionStarted)
        assert (started.system, started.subject) == ("own sys", "p-9")
    finally:
        await store.aclose()


async def test_a_fork_on_an_encrypted_store_reads_its_source_through_the_keys(
    tmp_path: Path,
) -> None:
    from turnledger.adapters.encryption import StaticKeys

    keys = StaticKeys({"k1": bytes([7]) * 32}, "k1")
    path = tmp_path / "sealed.db"
    store = await open_store(path, keys=keys)
    try:
        async with (
            open_loopback_server([openai_stream_reply(f"a{i}") for i in range(3)]) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m") as hub,
        ):
            await (await hub.submit("s", "a secret question")).outcome()
            await (await hub.submit("s", "q1")).outcome()
            await hub.fork("s", "f", 1)
            await (await hub.submit("f", "fq1")).outcome()
            live = await hub.state("f")
    finally:
        await store.aclose()
    assert b"a secret question" not in path.read_bytes()
    store = await open_store(path, keys=keys)
    try:
        assert await replay_stored(store, "f") == live
        assert [t.question for t in live.turns] == ["a secret question", "fq1"]
    finally:
        await store.aclose()


async def test_a_fork_logs_one_line_without_content(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    from turnledger.runtime._log import EVENTS, FIELDS

    store = await open_store(tmp_path / "logs.db")
    try:
        async with (
            open_loopback_server([openai_stream_reply("a0")]) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m") as hub,
        ):
            await (await hub.submit("s", "a private question")).outcome()
            with capture_logs() as logs:
                await hub.fork("s", "f")
    finally:
        await store.aclose()
    (line,) = [x for x in logs if x["event"] == "session_forked"]
    assert line == {
        "event": "session_forked",
        "log_level": "info",
        "session_id": "f",
        "source": "s",
        "source_seq": 4,
        "branch": "main",
        "at_turn": 1,
    }
    assert EVENTS["session_forked"] == "info"
    assert set(line) - {"event", "log_level"} <= FIELDS
    assert "a private question" not in str(logs)


async def test_a_source_erased_while_its_fork_is_written_takes_the_fork() -> None:
    # The erasure runs just before the fork's rows are appended: its scan
    # for forks finds none, so the fork, finding its source gone once
    # written, erases itself and says the source is unknown.
    from turnledger.testing import ScriptedProvider

    from ._helpers import HookedStore

    store = HookedStore()
    async with open_hub(store, ScriptedProvider(), model="m") as hub:
        await (await hub.submit("s", "q0")).outcome()

        async def erase_source() -> None:
            await hub.erase("s")

        store.before("session_forked", erase_source)
        with pytest.raises(UnknownSession, match="erased meanwhile"):
            await hub.fork("s", "f")
        assert await store.session_ids() == []
        assert await hub.history("f") == ()


async def test_retention_keeps_a_source_its_forks_hold_and_never_trims_a_fork(
    tmp_path: Path,
) -> None:
    from turnledger.sessions import RetentionPolicy
    from turnledger.testing import ScriptedProvider

    store = await open_store(tmp_path / "retention.db")
    try:
        async with open_hub(store, ScriptedProvider(), model="m") as hub:
            for q in ("one", "two", "three"):
                await (await hub.submit("s", q)).outcome()
                await (await hub.submit("alone", q)).outcome()
            await hub.fork("s", "f")
            for q in ("four", "five"):
                await (await hub.submit("f", q)).outcome()
            before = {sid: await _rows(store, sid) for sid in ("s", "f")}
            # at most one turn: the plain session is cut, the source and the fork are not
            steps = await hub.prune(RetentionPolicy(max_turns=1))
            assert [(st.session_id, st.action) for st in steps] == [("alone", "trim")]
            assert {sid: await _rows(store, sid) for sid in ("s", "f")} == before
            # idle for long: the fork goes, its source stays while the fork is kept
            later = 10**10
            steps = await hub.prune(RetentionPolicy(max_idle=60), now=later)
            assert sorted((st.session_id, st.action) for st in steps) == [
                ("alone", "erase"),
                ("f", "erase"),
            ]
            # the next round: nothing holds the source any more
            steps = await hub.prune(RetentionPolicy(max_idle=60), now=later)
            assert [(st.session_id, st.action) for st in steps] == [("s", "erase")]
    finally:
        await store.aclose()
