"""The exception hierarchy of turnledger.

::

    TurnLedgerError(Exception)
    ├── InvalidCommand          the caller broke the state machine; state unchanged
    │   ├── UnknownTurn             an edit or regenerate of a turn the branch does not have
    │   ├── UnknownBranch           a switch to a branch the session does not have
    │   ├── UnknownPin              an unpin of an item the session has not pinned
    │   ├── SessionBusy             a switch or a pin while a turn is in flight (policy: reject)
    │   └── SessionExists           a fork onto a session id that already has events
    ├── SummaryFailed           a summarizer failed, timed out or was cancelled
    ├── ReplayError             a stored log does not fold; the log is suspect
    ├── SessionClosed           the session or hub was used after it closed
    ├── ProviderSettingsError   no provider can be built from these settings
    ├── UnknownSession          no session has that id (never was, or erased)
    ├── CodecError              an event or envelope could not be encoded/decoded
    │   └── UnknownEventTag     a wire tag (or tag version) this release does not know
    ├── StoreError              failures of an event store, mapped at the boundary
    │   ├── ConcurrencyConflict     the stream moved: the expected version is stale
    │   ├── StoreUnavailable        the store cannot be reached or opened
    │   ├── StoreCorrupted          stored bytes fail their checks (names the place)
    │   ├── StoreFull               a configured size cap refuses the append
    │   │   └── StoreCapReached         the store's own size cap (not the disk) refuses it
    │   └── SessionOwnedElsewhere   another process owns the session
    │       └── LeaseLost               this store's lease was taken over: a stale append
    └── ProviderError           raised by provider adapters and stream decoders
        ├── DecodeError             bytes -> text -> frames -> JSON failed
        ├── LimitExceeded           a configured stream limit was hit
        └── StreamProtocolError     the chat protocol was broken

Cancellation is never wrapped: ``trio.Cancelled`` propagates untouched.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .events._events import DiscardReason

__all__ = [
    "CodecError",
    "ConcurrencyConflict",
    "DecodeError",
    "InvalidCommand",
    "LeaseLost",
    "LimitExceeded",
    "ProviderError",
    "ProviderSettingsError",
    "ReplayError",
    "SessionBusy",
    "SessionClosed",
    "SessionExists",
    "SessionOwnedElsewhere",
    "StoreCapReached",
    "StoreCorrupted",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "StreamProtocolError",
    "SummaryFailed",
    "TurnLedgerError",
    "UnknownBranch",
    "UnknownEventTag",
    "UnknownPin",
    "UnknownSession",
    "UnknownTurn",
    "WrongEventLoop",
]


class TurnLedgerError(Exception):
    """Base class of every error turnledger raises on purpose."""


class InvalidCommand(TurnLedgerError):
    """A message is not allowed in the session's current state.

    The state is unchanged and nothing was written.
    """


class UnknownTurn(InvalidCommand, LookupError):
    """An edit or a regenerate names a turn the active branch does not have
    (or a regenerate of a branch with no turn). Nothing was written."""


class UnknownBranch(InvalidCommand, LookupError):
    """A switch names a branch the session does not have. Nothing was written."""


class UnknownPin(InvalidCommand, LookupError):
    """An unpin names an item the session has not pinned (or unpinned
    already). Nothing was written."""


class SummaryFailed(TurnLedgerError):
    """A summarizer raised, timed out or was cancelled, or its text cannot be
    recorded. Nothing was written; no turn was changed or held up. The
    message names the cause's type, never what a provider answered."""


class SessionBusy(InvalidCommand):
    """A switch while a turn is in flight, in a session whose busy policy is
    ``reject`` (under ``supersede`` the turn in flight is discarded first);
    a pin or an unpin while a turn is in flight, whatever the policy.
    Nothing was written."""


class SessionExists(InvalidCommand):
    """A fork names, as its new session, a session id that already has
    events. Nothing was written."""

    def __init__(self, session_id: str, detail: str = "") -> None:
        self.session_id = session_id
        super().__init__(detail or f"session {session_id!r} exists already")


class WrongEventLoop(TurnLedgerError, RuntimeError):
    """A trio API was called from asyncio, or the asyncio one from trio.

    The message says which one to use instead (:mod:`turnledger.aio` under
    asyncio, :func:`turnledger.sessions.open_hub` under trio).
    """


class ReplayError(TurnLedgerError):
    """A stored event sequence cannot be folded into a state."""


class SessionClosed(TurnLedgerError):
    """A session, turn or hub was used after it was closed."""


class ProviderSettingsError(TurnLedgerError, ValueError):
    """A provider cannot be built from its settings: an unknown protocol, an
    API key variable that is not set, a base URL that is not ``http(s)://``.

    Raised before any connection is made or client created.
    """


class UnknownSession(TurnLedgerError, LookupError):
    """No session has this id: it never existed, or it was erased. Raised by
    operations that need one (an erasure); nothing was changed."""

    def __init__(self, session_id: str, detail: str = "") -> None:
        self.session_id = session_id
        super().__init__(detail or f"no session {session_id!r}")


class CodecError(TurnLedgerError):
    """An event or envelope could not be encoded or decoded."""


class UnknownEventTag(CodecError):
    """The wire tag, or its schema version, is not known to this release."""


class StoreError(TurnLedgerError):
    """An event store failed; the batch being appended was not written."""


class ConcurrencyConflict(StoreError):
    """The session's stream moved: ``expected_version`` is stale.

    Nothing from the refused batch was written.
    """

    def __init__(self, session_id: str, expected_version: int, actual_version: int | None) -> None:
        self.session_id = session_id
        self.expected_version = expected_version
        self.actual_version = actual_version
        super().__init__(
            f"session {session_id!r}: expected version {expected_version}, "
            f"found {actual_version if actual_version is not None else 'a newer one'}"
        )


class StoreUnavailable(StoreError):
    """The store cannot be reached, opened or locked."""


class StoreCorrupted(StoreError):
    """Stored data fails its integrity checks; nothing was rewritten."""


class EncryptionError(StoreError):
    """Encrypted content could not be written or read; nothing was changed.

    The subclasses say why. Raised by
    :class:`~turnledger.adapters.encryption.EncryptedStore`.
    """


class DecryptionFailed(EncryptionError):
    """A ciphertext does not open under its session's data key at its place:
    the key is wrong, or the row was copied from another session, sequence
    number, event type or store. Never garbage: nothing is returned."""


class WrongKey(EncryptionError):
    """The key-encryption key cannot unwrap a session's data key: it is not
    the key the data key was wrapped with, or that key is not provided."""


class PlaintextRefused(EncryptionError):
    """A plaintext row was found in (or offered to) an encrypted store."""


class ContentEncrypted(CodecError):
    """The stored content is encrypted and no key was given to read it.

    The message says how to give one; the ciphertext is never shown.
    """


class StoreFull(StoreError):
    """A configured size cap refused the append; the store is unchanged."""


class StoreCapReached(StoreFull):
    """The store's configured size cap (not the disk) refused the append,
    after whatever could make room (a compaction, retention) was tried; the
    store is unchanged."""


class SessionOwnedElsewhere(StoreError):
    """Another process holds the session; this one must not write to it."""

    def __init__(self, session_id: str, detail: str = "") -> None:
        self.session_id = session_id
        msg = f"session {session_id!r} is owned by another process"
        super().__init__(f"{msg}: {detail}" if detail else msg)


def describe_store_error(exc: BaseException) -> str:
    """What a store error tells a caller (a result's ``detail``, an HTTP
    error's message): its class, then the innermost cause the store mapped,
    named as the system names it: ``StoreFull: ENOSPC (No space left on
    device)``, ``StoreFull: database or disk is full (SQLITE_FULL)``, the
    server's own message for PostgreSQL. The store's wording, which names
    files, goes to the log only; an error with no cause is told as it is."""
    inner = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    name = type(exc).__name__
    if inner is exc:
        return f"{name}: {exc}"
    if isinstance(inner, OSError) and inner.errno is not None:
        code = errno.errorcode.get(inner.errno, str(inner.errno))
        return f"{name}: {code} ({inner.strerror or 'no description'})"
    text = str(inner).strip().partition("\n")[0] or type(inner).__name__
    sqlite_code = getattr(inner, "sqlite_errorname", None)
    return f"{name}: {text} ({sqlite_code})" if sqlite_code else f"{name}: {text}"


class ProviderError(TurnLedgerError):
    """A provider adapter or stream decoder failed.

    ``reason`` is one of the closed set of discard reasons (see
    :data:`turnledger.events.DISCARD_REASONS`).
    """

    reason: DiscardReason = "protocol"

    def __init__(self, message: str, *, reason: DiscardReason | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class DecodeError(ProviderError):
    """Bytes, text, framing or JSON were not well formed."""

    reason = "malformed"


class LimitExceeded(ProviderError):
    """A configured stream limit was exceeded; the stream was abandoned."""

    reason = "limit"


class StreamProtocolError(ProviderError):
    """The chat protocol on top of well-formed frames was broken."""

    reason = "protocol"


class LeaseLost(SessionOwnedElsewhere):
    """This store's lease on the session was taken over (it ran out while the
    owner was stalled): the append was refused as stale and nothing was written.

    ``epoch`` is the lease this store held; ``current_epoch`` the one found
    (``None`` if the lease is gone).
    """

    def __init__(self, session_id: str, epoch: int, current_epoch: int | None) -> None:
        self.epoch = epoch
        self.current_epoch = current_epoch
        super().__init__(
            session_id,
            f"this store's lease (epoch {epoch}) was taken over"
            f" (epoch now {current_epoch}); it must not write to the session",
        )
