"""Logs written before branches (main at 85433a9 and at 6b53ecb, see
``tests/fixtures/make_log_*.py``) replay exactly as those releases replayed
them, with one branch, ``main``; and their sessions can branch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from turnledger.adapters.stores import JournalStore
from turnledger.events import DEFAULT_CODEC, MAIN_BRANCH
from turnledger.sessions import CommittedResult, branches_of, open_hub, replay
from turnledger.testing import ScriptedProvider

FIXTURES = Path(__file__).parent.parent / "fixtures"
RELEASES = ["85433a9", "6b53ecb"]


def _copy(tmp_path: Path, release: str) -> Path:
    path = tmp_path / f"old-{release}.jsonl"
    shutil.copyfile(FIXTURES / f"log_{release}.jsonl", path)
    return path


@pytest.mark.parametrize("release", RELEASES)
async def test_a_log_from_before_branches_replays_unchanged(tmp_path: Path, release: str) -> None:
    expected = json.loads((FIXTURES / f"log_{release}.expected.json").read_text("utf-8"))
    path = _copy(tmp_path, release)
    before = path.read_bytes()
    store = await JournalStore.open(path, read_only=True)
    try:
        assert sorted(await store.session_ids()) == sorted(expected)
        for sid, want in expected.items():
            state = replay(await store.read_decoded(sid, DEFAULT_CODEC))
            got = {
                "phase": type(state).__name__,
                "version": state.version,
                "turns": [[t.request_id, t.question, t.answer] for t in state.turns],
                "context_start": state.context_start,
                "endings": [[rid, e.kind, e.reason, e.detail] for rid, e in state.endings],
            }
            assert got == want, sid
            # one branch, main, active, holding every turn; no records kept
            (main,) = branches_of(state)
            assert (main.branch_id, main.active, main.length) == ("main", True, len(want["turns"]))
            assert state.active_branch == MAIN_BRANCH and state.branches == ()
    finally:
        await store.aclose()
    assert path.read_bytes() == before


@pytest.mark.parametrize("release", RELEASES)
async def test_an_old_session_branches_and_keeps_its_turns(tmp_path: Path, release: str) -> None:
    expected = json.loads((FIXTURES / f"log_{release}.expected.json").read_text("utf-8"))
    old = [tuple(t) for t in expected["ledger"]["turns"]]
    assert len(old) >= 2
    store = await JournalStore.open(_copy(tmp_path, release))
    try:
        async with open_hub(store, ScriptedProvider.instant("edited"), model="m") as hub:
            result = await (await hub.edit("ledger", 1, "asked differently")).outcome()
            assert isinstance(result, CommittedResult)
            branch = [(t.request_id, t.question, t.answer) for t in await hub.history("ledger")]
            assert branch[:1] == old[:1] and branch[1][1:] == ("asked differently", "edited")
            await hub.switch("ledger", "main")
            main = [(t.request_id, t.question, t.answer) for t in await hub.history("ledger")]
            assert main == old
    finally:
        await store.aclose()


def test_retention_keeps_a_branched_session_whole() -> None:
    from turnledger.events import BranchId, RequestId
    from turnledger.sessions import (
        Completed,
        Edit,
        Message,
        RetentionPolicy,
        SessionState,
        Start,
        Submit,
        decide,
        evolve,
        initial_state,
        plan_retention,
    )

    state: SessionState = initial_state()
    events = []

    def send(msg: Message) -> None:
        nonlocal state
        for ev in decide(state, msg):
            state = evolve(state, ev)
            events.append(ev)

    send(Start("s", "m"))
    for i in range(4):
        send(Submit(RequestId(f"r{i}"), f"q{i}"))
        send(Completed(RequestId(f"r{i}"), f"a{i}", "stop"))
    stored = [
        DEFAULT_CODEC.encode(e, session_id="s", seq=i, recorded_at=float(i))
        for i, e in enumerate(events, 1)
    ]
    policy = RetentionPolicy(max_turns=2)
    step = plan_retention("s", stored, policy, now=100.0)
    assert step is not None and step.action == "trim"  # the same log, unbranched: trimmed
    send(Edit(RequestId("e"), 3, "q3 again"))
    send(Completed(RequestId("e"), "a3 again", "stop"))
    assert state.active_branch == BranchId("b1")
    stored = [
        DEFAULT_CODEC.encode(e, session_id="s", seq=i, recorded_at=float(i))
        for i, e in enumerate(events, 1)
    ]
    assert plan_retention("s", stored, policy, now=100.0) is None
    # an idle session is still erased whole
    erase = plan_retention("s", stored, RetentionPolicy(max_idle=10), now=1000.0)
    assert erase is not None and erase.action == "erase"
