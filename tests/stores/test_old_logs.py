"""A log written by the release before context windows (main at 6b53ecb,
``tests/fixtures/make_log_6b53ecb.py``) replays exactly as that release
replayed it, and its sessions go on."""

import json
import shutil
from pathlib import Path

from turnledger.adapters.stores import JournalStore
from turnledger.events import DEFAULT_CODEC, SessionStarted, TurnSubmitted
from turnledger.sessions import Budget, CommittedResult, open_hub, prompt_token_cap, replay
from turnledger.testing import ScriptedProvider

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _copy(tmp_path: Path) -> Path:
    path = tmp_path / "old.jsonl"
    shutil.copyfile(FIXTURES / "log_6b53ecb.jsonl", path)
    return path


async def test_an_old_log_replays_unchanged(tmp_path: Path) -> None:
    expected = json.loads((FIXTURES / "log_6b53ecb.expected.json").read_text("utf-8"))
    path = _copy(tmp_path)
    before = path.read_bytes()
    store = await JournalStore.open(path, read_only=True)
    try:
        assert sorted(await store.session_ids()) == sorted(expected)
        for sid, want in expected.items():
            events = await store.read_decoded(sid, DEFAULT_CODEC)
            state = replay(events)
            got = {
                "phase": type(state).__name__,
                "version": state.version,
                "turns": [[t.request_id, t.question, t.answer] for t in state.turns],
                "context_start": state.context_start,
                "endings": [[rid, e.kind, e.reason, e.detail] for rid, e in state.endings],
            }
            assert got == want, sid
            # upcast: no window, no estimates, hence no token cap of the session's own
            started = events[0]
            assert isinstance(started, SessionStarted)
            assert (started.context_window, started.output_reserve) == (None, None)
            assert started.window_source == "none"
            assert all(
                e.estimated_prompt_tokens is None for e in events if isinstance(e, TurnSubmitted)
            )
            assert prompt_token_cap(state, Budget()) is None
    finally:
        await store.aclose()
    assert path.read_bytes() == before


async def test_an_old_session_goes_on(tmp_path: Path) -> None:
    expected = json.loads((FIXTURES / "log_6b53ecb.expected.json").read_text("utf-8"))
    store = await JournalStore.open(_copy(tmp_path))
    try:
        async with open_hub(store, ScriptedProvider.instant("yes"), model="m") as hub:
            result = await (await hub.submit("window", "still there?")).outcome()
            assert isinstance(result, CommittedResult)
            turns = await hub.history("window")
        old = [tuple(t) for t in expected["window"]["turns"]]
        assert [(t.request_id, t.question, t.answer) for t in turns[:-1]] == old
        assert turns[-1].answer == "yes"
    finally:
        await store.aclose()
