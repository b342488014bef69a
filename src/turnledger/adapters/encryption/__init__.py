"""Encryption at rest (opt-in; needs the ``cryptography`` package:
``pip install 'turnledger[encryption]'``).

Each session's events are sealed with its own data key (AES-256-GCM); data
keys are wrapped by a key-encryption key from a :class:`KeyProvider` and
kept in a :class:`KeyRing`, apart from the events. Destroying a session's
data key (:meth:`EncryptedStore.forget`, which erasure calls first) makes
every copy of its ciphertext unreadable. See docs/encryption.md.
"""

from ..._errors import (
    ContentEncrypted,
    DecryptionFailed,
    EncryptionError,
    PlaintextRefused,
    WrongKey,
)
from ._keyring import KeyRing, PostgresKeyRing, SQLiteKeyRing
from ._providers import (
    KEY_FILE_ENV,
    KEYS_ENV,
    KeyProvider,
    StaticKeys,
    WrappedKey,
    keys_from_env,
    keys_from_environment,
    keys_from_file,
    new_key_line,
)
from ._store import EncryptedStore, SealedSnapshots, rotate_keys

__all__ = [
    "KEYS_ENV",
    "KEY_FILE_ENV",
    "ContentEncrypted",
    "DecryptionFailed",
    "EncryptedStore",
    "EncryptionError",
    "KeyProvider",
    "KeyRing",
    "PlaintextRefused",
    "PostgresKeyRing",
    "SQLiteKeyRing",
    "SealedSnapshots",
    "StaticKeys",
    "WrappedKey",
    "WrongKey",
    "keys_from_env",
    "keys_from_environment",
    "keys_from_file",
    "new_key_line",
    "rotate_keys",
]
