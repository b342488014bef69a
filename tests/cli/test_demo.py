"""``turnledger demo``, run as a user runs it: a real process, a real file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from turnledger.adapters.providers import PROVIDER_KINDS

from ._run import tl

PROVIDERS = list(PROVIDER_KINDS)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("provider", "cap"), [("openai", "length"), ("anthropic", "max_tokens")])
def test_demo_runs_end_to_end_and_replays(tmp_path: Path, provider: str, cap: str) -> None:
    r = tl("demo", "--provider", provider, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    db = tmp_path / "turnledger-demo.db"
    assert db.exists() and str(db) in out
    for expected in (
        "outcome: committed",
        "reason=timeout",
        "dropped to fit",
        "history unchanged by the trim and the timeout: yes",
        "reason=cancelled",
        "reason=http_status: HTTP 429",
        f"reason=incomplete_finish: finish_reason={cap}",
        "recorded as completion_ignored",
        "replayed history matches the live session (2 turns)",
        'tool calculator({"expression":"6*7"}) → {"value":42.0}',
        "history unchanged, no call without its result: yes",
        "replayed tool session matches the live one (1 turn)",
        "  * b2       1 turn(s) (regenerate of turn 1)",
        "history now ['Orange.']; after /switch main ['Blue.', 'A pear.']",
        "hub.erase: 4 events before, 0 after",
        "pinned p1 (policy): sent after the system prompt, with every request",
        "summary s1 of turns 1-2 (model, concise prompt, ~15 tokens): "
        "Ada keeps bees and starts with two hives.",
        "the next request dropped 2 turns and sent s1 in their place, the pin with it",
        "history keeps every turn: 4 turn(s)",
        *(f"{name:17s} committed" for name in PROVIDERS),
    ):
        assert expected in out, expected
    # the error body never reaches the transcript, the logs or the log file
    assert "/srv/app/limits.py" not in out + r.stderr
    assert b"/srv/app/limits.py" not in db.read_bytes()
    # the erased session's text is in no file of the store
    for f in tmp_path.glob("turnledger-demo.db*"):
        assert b"4111 1111" not in f.read_bytes(), f
    # and the file tells the same story to `log` and `replay`
    log = tl("log", str(db), "--json", cwd=tmp_path)
    rows = [json.loads(line) for line in log.stdout.splitlines()]
    tags = [row["tag"] for row in rows]
    # the tool session's turn too, and one per protocol
    # (the branch session's four answers, the summary session's four;
    # nothing of the erased one)
    assert tags.count("turn_committed") == 3 + 4 + len(PROVIDERS) + 4
    assert tags.count("summary_recorded") == tags.count("summary_sent") == 1
    assert tags.count("pin_added") == 1
    assert tags.count("branch_started") == 2 and tags.count("branch_switched") == 1
    assert tags.count("tool_result_recorded") == 2 and "tool_round_submitted" in tags
    assert "completion_ignored" in tags
    late = next(row for row in rows if row["tag"] == "completion_ignored")
    assert late["late_by"] > 0.3
    reasons = {row["reason"] for row in rows if row["tag"] == "turn_discarded"}
    assert reasons == {"timeout", "cancelled", "http_status", "incomplete_finish"}
    replay = tl("replay", str(db), "--json", cwd=tmp_path)
    by_id = {
        s["session_id"].rpartition("-")[2]: s for s in map(json.loads, replay.stdout.splitlines())
    }
    session = next(s for s in by_id.values() if s["session_id"].count("-") == 1)
    tools = by_id["tools"]
    assert len(by_id) == 4 + len(PROVIDERS)
    assert len(by_id["summary"]["turns"]) == 4
    assert len(session["turns"]) == 2
    (turn,) = tools["turns"]
    assert [c["name"] for c in turn["rounds"][0]["calls"]] == ["calculator", "clock"]
    # `log` shows tool names, call ids and sizes, never arguments or results...
    text = tl("log", str(db), "-s", tools["session_id"], cwd=tmp_path).stdout
    assert "calculator call_1" in text and "ms" in text
    assert "expression" not in text and "value" not in text
    # ...unless asked; `replay` prints the tool messages
    assert "expression" in tl("log", str(db), "--text", cwd=tmp_path).stdout
    shown = tl("replay", str(db), "-s", tools["session_id"], cwd=tmp_path).stdout
    assert "assistant calls: calculator(" in shown and "tool [call_2]:" in shown


def test_the_closing_hint_runs_as_printed_in_an_unactivated_venv(tmp_path: Path) -> None:
    # PATH without this environment's bin folder: a venv that was not activated.
    bin_dir = os.path.dirname(sys.executable)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != bin_dir)
    r = tl("demo", "--db", "d.db", cwd=tmp_path, env={"PATH": path})
    assert r.returncode == 0, r.stderr
    hint = r.stdout.rstrip().splitlines()[-1]
    prefix = "See the whole story:  "
    assert hint.startswith(prefix), hint
    command = hint.removeprefix(prefix)
    assert not command.startswith("turnledger ")  # not on PATH: a path that works
    shown = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, env={**os.environ, "PATH": path})  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert " turn_committed " in shown.stdout
