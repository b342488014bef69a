"""`turnledger replay --branch`: any branch's turns, from a real SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from turnledger.adapters.stores import SQLiteStore
from turnledger.events import DEFAULT_CODEC, BranchId, Event, RequestId
from turnledger.sessions import (
    Completed,
    Edit,
    Message,
    SessionState,
    Start,
    Submit,
    Switch,
    decide,
    evolve,
    initial_state,
)

from ._run import tl


def _branched_log() -> list[Event]:
    state: SessionState = initial_state()
    log: list[Event] = []

    def send(msg: Message) -> None:
        nonlocal state
        for ev in decide(state, msg):
            state = evolve(state, ev)
            log.append(ev)

    send(Start("sys", "m"))
    for rid, q in (("r0", "one"), ("r1", "two")):
        send(Submit(RequestId(rid), q))
        send(Completed(RequestId(rid), f"a {q}", "stop"))
    send(Edit(RequestId("e1"), 1, "deux"))
    send(Completed(RequestId("e1"), "a deux", "stop"))
    send(Switch(BranchId("main")))
    return log


def _write(db: Path) -> None:
    stored = [
        DEFAULT_CODEC.encode(e, session_id="s", seq=i, recorded_at=float(i))
        for i, e in enumerate(_branched_log(), 1)
    ]

    async def write() -> None:
        store = await SQLiteStore.open(db)
        try:
            await store.append("s", stored, 0)
        finally:
            await store.aclose()

    trio.run(write)


def test_replay_shows_the_active_branch_or_the_one_asked_for(tmp_path: Path) -> None:
    _write(tmp_path / "b.db")
    active = tl("replay", "b.db", "--session", "s", "--json", cwd=tmp_path)
    assert active.returncode == 0, active.stderr
    out = json.loads(active.stdout)
    assert [t["question"] for t in out["turns"]] == ["one", "two"] and "branch" not in out
    b1 = tl("replay", "b.db", "--session", "s", "--json", "--branch", "b1", cwd=tmp_path)
    assert b1.returncode == 0, b1.stderr
    out = json.loads(b1.stdout)
    assert [t["question"] for t in out["turns"]] == ["one", "deux"] and out["branch"] == "b1"
    text = tl("replay", "b.db", "--session", "s", "--branch", "b1", cwd=tmp_path)
    assert text.returncode == 0 and "branch b1" in text.stdout and "user: deux" in text.stdout
    unknown = tl("replay", "b.db", "--session", "s", "--branch", "b9", cwd=tmp_path)
    assert (
        unknown.returncode != 0 and "no branch b9 in session s (it has main, b1)" in unknown.stderr
    )
    alone = tl("replay", "b.db", "--branch", "b1", cwd=tmp_path)
    assert alone.returncode != 0 and "--branch needs --session" in alone.stderr


def test_export_writes_one_branch_path(tmp_path: Path) -> None:
    _write(tmp_path / "b.db")
    active = tl("export", "b.db", "--session", "s", "--format", "json", cwd=tmp_path)
    assert active.returncode == 0, active.stderr
    record = json.loads(active.stdout)
    assert record["branch"] == "main"
    assert [t["question"] for t in record["turns"]] == ["one", "two"]
    b1 = tl("export", "b.db", "-s", "s", "--format", "json", "--branch", "b1", cwd=tmp_path)
    record = json.loads(b1.stdout)
    assert record["branch"] == "b1"
    assert [t["question"] for t in record["turns"]] == ["one", "deux"]
    md = tl("export", "b.db", "-s", "s", "--branch", "b1", cwd=tmp_path)
    assert md.returncode == 0 and "deux" in md.stdout and "two" not in md.stdout
    unknown = tl("export", "b.db", "-s", "s", "--branch", "b9", cwd=tmp_path)
    assert unknown.returncode != 0 and "no branch 'b9'" in unknown.stderr
