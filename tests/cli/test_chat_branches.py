"""/edit, /retry, /branches and /switch in `turnledger chat`, in a
pseudo-terminal, against the built-in loopback model server and against an
OpenAI-compatible server in a process of its own, over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ._run import server_process, tl
from .test_terminal import finish, questions, spawn

pytestmark = pytest.mark.slow


def test_edit_retry_branches_and_switch_at_the_prompt(tmp_path: Path) -> None:
    child = spawn(tmp_path)
    child.expect("you>")
    child.send("/retry\r")  # nothing asked yet: nothing to ask again
    child.expect("refused: branch main has no question to ask again")
    child.expect("you>")
    child.send("one\r")
    child.expect("held 0 earlier turn")
    child.send("two\r")
    child.expect("held 1 earlier turn")
    child.expect("you>")
    # question 2 asked differently: a branch that keeps question 1 only
    child.send("/edit 2 deux\r")
    child.expect("held 1 earlier turn")
    child.expect("you>")
    child.send("/history\r")
    child.expect(r"\[2\] you: deux")
    child.expect("you>")
    child.send("/retry\r")
    child.expect("held 1 earlier turn")
    child.expect("you>")
    child.send("/branches\r")
    child.expect(r"  main: 2 turns")
    child.expect(r"  b1 from main after 1 turns \(edit\): 2 turns")
    child.expect(r"\* b2 from b1 after 1 turns \(regenerate\): 2 turns")
    child.expect("you>")
    child.send("/switch main\r")
    child.expect("on branch main: 2 turns")
    child.expect("you>")
    child.send("/history\r")
    child.expect(r"\[2\] you: two")
    child.expect("you>")
    child.send("/switch b9\r")
    child.expect("refused: no branch 'b9'")
    child.expect("you>")
    child.send("/edit 9 nine\r")
    child.expect("refused: no question 9 on this branch")
    child.expect("you>")
    child.send("/edit two\r")
    child.expect("usage: /edit N TEXT")
    child.expect("you>")
    child.send("three\r")
    child.expect("held 2 earlier turn")  # main goes on from its own turns
    child.expect("you>")
    child.send("/exit\r")
    finish(child)
    assert questions(tmp_path, "chat") == ["one", "two", "three"]


def test_the_branch_commands_against_an_openai_compatible_server(tmp_path: Path) -> None:
    # A server in a process of its own, on the OpenAI-compatible path: each
    # answer says what the request carried, so the terminal shows what the
    # branch sent.
    setup = (
        "answer = lambda messages: 'sent: ' + ' | '.join(\n"
        "    m['content'] for m in messages if m['role'] != 'system')\n"
    )
    with server_process(tmp_path, "chat_responder(answer)", setup) as base_url:
        child = spawn(tmp_path, "--base-url", base_url + "/v1", "--model", "m")
        child.expect("you>")
        child.send("one\r")
        child.expect(r"sent: one\r?\n")
        child.send("two\r")
        child.expect(r"sent: one \| sent: one \| two")
        child.expect("you>")
        child.send("/edit 2 deux\r")
        child.expect(r"sent: one \| sent: one \| deux")
        child.expect("you>")
        child.send("/retry\r")
        child.expect(r"sent: one \| sent: one \| deux")
        child.expect("you>")
        child.send("/switch b1\r")
        child.expect("on branch b1: 2 turns")
        child.expect("you>")
        child.send("three\r")
        child.expect(r"sent: one \| sent: one \| deux \| sent: one \| sent: one \| deux \| three")
        child.expect("you>")
        child.send("/exit\r")
        finish(child)
    b1 = tl("replay", "t.db", "--session", "chat", "--branch", "b1", "--json", cwd=tmp_path)
    assert b1.returncode == 0, b1.stderr
    assert [t["question"] for t in json.loads(b1.stdout)["turns"]] == ["one", "deux", "three"]
    assert questions(tmp_path, "chat") == ["one", "deux", "three"]  # b1 is active
