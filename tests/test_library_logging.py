"""Logging that behaves like a library's, each case in a fresh interpreter.

An application that configures nothing sees nothing below WARNING, on stdout
or stderr; ``logging.basicConfig(level=INFO)`` shows the transitions; an
application's own structlog configuration gets turnledger's lines through
its processors and is left as it was.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from turnledger.runtime._log import EVENTS, FIELDS

RUN = """
import trio
from turnledger.sessions import open_hub
from turnledger.testing import Chunk, Finish, Hook, MemoryStore, ScriptedProvider

async def boom(request):
    raise RuntimeError("a bug in the provider")

def script(request):
    if request.messages[-1].content == "bug":
        return [Hook(boom)]
    return [Chunk("fine"), Finish()]

async def main():
    async with open_hub(MemoryStore(), ScriptedProvider(script), model="m") as hub:
        for i in range(5):
            await (await hub.submit(f"s{i}", f"question {i}")).outcome()
        await (await hub.submit("s-bug", "bug")).outcome()

trio.run(main)
"""


def run(before: str, after: str = "") -> tuple[str, str]:
    code = textwrap.dedent(before) + RUN + textwrap.dedent(after)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode(), done.stderr.decode()


def test_an_application_that_configures_nothing_sees_only_errors() -> None:
    after = """
    import logging
    from turnledger._logging import library_logger
    log = library_logger("turnledger.sessions").bind(session_id="s")
    # What is not shown is not built: the runtime can ask before it builds.
    assert not log.is_enabled_for(logging.INFO) and log.is_enabled_for(logging.WARNING)
    """
    out, err = run("", after)
    assert out == ""
    # Python's last-resort handler shows the one error, nothing below WARNING.
    assert err.count("request_error") == 1 and "error='RuntimeError'" in err
    assert err.strip().count("\n") == 0, err
    assert "a bug in the provider" not in err  # an exception's class name only


def test_basic_config_at_info_shows_the_transitions() -> None:
    before = """
    import json, logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(name)s %(levelname)s %(message)s")
    fields = []
    class Keep(logging.Handler):
        def emit(self, record):
            fields.append(record.turnledger)
    logging.getLogger("turnledger").addHandler(Keep())
    """
    after = """
    print(json.dumps(fields))
    """
    out, err = run(before, after)
    lines = err.splitlines()
    committed = [x for x in lines if "tag='turn_committed'" in x]
    assert len(committed) == 5
    assert all(x.startswith("turnledger.sessions INFO transition ") for x in committed)
    assert not any("message_received" in x for x in lines)  # debug stays quiet
    assert "question 1" not in err and "fine" not in err  # lengths, never text
    records = json.loads(out)
    first = next(r for r in records if r.get("tag") == "turn_committed")
    assert first["event"] == "transition" and first["session_id"] == "s0"
    assert {"seq", "from", "to", "request_id", "answer_chars"} <= set(first)
    assert {r["event"] for r in records} <= set(EVENTS)


def test_an_applications_structlog_configuration_is_used_and_left_intact() -> None:
    before = """
    import json, sys, structlog
    def mark(logger, method, event_dict):
        event_dict["app"] = "mine"
        event_dict["level"] = method
        return event_dict
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, mark,
                    structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
    )
    mine = structlog.get_config()
    import turnledger.adapters.logging, turnledger.aio, turnledger.cli
    from turnledger.adapters import providers, stores
    """
    after = """
    assert structlog.get_config() == mine, "the application's configuration changed"
    """
    out, err = run(before, after)
    assert err == ""
    lines = [json.loads(x) for x in out.splitlines()]
    assert lines and all(x["app"] == "mine" for x in lines)
    names = {x["event"] for x in lines}
    assert {"message_received", "transition", "actor_started", "request_error"} <= names
    assert names <= set(EVENTS)
    for line in lines:
        assert set(line) - {"event", "app", "level"} <= FIELDS, line
        assert line["level"] == EVENTS[line["event"]]
