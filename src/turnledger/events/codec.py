"""The one codec between typed events and JSON-able payloads.

Each event class has an explicit, stable wire tag (the table below, never the
class name) and a schema version. Payloads written by an older release are
brought up to date by *upcasters*: ``(tag, from_version) -> function`` steps
applied one version at a time before the payload is structured.

Decoding is strict: unknown tags, unknown versions, missing or extra fields and
values of the wrong JSON type raise :class:`~turnledger.CodecError`, never a
half-built event. Strings are never coerced into numbers or back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NoReturn, TypeAlias

import attrs
import cattrs
from cattrs.strategies import configure_tagged_union

from .._errors import CodecError, ContentEncrypted, UnknownEventTag
from ._envelope import StoredEvent, envelope
from ._events import (
    BranchStarted,
    BranchSwitched,
    CompletionIgnored,
    Event,
    HistoryPolicy,
    Ledger,
    PinAdded,
    PinRemoved,
    SessionForked,
    SessionStarted,
    StreamStarted,
    SummaryRecorded,
    SummarySent,
    ToolCallsRequested,
    ToolResultRecorded,
    ToolRoundSubmitted,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnRetried,
    TurnSubmitted,
    Window,
)
from ._exact_json import fast_loads as _fast_loads
from ._exact_json import loads_exact
from ._store import PayloadNotJSON
from ._structurers import Declined, Structurer, Unstructurer, structurers, unstructurer

__all__ = [
    "DEFAULT_CODEC",
    "ENCRYPTED_FIELD",
    "SCHEMA_VERSIONS",
    "UPCASTERS",
    "WIRE_TAGS",
    "EventCodec",
    "Upcaster",
    "decode",
    "encode",
    "from_payload",
    "to_payload",
]

#: Wire tags, frozen once released. Renaming a class must not change its tag.
WIRE_TAGS: Final[Mapping[type[Any], str]] = {
    SessionStarted: "session_started",
    TurnSubmitted: "turn_submitted",
    TurnRejected: "turn_rejected",
    StreamStarted: "stream_started",
    TurnCommitted: "turn_committed",
    TurnDiscarded: "turn_discarded",
    CompletionIgnored: "completion_ignored",
    ToolCallsRequested: "tool_calls_requested",
    ToolResultRecorded: "tool_result_recorded",
    ToolRoundSubmitted: "tool_round_submitted",
    TurnRetried: "turn_retried",
    BranchStarted: "branch_started",
    BranchSwitched: "branch_switched",
    SessionForked: "session_forked",
    SummaryRecorded: "summary_recorded",
    SummarySent: "summary_sent",
    PinAdded: "pin_added",
    PinRemoved: "pin_removed",
}
_CLASSES: Final[Mapping[str, type[Any]]] = {tag: cls for cls, tag in WIRE_TAGS.items()}

#: Current schema version of each tag's payload.
SCHEMA_VERSIONS: Final[Mapping[str, int]] = {
    "session_started": 4,
    "turn_submitted": 2,
    "turn_rejected": 1,
    "stream_started": 1,
    "turn_committed": 1,
    "turn_discarded": 2,
    "completion_ignored": 2,
    "tool_calls_requested": 1,
    "tool_result_recorded": 1,
    "tool_round_submitted": 1,
    "turn_retried": 1,
    "branch_started": 1,
    "branch_switched": 1,
    "session_forked": 1,
    "summary_recorded": 1,
    "summary_sent": 1,
    "pin_added": 1,
    "pin_removed": 1,
}

#: The only field of an encrypted payload (see
#: :mod:`turnledger.adapters.encryption`): a codec that meets it was given
#: ciphertext without the key, and says so rather than calling it damage.
ENCRYPTED_FIELD: Final = "$enc"

_POLICY_TAGS: Final[Mapping[type[Any], str]] = {Ledger: "ledger", Window: "window"}

Payload: TypeAlias = dict[str, Any]
Upcaster: TypeAlias = Callable[[Payload], Payload]


def _session_started_v1_to_v2(payload: Payload) -> Payload:
    # v1 stored the history window as a bare ``max_turns`` (null for "keep
    # everything") and had no busy policy.
    out = {k: v for k, v in payload.items() if k != "max_turns"}
    max_turns = payload.get("max_turns")
    out["policy"] = (
        {"kind": "ledger"} if max_turns is None else {"kind": "window", "max_turns": max_turns}
    )
    out.setdefault("on_busy", "reject")
    return out


def _session_started_v2_to_v3(payload: Payload) -> Payload:
    # v2 had no tools (a plain chat session) and recorded no context window
    # (such a session keeps working as it did, with no token cap of its own).
    return {
        **payload,
        "tools": [],
        "tool_choice": "auto",
        "max_tool_rounds": 8,
        "on_tool_error": "report",
        "context_window": None,
        "output_reserve": None,
        "window_source": "none",
    }


def _session_started_v3_to_v4(payload: Payload) -> Payload:
    # v3 recorded no subject (such a session belongs to nobody named) and no
    # retention of its own.
    return {**payload, "subject": None, "retain_seconds": None, "retain_turns": None}


def _turn_discarded_v1_to_v2(payload: Payload) -> Payload:
    # v1 did not record how much preview the caller had seen.
    return {**payload, "preview_chars": 0}


def _turn_submitted_v1_to_v2(payload: Payload) -> Payload:
    # v1 did not record the prompt's estimated tokens.
    return {**payload, "estimated_prompt_tokens": None}


def _completion_ignored_v1_to_v2(payload: Payload) -> Payload:
    # v1 did not record the usage of a late answer.
    return {**payload, "usage": None}


#: The upcasters of this release: ``(tag, from_version) -> step to from_version + 1``.
UPCASTERS: Final[Mapping[tuple[str, int], Upcaster]] = {
    ("session_started", 1): _session_started_v1_to_v2,
    ("session_started", 2): _session_started_v2_to_v3,
    ("session_started", 3): _session_started_v3_to_v4,
    ("turn_submitted", 1): _turn_submitted_v1_to_v2,
    ("turn_discarded", 1): _turn_discarded_v1_to_v2,
    ("completion_ignored", 1): _completion_ignored_v1_to_v2,
}


def _strict(expected: type[Any] | tuple[type[Any], ...]) -> Callable[[Any, Any], Any]:
    def structure(value: Any, _type: Any) -> Any:
        # bool is an int subclass in Python but not a number on the wire.
        if isinstance(value, bool) and expected is not bool:
            raise TypeError(f"expected {_type}, got a boolean")
        if not isinstance(value, expected):
            raise TypeError(f"expected {_type}, got {type(value).__name__}")
        return value

    return structure


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    conv.register_structure_hook(str, _strict(str))
    conv.register_structure_hook(int, _strict(int))
    conv.register_structure_hook(bool, _strict(bool))
    conv.register_structure_hook(float, _strict((int, float)))
    configure_tagged_union(
        HistoryPolicy,
        conv,
        tag_generator=lambda cls: _POLICY_TAGS[cls],
        tag_name="kind",
    )
    return conv


@attrs.define
class EventCodec:
    """Turns events into ``(tag, schema_version, payload)`` and back.

    Args:
        upcasters: ``(tag, from_version) -> function`` steps; the default is
            this release's :data:`UPCASTERS`.
        versions: the current schema version of each tag.
    """

    upcasters: Mapping[tuple[str, int], Upcaster] = attrs.field(default=UPCASTERS)
    versions: Mapping[str, int] = attrs.field(default=SCHEMA_VERSIONS)
    _converter: cattrs.Converter = attrs.field(factory=_make_converter, init=False)
    # Generated strict structurers for current-version payloads: the common
    # case of replay. Anything they do not accept exactly goes through cattrs,
    # which either builds the same event or raises a detailed CodecError.
    # tag -> (its current version, its structurer).
    _current: dict[str, tuple[int, Structurer]] = attrs.field(init=False)

    # Generated unstructurers, one per event class: what cattrs' hooks give,
    # without their dispatch (see ``unstructurer``). Class -> (its tag, its
    # current version, its unstructurer).
    _encoders: dict[type[Any], tuple[str, int, Unstructurer]] = attrs.field(init=False)

    @_current.default
    def _current_default(self) -> dict[str, tuple[int, Structurer]]:
        fast = structurers(_CLASSES)
        return {t: (self.versions[t], f) for t, f in fast.items() if t in self.versions}

    @_encoders.default
    def _encoders_default(self) -> dict[type[Any], tuple[str, int, Unstructurer]]:
        hook = self._converter.get_unstructure_hook
        return {
            cls: (tag, self.versions[tag], unstructurer(cls, hook))
            for cls, tag in WIRE_TAGS.items()
            if tag in self.versions
        }

    def to_payload(self, event: Event) -> tuple[str, int, Payload]:
        """Return the wire tag, schema version and JSON-able payload of ``event``."""
        entry = self._encoders.get(type(event))
        if entry is None:
            self._refuse(event)
        tag, version, unstructure = entry
        return tag, version, unstructure(event)

    def _refuse(self, event: object) -> NoReturn:
        if type(event) in WIRE_TAGS:
            # A tag without a version in ``versions`` (as the cattrs path did).
            raise KeyError(WIRE_TAGS[type(event)])
        raise CodecError(f"not an event: {type(event).__name__}")

    def from_payload(self, tag: str, schema_version: int, payload: Mapping[str, Any]) -> Event:
        """Rebuild a typed event, upcasting old payloads first.

        Raises:
            UnknownEventTag: the tag or the version is not known.
            CodecError: the payload does not match the event's schema.
        """
        entry = self._current.get(tag)
        if entry is not None and entry[0] == schema_version:
            try:
                event: Event = entry[1](payload)
                return event
            except (Declined, ValueError, TypeError):
                pass  # let cattrs explain
        if isinstance(payload, Mapping) and ENCRYPTED_FIELD in payload:
            raise ContentEncrypted(
                f"{tag}: the content is encrypted; open the store with its key to read it"
            )
        cls = _CLASSES.get(tag)
        current = self.versions.get(tag)
        if cls is None or current is None:
            raise UnknownEventTag(f"unknown event tag {tag!r}")
        if not isinstance(payload, Mapping):
            raise CodecError(f"{tag}: payload must be a JSON object")
        if type(schema_version) is not int or not 1 <= schema_version <= current:
            raise UnknownEventTag(
                f"{tag}: schema version {schema_version!r} is not known (current {current})"
            )
        data = dict(payload)
        for version in range(schema_version, current):
            step = self.upcasters.get((tag, version))
            if step is None:
                raise UnknownEventTag(f"{tag}: no upcaster from version {version}")
            data = step(data)
        try:
            event = self._converter.structure(data, cls)
        except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
            detail = _describe(exc)
            raise CodecError(f"{tag} v{schema_version}: bad payload: {detail}") from exc
        return event

    def encode(self, event: Event, *, session_id: str, seq: int, recorded_at: float) -> StoredEvent:
        """Wrap ``event`` in the envelope stores keep."""
        # (to_payload inlined, and positional: every turn encodes its events.)
        entry = self._encoders.get(type(event))
        if entry is None:
            self._refuse(event)
        return envelope(session_id, seq, entry[0], entry[1], entry[2](event), recorded_at)

    def decode(self, stored: StoredEvent) -> Event:
        """Rebuild the typed event inside a stored envelope."""
        try:
            return self.from_payload(stored.tag, stored.schema_version, stored.payload)
        except CodecError as exc:
            raise type(exc)(f"session {stored.session_id!r} seq {stored.seq}: {exc}") from exc

    def decode_json(
        self, session_id: str, seq: int, tag: str, schema_version: int, text: str | bytes
    ) -> Event:
        """Rebuild the typed event from a payload's JSON text, without an envelope.

        The same event :meth:`decode` gives for the envelope of that text
        (:meth:`decode_rows` does this for each row a store that keeps JSON
        text reads). Current-version payloads of the common events take a
        fast path: orjson, then the generated structurer. That structurer
        accepts only strings, integers, ``None`` and nested objects of them,
        never a float, so when it accepts orjson's result the parse was exact
        (orjson's only inexact result is a float for an integer beyond 64
        bits). Anything it declines is parsed again exactly
        (:func:`json.loads` semantics) and decoded as :meth:`decode` would.

        Raises:
            PayloadNotJSON: ``text`` is not a JSON object in UTF-8: damage the
                store reports as such (``StoreCorrupted``).
            UnknownEventTag, CodecError: as :meth:`decode`.
        """
        entry = self._current.get(tag)
        if entry is not None and entry[0] == schema_version:
            try:
                event: Event = entry[1](_fast_loads(text))
                return event
            except (Declined, ValueError, TypeError):
                pass  # not JSON to orjson, or not exactly this schema: decide below
        return self._decode_exact(session_id, seq, tag, schema_version, text)

    def _decode_exact(
        self, session_id: str, seq: int, tag: str, schema_version: int, text: str | bytes
    ) -> Event:
        # decode_json without its fast path: json.loads semantics, then cattrs
        # (and upcasters) through from_payload.
        try:
            # Bytes are the UTF-8 of a text column: decoded strictly, as the
            # store's read() would (json.loads would also take a BOM, UTF-16
            # or UTF-32, and encoded surrogates).
            payload = loads_exact(text if isinstance(text, str) else text.decode("utf-8"))
        except ValueError as exc:
            raise PayloadNotJSON(f"the payload is not JSON: {exc}") from exc
        if type(payload) is not dict:
            raise PayloadNotJSON(f"the payload is a JSON {type(payload).__name__}, not an object")
        try:
            return self.from_payload(tag, schema_version, payload)
        except CodecError as exc:
            raise type(exc)(f"session {session_id!r} seq {seq}: {exc}") from exc

    def decode_rows(
        self, session_id: str, rows: Iterable[tuple[int, str, int, str | bytes]]
    ) -> list[Event]:
        """:meth:`decode_json` of each ``(seq, tag, schema_version, text)`` row.

        The replay loop of the stores that keep JSON text: the fast path of
        :meth:`decode_json` inlined, since it runs once per event replayed.

        Raises:
            PayloadNotJSON: a text is not a JSON object in UTF-8.
            UnknownEventTag, CodecError: as :meth:`decode`.
        """
        exact = self._decode_exact
        loads = _fast_loads
        current = self._current
        out: list[Event] = []
        append = out.append
        for seq, tag, version, text in rows:
            entry = current.get(tag)
            if entry is not None and entry[0] == version:
                try:
                    append(entry[1](loads(text)))
                    continue
                except (Declined, ValueError, TypeError):
                    pass  # decided exactly below
            append(exact(session_id, seq, tag, version, text))
        return out


def _describe(exc: BaseException) -> str:
    if isinstance(exc, cattrs.BaseValidationError):
        parts = []
        for sub, note in zip(
            exc.exceptions,
            getattr(exc, "__notes__", []) or [None] * len(exc.exceptions),
            strict=False,
        ):
            notes = getattr(sub, "__notes__", None) or ([note] if note else [])
            where = "; ".join(str(n) for n in notes)
            inner = _describe(sub)
            parts.append(f"{where}: {inner}" if where else inner)
        return "; ".join(parts) or str(exc)
    return str(exc) or type(exc).__name__


#: The codec of this release.
DEFAULT_CODEC: Final[EventCodec] = EventCodec()
to_payload = DEFAULT_CODEC.to_payload
from_payload = DEFAULT_CODEC.from_payload
encode = DEFAULT_CODEC.encode
decode = DEFAULT_CODEC.decode
