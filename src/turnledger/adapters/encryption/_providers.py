"""Key-encryption keys: the ``KeyProvider`` port and its two bundled
implementations (an environment variable, a key file).

A provider wraps and unwraps the small per-session data keys; it never sees
an event. A cloud KMS plugs in by implementing the three methods (its
``wrap``/``unwrap`` calls the KMS; they run on a worker thread, so they may
block). Keys are written one per line as ``ID:BASE64`` (32 bytes, AES-256);
the first line is the current key, the others stay readable until every data
key has been rewrapped (:func:`~turnledger.adapters.encryption.rotate_keys`).
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Final, Protocol, runtime_checkable

import attrs
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..._errors import WrongKey

__all__ = [
    "KEYS_ENV",
    "KEY_FILE_ENV",
    "KeyProvider",
    "StaticKeys",
    "WrappedKey",
    "keys_from_env",
    "keys_from_environment",
    "keys_from_file",
    "new_key_line",
]

#: The environment variable :func:`keys_from_env` reads: ``ID:BASE64`` keys,
#: separated by commas or newlines, the current one first.
KEYS_ENV: Final = "TURNLEDGER_KEYS"
#: The environment variable naming a key file (the command line's ``--key-file``).
KEY_FILE_ENV: Final = "TURNLEDGER_KEY_FILE"

_NONCE: Final = 12


@attrs.frozen
class WrappedKey:
    """A data key encrypted under a key-encryption key: what a key ring keeps."""

    #: Which key-encryption key wrapped it.
    kek_id: str
    #: The provider's bytes (for :class:`StaticKeys`: nonce then AES-GCM ciphertext).
    blob: bytes = attrs.field(repr=False)


@runtime_checkable
class KeyProvider(Protocol):
    """Where key-encryption keys live: an environment variable, a file, a KMS.

    ``context`` binds a wrapped key to its store and session (it is the
    associated data of the wrap), so a wrapped key copied to another session
    does not unwrap there.
    """

    def current_kek_id(self) -> str:
        """The id of the key new data keys are wrapped with."""
        ...

    def wrap(self, data_key: bytes, context: bytes) -> WrappedKey:
        """Encrypt ``data_key`` under the current key-encryption key."""
        ...

    def unwrap(self, wrapped: WrappedKey, context: bytes) -> bytes:
        """The data key inside ``wrapped``.

        Raises:
            WrongKey: the key it names is not provided, or does not open it.
        """
        ...


@attrs.frozen
class StaticKeys:
    """A :class:`KeyProvider` over keys held in memory (AES-256-GCM wrap).

    Args:
        keys: key id -> 32 key bytes.
        current: the id new data keys are wrapped with (one of ``keys``).
    """

    keys: Mapping[str, bytes] = attrs.field(repr=False)
    current: str

    #: Unwrapping is a computation in memory (no I/O): a store may unwrap
    #: on its own I/O thread, with a session's first read. A provider
    #: without this attribute (a KMS) is called on a worker thread of its
    #: own.
    unwraps_in_memory: ClassVar[bool] = True

    def __attrs_post_init__(self) -> None:
        if self.current not in self.keys:
            raise ValueError(f"the current key {self.current!r} is not among the keys")
        for kid, key in self.keys.items():
            if len(key) != 32:
                raise ValueError(f"key {kid!r} has {len(key)} bytes; AES-256 needs 32")
            if not kid or ":" in kid or kid != kid.strip():
                raise ValueError(f"key id {kid!r} must be non-empty, without ':' or blanks")

    def current_kek_id(self) -> str:
        return self.current

    def wrap(self, data_key: bytes, context: bytes) -> WrappedKey:
        nonce = os.urandom(_NONCE)
        sealed = AESGCM(self.keys[self.current]).encrypt(nonce, data_key, context)
        return WrappedKey(self.current, nonce + sealed)

    def unwrap(self, wrapped: WrappedKey, context: bytes) -> bytes:
        key = self.keys.get(wrapped.kek_id)
        if key is None:
            raise WrongKey(
                f"the data key was wrapped with key {wrapped.kek_id!r}, which is not provided"
            )
        try:
            return AESGCM(key).decrypt(wrapped.blob[:_NONCE], wrapped.blob[_NONCE:], context)
        except InvalidTag:
            raise WrongKey(
                f"key {wrapped.kek_id!r} does not unwrap this data key: wrong key material, "
                "or the wrapped key belongs to another session or store"
            ) from None


def new_key_line(kek_id: str) -> str:
    """A fresh random key as one ``ID:BASE64`` line of a key file."""
    StaticKeys({kek_id: bytes(32)}, kek_id)  # checks the id
    return f"{kek_id}:{base64.b64encode(secrets.token_bytes(32)).decode('ascii')}"


def parse_keys(text: str, where: str) -> StaticKeys:
    """``ID:BASE64`` keys, one per line or comma-separated (``#`` starts a
    comment line); the first is current.

    Raises:
        ValueError: no key, a malformed line or a key of the wrong size; the
            message never quotes key material.
    """
    keys: dict[str, bytes] = {}
    for n, raw in enumerate(text.replace(",", "\n").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        kid, sep, b64 = line.partition(":")
        if not sep:
            raise ValueError(f"{where}: entry {n} is not ID:BASE64")
        try:
            key = base64.b64decode(b64.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{where}: key {kid.strip()!r} is not base64") from None
        if kid.strip() in keys:
            raise ValueError(f"{where}: key {kid.strip()!r} is given twice")
        keys[kid.strip()] = key
    if not keys:
        raise ValueError(f"{where}: no key")
    return StaticKeys(keys, next(iter(keys)))


def keys_from_env(var: str = KEYS_ENV) -> StaticKeys:
    """The keys in environment variable ``var`` (see :func:`parse_keys`).

    Raises:
        ValueError: the variable is unset or malformed.
    """
    text = os.environ.get(var)
    if text is None:
        raise ValueError(f"{var} is not set")
    return parse_keys(text, var)


def keys_from_file(path: str | os.PathLike[str]) -> StaticKeys:
    """The keys in the file ``path`` (see :func:`parse_keys`).

    Raises:
        ValueError: the file cannot be read or is malformed.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the key file {os.fspath(path)!r}: {exc}") from exc
    return parse_keys(text, f"key file {os.fspath(path)!r}")


def keys_from_environment(key_file: str | os.PathLike[str] | None = None) -> StaticKeys | None:
    """The keys a command line was given: ``key_file``, else the file named
    by ``TURNLEDGER_KEY_FILE``, else ``TURNLEDGER_KEYS``; ``None`` if none.

    Raises:
        ValueError: the keys given cannot be read.
    """
    if key_file is not None:
        return keys_from_file(key_file)
    named = os.environ.get(KEY_FILE_ENV)
    if named:
        return keys_from_file(named)
    if os.environ.get(KEYS_ENV):
        return keys_from_env()
    return None
