"""``turnledger log --text``, ``export`` and ``search``; ``log --json`` in
the keys of the structlog lines. Real processes, real files."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from turnledger.adapters.providers import PROVIDER_KINDS

from ._run import tl

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's log: committed turns, turns discarded for four reasons
    and a late completion."""
    folder = tmp_path_factory.mktemp("demo")
    r = tl("demo", "--db", "d.db", cwd=folder)
    assert r.returncode == 0, r.stderr
    return folder / "d.db"


def sessions_of(db: Path) -> list[str]:
    """The demo's main session (its tool turns have a session of their own,
    and so have its branches, its summary scene and its turn through each
    wire protocol; the session it erases is gone)."""
    r = tl("sessions", str(db), "--json", cwd=db.parent)
    found = [json.loads(line)["session_id"] for line in r.stdout.splitlines()]
    assert not any(s.endswith("-erased") for s in found)
    others = tuple(f"-{name}" for name in ("tools", "branches", "summary", *PROVIDER_KINDS))
    assert len(found) == len(others) + 1 and sum(s.endswith("-tools") for s in found) == 1
    return [s for s in found if not s.endswith(others)]


def test_export_json_is_replay_plus_times_and_usage(demo_db: Path) -> None:
    (sid,) = sessions_of(demo_db)
    replayed = json.loads(
        tl("replay", str(demo_db), "--json", "-s", sid, cwd=demo_db.parent).stdout
    )
    r = tl("export", str(demo_db), "--session", sid, "--format", "json", cwd=demo_db.parent)
    assert r.returncode == 0, r.stderr
    exported = json.loads(r.stdout)
    assert exported["session_id"] == sid and exported["model"]
    # the same turns, in order, with the same fields...
    keys = ("request_id", "question", "answer")
    assert [{k: t[k] for k in keys} for t in exported["turns"]] == replayed["turns"]
    # ...plus when each was asked and kept, how it finished and what it cost
    for turn in exported["turns"]:
        asked = dt.datetime.fromisoformat(turn["asked_at"])
        assert asked <= dt.datetime.fromisoformat(turn["committed_at"])
        assert turn["finish_reason"] == "stop" and "usage" in turn
    # the turns that were not kept are listed apart, never among the turns
    reasons = {n["reason"] for n in exported["not_saved"]}
    assert reasons == {"timeout", "cancelled", "http_status", "incomplete_finish"}
    kept = {t["request_id"] for t in exported["turns"]}
    assert not kept & {n["request_id"] for n in exported["not_saved"]}


def test_export_markdown_names_every_committed_turn_in_order(demo_db: Path) -> None:
    (sid,) = sessions_of(demo_db)
    replayed = json.loads(
        tl("replay", str(demo_db), "--json", "-s", sid, cwd=demo_db.parent).stdout
    )
    r = tl("export", str(demo_db), "-s", sid, cwd=demo_db.parent)
    assert r.returncode == 0, r.stderr
    md = r.stdout
    at = 0
    for n, turn in enumerate(replayed["turns"], 1):
        heading = md.index(f"## Turn {n}\n", at)
        question = md.index(turn["question"], heading)
        at = md.index(turn["answer"], question)
    assert f"## Turn {len(replayed['turns']) + 1}" not in md
    exported = tl("export", str(demo_db), "-s", sid, "--format", "json", cwd=demo_db.parent)
    not_saved = json.loads(exported.stdout)["not_saved"]
    assert len(not_saved) >= 4
    assert md.count("> **Not saved** — discarded: ") == len(not_saved)
    missing = tl("export", str(demo_db), "-s", "nobody", cwd=demo_db.parent)
    assert missing.returncode == 4 and "no events for session 'nobody'" in missing.stderr


def test_search_finds_committed_turns_only(tmp_path: Path) -> None:
    big = "x" * 500 + " apple"
    r = tl("chat", "--db", "s.db", "--max-request-bytes", "400", cwd=tmp_path,
           stdin=f"an Apple a day\n{big}\nno fruit\n")  # fmt: skip
    assert r.returncode == 1  # the big one was rejected
    hits = tl("search", "s.db", "APPLE", cwd=tmp_path)
    assert hits.returncode == 0, hits.stderr
    assert hits.stdout.splitlines() == ["chat #1  an Apple a day"]
    as_json = tl("search", "s.db", "fruit", "--json", cwd=tmp_path)
    (row,) = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert (row["session_id"], row["turn"], row["question"]) == ("chat", 2, "no fruit")
    none = tl("search", "s.db", "pear", cwd=tmp_path)
    assert none.returncode == 4 and "no committed turn holds 'pear'" in none.stderr


def test_log_text_shows_each_question_and_answer_on_one_line(tmp_path: Path) -> None:
    question = "first line\nsecond\x1b[31m line " + "y" * 200
    r = tl("chat", "--db", "t.db", cwd=tmp_path, stdin=question.replace("\n", " ") + "\n")
    assert r.returncode == 0, r.stderr
    log = tl("log", "t.db", "--text", cwd=tmp_path)
    you = [line for line in log.stdout.splitlines() if line.lstrip().startswith("you: ")]
    answers = [line for line in log.stdout.splitlines() if line.lstrip().startswith("answer: ")]
    assert len(you) == len(answers) == 1
    assert "second\\x1b[31m line yyy" in you[0] and "\x1b" not in log.stdout
    assert you[0].endswith("…") and len(you[0].strip()) == len("you: ") + 100


def test_log_json_uses_the_keys_of_the_structlog_lines(tmp_path: Path) -> None:
    r = tl("chat", "--db", "k.db", "--log-json", cwd=tmp_path, stdin="q\n")
    assert r.returncode == 0, r.stderr
    logged = [json.loads(line) for line in r.stderr.splitlines()]
    transitions = [line for line in logged if line["event"] == "transition"]
    log = tl("log", "k.db", "--json", cwd=tmp_path)
    rows = [json.loads(line) for line in log.stdout.splitlines()]
    assert [row["tag"] for row in rows] == [line["tag"] for line in transitions]
    for row, line in zip(rows, transitions, strict=True):
        for key in ("session_id", "seq", "request_id", "tag"):
            assert row[key] == line[key], key
        assert (row["from"], row["to"]) == (line["from"].lower(), line["to"].lower())
        # the same ISO form of time, so one jq filter reads both
        assert row["timestamp"].endswith("Z") and line["timestamp"].endswith("Z")
        assert dt.datetime.fromisoformat(row["timestamp"]).tzinfo is not None
    assert all("text" not in row for row in rows)  # text only when asked for
    with_text = tl("log", "k.db", "--json", "--text", cwd=tmp_path)
    texts = [json.loads(line)["text"] for line in with_text.stdout.splitlines()]
    assert "q" in texts


async def test_find_turns_skips_unparsed_sessions_without_missing_a_match(tmp_path: Path) -> None:
    from turnledger.adapters.stores import SQLiteStore
    from turnledger.cli._browse import find_turns
    from turnledger.events import (
        DEFAULT_CODEC,
        RequestId,
        SessionStarted,
        StreamStarted,
        TurnCommitted,
        TurnDiscarded,
        TurnSubmitted,
    )

    def events(sid: str, question: str, answer: str, kept: bool = True) -> list[Any]:
        rid = RequestId(f"{sid}-r")
        end = TurnCommitted(rid, answer, "stop") if kept else TurnDiscarded(rid, "cancelled", "")
        evs = [SessionStarted("", "m"), TurnSubmitted(rid, question, 0, 0, 10),
               StreamStarted(rid), end]  # fmt: skip
        return [DEFAULT_CODEC.encode(e, session_id=sid, seq=i, recorded_at=1.7e9)
                for i, e in enumerate(evs, 1)]  # fmt: skip

    store = await SQLiteStore.open(tmp_path / "f.db")
    try:
        await store.append("a", events("a", "Straße nach Köln", "ok"), 0)
        await store.append("b", events("b", 'say "hi"\tthere', "line one\nline two"), 0)
        await store.append("c", events("c", "lone \ud800 surrogate in Köln", "ok"), 0)
        await store.append("d", events("d", "a secret plan", "not kept", kept=False), 0)

        async def found(text: str) -> list[str]:
            return sorted((await find_turns(store, text)).keys())

        assert await found("STRASSE") == ["a"]  # case folded alike
        assert await found('"hi"\tthere') == ["b"]  # JSON-escaped characters: a full scan
        assert await found("one\nline") == ["b"]
        assert await found("KÖLN") == ["a", "c"]  # a payload with \u escapes is parsed
        assert await found("question") == []  # a payload key is no match
        assert await found("secret") == []  # a discarded turn is not history
        assert await found("ok") == ["a", "c"]
        assert list(await find_turns(store, "ok", "c")) == ["c"]
    finally:
        await store.aclose()
