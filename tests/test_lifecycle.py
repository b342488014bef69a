"""Erasure and retention through the hub, over real HTTP (the loopback
server) into real stores: the canary scans, erasing during a turn, subjects,
pruning and trimming."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio

from turnledger import UnknownSession
from turnledger.adapters.providers import OpenAIChat
from turnledger.adapters.stores import open_store
from turnledger.events import DEFAULT_CODEC, EventStore, ToolCall, session_hash
from turnledger.sessions import (
    CommittedResult,
    DiscardedResult,
    RejectedResult,
    RetentionPolicy,
    Tool,
    ToolInvocation,
    open_hub,
    replay,
)
from turnledger.testing import (
    Reply,
    Stall,
    chat_responder,
    open_loopback_server,
    openai_sse_chunks,
)

pytestmark = pytest.mark.loopback

CANARY = "CANARY-7f3e9a1c-ERASE-ME"
TIMEOUT = 30


def _answer(messages: list[dict[str, Any]]) -> str | tuple[ToolCall, ...]:
    last = messages[-1]
    if last.get("role") == "tool":
        return f"the answer holds {CANARY} too"
    if CANARY in str(last.get("content")):
        return (ToolCall("call-1", "lookup", '{"q":"x"}'),)
    return "a plain answer"


async def _lookup(call: ToolInvocation) -> str:
    return f"a tool result with {CANARY}"


TOOLS = [Tool("lookup", _lookup)]


@asynccontextmanager
async def _hub(store: EventStore, **kwargs: Any) -> AsyncIterator[Any]:
    async with (
        open_loopback_server(chat_responder(_answer)) as server,
        OpenAIChat(base_url=server.openai_base_url) as provider,
        open_hub(store, provider, model="m", tools=TOOLS, **kwargs) as hub,
    ):
        yield hub


async def _fill(hub: Any, others: int = 5) -> None:
    """One session whose system prompt, question, answer and tool result
    hold the canary, among ``others`` that do not."""
    await hub.open_session("secret", system=f"system prompt {CANARY}", subject="user-1")
    for i in range(others):
        result = await (await hub.submit(f"other-{i}", f"question {i}")).outcome()
        assert isinstance(result, CommittedResult)
    result = await (await hub.submit("secret", f"please keep {CANARY}")).outcome()
    assert isinstance(result, CommittedResult) and CANARY in result.answer


def _scan(folder: Path) -> dict[str, int]:
    """How often the canary's bytes appear in each file of ``folder``."""
    found = {}
    for path in sorted(folder.iterdir()):
        if path.is_file():
            found[path.name] = path.read_bytes().count(CANARY.encode())
    return found


async def _snapshot(store: EventStore, ids: list[str]) -> dict[str, Any]:
    return {sid: [(e.seq, e.tag, e.payload) for e in await store.read(sid)] for sid in ids}


@pytest.mark.parametrize("name", ["events.db", "events.jsonl"])
async def test_an_erased_session_leaves_no_byte_in_any_file(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    others = [f"other-{i}" for i in range(5)]
    with trio.fail_after(TIMEOUT):
        store = await open_store(folder / name)
        try:
            async with _hub(store) as hub:
                await _fill(hub)
                before = _scan(folder)
                kept = await _snapshot(store, others)
                with structlog.testing.capture_logs() as logs:
                    record = await hub.erase("secret")
                assert await hub.history("secret") == ()
            assert await store.read("secret") == []
            assert "secret" not in await store.session_ids()
            assert await _snapshot(store, others) == kept
            assert record.session_hash == session_hash("secret") and record.events >= 8
            assert await store.erasures() == [record]
            after_open = _scan(folder)
        finally:
            await store.aclose()
    assert sum(before.values()) >= 4, before  # the scan sees the canary when it is there
    assert sum(after_open.values()) == 0, after_open
    assert sum(_scan(folder).values()) == 0
    # The log line names the erasure, never the content.
    erased = [entry for entry in logs if entry["event"] == "session_erased"]
    assert len(erased) == 1 and erased[0]["events"] == record.events
    assert CANARY not in repr(logs)
    # Reopened, the file still has the others and not the erased one.
    store = await open_store(folder / name)
    try:
        assert await store.read("secret") == []
        assert await _snapshot(store, others) == kept
    finally:
        await store.aclose()


async def test_postgres_erase_deletes_the_rows(pg_dsn: str) -> None:
    import psycopg

    with trio.fail_after(TIMEOUT):
        store = await open_store(pg_dsn)
        try:
            async with _hub(store) as hub:
                await _fill(hub, others=3)
                await hub.erase("secret")
            assert await store.read("secret") == []
            assert len(await store.erasures()) == 1
        finally:
            await store.aclose()
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM turnledger_events WHERE session_id = 'secret'"
            " OR payload::text LIKE %s OR payload_text LIKE %s",
            (f"%{CANARY}%", f"%{CANARY}%"),
        ).fetchone()
        leases = conn.execute(
            "SELECT count(*) FROM turnledger_events_leases WHERE session_id = 'secret'"
        ).fetchone()
        erasures = conn.execute("SELECT * FROM turnledger_events_erasures").fetchall()
    assert rows == (0,) and leases == (0,)
    assert len(erasures) == 1 and "secret" not in repr(erasures) and CANARY not in repr(erasures)


async def test_erasing_during_a_turn_discards_it_as_erased(tmp_path: Path) -> None:
    body = (*openai_sse_chunks(f"streaming {CANARY}", finish_reason=None, done=False), Stall())
    store = await open_store(tmp_path / "events.db")
    try:
        with trio.fail_after(TIMEOUT):
            async with (
                open_loopback_server([Reply(body=body)]) as server,
                OpenAIChat(base_url=server.openai_base_url) as provider,
                open_hub(store, provider, model="m") as hub,
            ):
                turn = await hub.submit("s", f"question {CANARY}")
                async for delta in turn.preview():
                    if delta:
                        break
                await hub.erase("s")
                result = await turn.outcome()
                assert isinstance(result, DiscardedResult)
                assert result.reason == "erased" and result.preview_chars > 0
                exchange = server.exchanges[0]
                await exchange.wait_ended()
                assert exchange.client_disconnected
                assert hub.statistics().requests == 0
                assert await hub.history("s") == ()
                assert await store.read("s") == []
                # The id starts afresh, with nothing of the erased session.
                state = await hub.open_session("s")
                assert state.version == 1 and not state.turns
    finally:
        await store.aclose()
    assert sum(_scan(tmp_path).values()) == 0


async def test_erasing_an_unknown_session_changes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    store = await open_store(folder / "events.db")
    try:
        with trio.fail_after(TIMEOUT):
            async with _hub(store) as hub:
                await _fill(hub, others=2)
                feed = await store.read_all()
                with pytest.raises(UnknownSession, match="nobody"):
                    await hub.erase("nobody")
                assert await store.read_all() == feed
                assert await store.erasures() == []
                # The hub goes on.
                assert isinstance(await (await hub.submit("other-0", "again")).outcome(),
                                  CommittedResult)  # fmt: skip
    finally:
        await store.aclose()


async def test_erase_subject_erases_every_session_of_one_person(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "events.jsonl")
    try:
        with trio.fail_after(TIMEOUT):
            async with _hub(store) as hub:
                await hub.open_session("a", subject="user-1")
                await (await hub.submit("b", "q", subject="user-1")).outcome()
                await hub.open_session("c", subject="user-2")
                await hub.open_session("d")
                assert (await hub.state("b")).config.subject == "user-1"  # type: ignore[union-attr]
                records = await hub.erase_subject("user-1")
                assert await hub.erase_subject("user-1") == []
                assert await hub.erase_subject("nobody") == []
            assert [r.session_hash for r in records] == [session_hash("a"), session_hash("b")]
            assert await store.session_ids() == ["c", "d"]
    finally:
        await store.aclose()


async def test_a_subject_must_be_text(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "events.db")
    try:
        async with _hub(store) as hub:
            with pytest.raises(Exception, match="subject"):
                await hub.open_session("a", subject="")
            assert await store.session_ids() == []
    finally:
        await store.aclose()


class _Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("name", ["events.db", "events.jsonl"])
async def test_prune_erases_idle_sessions_and_dry_run_changes_nothing(
    tmp_path: Path, name: str
) -> None:
    clock = _Clock()
    store = await open_store(tmp_path / name)
    try:
        with trio.fail_after(TIMEOUT):
            async with _hub(store, clock=clock, retention=RetentionPolicy(max_idle=3600)) as hub:
                await (await hub.submit("old", "q")).outcome()
                clock.now += 3000
                await (await hub.submit("new", "q")).outcome()
                clock.now += 1000
                feed = await store.read_all()
                planned = await hub.prune(dry_run=True)
                assert [(s.session_id, s.action) for s in planned] == [("old", "erase")]
                assert await store.read_all() == feed and await store.erasures() == []
                with structlog.testing.capture_logs() as logs:
                    done = await hub.prune()
                assert [(s.session_id, s.action) for s in done] == [("old", "erase")]
                assert await store.session_ids() == ["new"]
                erased = [entry for entry in logs if entry["event"] == "session_erased"]
                assert [entry["session_id"] for entry in erased] == ["old"]
    finally:
        await store.aclose()


async def test_a_session_with_a_turn_in_flight_is_not_pruned(tmp_path: Path) -> None:
    body = (*openai_sse_chunks("x", finish_reason=None, done=False), Stall())
    clock = _Clock()
    store = await open_store(tmp_path / "events.db")
    try:
        with trio.fail_after(TIMEOUT):
            async with (
                open_loopback_server([Reply(body=body)]) as server,
                OpenAIChat(base_url=server.openai_base_url) as provider,
                open_hub(store, provider, model="m", clock=clock) as hub,
            ):
                turn = await hub.submit("s", "q")
                async for _ in turn.preview():
                    break
                clock.now += 10_000
                # The stream's start is written beside the relayed delta:
                # wait for it, so the log is still while prune looks.
                while not any(e.tag == "stream_started" for e in await store.read("s")):
                    await trio.sleep(0.01)
                before = await store.read("s")
                assert await hub.prune(RetentionPolicy(max_idle=60)) == []
                assert await store.read("s") == before and len(before) >= 3
                await turn.cancel()
    finally:
        await store.aclose()


@pytest.mark.parametrize("name", ["events.db", "events.jsonl"])
async def test_trimming_keeps_the_newest_whole_turns(tmp_path: Path, name: str) -> None:
    questions = ["one", f"two {CANARY}", "three", "four"]
    store = await open_store(tmp_path / name)
    try:
        with trio.fail_after(TIMEOUT):
            async with _hub(store) as hub:
                await hub.open_session("s", retention=RetentionPolicy(max_turns=2))
                for q in questions:
                    assert isinstance(await (await hub.submit("s", q)).outcome(), CommittedResult)
                before = await hub.history("s")
                steps = await hub.prune()
                assert [(s.session_id, s.action, s.turns) for s in steps] == [("s", "trim", 2)]
                after = await hub.history("s")
                assert after == before[2:]
                # The session goes on from the trimmed log.
                await (await hub.submit("s", "five")).outcome()
                assert [t.question for t in await hub.history("s")] == ["three", "four", "five"]
            events = [DEFAULT_CODEC.decode(e) for e in await store.read("s")]
            assert [t.question for t in replay(events).turns] == ["three", "four", "five"]
            assert len(await store.erasures()) == 1
    finally:
        await store.aclose()


async def test_trimming_keeps_a_tool_turn_whole(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "events.db")
    try:
        with trio.fail_after(TIMEOUT):
            async with _hub(store) as hub:
                for q in ["one", f"tool {CANARY}"]:
                    await (await hub.submit("s", q)).outcome()
                steps = await hub.prune(RetentionPolicy(max_turns=1))
                assert [s.action for s in steps] == ["trim"]
                tags = [e.tag for e in await store.read("s")]
                history = await hub.history("s")
    finally:
        await store.aclose()
    assert [t.question for t in history] == [f"tool {CANARY}"]
    assert tags == [
        "session_started", "turn_submitted", "stream_started", "tool_calls_requested",
        "tool_result_recorded", "tool_round_submitted", "stream_started", "turn_committed",
    ]  # fmt: skip


async def test_journal_erase_is_refused_while_another_process_holds_it(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    store = await open_store(path)
    try:
        async with _hub(store) as hub:
            await hub.open_session("s")
        proc = await trio.run_process(
            [
                sys.executable,
                "-m",
                "turnledger",
                "erase",
                str(path),
                "--session",
                "s",
                "--yes",
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert proc.returncode == 3
        assert b"locked by another writer" in proc.stderr
        assert len(await store.read("s")) == 1
    finally:
        await store.aclose()


async def _journal(path: Path, cap: int) -> EventStore:
    from turnledger.adapters.stores import JournalStore

    return await JournalStore.open(path, max_bytes=cap)


async def test_a_full_journal_rejects_a_question_as_limit(tmp_path: Path) -> None:
    store = await _journal(tmp_path / "events.jsonl", 6000)
    try:
        with trio.fail_after(TIMEOUT):
            async with _hub(store) as hub:
                results = []
                for i in range(40):
                    results.append(await (await hub.submit("s", f"question {i}")).outcome())
                    if results[-1].kind != "committed":
                        break
                last = results[-1]
                assert isinstance(last, RejectedResult) and last.reason == "limit"
                assert "cap" in last.detail
                # A new session that cannot even start is rejected the same way.
                fresh = await (await hub.submit("another", "q")).outcome()
                assert isinstance(fresh, RejectedResult) and fresh.reason == "limit"
                # The session is still there, and reads what it committed.
                history = await hub.history("s")
                assert len(history) == len(results) - 1 >= 3
            assert store.size <= 6000  # type: ignore[attr-defined]
    finally:
        await store.aclose()


async def test_a_full_journal_makes_room_by_the_retention(tmp_path: Path) -> None:
    clock = _Clock()
    store = await _journal(tmp_path / "events.jsonl", 8000)
    try:
        with trio.fail_after(TIMEOUT):
            policy = RetentionPolicy(max_idle=3600)
            async with _hub(store, clock=clock, retention=policy) as hub:
                for i in range(3):
                    await (await hub.submit("old", f"an old question {i}")).outcome()
                clock.now += 7200
                sizes, results = [], []
                for i in range(30):
                    results.append(await (await hub.submit("new", f"question {i}")).outcome())
                    sizes.append(store.size)  # type: ignore[attr-defined]
                    if results[-1].kind != "committed":
                        break
                # The cap was reached, the idle session erased to make room
                # (the journal shrank), and the turn went on; once "new"
                # alone fills the journal, a question is rejected as limit.
                shrank = [i for i in range(1, len(sizes)) if sizes[i] < sizes[i - 1]]
                assert len(shrank) == 1 and results[shrank[0]].kind == "committed"
                assert await store.session_ids() == ["new"]
                assert len(await store.erasures()) == 1
                last = results[-1]
                assert isinstance(last, RejectedResult) and last.reason == "limit"
            assert store.size <= 8000  # type: ignore[attr-defined]
    finally:
        await store.aclose()


def test_a_session_started_of_version_3_reads_without_a_subject() -> None:
    from turnledger.events import SessionStarted

    v3 = {
        "system": "s",
        "model": "m",
        "policy": {"kind": "ledger"},
        "on_busy": "reject",
        "tools": [],
        "tool_choice": "auto",
        "max_tool_rounds": 8,
        "on_tool_error": "report",
        "context_window": None,
        "output_reserve": None,
        "window_source": "none",
    }
    old = DEFAULT_CODEC.from_payload("session_started", 3, v3)
    assert old == SessionStarted("s", "m")
    assert old.subject is None and old.retain_seconds is None and old.retain_turns is None
    tag, version, payload = DEFAULT_CODEC.to_payload(SessionStarted("s", "m", subject="u"))
    assert (tag, version, payload["subject"]) == ("session_started", 4, "u")
    with pytest.raises(Exception, match="subject"):
        DEFAULT_CODEC.from_payload("session_started", 4, {**payload, "subject": 7})


async def test_postgres_refuses_to_erase_a_session_another_store_holds(pg_dsn: str) -> None:
    from turnledger import SessionOwnedElsewhere
    from turnledger.adapters.stores import PostgresStore

    with trio.fail_after(TIMEOUT):
        owner = await PostgresStore.open(pg_dsn)
        other = await PostgresStore.open(pg_dsn)
        try:
            async with _hub(owner) as hub:
                await hub.open_session("held")  # its actor holds the lease
                before = await other.read("held")
                with pytest.raises(SessionOwnedElsewhere):
                    await other.erase("held")
                assert await other.read("held") == before and await other.erasures() == []
                await hub.erase("held")  # the owner's own hub may
            assert await other.read("held") == []
        finally:
            await other.aclose()
            await owner.aclose()
