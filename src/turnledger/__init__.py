"""turnledger: LLM chat sessions whose history can be trusted.

A turn enters history only when a complete, accepted answer arrived. Every
session is an actor whose typed events go to an append-only log, and replaying
the log rebuilds history exactly.

The everyday names are here, so a program imports from ``turnledger`` alone::

    from turnledger import CommittedResult, open_hub, open_provider, open_store

- :func:`open_hub` (trio; :mod:`turnledger.aio` has asyncio's), :func:`open_store`
  and :func:`open_provider`;
- the stores (:class:`MemoryStore`, :class:`SQLiteStore`,
  :class:`JournalStore`, :class:`PostgresStore`) and the providers
  (:class:`OpenAIChat`, :class:`OllamaChat`, :class:`AnthropicChat`,
  :class:`OpenAIResponses`), with :class:`ProviderSettings`,
  :class:`RetryPolicy` and :class:`StreamLimits`;
- :class:`Tool` (a tool gets a :class:`ToolInvocation` and raises
  :class:`ToolError` for an error the model should see), the history
  policies :class:`Ledger` and :class:`Window`, and what a turn gives back:
  :class:`TurnResult`, one of :class:`CommittedResult`,
  :class:`DiscardedResult` or :class:`RejectedResult`, with its :class:`Turn`;
- every error (the tree is drawn in :mod:`turnledger._errors`).

Everything but the errors loads on first use (module ``__getattr__``):
``import turnledger`` stays as quick as the errors alone, and so does
``turnledger --help``. The rest lives in the subpackages: :mod:`.sessions`
(the pure core and the hub's types), :mod:`.events`, :mod:`.adapters`,
:mod:`.aio`, :mod:`.serve`, :mod:`.testing`.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._errors import (
    CodecError,
    ConcurrencyConflict,
    ContentEncrypted,
    DecodeError,
    DecryptionFailed,
    EncryptionError,
    InvalidCommand,
    LeaseLost,
    LimitExceeded,
    PlaintextRefused,
    ProviderError,
    ProviderSettingsError,
    ReplayError,
    SessionBusy,
    SessionClosed,
    SessionExists,
    SessionOwnedElsewhere,
    StoreCapReached,
    StoreCorrupted,
    StoreError,
    StoreFull,
    StoreUnavailable,
    StreamProtocolError,
    SummaryFailed,
    TurnLedgerError,
    UnknownBranch,
    UnknownEventTag,
    UnknownPin,
    UnknownSession,
    UnknownTurn,
    WrongEventLoop,
    WrongKey,
)

if _TYPE_CHECKING:
    from .adapters.providers import (
        AnthropicChat,
        OllamaChat,
        OpenAIChat,
        OpenAIResponses,
        ProviderSettings,
        RetryPolicy,
        StreamLimits,
        open_provider,
    )
    from .adapters.stores import JournalStore, MemoryStore, PostgresStore, SQLiteStore, open_store
    from .events import Ledger, Window
    from .sessions import (
        CommittedResult,
        DiscardedResult,
        RejectedResult,
        Tool,
        ToolError,
        ToolInvocation,
        Turn,
        TurnResult,
        open_hub,
    )

__version__ = "0.1.0"

__all__ = [
    "AnthropicChat",
    "CodecError",
    "CommittedResult",
    "ConcurrencyConflict",
    "ContentEncrypted",
    "DecodeError",
    "DecryptionFailed",
    "DiscardedResult",
    "EncryptionError",
    "InvalidCommand",
    "JournalStore",
    "LeaseLost",
    "Ledger",
    "LimitExceeded",
    "MemoryStore",
    "OllamaChat",
    "OpenAIChat",
    "OpenAIResponses",
    "PlaintextRefused",
    "PostgresStore",
    "ProviderError",
    "ProviderSettings",
    "ProviderSettingsError",
    "RejectedResult",
    "ReplayError",
    "RetryPolicy",
    "SQLiteStore",
    "SessionBusy",
    "SessionClosed",
    "SessionExists",
    "SessionOwnedElsewhere",
    "StoreCapReached",
    "StoreCorrupted",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "StreamLimits",
    "StreamProtocolError",
    "SummaryFailed",
    "Tool",
    "ToolError",
    "ToolInvocation",
    "Turn",
    "TurnLedgerError",
    "TurnResult",
    "UnknownBranch",
    "UnknownEventTag",
    "UnknownPin",
    "UnknownSession",
    "UnknownTurn",
    "Window",
    "WrongEventLoop",
    "WrongKey",
    "__version__",
    "open_hub",
    "open_provider",
    "open_store",
]

#: Where each lazily loaded name lives (a public module, so that the name
#: is the very object its home module exports).
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        ("AnthropicChat", "OllamaChat", "OpenAIChat", "OpenAIResponses", "ProviderSettings",
         "RetryPolicy", "StreamLimits", "open_provider"),
        "turnledger.adapters.providers",
    ),
    **dict.fromkeys(
        ("JournalStore", "MemoryStore", "PostgresStore", "SQLiteStore", "open_store"),
        "turnledger.adapters.stores",
    ),
    **dict.fromkeys(("Ledger", "Window"), "turnledger.events"),
    **dict.fromkeys(
        ("CommittedResult", "DiscardedResult", "RejectedResult", "Tool", "ToolError",
         "ToolInvocation", "Turn", "TurnResult", "open_hub"),
        "turnledger.sessions",
    ),
}  # fmt: skip


def __getattr__(name: str) -> _Any:
    # Loaded on first use, then kept as a module global (so this runs once
    # per name): importing turnledger does not import trio, httpx or a store.
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
