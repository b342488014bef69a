"""``turnledger erase``, ``prune`` and ``sessions --subject``: real processes
on real files, the logs written through the hub over real HTTP."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
import trio

from turnledger.adapters.providers import OpenAIChat
from turnledger.adapters.stores import open_store
from turnledger.sessions import open_hub
from turnledger.testing import chat_responder, open_loopback_server

from ._run import tl

pytestmark = pytest.mark.loopback

CANARY = "CANARY-3d1b-CLI-ERASE"
DAY = 86400.0


async def _write(db: Path) -> None:
    """``old`` (idle 40 days, subject user-1), ``secret`` (the canary,
    subject user-1) and ``keep`` (subject user-2)."""
    store = await open_store(db)
    try:
        async with (
            open_loopback_server(chat_responder(lambda m: f"answer to {m[-1]['content']}")) as srv,
            OpenAIChat(base_url=srv.openai_base_url) as provider,
        ):
            async with open_hub(
                store, provider, model="m", clock=lambda: time.time() - 40 * DAY
            ) as hub:
                await (await hub.submit("old", "an old question", subject="user-1")).outcome()
            async with open_hub(store, provider, model="m") as hub:
                await hub.open_session("secret", system=f"sys {CANARY}", subject="user-1")
                await (await hub.submit("secret", f"q {CANARY}")).outcome()
                for _ in range(3):
                    await (await hub.submit("keep", "a question", subject="user-2")).outcome()
    finally:
        await store.aclose()


@pytest.fixture(params=["events.db", "events.jsonl"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    folder = tmp_path / "store"
    folder.mkdir()
    path = folder / request.param
    trio.run(_write, path)
    return path


def _digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def _canaries(folder: Path) -> int:
    return sum(p.read_bytes().count(CANARY.encode()) for p in folder.iterdir() if p.is_file())


def _sessions(db: Path, *extra: str) -> list[dict[str, object]]:
    r = tl("sessions", str(db), "--json", *extra, cwd=db.parent)
    assert r.returncode in (0, 4), r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_erase_a_session_leaves_no_byte_of_it(db: Path) -> None:
    assert _canaries(db.parent) > 0
    keep_before = tl("export", str(db), "-s", "keep", "--format", "json", cwd=db.parent).stdout
    r = tl("erase", str(db), "--session", "secret", "--yes", cwd=db.parent)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("erased secret: ") and "sha256 " in r.stdout
    assert _canaries(db.parent) == 0
    assert [s["session_id"] for s in _sessions(db)] == ["old", "keep"]
    keep_after = tl("export", str(db), "-s", "keep", "--format", "json", cwd=db.parent).stdout
    assert keep_after == keep_before
    for command in (("export", str(db), "-s", "secret"), ("search", str(db), CANARY)):
        gone = tl(*command, cwd=db.parent)
        assert gone.returncode == 4 and CANARY not in gone.stdout


def test_erase_asks_and_refuses_without_a_terminal(db: Path) -> None:
    before = _digest(db.parent)
    r = tl("erase", str(db), "--session", "secret", cwd=db.parent, stdin="yes\n")
    assert r.returncode == 2
    assert "refusing to erase without --yes" in r.stderr
    assert _digest(db.parent) == before


def test_erasing_an_unknown_session_changes_nothing(db: Path) -> None:
    before = _digest(db.parent)
    r = tl("erase", str(db), "--session", "nobody", "--yes", cwd=db.parent)
    assert r.returncode == 4
    assert "no session 'nobody'; nothing erased" in r.stderr
    assert _digest(db.parent) == before


def test_erase_a_subject_and_list_sessions_by_subject(db: Path) -> None:
    mine = _sessions(db, "--subject", "user-1")
    assert [(s["session_id"], s["subject"]) for s in mine] == [
        ("old", "user-1"),
        ("secret", "user-1"),
    ]
    r = tl("erase", str(db), "--subject", "user-1", "--yes", "--json", cwd=db.parent)
    assert r.returncode == 0, r.stderr
    erased = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["session_id"] for e in erased] == ["old", "secret"]
    assert _sessions(db, "--subject", "user-1") == []
    assert [s["session_id"] for s in _sessions(db)] == ["keep"]
    assert _canaries(db.parent) == 0


def test_prune_dry_run_changes_nothing_and_prune_erases(db: Path) -> None:
    before = _digest(db.parent)
    r = tl("prune", str(db), "--older-than", "30d", "--dry-run", cwd=db.parent)
    assert r.returncode == 0, r.stderr
    assert "old: would be erased" in r.stdout
    assert "would prune 1 session(s): 1 erased, 0 trimmed" in r.stdout
    assert _digest(db.parent) == before  # not a byte, not a new file
    r = tl("prune", str(db), "--older-than", "30d", "--max-turns", "2", "--json", cwd=db.parent)
    assert r.returncode == 0, r.stderr
    steps = {s["session_id"]: s for s in map(json.loads, r.stdout.splitlines())}
    assert steps["old"]["action"] == "erase"
    assert steps["keep"]["action"] == "trim" and steps["keep"]["turns"] == 1
    sessions = {s["session_id"]: s for s in _sessions(db)}
    assert set(sessions) == {"secret", "keep"}
    assert sessions["keep"]["turns"] == 2


def test_prune_needs_a_rule_and_a_valid_age(db: Path) -> None:
    r = tl("prune", str(db), cwd=db.parent)
    assert r.returncode == 2 and "--older-than" in r.stderr
    r = tl("prune", str(db), "--older-than", "soon", cwd=db.parent)
    assert r.returncode == 2 and "not an age" in r.stderr
