"""What users need to test code built on turnledger.

- :class:`ScriptedProvider` and its steps: an in-process provider that plays a
  script per request, so tests can force every race.
- :class:`LoopbackServer` / :func:`open_loopback_server`: a real HTTP/1.1
  server on 127.0.0.1 that plays a :data:`ReplyScript`, faults included. In
  a :class:`Reply` body, :class:`WritePause` pauses the writes,
  :class:`Stall` stops writing and keeps the connection open, :class:`Abort`
  closes it.
- Reply builders for what OpenAI-compatible servers, Ollama, Anthropic's
  Messages API and OpenAI's Responses API send (:func:`openai_stream_reply`,
  :func:`ollama_stream_reply`, :func:`anthropic_stream_reply`,
  :func:`responses_stream_reply`, :func:`answer_parts`,
  :func:`error_reply`, :func:`chat_responder`, ...).

The scripted provider's steps and the loopback server's body parts are
different things with different names: :class:`Pause` and :class:`Hang` are
steps of a :class:`ScriptedProvider` :data:`Script`; :class:`WritePause` and
:class:`Stall` are parts of a :class:`Reply` body.
- :class:`EventStoreContract`: the contract suite every event store passes.
- :class:`MemoryStore`: the in-memory store.
- :func:`simulate`: the deterministic simulation of the whole runtime under
  faults, one seed at a time, built on :class:`FaultyStore` (faults of any
  store's appends, and a crash point) and :class:`FaultyProvider`.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ..adapters.stores.memory import MemoryStore
from ._faults import FaultyProvider, FaultyStore
from ._loopback import (
    Abort,
    Exchange,
    LoopbackServer,
    Reply,
    ReplyScript,
    Responder,
    Stall,
    WritePause,
    open_loopback_server,
)
from ._replies import (
    WireProtocol,
    answer_parts,
    anthropic_error_event,
    anthropic_sse_events,
    anthropic_stream_reply,
    chat_messages,
    chat_responder,
    error_reply,
    media_type_of,
    ollama_json_reply,
    ollama_ndjson_lines,
    ollama_stream_reply,
    ollama_tool_call_lines,
    openai_error_event,
    openai_json_reply,
    openai_sse_chunks,
    openai_stream_reply,
    openai_tool_call_chunks,
    protocol_of,
    responses_error_event,
    responses_sse_events,
    responses_stream_reply,
    sse_event,
    tool_call_reply,
)
from ._samples import sample_events
from ._scripted import (
    Begin,
    Chunk,
    Fail,
    Finish,
    Hang,
    Hook,
    InSequence,
    Pause,
    Script,
    ScriptedProvider,
    Step,
    echo_script,
)
from ._servers import ServerKind, model_server
from ._simulation import SimulationFailure, SimulationReport, simulate

if _TYPE_CHECKING:
    from ._contract import EventStoreContract

__all__ = [
    "Abort",
    "Begin",
    "Chunk",
    "EventStoreContract",
    "Exchange",
    "Fail",
    "FaultyProvider",
    "FaultyStore",
    "Finish",
    "Hang",
    "Hook",
    "InSequence",
    "LoopbackServer",
    "MemoryStore",
    "Pause",
    "Reply",
    "ReplyScript",
    "Responder",
    "Script",
    "ScriptedProvider",
    "ServerKind",
    "SimulationFailure",
    "SimulationReport",
    "Stall",
    "Step",
    "WireProtocol",
    "WritePause",
    "answer_parts",
    "anthropic_error_event",
    "anthropic_sse_events",
    "anthropic_stream_reply",
    "chat_messages",
    "chat_responder",
    "echo_script",
    "error_reply",
    "media_type_of",
    "model_server",
    "ollama_json_reply",
    "ollama_ndjson_lines",
    "ollama_stream_reply",
    "ollama_tool_call_lines",
    "open_loopback_server",
    "openai_error_event",
    "openai_json_reply",
    "openai_sse_chunks",
    "openai_stream_reply",
    "openai_tool_call_chunks",
    "protocol_of",
    "responses_error_event",
    "responses_sse_events",
    "responses_stream_reply",
    "sample_events",
    "simulate",
    "sse_event",
    "tool_call_reply",
]


def __getattr__(name: str) -> _Any:
    # The contract suite needs pytest; everything else here must not, so the
    # command line can use the loopback server without the test extra.
    if name == "EventStoreContract":
        from ._contract import EventStoreContract

        globals()[name] = EventStoreContract
        return EventStoreContract
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
