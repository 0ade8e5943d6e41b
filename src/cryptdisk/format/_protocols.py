"""What the format needs from keys, as small protocols (implemented by :mod:`cryptdisk.keys`).

The format never imports the keys layer: it asks a :class:`KeyLookup` for a
:class:`WrappingKey` by id and lets that key wrap and unwrap file data keys.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ._cipher import Algorithm

__all__ = ["KeyLookup", "WrappingKey"]


@runtime_checkable
class WrappingKey(Protocol):
    """A key-encryption key (KEK).

    Contract:
    - ``key_id`` is the u64 written into headers; ``check_value`` is 8 bytes
      derived from the key (see ``docs/format.md``) so that a wrong key with the
      right id is told apart from a tampered header.
    - ``wrap(dek, ad)`` returns ``nonce(12) || AES-GCM(kek, nonce, dek, ad)`` with
      a fresh random nonce; ``unwrap(blob, ad)`` inverts it and raises
      ``cryptography.exceptions.InvalidTag`` when it does not authenticate.
    - ``algorithm`` is the data cipher for files newly written under this key.
    """

    @property
    def key_id(self) -> int: ...

    @property
    def algorithm(self) -> Algorithm: ...

    @property
    def check_value(self) -> bytes: ...

    def wrap(self, dek: bytes, associated_data: bytes) -> bytes: ...

    def unwrap(self, blob: bytes, associated_data: bytes) -> bytes: ...


@runtime_checkable
class KeyLookup(Protocol):
    """Where the format finds keys: the current one for new files, any one by id for reading.

    ``key_by_id`` raises :class:`cryptdisk.errors.KeyNotFoundError` when it has no such key.
    """

    def current_key(self) -> WrappingKey: ...

    def key_by_id(self, key_id: int) -> WrappingKey: ...
