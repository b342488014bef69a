"""Every public namespace, pinned: a name added, renamed or dropped shows up here
(and in the README) on purpose, never by accident. Names are listed
separated by spaces, in ``__all__`` order."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

PUBLIC: dict[str, str] = {
    "turnledger": (
        "AnthropicChat CodecError CommittedResult ConcurrencyConflict ContentEncrypted "
        "DecodeError DecryptionFailed DiscardedResult EncryptionError InvalidCommand "
        "JournalStore LeaseLost Ledger LimitExceeded MemoryStore OllamaChat OpenAIChat "
        "OpenAIResponses PlaintextRefused PostgresStore ProviderError ProviderSettings "
        "ProviderSettingsError RejectedResult ReplayError RetryPolicy SQLiteStore SessionBusy "
        "SessionClosed SessionExists SessionOwnedElsewhere StoreCapReached StoreCorrupted "
        "StoreError StoreFull StoreUnavailable StreamLimits StreamProtocolError SummaryFailed "
        "Tool ToolError ToolInvocation Turn TurnLedgerError TurnResult UnknownBranch "
        "UnknownEventTag UnknownPin UnknownSession UnknownTurn Window WrongEventLoop WrongKey "
        "__version__ open_hub open_provider open_store"
    ),
    "turnledger.aio": "Hub Opener TurnHandle open_hub",
    "turnledger.adapters.otel": "SEMCONV_VERSION Telemetry",
    "turnledger.adapters.encryption": (
        "KEYS_ENV KEY_FILE_ENV ContentEncrypted DecryptionFailed EncryptedStore EncryptionError "
        "KeyProvider KeyRing PlaintextRefused PostgresKeyRing SQLiteKeyRing SealedSnapshots "
        "StaticKeys WrappedKey WrongKey keys_from_env keys_from_environment keys_from_file "
        "new_key_line rotate_keys"
    ),
    "turnledger.events": (
        "BRANCH_KINDS DEFAULT_CODEC DISCARD_REASONS MAIN_BRANCH REJECT_REASONS SCHEMA_VERSIONS "
        "SUMMARY_ORIGINS WINDOW_SOURCES WIRE_TAGS BaseEventStore BranchId BranchKind "
        "BranchStarted BranchSwitched CompletionIgnored DiscardReason Erasure Event EventCodec "
        "EventDecoder EventStore HistoryPolicy Ledger OnBusy PayloadNotJSON PinAdded PinRemoved "
        "RejectReason RequestId SessionForked SessionId SessionStarted StoredEvent "
        "StreamStarted SummaryOrigin SummaryRecorded SummarySent ToolCall ToolCallsRequested "
        "ToolErrorPolicy ToolResultRecorded ToolRoundSubmitted ToolSpec TurnCommitted "
        "TurnDiscarded TurnRejected TurnRetried TurnSubmitted Usage Window WindowSource "
        "session_hash"
    ),
    "turnledger.sessions": (
        "EVENT_TRANSITIONS MAX_TOOL_RESULT_BYTES TRANSITIONS AnswersAtOnce AwaitingTools Branch "
        "BranchInfo Budget Cancel CharTokenEstimator ChatMessage ChatRequest Committed "
        "CommittedResult Completed Completion DescribesModels Discarded DiscardedResult Edit "
        "Ending Endings Failed Failure History Hub HubStatistics Idle InFlight Interrupt "
        "JsonChatEncoder Message ModelInfo ModelSummarizer Pending Pin Plan Provider "
        "RecordSummary Regenerate RejectedResult RequestEncoder ResponseStarted RetentionPolicy "
        "RetentionStep Role SessionState Start StreamSink Streaming Submit SummaryPolicy Switch "
        "Timeout TokenEstimator Tool ToolDone ToolError ToolInvocation ToolResult ToolRound "
        "Turn TurnHandle TurnResult Unpin branch_turns branches_of build_messages decide "
        "ending_of erase_sessions evolve fork_events fork_seed forks_of initial_state "
        "is_in_flight open_hub plan plan_retention prompt_token_cap prune_store replay "
        "replay_resolved replay_sessions replay_stored request_messages seed_of "
        "sessions_of_subject subject_of summary_of with_forks"
    ),
    "turnledger.sse": "SSEDecoder ServerSentEvent StreamLimits",
    "turnledger.text": "INVISIBLE_RANGES visible",
    "turnledger.timeline": (
        "BranchEntry BranchStart BranchSwitch End LateCompletion RetryEntry Row Step Timeline "
        "ToolCallEntry ToolRoundEntry branch_line branch_tree explain iso_time phase_name "
        "session_summary timeline"
    ),
    "turnledger.adapters.providers": (
        "PROVIDER_KINDS AnthropicChat AnthropicEncoder AnthropicEventValidator "
        "AnthropicStreamDecoder Endpoint NDJSONDecoder OllamaChat OllamaLineValidator "
        "OllamaResponseDecoder OllamaStreamDecoder OpenAIChat OpenAIChunkValidator "
        "OpenAIResponseDecoder OpenAIResponses OpenAIStreamDecoder ProviderKind "
        "ProviderSettings ResponseDecoder ResponsesEncoder ResponsesEventValidator "
        "ResponsesStreamDecoder "
        "RetryPolicy SSEDecoder ServerSentEvent StreamLimits Utf8Decoder configured_endpoint "
        "loads_object loads_strict map_httpx_error open_provider parse_openai_completion "
        "parse_retry_after"
    ),
    "turnledger.adapters.stores": (
        "JournalStore MemorySnapshots MemoryStore NodeInfo PostgresSnapshots PostgresStore "
        "PreviewDelta Previews SQLiteSnapshots SQLiteStats SQLiteStore SessionLease "
        "open_previews open_store snapshots_beside store_kind"
    ),
    "turnledger.testing": (
        "Abort Begin Chunk EventStoreContract Exchange Fail FaultyProvider FaultyStore "
        "Finish Hang Hook InSequence LoopbackServer MemoryStore Pause Reply ReplyScript "
        "Responder Script ScriptedProvider ServerKind SimulationFailure SimulationReport "
        "Stall Step WireProtocol WritePause answer_parts anthropic_error_event "
        "anthropic_sse_events anthropic_stream_reply chat_messages chat_responder "
        "echo_script error_reply media_type_of model_server ollama_json_reply "
        "ollama_ndjson_lines ollama_stream_reply ollama_tool_call_lines open_loopback_server "
        "openai_error_event openai_json_reply openai_sse_chunks openai_stream_reply "
        "openai_tool_call_chunks protocol_of responses_error_event responses_sse_events "
        "responses_stream_reply sample_events simulate sse_event tool_call_reply"
    ),
}


@pytest.mark.parametrize("name", PUBLIC)
def test_all_is_pinned_sorted_and_complete(name: str) -> None:
    module = importlib.import_module(name)
    names = list(module.__all__)
    assert names == PUBLIC[name].split()
    assert names == sorted(names, key=lambda n: (not n.isupper(), n)) or names == sorted(names)
    for n in names:
        assert getattr(module, n) is not None, f"{name}.{n} is listed but missing"
    public = {
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and not isinstance(v, type(importlib))
    }
    assert public <= set(names) | {"annotations"}, public - set(names)


def test_the_top_level_names_are_their_homes_objects_loaded_on_use() -> None:
    # Each everyday name is the object its public home module exports; it
    # loads on first use, and dir() lists it before that.
    import subprocess
    import sys

    import turnledger

    lazy = turnledger._LAZY
    assert set(lazy) == set(turnledger.__all__) - set(vars(turnledger._errors)) - {"__version__"}
    for name, home in lazy.items():
        assert name in importlib.import_module(home).__all__
        assert getattr(turnledger, name) is getattr(importlib.import_module(home), name)
    probe = (
        "import sys, turnledger\n"
        "listed = set(dir(turnledger)) >= set(turnledger.__all__)\n"
        "print(listed, 'trio' in sys.modules, 'turnledger.sessions' in sys.modules)\n"
        "turnledger.Tool\n"
        "print('turnledger.sessions' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["True", "False", "False", "True"]
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        turnledger.nope  # noqa: B018


def test_the_type_checker_sees_every_lazy_name() -> None:
    # The names mypy sees (the TYPE_CHECKING imports) are the lazy ones.
    import ast

    import turnledger

    tree = ast.parse(Path(turnledger.__file__).read_text(encoding="utf-8"))
    [block] = [
        n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n.test)
    ]
    seen = {a.name for n in block.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert seen == set(turnledger._LAZY)


_PRIVATE_KIT_IMPORT = re.compile(r"turnledger\.testing\.(_\w+) import (\([^)]*\)|[^\n]*)")


def _public_names_taken_privately(text: str, kit: set[str]) -> list[str]:
    return [
        f"{module}.{name}"
        for module, names in _PRIVATE_KIT_IMPORT.findall(text)
        for name in sorted(kit & set(re.findall(r"\w+", names)))
    ]


def test_tests_take_the_testing_kit_by_its_public_names() -> None:
    # A test is the kit's first user: it imports from turnledger.testing
    # whatever that exports, never from the private module behind it (in
    # code, or in code that a test runs in a child process).
    kit = set(importlib.import_module("turnledger.testing").__all__)
    found = {
        path.name: taken
        for path in sorted(Path(__file__).parent.rglob("*.py"))
        if path != Path(__file__)  # (its sample below)
        and (taken := _public_names_taken_privately(path.read_text(encoding="utf-8"), kit))
    }
    assert found == {}
    # The check sees both forms, and lets a private name through.
    sample = (
        "from turnledger.testing._scripted import Chunk, Finish\n"
        "from turnledger.testing._crash import (\n    run_trial,\n    Hook,\n)\n"
        "from turnledger.testing import ScriptedProvider\n"
    )
    taken = _public_names_taken_privately(sample, kit)
    assert taken == ["_scripted.Chunk", "_scripted.Finish", "_crash.Hook"]
