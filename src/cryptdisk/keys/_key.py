"""One key-encryption key: an id, an algorithm, and material that never leaves it."""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import InvalidKeyError, KeySourceError
from ..format import Algorithm, new_aead

__all__ = ["Key", "export_key_material", "key_check_value"]

_CHECK_LABEL = b"cryptdisk key check v1"
_MAX_ID = 2**64 - 1


def key_check_value(material: bytes | bytearray) -> bytes:
    """``HMAC-SHA256(key, "cryptdisk key check v1")[:8]``: a key's check value (in every
    header it wraps), which tells keys apart and reveals nothing."""
    return hmac.new(material, _CHECK_LABEL, hashlib.sha256).digest()[:8]


class Key:
    """A key-encryption key (KEK) with a u64 ``key_id``.

    The material is 16 or 32 bytes (AES-128/256); it has no attribute (only
    :func:`export_key_material` hands it out),
    ``repr`` shows the id, algorithm and source kind only, and pickling raises.
    ``bytearray`` material is copied, so the caller may wipe its own buffer
    (zeroing memory in Python is best effort).

    Implements :class:`cryptdisk.format.WrappingKey`: ``wrap`` returns
    ``nonce(12) || AES-GCM(key, nonce, dek, ad)`` with a fresh random nonce.
    """

    __slots__ = ("_aead", "_algorithm", "_check", "_fingerprint", "_id", "_material", "source")

    def __init__(self, key_id: int, material: bytes | bytearray | memoryview, *,
                 algorithm: str | Algorithm | None = None, source: str = "inline") -> None:
        if not isinstance(key_id, int) or isinstance(key_id, bool):
            raise TypeError(f"key id must be an int, not {type(key_id).__name__}")
        if not 0 <= key_id <= _MAX_ID:
            raise ValueError(f"key id must be between 0 and 2**64-1, not {key_id}")
        if not isinstance(material, (bytes, bytearray, memoryview)):
            raise TypeError("key material must be bytes or bytearray")
        raw = bytes(material)
        if len(raw) not in (16, 32):
            raise InvalidKeyError(
                f"key {key_id} is {len(raw)} bytes; AES keys must be 16 or 32 bytes "
                "(32 or 64 hex digits)",
                hint="generate one with 'cryptdisk keygen'",
            )
        alg = Algorithm.parse(algorithm) if algorithm is not None else Algorithm.for_key_size(
            len(raw))
        if alg.key_size != len(raw):
            raise InvalidKeyError(
                f"key {key_id} is {len(raw)} bytes but {alg.label} needs {alg.key_size}"
            )
        self._id = key_id
        self._material = raw
        self._algorithm = alg
        self._aead = new_aead(raw)
        self._check = key_check_value(raw)
        self._fingerprint: bytes | None = None
        self.source = source

    @classmethod
    def generate(cls, key_id: int = 1, algorithm: str | Algorithm = Algorithm.AES_256_GCM,
                 ) -> Key:
        """A new random key."""
        alg = Algorithm.parse(algorithm)
        return cls(key_id, os.urandom(alg.key_size), algorithm=alg, source="generated")

    @property
    def key_id(self) -> int:
        return self._id

    @property
    def algorithm(self) -> Algorithm:
        return self._algorithm

    @property
    def check_value(self) -> bytes:
        """``HMAC-SHA256(key, "cryptdisk key check v1")[:8]``: tells keys apart, reveals nothing."""
        return self._check

    def wrap(self, dek: bytes, associated_data: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, dek, associated_data)

    def unwrap(self, blob: bytes, associated_data: bytes) -> bytes:
        return self._aead.decrypt(blob[:12], blob[12:], associated_data)

    def derive(self, purpose: bytes, length: int = 32) -> bytes:
        """A subkey for another use: ``HKDF-SHA256(key, salt=None, info=purpose)[:length]``.

        Easy to misuse: the result is key material. Hand it straight to a cipher
        (the file-name cipher of encrypted disks takes 64 bytes for AES-SIV) and
        never print, log or store it. ``purpose`` must name the use uniquely, so
        no two uses share a subkey.
        """
        if not isinstance(purpose, bytes) or not purpose:
            raise ValueError("purpose must be non-empty bytes naming the subkey's use")
        return HKDF(algorithm=hashes.SHA256(), length=length, salt=None,
                    info=purpose).derive(self._material)

    def with_id(self, key_id: int) -> Key:
        """The same material under another id."""
        return Key(key_id, self._material, algorithm=self._algorithm, source=self.source)

    def same_material(self, other: Key) -> bool:
        """Whether both keys hold the same bytes (constant time; False when either key is
        held by a key provider and has no material here)."""
        if self._material is None or other._material is None:
            return False
        return hmac.compare_digest(self._material, other._material)

    def __repr__(self) -> str:
        return f"<Key id={self._id} algorithm={self._algorithm.label} source={self.source}>"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Key):
            return NotImplemented
        return self._id == other._id and self.same_material(other)

    def __hash__(self) -> int:
        return hash((self._id, self._check))

    def __reduce__(self) -> Any:
        raise TypeError(
            "cryptdisk keys cannot be pickled (that would write key material); pass a key "
            "reference instead: a keyring config path, an environment variable name or a key file"
        )

    def __copy__(self) -> Key:
        return self

    def __deepcopy__(self, memo: Any) -> Key:
        return self


def export_key_material(key: Key) -> bytes:
    """A key's bytes: the one way out of a :class:`Key`, for the few layers that must have them.

    Easy to misuse. The users are: writing a key file (:func:`write_key_file` takes
    the :class:`Key` itself), printing a new key (``cryptdisk keygen --print``), and
    building a ClickHouse AES-CTR disk key from a keyring key (ClickHouse's format
    takes the raw key). Everything else wraps and unwraps through the key
    (:meth:`Key.wrap`, :meth:`Key.unwrap`). The result is plain ``bytes``: never log
    it or put it in a message, a catalog, fsspec ``storage_options`` or a command line.
    """
    if not isinstance(key, Key):
        raise TypeError(f"expected a cryptdisk Key, not {type(key).__name__}")
    if key._material is None:
        raise KeySourceError(f"key {key.key_id} is held by a key provider ({key.source}) and "
                             "has no material to hand out")
    return key._material
