"""Every public namespace, pinned: a name added, renamed or dropped shows up here
(and in the README) on purpose, never by accident. Names are listed
separated by spaces, in ``__all__`` order."""

from __future__ import annotations

import importlib

import pytest

PUBLIC: dict[str, str] = {
    "turnledger": (
        "CodecError ConcurrencyConflict DecodeError InvalidCommand LeaseLost LimitExceeded "
        "ProviderError ReplayError SessionClosed SessionOwnedElsewhere StoreCorrupted "
        "StoreError StoreFull StoreUnavailable StreamProtocolError TurnLedgerError "
        "UnknownEventTag WrongEventLoop __version__"
    ),
    "turnledger.aio": "Hub Opener TurnHandle open_hub",
    "turnledger.adapters.otel": "SEMCONV_VERSION Telemetry",
    "turnledger.events": (
        "DEFAULT_CODEC DISCARD_REASONS REJECT_REASONS SCHEMA_VERSIONS WINDOW_SOURCES "
        "WIRE_TAGS CompletionIgnored DiscardReason Event EventCodec EventDecoder EventStore "
        "HistoryPolicy Ledger OnBusy PayloadNotJSON RejectReason RequestId SessionId "
        "SessionStarted StoredEvent StreamStarted ToolCall ToolCallsRequested "
        "ToolErrorPolicy ToolResultRecorded ToolRoundSubmitted ToolSpec TurnCommitted "
        "TurnDiscarded TurnRejected TurnRetried TurnSubmitted Usage Window WindowSource"
    ),
    "turnledger.sessions": (
        "EVENT_TRANSITIONS MAX_TOOL_RESULT_BYTES TRANSITIONS AwaitingTools Budget Cancel "
        "CharTokenEstimator ChatMessage ChatRequest Committed CommittedResult Completed "
        "Completion DescribesModels Discarded DiscardedResult Ending Endings Failed "
        "Failure History Hub HubStatistics Idle InFlight Interrupt JsonChatEncoder "
        "Message ModelInfo Pending Plan Provider RejectedResult RequestEncoder "
        "ResponseStarted Role SessionState Start StreamSink Streaming Submit "
        "Timeout TokenEstimator Tool ToolDone ToolError ToolInvocation "
        "ToolResult ToolRound Turn TurnHandle TurnResult build_messages decide "
        "ending_of evolve initial_state is_in_flight open_hub plan prompt_token_cap "
        "replay replay_sessions request_messages"
    ),
    "turnledger.sse": "SSEDecoder ServerSentEvent StreamLimits",
    "turnledger.adapters.providers": (
        "NDJSONDecoder OllamaChat OllamaLineValidator OllamaResponseDecoder "
        "OllamaStreamDecoder OpenAIChat OpenAIChunkValidator OpenAIResponseDecoder "
        "OpenAIStreamDecoder ResponseDecoder RetryPolicy SSEDecoder ServerSentEvent "
        "StreamLimits Utf8Decoder loads_object loads_strict map_httpx_error "
        "parse_openai_completion parse_retry_after"
    ),
    "turnledger.adapters.stores": (
        "JournalStore MemoryStore PostgresStore SQLiteStats SQLiteStore SessionLease open_store "
        "store_kind"
    ),
    "turnledger.testing": (
        "Abort Begin Chunk EventStoreContract Exchange Fail FaultyProvider FaultyStore Finish "
        "Hang Hook InSequence LoopbackServer MemoryStore Pause Reply ReplyScript Responder "
        "Script ScriptedProvider ServerKind SimulationFailure SimulationReport Stall Step "
        "WritePause chat_responder echo_script "
        "error_reply model_server ollama_json_reply ollama_ndjson_lines "
        "ollama_stream_reply ollama_tool_call_lines open_loopback_server "
        "openai_error_event openai_json_reply openai_sse_chunks openai_stream_reply "
        "openai_tool_call_chunks sample_events simulate sse_event tool_call_reply"
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
