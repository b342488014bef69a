import errno
import json
import os
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog.testing
import trio

import turnledger
from turnledger import ConcurrencyConflict, StoreCorrupted, StoreFull, StoreUnavailable
from turnledger.adapters.stores import JournalStore
from turnledger.adapters.stores import journal as journal_module
from turnledger.events import DEFAULT_CODEC, EventStore, RequestId, StreamStarted
from turnledger.testing import EventStoreContract, sample_events

from ._store_scenarios import stream_events as _events


class TestJournalStore(EventStoreContract):
    supports_reopen = True

    async def open_store(self, path: Path) -> EventStore:
        return await JournalStore.open(path / "events.jsonl")


async def _write_journal(path: Path, appends: int = 3) -> None:
    """Sessions a and b, ``appends`` appends of 3 events each, interleaved."""
    store = await JournalStore.open(path)
    try:
        for r in range(appends):
            sid = "ab"[r % 2]
            version = len(await store.read(sid))
            await store.append(sid, _events(sid, version), version)
    finally:
        await store.aclose()


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


async def test_lines_are_plain_json_with_a_verifiable_checksum(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    store = await JournalStore.open(path)
    try:
        await store.append(
            "s-1",
            [
                DEFAULT_CODEC.encode(e, session_id="s-1", seq=i, recorded_at=1.7e9)
                for i, e in enumerate(sample_events(), 1)
            ],
            0,
        )
    finally:
        await store.aclose()
    lines = _lines(path)
    assert len(lines) == len(sample_events())
    for n, line in enumerate(lines, 1):
        assert line.endswith(b"\n")
        record = json.loads(line)
        assert list(record)[-1] == "crc32"
        assert record["position"] == n and record["seq"] == n
        assert record["batch_end"] == len(lines)
        # The documented rule: CRC-32 of the line without its crc32 member.
        body = line.rstrip(b"\n")[:-20] + b"}"
        assert f"{zlib.crc32(body):08x}" == record["crc32"]
    assert "你好" in lines[0].decode()  # readable text, not \\u escapes


async def test_size_cap_refuses_and_leaves_the_file_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    await _write_journal(path, appends=2)
    size = path.stat().st_size
    before = path.read_bytes()
    store = await JournalStore.open(path, max_bytes=size + 200)  # a line is ~170 bytes
    try:
        version = len(await store.read("a"))
        with pytest.raises(StoreFull, match="cap"):
            await store.append("a", _events("a", version), version)
        assert path.read_bytes() == before
        assert store.size == size
        # A smaller append that fits still goes in.
        assert await store.append("a", _events("a", version, 1), version) == version + 1
        assert path.stat().st_size <= size + 200
    finally:
        await store.aclose()


_DEEP = b"[" * 5000 + b"]" * 5000  # deeper than the interpreter's stack


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(
            lambda b: b.replace(b'"tag":"stream_started"', b'"tag":"stream_startee"', 1),
            id="bad-checksum",
        ),
        pytest.param(lambda b: b[:10] + b"}" + b[11:], id="bad-json"),
        pytest.param(lambda b: b"", id="deleted-line"),
        # Valid checksums over bytes that are not UTF-8 JSON text, although
        # json.loads of bytes would take them:
        pytest.param(lambda b: _resealed(b"\xef\xbb\xbf" + _unsealed(b)), id="bom"),
        pytest.param(
            lambda b: _resealed(_unsealed(b).replace(b'_id":"', b'_id":"\xed\xa0\x80', 1)),
            id="encoded-surrogate",
        ),
        pytest.param(
            lambda b: _resealed(
                _unsealed(b).replace(b'"tag":', b'"deep":' + _DEEP + b',"tag":', 1)
            ),
            id="nested-too-deep",
        ),
    ],
)
async def test_damaged_middle_line_is_an_error_naming_it(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    path = tmp_path / "events.jsonl"
    await _write_journal(path)
    lines = _lines(path)
    lines[4] = damage(lines[4])
    path.write_bytes(b"".join(lines))
    before = path.read_bytes()
    with pytest.raises(StoreCorrupted, match="line 5"):
        await JournalStore.open(path)
    assert path.read_bytes() == before
    # The lock was released: a fixed file opens again.
    path.write_bytes(b"".join(_lines(path)[:3]))
    await (await JournalStore.open(path)).aclose()


def _unsealed(line: bytes) -> bytes:
    # The record without its crc32 member (what the checksum covers).
    return line[: line.rindex(b',"crc32":')] + b"}"


def _resealed(body: bytes) -> bytes:
    return body[:-1] + b',"crc32":"%08x"}\n' % zlib.crc32(body)


def _flip_crc(line: bytes) -> bytes:
    digit = b"1" if line[-4:-3] == b"0" else b"0"
    return line[:-4] + digit + b'"}\n'


@pytest.mark.parametrize(
    ("tear", "reason"),
    [
        (lambda lines: [*lines[:-1], lines[-1][:-40]], "no newline"),
        (lambda lines: [*lines[:-1], lines[-1][:-40] + b"\0" * 40], "no newline"),
        # Part of the last write never reached the disk: zeros, then its end.
        (lambda lines: [*lines[:-1], b"\0" * 60 + lines[-1][60:]], "zeros"),
        (lambda lines: lines[:-1], "incomplete"),  # an append of 3 lost its last line
    ],
)
async def test_torn_tail_is_cut_with_a_warning(
    tmp_path: Path, tear: Callable[[list[bytes]], list[bytes]], reason: str
) -> None:
    path = tmp_path / "events.jsonl"
    await _write_journal(path)
    lines = _lines(path)
    intact = b"".join(lines[:6])  # the first two appends
    path.write_bytes(b"".join(tear(lines)))
    with structlog.testing.capture_logs() as logs:
        store = await JournalStore.open(path)
    try:
        assert [(e.session_id, e.seq) for e in await store.read_all()] == [
            ("a", 1),
            ("a", 2),
            ("a", 3),
            ("b", 1),
            ("b", 2),
            ("b", 3),
        ]
        assert path.read_bytes() == intact
        [warning] = [entry for entry in logs if entry["log_level"] == "warning"]
        assert warning["event"] == "journal_torn_tail_cut"
        assert warning["line"] == 7 and reason in warning["reason"]
        # The cut bytes were kept in a side file, named in the warning.
        saved = Path(warning["saved_to"])
        assert saved.parent == tmp_path and saved.name.startswith("events.jsonl.torn-")
        assert intact + saved.read_bytes() == b"".join(tear(lines))
        # The journal goes on from there.
        assert await store.append("a", _events("a", 3), 3) == 6
    finally:
        await store.aclose()
    reopened = await JournalStore.open(path)
    try:
        assert len(await reopened.read_all()) == 9
    finally:
        await reopened.aclose()


def _flip_bit(line: bytes) -> bytes:
    i = line.index(b'"tag":') + 8
    return line[:i] + bytes([line[i] ^ 0x04]) + line[i + 1 :]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_flip_crc, id="checksum"),
        pytest.param(_flip_bit, id="flipped-bit"),
        pytest.param(lambda b: b.replace(b'"tag":"', b'"tag":"\xff', 1), id="not-utf8"),
        pytest.param(lambda b: b'{"position": 9, "seq\n', id="not-json"),
        pytest.param(lambda b: b"\0" + b[1:], id="one-zero-byte"),
    ],
)
async def test_a_complete_damaged_last_line_is_refused_not_cut(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    # A last line with its newline was written whole: if it fails its
    # checks it is damage (the acknowledged append it holds must not be cut).
    path = tmp_path / "events.jsonl"
    await _write_journal(path)
    lines = _lines(path)
    path.write_bytes(b"".join([*lines[:-1], damage(lines[-1])]))
    before = path.read_bytes()
    with pytest.raises(StoreCorrupted, match="line 9"):
        await JournalStore.open(path)
    with pytest.raises(StoreCorrupted, match="line 9"):
        await JournalStore.open(path, read_only=True)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl", "events.jsonl.lock"]


async def test_a_failed_write_is_cut_off_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "events.jsonl"
    await _write_journal(path, appends=1)
    before = path.read_bytes()
    store = await JournalStore.open(path)
    try:

        def disk_full(fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(journal_module, "_sync", disk_full)
        with pytest.raises(StoreFull):
            await store.append("a", _events("a", 3), 3)
        assert path.read_bytes() == before
        monkeypatch.undo()
        assert await store.read("a", after=3) == []
        assert await store.append("a", _events("a", 3), 3) == 6
        with pytest.raises(ConcurrencyConflict):
            await store.append("a", _events("a", 3), 3)
    finally:
        await store.aclose()


_SECOND_OPENER = """
import sys, trio
from turnledger import StoreUnavailable
from turnledger.adapters.stores import JournalStore

async def main():
    try:
        store = await JournalStore.open(sys.argv[1])
    except StoreUnavailable as exc:
        print("refused:", exc)
        return
    await store.aclose()
    print("opened")

trio.run(main)
"""


def _run_python(code: str, *args: str) -> str:
    src = str(Path(turnledger.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    return done.stdout.strip()


async def test_second_process_cannot_open_for_writing(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    store = await JournalStore.open(path)
    try:
        await store.append("a", _events("a", 0), 0)
        out = await trio.to_thread.run_sync(_run_python, _SECOND_OPENER, str(path))
        assert out.startswith("refused:")
        assert f"pid {os.getpid()}" in out and "locked" in out
        # In this process too.
        with pytest.raises(StoreUnavailable, match=f"pid {os.getpid()}"):
            await JournalStore.open(path)
        # Reading without the lock works, as a snapshot.
        snapshot = await JournalStore.open(path, read_only=True)
        try:
            assert len(await snapshot.read("a")) == 3
            with pytest.raises(StoreUnavailable, match="read-only"):
                await snapshot.append("a", _events("a", 3), 3)
        finally:
            await snapshot.aclose()
    finally:
        await store.aclose()
    out = await trio.to_thread.run_sync(_run_python, _SECOND_OPENER, str(path))
    assert out == "opened"


async def test_read_only_skips_a_torn_tail_without_cutting(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    await _write_journal(path, appends=2)
    torn = path.read_bytes() + b'{"position":7,"sess'
    path.write_bytes(torn)
    with structlog.testing.capture_logs() as logs:
        store = await JournalStore.open(path, read_only=True)
    try:
        assert len(await store.read_all()) == 6
    finally:
        await store.aclose()
    assert path.read_bytes() == torn
    assert [e["event"] for e in logs] == ["journal_torn_tail_skipped"]


@pytest.mark.parametrize(
    "content",
    [b'{"name": "my precious data"}\n', b"hello world", b"hello\nworld\n", b"\x00\x00hi"],
)
@pytest.mark.parametrize("read_only", [False, True])
async def test_a_file_that_is_not_a_journal_is_refused_untouched(
    tmp_path: Path, content: bytes, read_only: bool
) -> None:
    path = tmp_path / "notes.jsonl"
    path.write_bytes(content)
    with pytest.raises(StoreCorrupted, match="line 1"):
        await JournalStore.open(path, read_only=read_only)
    assert path.read_bytes() == content


async def test_a_first_append_torn_by_a_crash_is_still_cut(tmp_path: Path) -> None:
    # The process died while writing the very first record: what is left is
    # the start of a record of ours, so the journal opens, empty.
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"position":1,"session_id":"s","se')
    store = await JournalStore.open(path)
    try:
        assert await store.read_all() == []
    finally:
        await store.aclose()
    assert path.read_bytes() == b""


async def test_zeros_left_by_a_crash_after_good_records_are_cut(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    store = await JournalStore.open(path)
    await store.append(
        "s",
        [
            DEFAULT_CODEC.encode(
                StreamStarted(RequestId("r")), session_id="s", seq=1, recorded_at=1.7e9
            )
        ],
        0,
    )
    await store.aclose()
    good = path.read_bytes()
    path.write_bytes(good + b"\x00" * 100)
    store = await JournalStore.open(path)
    try:
        assert [e.seq for e in await store.read("s")] == [1]
    finally:
        await store.aclose()
    assert path.read_bytes() == good


_OPEN_IN_A_SMALL_CHILD = """
import resource, sys, trio
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # 1 GiB: fail, never swap
from turnledger.adapters.stores import JournalStore

async def main():
    try:
        store = await JournalStore.open(sys.argv[1], read_only=sys.argv[2] == "ro")
    except Exception as exc:
        print(type(exc).__name__, exc)
    else:
        print("opened", len(await store.read_all()))
        await store.aclose()

trio.run(main)
"""


@pytest.mark.parametrize("mode", ["rw", "ro"])
def test_a_journal_that_is_a_device_is_refused_without_reading_it(
    tmp_path: Path, mode: str
) -> None:
    path = tmp_path / "events.jsonl"
    path.symlink_to("/dev/zero")
    child = subprocess.run(
        [sys.executable, "-c", _OPEN_IN_A_SMALL_CHILD, str(path), mode],
        capture_output=True,
        timeout=60,
        check=False,
    )
    out = child.stdout.decode()
    assert out.startswith("StoreUnavailable") and "is a device" in out, (out, child.stderr[-500:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl"]  # no lock file


async def test_a_directory_given_as_the_journal_says_so(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.mkdir()
    for read_only in (False, True):
        with pytest.raises(StoreUnavailable, match="is a directory"):
            await JournalStore.open(path, read_only=read_only)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl"]


async def test_a_journal_that_cannot_be_opened_leaves_no_lock_file(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable):
        await JournalStore.open(tmp_path / "missing" / "events.jsonl")
    # A damaged journal (refused after its lock was taken) leaves none either.
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"not a journal\n")
    with pytest.raises(StoreCorrupted):
        await JournalStore.open(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl"]


async def test_no_read_goes_past_the_size_cap(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    await _write_journal(path)
    size = path.stat().st_size
    with pytest.raises(StoreFull, match=f"larger than its cap of {size - 1} bytes"):
        await JournalStore.open(path, max_bytes=size - 1, read_only=True)
    store = await JournalStore.open(path, max_bytes=size)
    try:
        assert len(await store.read_all()) == 9
    finally:
        await store.aclose()
