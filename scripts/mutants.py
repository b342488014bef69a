#!/usr/bin/env python3
"""Plant each bug of docs/testing.md's mutant table, one at a time, and check
that the test named for it fails.

    python scripts/mutants.py             # every mutant
    python scripts/mutants.py --list      # what each one changes, and its tests

Each mutant is a one-place text change to a source file. The file is changed,
the named tests run (in a child pytest), and the file is written back as it
was, whatever happened; a file with uncommitted changes is refused, so an
interrupted run can always be undone with ``git checkout``. A mutant whose
tests still pass "survived": the run says so and exits 1.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Mutant(NamedTuple):
    """One planted bug: in ``path``, ``old`` (found exactly once) becomes ``new``."""

    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


_CW = "tests/core/test_context_window.py::"
_AT_ONCE = "tests/sessions/test_answer_at_once.py::"
MUTANTS = (
    Mutant(
        "after an overflow the cap is 4/5 of the failed estimate, not 3/4",
        "src/turnledger/sessions/_budgets.py",
        "else failed * 3 // 4",
        "else failed * 4 // 5",
        (
            _CW + "test_an_overflow_with_nothing_smaller_to_send_caps_at_three_quarters",
            _CW + "test_an_overflow_retries_below_three_quarters_of_the_failed_request",
        ),
    ),
    Mutant(
        "the overflow cap ignores the largest request that committed",
        "src/turnledger/sessions/_budgets.py",
        "    cap = ok if 0 < ok < failed else failed * 3 // 4",
        "    cap = failed * 3 // 4",
        (_CW + "test_overflow_before_any_byte_retries_once_with_a_smaller_projection",),
    ),
    Mutant(
        "the retry after an overflow is planned without the shrunk cap",
        "src/turnledger/sessions/_machine.py",
        "token_cap=prompt_token_cap(shrunk, budget)",
        "token_cap=prompt_token_cap(state, budget)",
        (_CW + "test_an_overflow_retries_below_three_quarters_of_the_failed_request",),
    ),
    Mutant(
        "a cancelled asyncio waiter leaves its trio task running",
        "src/turnledger/aio/_hub.py",
        "            self.cancel(scope)\n            raise",
        "            raise",
        ("tests/test_aio_bridge.py::test_a_cancelled_asyncio_waiter_ends_its_trio_task",),
    ),
    Mutant(
        "the trio run ends and an asyncio call still waiting is never failed",
        "src/turnledger/aio/_hub.py",
        "            self.bridge.fail_pending()",
        "            pass",
        ("tests/test_aio_bridge.py::test_a_trio_run_that_ends_fails_the_calls_still_waiting",),
    ),
    Mutant(
        "the SQLite damage check lets one lost acknowledged event through",
        "src/turnledger/adapters/stores/sqlite.py",
        "    if last < mark:",
        "    if last + 1 < mark:",
        ("tests/stores/test_sqlite_acknowledged.py",),
    ),
    Mutant(
        "only a lower-case \\u003a sends a text to the exact parse",
        "src/turnledger/wire/_strict_json.py",
        'if "\\\\u003" in text',
        'if "\\\\u003a" in text',
        ("tests/providers/test_json_escapes.py",),
    ),
    Mutant(
        "a password keyword is found in lower case only",
        "src/turnledger/cli/_errors.py",
        "    re.IGNORECASE,\n)\n_MASK",
        ")\n_MASK",
        ("tests/cli/test_masking.py",),
    ),
    Mutant(
        "evolve records a tool error as a success",
        "src/turnledger/sessions/_machine.py",
        "ToolResult(event.call_id, event.content, event.is_error)",
        "ToolResult(event.call_id, event.content, False)",
        ("tests/core/test_machine_table.py::test_every_pair_matches_the_table",),
    ),
    Mutant(
        "a turn's tool rounds are left out of every later request",
        "src/turnledger/sessions/_projection.py",
        "    if not t.rounds:\n        return [",
        "    if True:\n        return [",
        (
            "tests/core/test_projection.py::"
            "test_projection_of_tool_turns_chooses_what_the_naive_loop_chooses",
        ),
    ),
    Mutant(
        "the default token estimate counts 5 tokens a message, not 4",
        "src/turnledger/sessions/_projection.py",
        "per_message: int = attrs.field(default=4,",
        "per_message: int = attrs.field(default=5,",
        (_CW + "test_submitted_records_the_estimate_of_the_request_sent",),
    ),
    Mutant(
        "an answer at once goes before the messages queued while it was asked",
        "src/turnledger/runtime/_actor.py",
        "batch = mailbox.receive_nowait(MAX_BATCH)\n                batch += inline",
        "batch = inline + mailbox.receive_nowait(MAX_BATCH)",
        (_AT_ONCE + "test_a_cancel_queued_before_a_retry_answered_at_once_comes_first",),
    ),
    Mutant(
        "a question answered at once is appended apart from its answer",
        "src/turnledger/runtime/_actor.py",
        "if rt.answer_now is not None and events:",
        "if False:",
        (_AT_ONCE + "test_a_question_answered_at_once_is_one_append",),
    ),
    Mutant(
        "the answer at once is folded into the state but not appended",
        "src/turnledger/runtime/_actor.py",
        "events = events + events_more",
        "events = list(events)",
        (_AT_ONCE + "test_the_log_is_the_same_with_and_without_the_answer_at_once",),
    ),
)


def _clean(path: Path) -> bool:
    """Whether git knows ``path`` with no uncommitted change."""
    done = subprocess.run(
        ["git", "status", "--porcelain", "--", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode == 0 and not done.stdout.strip()


def run(mutant: Mutant, timeout: float) -> bool:
    """Plant ``mutant``, run its tests, restore the file; True if killed."""
    path = ROOT / mutant.path
    original = path.read_text()
    if original.count(mutant.old) != 1:
        msg = f"{mutant.path}: the text to change is not there exactly once: {mutant.old!r}"
        raise SystemExit(msg)
    path.write_text(original.replace(mutant.old, mutant.new))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *mutant.tests],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        path.write_text(original)
    lines = done.stdout.strip().splitlines()
    killed = done.returncode == 1  # tests failed (not: an error collecting them)
    print(f"{'killed  ' if killed else 'SURVIVED'} {mutant.what}: {lines[-1] if lines else ''}")
    return killed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--list", action="store_true", help="print the mutants and their tests")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's tests")
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTANTS:
            print(f"{m.what}\n  {m.path}: {m.old.strip()!r} -> {m.new.strip()!r}")
            for test in m.tests:
                print(f"  killed by {test}")
        return 0
    dirty = sorted({m.path for m in MUTANTS if not _clean(ROOT / m.path)})
    if dirty:
        print(f"uncommitted changes in {', '.join(dirty)}: commit or stash them first")
        return 2
    survived = [m.what for m in MUTANTS if not run(m, args.timeout)]
    print(f"{len(MUTANTS) - len(survived)} of {len(MUTANTS)} mutants killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
