"""OpenTelemetry (turnledger.adapters.otel) with the SDK's in-memory exporter and reader."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from _pytest_guards import import_or_skip
from turnledger.adapters.providers import OpenAIChat
from turnledger.events import StoredEvent
from turnledger.sessions import CommittedResult, DiscardedResult, open_hub
from turnledger.testing import (
    Begin,
    Chunk,
    Finish,
    Hang,
    MemoryStore,
    Pause,
    ScriptedProvider,
    open_loopback_server,
    openai_stream_reply,
)

otel_sdk = import_or_skip("opentelemetry.sdk", required_by="TURNLEDGER_REQUIRE_OTEL")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from turnledger.adapters.otel import Telemetry  # noqa: E402

QUESTION = "what is the secret question"
ANSWER = "the confidential answer"


class Kit:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        meter_provider = MeterProvider(metric_readers=[self.reader])
        self.telemetry = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        found = []
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found


def no_content(span: ReadableSpan) -> None:
    values = [str(v) for v in (span.attributes or {}).values()]
    for event in span.events:
        values += [event.name, *(str(v) for v in (event.attributes or {}).values())]
    for text in (QUESTION, ANSWER, "secret", "confidential"):
        assert not any(text in v for v in values), (text, values)


@pytest.mark.loopback
async def test_a_committed_turn_over_http() -> None:
    kit = Kit()
    async with open_loopback_server() as server:
        server.enqueue(openai_stream_reply(ANSWER, usage=(11, 4)))
        provider = OpenAIChat(
            base_url=server.openai_base_url,
            api_key="sk-do-not-show",
            temperature=0.5,
            max_tokens=64,
            stop=["END"],
            include_usage=True,
        )
        async with (
            provider,
            open_hub(
                kit.telemetry.store(MemoryStore()),
                kit.telemetry.provider(provider),
                model="gpt-test",
            ) as hub,
        ):
            turn = await hub.submit("s1", QUESTION, request_id="r1")
            result = await turn.outcome()
    assert isinstance(result, CommittedResult)

    [span] = kit.spans()
    assert span.name == "chat gpt-test" and span.kind is SpanKind.CLIENT
    attributes = dict(span.attributes or {})
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-test",
        "gen_ai.request.max_tokens": 64,
        "gen_ai.request.temperature": 0.5,
        "gen_ai.request.stop_sequences": ("END",),
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 11,
        "gen_ai.usage.output_tokens": 4,
        "server.address": "127.0.0.1",
        "server.port": server.port,
        "turnledger.session_id": "s1",
        "turnledger.request_id": "r1",
        "turnledger.turns_sent": 0,
        "turnledger.turns_dropped": 0,
        "turnledger.request_bytes": len(server.exchanges[0].body),
        "turnledger.outcome": "committed",
    }
    assert [e.name for e in span.events] == ["turnledger.stream_started", "turnledger.first_chunk"]
    assert span.status.status_code is StatusCode.UNSET
    no_content(span)
    assert "sk-do-not-show" not in str(attributes)

    [duration] = kit.points("gen_ai.client.operation.duration")
    assert duration.count == 1 and "error.type" not in duration.attributes
    assert duration.attributes["gen_ai.provider.name"] == "openai"
    assert duration.attributes["gen_ai.request.model"] == "gpt-test"
    [first] = kit.points("gen_ai.client.operation.time_to_first_chunk")
    assert first.count == 1 and 0 < first.sum <= duration.sum


async def test_a_cancelled_turn() -> None:
    kit = Kit()
    provider = ScriptedProvider(lambda request: [Chunk("par"), Hang()])
    async with open_hub(
        kit.telemetry.store(MemoryStore()), kit.telemetry.provider(provider), model="m"
    ) as hub:
        turn = await hub.submit("s1", QUESTION)
        async for _ in turn.preview():
            break
        result = await turn.cancel()
    assert isinstance(result, DiscardedResult) and result.reason == "cancelled"
    [span] = kit.spans()
    assert span.name == "chat m"
    assert span.attributes is not None
    assert span.attributes["error.type"] == "cancelled"
    assert span.attributes["turnledger.outcome"] == "discarded"
    assert span.attributes["gen_ai.provider.name"] == "scriptedprovider"
    assert span.status.status_code is StatusCode.ERROR
    assert "gen_ai.response.finish_reasons" not in span.attributes
    no_content(span)
    [duration] = kit.points("gen_ai.client.operation.duration")
    assert duration.attributes["error.type"] == "cancelled"


async def test_a_timed_out_turn(autojump_clock: Any) -> None:
    kit = Kit()
    provider = ScriptedProvider(lambda request: [Begin(), Hang()])
    async with open_hub(
        kit.telemetry.store(MemoryStore()),
        kit.telemetry.provider(provider),
        model="m",
        idle_timeout=5,
    ) as hub:
        result = await (await hub.submit("s1", QUESTION)).outcome()
    assert isinstance(result, DiscardedResult) and result.reason == "timeout"
    [span] = kit.spans()
    assert span.attributes is not None
    assert span.attributes["error.type"] == "timeout"
    assert [e.name for e in span.events] == ["turnledger.stream_started"]
    no_content(span)
    assert kit.points("gen_ai.client.operation.time_to_first_chunk") == []


class SlowDiscards(MemoryStore):
    """Holds the first append of a discard for a second, so a completion gets late."""

    held = False

    async def append(
        self, session_id: str, events: Sequence[StoredEvent], expected_version: int
    ) -> int:
        if not self.held and any(e.tag == "turn_discarded" for e in events):
            self.held = True
            await trio.sleep(1)
        return await super().append(session_id, events, expected_version)


async def test_a_late_completion_is_a_linked_span(autojump_clock: Any) -> None:
    kit = Kit()
    provider = ScriptedProvider(lambda request: [Begin(), Pause(60.5), Finish(ANSWER)])
    async with open_hub(
        kit.telemetry.store(SlowDiscards()),
        kit.telemetry.provider(provider),
        model="m",
        idle_timeout=None,
        turn_deadline=60,
    ) as hub:
        result = await (await hub.submit("s1", QUESTION, request_id="r1")).outcome()
        await wait_all_tasks_blocked()
    assert isinstance(result, DiscardedResult) and result.reason == "timeout"
    turn, late = kit.spans()
    assert turn.name == "chat m" and turn.attributes is not None
    assert turn.attributes["error.type"] == "timeout"
    assert late.name == "turnledger.late_completion" and late.kind is SpanKind.INTERNAL
    assert [link.context for link in late.links] == [turn.context]
    [event] = late.events
    assert event.name == "turnledger.late_completion"
    assert dict(event.attributes or {}) == {
        "turnledger.outcome": "completed",
        "turnledger.turn_outcome": "discarded",
    }
    assert late.attributes == {"turnledger.session_id": "s1", "turnledger.request_id": "r1"}
    no_content(turn)
    no_content(late)


PROBE = """
import sys
{block}
import trio
import turnledger, turnledger.aio, turnledger.sessions
from turnledger.adapters import logging as _logging
from turnledger.adapters.providers import OpenAIChat, OllamaChat
from turnledger.adapters.stores import SQLiteStore, JournalStore
from turnledger.sessions import CommittedResult, open_hub
from turnledger.testing import MemoryStore, ScriptedProvider

async def main():
    async with open_hub(MemoryStore(), ScriptedProvider(), model="m") as hub:
        result = await (await hub.submit("s", "q")).outcome()
        assert isinstance(result, CommittedResult)

trio.run(main)
print("MODULES:", sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
try:
    import turnledger.adapters.otel
except ImportError as exc:
    print("ImportError:", exc)
"""

BLOCK = """
import importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
"""


def probe(block: str) -> list[str]:
    code = textwrap.dedent(PROBE).replace("{block}", block)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("MODULES:")) :]


def test_nothing_of_opentelemetry_is_imported_without_the_adapter() -> None:
    # Installed, but not imported by anything but the adapter itself.
    assert probe("")[0] == "MODULES: []"


def test_without_the_extra_the_library_runs_and_the_adapter_says_what_to_install() -> None:
    lines = probe(BLOCK)
    assert lines[0] == "MODULES: []"
    assert lines[1].startswith("ImportError:") and "turnledger[otel]" in lines[1]
