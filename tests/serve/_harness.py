"""A running ``turnledger serve`` child process, the loopback provider server
behind it, and a small SSE reader (shared by the serve tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from _procs import readline_within
from turnledger.testing import (
    Exchange,
    LoopbackServer,
    Reply,
    Stall,
    WritePause,
    openai_sse_chunks,
)

#: What the loopback server answers, by the question's first word.
#: ``slow N``: N deltas of "dN " 50 ms apart; ``hang``: headers, then silence;
#: ``late``: a complete answer only after 1.5 s; ``big K S``: K KiB of "x" in
#: deltas of 4 KiB, the first three S seconds apart; anything else: a quick
#: answer.


def answer_for(question: str) -> str:
    words = question.split()
    if words and words[0] == "slow":
        return "".join(f"{i:03d} " for i in range(1, int(words[1]) + 1))
    if words and words[0] == "big":
        return "x" * (int(words[1]) * 1024)
    return f"echo: {question}"


def responder(exchange: Exchange) -> Reply:
    question = exchange.json()["messages"][-1]["content"]
    word = question.split()[0] if question.split() else ""
    if word == "hang":
        return Reply(body=[Stall()])
    if word == "late":
        # The stream starts, then nothing until after the idle timeout: the
        # turn times out, and the complete answer that follows is ignored.
        chunks = openai_sse_chunks("a late answer", chunk_size=64, usage=(11, 3))
        return Reply(body=[chunks[0], WritePause(1.6), *chunks[1:]])
    if word == "big":
        gap = WritePause(float(question.split()[2]))
        parts: list[Any] = []
        for i, chunk in enumerate(openai_sse_chunks(answer_for(question), chunk_size=4096)):
            parts += [chunk, gap] if i < 4 else [chunk]
        return Reply(body=parts)
    if word == "slow":
        pause = float(question.split()[2]) if len(question.split()) > 2 else 0.05
        chunks = openai_sse_chunks(answer_for(question), chunk_size=4)
        body: list[Any] = []
        for chunk in chunks:
            body += [chunk, WritePause(pause)]
        return Reply(body=body)
    return Reply(body=openai_sse_chunks(answer_for(question), usage=(9, 4)))


#: Ids the library takes that the path of a URL cannot carry as they are.
ODD_IDS = ["café", "sid with space", ".", "..", "a/b", "~home", "%2e", "?x#y",
           "new\nline", "\u202e"]  # fmt: skip


@contextmanager
def loopback() -> Iterator[LoopbackServer]:
    with LoopbackServer(responder).start_in_thread() as server:
        yield server


class Serve:
    """A ``turnledger serve`` child on a free port."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        #: Where the child's stderr (its JSON log lines) goes.
        self.log = log

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kwargs)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def serve_command(db: str, base_url: str | None, *extra: str) -> list[str]:
    """``turnledger serve`` on a free port; ``base_url`` ``None``: the
    built-in loopback model server (serve's default, as chat's)."""
    model = ["--base-url", base_url, "--model", "m"] if base_url is not None else []
    return [
        sys.executable,
        "-m",
        "turnledger",
        "serve",
        "--db",
        db,
        "--port",
        "0",
        *model,
        "--log-json",
        *extra,
    ]


@contextmanager
def running(
    db: Path | str,
    base_url: str | None,
    *extra: str,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
) -> Iterator[Serve]:
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    log = (log_dir or Path(f"{db}").parent) / f"serve-{time.monotonic_ns()}.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            serve_command(str(db), base_url, *extra),
            stdout=subprocess.PIPE,
            stderr=err,
            env={**os.environ, **(env or {})},
        )
    try:
        line = readline_within(proc, 30)
        assert "listening on " in line, (line, log.read_text())
        yield Serve(proc, line.split("listening on ", 1)[1], log)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()


@contextmanager
def two_serving(
    dsn: str, base_url: str, log_dir: Path
) -> Iterator[tuple[Serve, Serve, httpx.Client, httpx.Client]]:
    """Two ``turnledger serve`` processes on one PostgreSQL, and a client of each."""
    with (
        running(dsn, base_url, log_dir=log_dir / "a") as first,
        running(dsn, base_url, log_dir=log_dir / "b") as second,
        first.client() as a,
        second.client() as b,
    ):
        yield first, second, a, b


_LINES: weakref.WeakKeyDictionary[httpx.Response, Iterator[str]] = weakref.WeakKeyDictionary()


def sse_events(
    response: httpx.Response, stop_after_deltas: int | None = None
) -> list[dict[str, Any]]:
    """The SSE events of a streamed response as ``{event, id, data}``; with
    ``stop_after_deltas`` it stops reading (the caller then closes)."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    deltas = 0
    if response not in _LINES:  # one line iterator per response, to read on later
        _LINES[response] = response.iter_lines()
    for line in _LINES[response]:
        if line == "":
            if current:
                current["data"] = json.loads(current.get("data", "null"))
                events.append(current)
                if current.get("event") == "delta":
                    deltas += 1
                    if stop_after_deltas is not None and deltas >= stop_after_deltas:
                        return events
                current = {}
            continue
        field, _, value = line.partition(":")
        current[field] = value[1:] if value.startswith(" ") else value
    return events


def post_turn(
    client: httpx.Client,
    session: str,
    question: str,
    rid: str | None = None,
    stop_after_deltas: int | None = None,
) -> tuple[int, list[dict[str, Any]] | Any]:
    body: dict[str, Any] = {"question": question}
    if rid is not None:
        body["request_id"] = rid
    with client.stream("POST", f"/v1/sessions/{session}/turns", json=body) as r:
        if r.headers["content-type"].startswith("text/event-stream"):
            return r.status_code, sse_events(r, stop_after_deltas)
        r.read()
        return r.status_code, r.json()
