"""turnledger: LLM chat sessions whose history can be trusted.

A turn enters history only when a complete, accepted answer arrived. Every
session is an actor whose typed events go to an append-only log, and replaying
the log rebuilds history exactly.
"""

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
    ReplayError,
    SessionClosed,
    SessionOwnedElsewhere,
    StoreCorrupted,
    StoreError,
    StoreFull,
    StoreUnavailable,
    StreamProtocolError,
    TurnLedgerError,
    UnknownEventTag,
    WrongEventLoop,
    WrongKey,
)

__version__ = "0.1.0"

__all__ = [
    "CodecError",
    "ConcurrencyConflict",
    "ContentEncrypted",
    "DecodeError",
    "DecryptionFailed",
    "EncryptionError",
    "InvalidCommand",
    "LeaseLost",
    "LimitExceeded",
    "PlaintextRefused",
    "ProviderError",
    "ReplayError",
    "SessionClosed",
    "SessionOwnedElsewhere",
    "StoreCorrupted",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "StreamProtocolError",
    "TurnLedgerError",
    "UnknownEventTag",
    "WrongEventLoop",
    "WrongKey",
    "__version__",
]
