"""A long conversation through the real ``turnledger chat``, with no budget
flags, against loopback servers that behave like real ones with a small
context window: every turn commits, old turns are dropped whole, and at
most one request per session meets a context overflow before the budget
adapts."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from turnledger.adapters.stores import open_store
from turnledger.events import DEFAULT_CODEC, SessionStarted, Window

from ._run import read_terminal, server_process, tl

pytestmark = pytest.mark.slow

QUESTIONS = [
    f"Question {i}: " + f"remember the number {i} and this filler text. " * 12 for i in range(10)
]


@contextlib.contextmanager
def model_server_process(tmp_path: Path, kind: str, n_ctx: int) -> Iterator[str]:
    """A loopback server playing ``kind`` in a process of its own; yields its base URL."""
    with server_process(tmp_path, f"model_server({kind!r}, n_ctx={n_ctx}, model='tiny')") as url:
        yield url


@pytest.mark.parametrize(
    ("kind", "source"),
    [("openai", "fallback"), ("silent", "fallback"), ("llamacpp", "discovered"),
     ("ollama", "discovered")],
)  # fmt: skip
def test_a_long_chat_keeps_committing(tmp_path: Path, kind: str, source: str) -> None:
    with model_server_process(tmp_path, kind, 1024) as base:
        provider = ["--provider", "ollama", "--base-url", base] if kind == "ollama" else [
            "--base-url", base + "/v1"
        ]  # fmt: skip
        r = tl(
            "chat", *provider, "--model", "tiny", "--db", "x.db", "--log-json",
            cwd=tmp_path, stdin="".join(q + "\n" for q in QUESTIONS), timeout=120,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["Noted."] * len(QUESTIONS)
    # the log says which window applies and where it came from (on a
    # terminal, the chat's first line says so)
    logs = [json.loads(line) for line in r.stderr.splitlines()]
    window = 8192 if source == "fallback" else 1024
    (chosen,) = [x for x in logs if x["event"] == "context_window"]
    assert (chosen["context_window"], chosen["window_source"]) == (window, source)
    if source == "fallback":
        assert [x for x in logs if x["event"] == "context_window_fallback"]

    replay = tl("replay", "x.db", "--json", cwd=tmp_path)
    (session,) = [json.loads(line) for line in replay.stdout.splitlines()]
    # history never loses a committed turn
    assert [t["question"] for t in session["turns"]] == QUESTIONS

    log = tl("log", "x.db", "--json", cwd=tmp_path)
    rows = [json.loads(line) for line in log.stdout.splitlines()]
    overflows = [row for row in rows if row["reason"] == "context_overflow"]
    assert len(overflows) <= 1
    assert not [row for row in rows if row["tag"] == "turn_discarded"]
    submitted = [row for row in rows if row["tag"] == "turn_submitted"]
    assert submitted[-1]["estimated_prompt_tokens"] > 0
    assert "dropped" in submitted[-1]["detail"] and not submitted[-1]["detail"].startswith(
        "9 turns sent"
    )  # old turns went, whole
    started = rows[0]
    assert (started["tag"], started["context_window"]) == ("session_started", window)

    sessions = tl("sessions", "x.db", "--json", cwd=tmp_path)
    (summary,) = [json.loads(line) for line in sessions.stdout.splitlines()]
    assert summary["turns"] == len(QUESTIONS) and summary["turns_dropped"] > 0
    assert summary["estimated_prompt_tokens"] > 0
    if kind != "silent":  # llama-cpp-python's way: no usage at all
        assert summary["prompt_tokens"] > 0
    text = tl("log", "x.db", cwd=tmp_path).stdout
    assert "tokens of" in text


def test_on_a_terminal_the_first_line_says_which_window_applies(tmp_path: Path) -> None:
    import os
    import pty

    with model_server_process(tmp_path, "llamacpp", 2048) as base:
        main, terminal = pty.openpty()
        try:
            chat = subprocess.run(
                [sys.executable, "-m", "turnledger", "chat", "--model", "tiny", "--base-url",
                 base + "/v1", "--db", "t.db", "--window", "3"],
                cwd=tmp_path, input=b"q1\nq2\n", stdout=subprocess.PIPE, stderr=terminal,
                timeout=60,
            )  # fmt: skip
            os.close(terminal)
            seen = read_terminal(main)
        finally:
            os.close(main)
    assert chat.returncode == 0
    first = seen.decode().splitlines()[0]
    assert first == (
        "[context window 2048 tokens (discovered), 512 kept for the answer; "
        "prompt budget ~1536 tokens]"
    )
    # --window 3 chose the bounded policy
    assert trio.run(_first_event, tmp_path / "t.db") == SessionStarted(
        "",
        "tiny",
        Window(3),
        "reject",
        context_window=2048,
        output_reserve=512,
        window_source="discovered",
    )


async def _first_event(path: Path) -> object:
    store = await open_store(path, read_only=True)
    try:
        return (await store.read_decoded("chat", DEFAULT_CODEC))[0]
    finally:
        await store.aclose()
