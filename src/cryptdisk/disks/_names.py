"""Encrypted file names for ``encrypted`` disks (``encrypt_names = true``).

Lower tier, easy to misuse: :class:`NameCipher` holds key material.

Each component of a disk path is encrypted on its own, so directories stay
directories on the backing store and listing a directory lists one backing
directory::

    stored component = base64url_nopad(AES-SIV(K_names, component, AD))
    AD               = ["cryptdisk name v1", plaintext parent directory]
    K_names          = HKDF-SHA256(KEK names_key_id, info="cryptdisk names v1 aes-siv-512")

AES-SIV (RFC 5297, ``cryptography``'s ``AESSIV``) is deterministic: the same
name in the same directory always gives the same stored name, which is what
makes lookup by name and listing work without an index. It is also
authenticated: a stored name that was changed, made up, or moved into
another directory (the parent is associated data) fails with
:class:`~cryptdisk.errors.NameAuthenticationError` instead of decrypting to
garbage. What determinism reveals: whether two files in one directory have the
same name as two others did (equal names encrypt equally), and each name's
length to within the base64 rounding (16 bytes of tag are added).

A stored component is ``ceil(4 * (len + 16) / 3)`` characters; plaintext
components are limited to :data:`MAX_NAME_BYTES` UTF-8 bytes so the stored one,
and the temporary name a writer publishes from (20 characters more), stay
within the 255-byte limit of common file systems. Longer names are refused
with a clear error (gocryptfs stores them in a side file instead).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESSIV

from ..errors import DiskError, NameAuthenticationError
from ..keys import Key

__all__ = ["MAX_NAME_BYTES", "NameCipher"]

#: Longest plaintext path component, in UTF-8 bytes (stored: 235 characters).
MAX_NAME_BYTES = 160
_PURPOSE = b"cryptdisk names v1 aes-siv-512"
_AD_LABEL = b"cryptdisk name v1"
_CACHE = 1 << 16  # components remembered each way


class NameCipher:
    """Encrypts and decrypts disk paths component by component (see the module docstring).

    ``repr`` shows the key id only; the derived key lives inside the AES-SIV
    object and has no attribute; pickling raises.
    """

    __slots__ = ("_plain", "_siv", "_stored", "key_id")

    def __init__(self, key: Key) -> None:
        if not isinstance(key, Key):
            raise TypeError("the names key must be a cryptdisk.Key")
        self.key_id = key.key_id
        self._siv = AESSIV(key.derive(_PURPOSE, 64))
        # Both directions of every component seen, so opening what was just listed
        # costs no AES: (parent, name) -> stored and (parent, stored) -> name.
        self._stored: dict[tuple[str, str], str] = {}
        self._plain: dict[tuple[str, str], str] = {}

    def _remember(self, parent: str, name: str, stored: str) -> None:
        if len(self._stored) >= _CACHE:
            self._stored.clear()
            self._plain.clear()
        self._stored[parent, name] = stored
        self._plain[parent, stored] = name

    def _encrypt_one(self, parent: str, name: str) -> str:
        stored = self._stored.get((parent, name))
        if stored is None:
            stored = self._encrypt_component(parent, name)
            self._remember(parent, name, stored)
        return stored

    def _decrypt_one(self, parent: str, stored: str) -> str:
        name = self._plain.get((parent, stored))
        if name is None:
            name = self._decrypt_component(parent, stored)
            self._remember(parent, name, stored)
        return name

    def _encrypt_component(self, parent: str, name: str) -> str:
        raw = name.encode("utf-8")
        if len(raw) > MAX_NAME_BYTES:
            raise DiskError(
                f"file name {name[:40]!r}... is {len(raw)} bytes; a disk that encrypts names "
                f"takes names of at most {MAX_NAME_BYTES} bytes per path component",
                hint="shorten the name, or split it into directories")
        sealed = self._siv.encrypt(raw, [_AD_LABEL, parent.encode("utf-8")])
        return base64.urlsafe_b64encode(sealed).rstrip(b"=").decode("ascii")

    def _decrypt_component(self, parent: str, stored: str) -> str:
        try:
            sealed = base64.urlsafe_b64decode(stored + "=" * (-len(stored) % 4))
            # Only the canonical encoding is accepted: one stored name per plaintext name.
            if base64.urlsafe_b64encode(sealed).rstrip(b"=").decode("ascii") != stored:
                raise ValueError(stored)
            name = self._siv.decrypt(sealed, [_AD_LABEL, parent.encode("utf-8")])
            return name.decode("utf-8")
        except (binascii.Error, ValueError, InvalidTag, UnicodeError):
            raise NameAuthenticationError(
                f"stored name {stored!r} (in directory {parent or '/'!r}) does not authenticate "
                f"under the names key (key id {self.key_id}): changed, moved or foreign on "
                "the backing store, or written with another names_key_id",
                path=stored) from None

    def encrypt_path(self, path: str) -> str:
        """The stored form of a clean relative path (``norm_path`` output)."""
        parent = ""
        out = []
        for name in path.split("/"):
            out.append(self._encrypt_one(parent, name))
            parent = f"{parent}/{name}" if parent else name
        return "/".join(out)

    def decrypt_path(self, stored: str) -> str:
        """The plaintext path of a stored one; NameAuthenticationError if any part fails."""
        parent = ""
        for part in stored.split("/"):
            name = self._decrypt_one(parent, part)
            parent = f"{parent}/{name}" if parent else name
        return parent

    def __repr__(self) -> str:
        return f"<NameCipher key_id={self.key_id}>"

    def __reduce__(self) -> Any:
        raise TypeError("a name cipher holds key material and cannot be pickled")
