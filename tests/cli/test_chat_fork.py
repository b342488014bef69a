"""/fork in `turnledger chat`, in a pseudo-terminal against the built-in
loopback model server; then the command line reads the fork (replay, export,
log, sessions) with its shared turns, and an erasure of the source takes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ._run import tl
from .test_terminal import finish, questions, spawn

pytestmark = pytest.mark.slow


def test_fork_at_the_prompt_then_read_it_from_the_command_line(tmp_path: Path) -> None:
    child = spawn(tmp_path)
    child.expect("you>")
    child.send("one\r")
    child.expect("held 0 earlier turn")
    child.send("two\r")
    child.expect("held 1 earlier turn")
    child.expect("you>")
    child.send("/fork side 9\r")
    child.expect("refused: no fork point 9")
    child.expect("you>")
    child.send("/fork side x\r")
    child.expect("usage: /fork NEW")
    child.expect("you>")
    child.send("/fork chat\r")
    child.expect("refused: session 'chat' exists already")
    child.expect("you>")
    child.send("/fork side 1\r")
    child.expect("a fork: side, sharing 1 turns of chat")
    child.expect("you>")
    child.send("/history\r")
    child.expect(r"\[1\] you: one")
    child.expect("you>")
    child.send("deux\r")
    child.expect("held 1 earlier turn")  # the shared turn went with the question
    child.expect("you>")
    child.send("/exit\r")
    finish(child)
    assert questions(tmp_path, "chat") == ["one", "two"]
    assert questions(tmp_path, "side") == ["one", "deux"]

    r = tl("replay", "t.db", "--session", "side", "--at", "2", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [t["question"] for t in json.loads(r.stdout)["turns"]] == ["one"]

    r = tl("export", "t.db", "--session", "side", "--format", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout)
    assert [t["question"] for t in record["turns"]] == ["one", "deux"]
    assert "held 0 earlier turn" in record["turns"][0]["answer"]
    assert record["turns"][0]["committed_at"] is not None
    assert record["forked_from"]["session_id"] == "chat"
    assert record["forked_from"]["at_turn"] == 1

    r = tl("log", "t.db", "--session", "side", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "fork of chat: shares its first 1 turns of branch main" in r.stdout

    r = tl("sessions", "t.db", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    turns = {s["session_id"]: s["turns"] for s in map(json.loads, r.stdout.splitlines())}
    assert turns == {"chat": 2, "side": 2}

    r = tl("search", "t.db", "deux", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    hit = json.loads(r.stdout)
    assert (hit["session_id"], hit["turn"]) == ("side", 2)

    # erasing the source erases its fork: the shared turn is nowhere
    r = tl("erase", "t.db", "--session", "chat", "--yes", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    erased = [json.loads(line)["session_id"] for line in r.stdout.splitlines()]
    assert erased == ["side", "chat"]
    r = tl("replay", "t.db", "--json", cwd=tmp_path)
    assert r.returncode != 0 and r.stdout == ""
