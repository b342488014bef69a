"""The SQLite store against what happens to its files: a second process, a
damaged write-ahead log, read-only opening, paths that are not files."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from _procs import within
from turnledger import StoreCorrupted, StoreUnavailable
from turnledger.adapters.stores import SQLiteStore

from ._store_scenarios import stream_events as _events

pytestmark = pytest.mark.slow

_ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# --- item: one writer process per file ---------------------------------------

_SLOW_SERVER = (
    "import sys\n"
    "from turnledger.testing import LoopbackServer, chat_responder\n"
    "answer = lambda messages: 'a slow answer ' * 100\n"
    "server = LoopbackServer(chat_responder(answer, chunk_size=2, pause=0.02))\n"
    "with server.start_in_thread() as s:\n"
    "    print(s.openai_base_url, flush=True)\n"
    "    sys.stdin.read()\n"
)


def _tl(*args: str, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnledger", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=_ENV,
    )


def test_a_second_chat_on_the_file_does_not_touch_the_live_turn(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", _SLOW_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        base_url = within(30, server.stdout.readline, "the server").strip()
        first = subprocess.Popen(
            [sys.executable, "-m", "turnledger", "chat", "--db", "c.db", "--model", "m",
             "--base-url", base_url],
            cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=_ENV,
        )  # fmt: skip
        try:
            assert first.stdin is not None and first.stdout is not None
            first.stdin.write("first question\n")
            first.stdin.flush()
            assert (
                within(60, lambda: first.stdout.read(10)) == "a slow ans"
            )  # its answer is streaming
            # A second writer is refused, naming the first one.
            second = _tl("chat", "--db", "c.db", cwd=tmp_path, stdin="hello\n")
            assert second.returncode == 3, second.stdout + second.stderr
            assert f"locked by another writer (pid {first.pid}" in second.stderr
            # Readers go on beside the writer.
            sessions = _tl("sessions", "c.db", cwd=tmp_path)
            assert sessions.returncode == 0 and "chat" in sessions.stdout, sessions.stderr
            assert first.poll() is None
            out, err = first.communicate("", timeout=60)
        finally:
            if first.poll() is None:  # pragma: no cover - only when an assertion failed
                first.kill()
                first.wait(30)
        assert first.returncode == 0, err
        assert "discarded" not in out + err
    finally:
        server.communicate("", timeout=30)
    log = _tl("log", "c.db", cwd=tmp_path)
    assert "interrupted" not in log.stdout and "turn_committed" in log.stdout, log.stdout


# --- item: a damaged write-ahead log -----------------------------------------

_WRITE_AND_DIE = """
import os, sys, trio
from turnledger.adapters.stores import SQLiteStore
from turnledger.events import DEFAULT_CODEC, RequestId, StreamStarted

async def main():
    store = await SQLiteStore.open(sys.argv[1])
    for sid in ("a", "b", "c"):
        events = [
            DEFAULT_CODEC.encode(StreamStarted(RequestId(f"{sid}/{i}")), session_id=sid, seq=i,
                                 recorded_at=1.7e9)
            for i in (1, 2, 3)
        ]
        await store.append(sid, events, 0)
    print("acknowledged", flush=True)
    sys.stdin.read()  # killed here: the commits stay in the write-ahead log

trio.run(main)
"""


def _crashed_writer(path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _WRITE_AND_DIE, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_ENV,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        assert within(60, child.stdout.readline).strip() == "acknowledged"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)


def _flip_in_frame(wal: Path, frame: int) -> None:
    # WAL: a 32-byte header (page size at bytes 8-12), then frames of a
    # 24-byte header and one page. Flip one bit in the page of ``frame``.
    data = bytearray(wal.read_bytes())
    page_size = int.from_bytes(data[8:12], "big")
    frames = (len(data) - 32) // (24 + page_size)
    index = frame if frame >= 0 else frames + frame
    at = 32 + index * (24 + page_size) + 24 + 100
    data[at] ^= 0x10
    wal.write_bytes(bytes(data))


@pytest.mark.parametrize("frame", [-1, 0], ids=["last-commit", "first-frame"])
async def test_a_damaged_wal_is_refused_and_left_as_it_is(tmp_path: Path, frame: int) -> None:
    path = tmp_path / "events.db"
    _crashed_writer(path)
    wal = tmp_path / "events.db-wal"
    assert wal.stat().st_size > 0
    _flip_in_frame(wal, frame)
    before = _files(tmp_path)
    with trio.fail_after(30):
        with pytest.raises(StoreCorrupted, match="nothing was changed"):
            await SQLiteStore.open(path, read_only=True)
        with pytest.raises(StoreCorrupted, match="nothing was changed"):
            await SQLiteStore.open(path)
    after = _files(tmp_path)
    after.pop("events.db-shm", None)  # SQLite's index of the log, rebuilt from it
    before.pop("events.db-shm", None)
    assert after.keys() == before.keys()
    for name in ("events.db", "events.db-wal"):
        assert after[name] == before[name], name


async def test_an_intact_wal_after_a_crash_opens_with_every_event(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    _crashed_writer(path)
    with trio.fail_after(30):
        store = await SQLiteStore.open(path)
        try:
            assert len(await store.read_all()) == 9
            assert await store.append("a", _events("a", 3), 3) == 6
        finally:
            await store.aclose()


async def test_a_new_file_after_the_old_one_was_removed_starts_afresh(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with trio.fail_after(30):
        async with await SQLiteStore.open(path) as store:
            await store.append("a", _events("a", 0), 0)
        path.unlink()
        async with await SQLiteStore.open(path) as store:
            assert await store.read_all() == []
            await store.append("b", _events("b", 0), 0)
        async with await SQLiteStore.open(path, read_only=True) as store:
            assert len(await store.read_all()) == 3


async def test_a_file_that_lost_acknowledged_events_is_refused(tmp_path: Path) -> None:
    # An older copy put back in place of the file (or a log cut short).
    path = tmp_path / "events.db"
    with trio.fail_after(30):
        async with await SQLiteStore.open(path) as store:
            await store.append("a", _events("a", 0), 0)
        older = path.read_bytes()
        async with await SQLiteStore.open(path) as store:
            await store.append("a", _events("a", 3), 3)
        path.write_bytes(older)
        with pytest.raises(StoreCorrupted, match="position 3, but position 6 was acknowledged"):
            await SQLiteStore.open(path)
        with pytest.raises(StoreCorrupted, match="position 6 was acknowledged"):
            await SQLiteStore.open(path, read_only=True)
        assert path.read_bytes() == older


# --- item: read-only opening creates and changes nothing ---------------------


async def test_read_only_opening_creates_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with trio.fail_after(30):
        async with await SQLiteStore.open(path) as store:
            await store.append("a", _events("a", 0), 0)
        before = _files(tmp_path)
        async with await SQLiteStore.open(path, read_only=True) as store:
            assert len(await store.read("a")) == 3
            assert await store.session_ids() == ["a"]
        assert _files(tmp_path) == before


async def test_a_read_only_snapshot_refuses_reads_after_a_writer_changed_the_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.db"
    with trio.fail_after(30):
        async with await SQLiteStore.open(path) as store:
            await store.append("a", _events("a", 0), 0)
        async with await SQLiteStore.open(path, read_only=True) as reader:
            assert len(await reader.read("a")) == 3
            async with await SQLiteStore.open(path) as store:
                await store.append("a", _events("a", 3), 3)
            # The writer checkpointed into the file on close.
            with pytest.raises(StoreUnavailable, match="open it again"):
                await reader.read("a")
        async with await SQLiteStore.open(path, read_only=True) as reader:
            assert len(await reader.read("a")) == 6


_AS_A_PLAIN_USER = """
import sys, trio
from turnledger import StoreError
from turnledger.adapters.stores import SQLiteStore

async def main():
    async with await SQLiteStore.open(sys.argv[1], read_only=True) as store:
        print("read", len(await store.read_all()))
    try:
        store = await SQLiteStore.open(sys.argv[1])
    except StoreError as exc:
        print("refused", type(exc).__name__, exc)
    else:
        print("opened for writing")
        await store.aclose()

trio.run(main)
"""


def _as_a_plain_user() -> list[str]:
    # Root writes anywhere: drop that power (the child stays uid 0, the owner
    # of the files, so their modes apply to it as to a normal user).
    if os.geteuid() != 0:  # pragma: no cover - the suite runs as root in CI
        return []
    if shutil.which("setpriv") is None:  # pragma: no cover
        pytest.skip("needs setpriv to drop root's power to write anywhere")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.mark.parametrize("folder_writable", [False, True])
def test_a_read_only_file_is_read_and_refused_for_writing_at_open(
    tmp_path: Path, folder_writable: bool
) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "events.db"
    trio.run(_write_three, path)
    (folder / "events.db.lock").unlink()
    path.chmod(0o444)
    if not folder_writable:
        folder.chmod(0o555)
    try:
        before = _files(folder)
        child = subprocess.run(
            [*_as_a_plain_user(), sys.executable, "-c", _AS_A_PLAIN_USER, str(path)],
            capture_output=True, text=True, timeout=60, env=_ENV,
        )  # fmt: skip
        lines = child.stdout.splitlines()
        assert lines[:1] == ["read 3"], child.stdout + child.stderr[-2000:]
        assert lines[1].startswith("refused StoreUnavailable"), lines
        assert _files(folder) == before  # nothing created, nothing changed
    finally:
        folder.chmod(0o755)


async def _write_three(path: Path) -> None:
    async with await SQLiteStore.open(path) as store:
        await store.append("a", _events("a", 0), 0)


# --- item: paths that are not files ------------------------------------------


@pytest.mark.parametrize("read_only", [False, True])
async def test_a_directory_or_a_device_as_the_file_says_so(tmp_path: Path, read_only: bool) -> None:
    folder = tmp_path / "events.db"
    folder.mkdir()
    device = tmp_path / "device.db"
    device.symlink_to("/dev/null")
    with trio.fail_after(30):
        with pytest.raises(StoreUnavailable, match="is a directory"):
            await SQLiteStore.open(folder, read_only=read_only)
        with pytest.raises(StoreUnavailable, match="is a device"):
            await SQLiteStore.open(device, read_only=read_only)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["device.db", "events.db"]
