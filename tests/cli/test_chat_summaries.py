"""/summarize, /pin, /pins and /unpin in `turnledger chat`, in a
pseudo-terminal, against the built-in loopback model server over HTTP."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from .test_terminal import finish, spawn

pytestmark = pytest.mark.slow


def test_summarize_and_pins_at_the_prompt(tmp_path: Path) -> None:
    child = spawn(tmp_path)
    child.expect("you>")
    child.send("/summarize\r")
    child.expect("nothing to summarize yet")
    child.expect("you>")
    for q in ("one", "two", "three"):
        child.send(f"{q}\r")
        child.expect("earlier turn")
        child.expect("you>")
    child.send("/summarize 9\r")
    child.expect("refused: no turns 0 to 9")
    child.expect("you>")
    child.send("/summarize x\r")
    child.expect("usage: /summarize")
    child.expect("you>")
    # the model (the loopback server here) summarizes all but the last two: question 1
    child.send("/summarize\r")
    child.expect(r"summary s1 of questions 1-1 \(model, concise, ~\d+ tokens\):")
    child.expect("The request held 0 earlier turn")  # the loopback's answer to it
    child.expect("you>")
    child.send("/pin My name is Ada.\r")
    child.expect("pinned as p1")
    child.expect("you>")
    child.send("/pins\r")
    child.expect(r"p1 \(chat\): My name is Ada\.")
    child.expect("you>")
    child.send("four\r")
    # three turns and the pinned item: four user messages before the question
    child.expect("held 4 earlier turn")
    child.expect("you>")
    child.send("/unpin p7\r")
    child.expect("refused: no pinned item 'p7'")
    child.expect("you>")
    child.send("/unpin p1\r")
    child.expect("unpinned p1")
    child.expect("you>")
    child.send("/pins\r")
    child.expect("nothing pinned")
    child.expect("you>")
    child.send("/exit\r")
    finish(child)
    con = sqlite3.connect(tmp_path / "t.db")
    try:
        tags = [t for (t,) in con.execute("select tag from events order by seq")]
    finally:
        con.close()
    assert tags.count("summary_recorded") == 1
    assert tags.count("pin_added") == 1 and tags.count("pin_removed") == 1
    assert tags.count("turn_committed") == 4
