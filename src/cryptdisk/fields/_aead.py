"""Column encryption over Arrow arrays: randomised (AES-256-GCM) and deterministic (AES-SIV).

Every output value is self-describing, in Tink's layout::

    randomised     0x01 | key id (u32 BE) | nonce (12) | ciphertext | GCM tag (16)
    deterministic  0x01 | key id (u32 BE) | SIV (16)   | ciphertext        (RFC 5297)

The first byte is the format version, the key id names the field key's version
that encrypted the value, so a new version can be added and old values still
decrypt (and be re-encrypted). GCM nonces are 96 random bits from ``os.urandom``:
keep a key version under 2**32 encryptions (NIST SP 800-38D's bound for random
nonces). AES-SIV is deterministic on purpose: equal plaintexts give equal
ciphertexts under one key version (joins, ``GROUP BY``, ``DISTINCT`` work on
them), which also tells an observer which values are equal.

Values are encrypted one by one (``cryptography`` has no batch AEAD call); nulls
stay null. Output is ``binary`` or, with ``output="base64"``, base64 text.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import Any

import pyarrow as pa
from cryptography.exceptions import InvalidTag

from ..errors import AuthenticationError, FormatError
from ._keys import FieldKey

__all__ = ["decrypt", "decrypt_deterministic", "encrypt", "encrypt_deterministic"]

VERSION = 1
_HEADER = 5


def _as_array(values: Any) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(values)
    return values


def _bytes_in(values: Any) -> list[bytes | None]:
    """The values as bytes (strings as UTF-8), nulls as None."""
    arr = _as_array(values)
    if pa.types.is_null(arr.type):
        return [None] * len(arr)
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary())
    elif not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)
              or pa.types.is_fixed_size_binary(arr.type)):
        arr = arr.cast(pa.string()).cast(pa.binary())
    out: list[bytes | None] = arr.to_pylist()
    return out


def _out(values: list[bytes | None], output: str) -> pa.Array:
    if output == "binary":
        return pa.array(values, pa.binary())
    if output == "base64":
        return pa.array([None if v is None else base64.b64encode(v).decode("ascii")
                         for v in values], pa.string())
    raise ValueError(f"output must be 'binary' or 'base64', not {output!r}")


def _ciphertexts(values: Any) -> list[bytes | None]:
    """Ciphertexts in: binary as is, text as base64."""
    arr = _as_array(values)
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        out: list[bytes | None] = []
        for row, v in enumerate(arr.to_pylist()):
            if v is None:
                out.append(None)
                continue
            try:
                out.append(base64.b64decode(v, validate=True))
            except (binascii.Error, ValueError):
                raise FormatError(f"row {row}: a field ciphertext is not valid base64") from None
        return out
    return _bytes_in(arr)


def _plain_out(values: list[bytes | None], output: str) -> pa.Array:
    if output == "binary":
        return pa.array(values, pa.binary())
    if output == "string":
        arr = pa.array(values, pa.binary())
        try:
            return arr.cast(pa.string())
        except pa.ArrowInvalid:
            raise FormatError("a decrypted value is not UTF-8 text; decrypt with "
                              "output='binary'") from None
    raise ValueError(f"output must be 'string' or 'binary', not {output!r}")


def _header(key_id: int) -> bytes:
    return bytes([VERSION]) + key_id.to_bytes(4, "big")


def _split(blob: bytes, row: int, minimum: int) -> tuple[int, bytes]:
    if len(blob) < _HEADER + minimum or blob[0] != VERSION:
        raise FormatError(f"row {row}: not a cryptdisk field ciphertext (version "
                          f"{blob[0] if blob else 'missing'}, {len(blob)} bytes)")
    return int.from_bytes(blob[1:5], "big"), blob[_HEADER:]


def _auth_error(row: int) -> AuthenticationError:
    return AuthenticationError(f"field value at row {row} does not authenticate (tampered, "
                               "or encrypted under another key)", offset=row)


def encrypt(values: Any, key: FieldKey, *, output: str = "binary") -> pa.Array:
    """AES-256-GCM with a fresh random nonce per value, under ``key``'s current version."""
    data = _bytes_in(values)
    aead = key._version().gcm()
    header = _header(key.current_id)
    nonces = os.urandom(12 * len(data))
    out: list[bytes | None] = []
    for i, v in enumerate(data):
        if v is None:
            out.append(None)
            continue
        nonce = nonces[12 * i:12 * i + 12]
        out.append(header + nonce + aead.encrypt(nonce, v, None))
    return _out(out, output)


def decrypt(values: Any, key: FieldKey, *, output: str = "string") -> pa.Array:
    """Check and decrypt :func:`encrypt`'s output (binary, or base64 text)."""
    out: list[bytes | None] = []
    cache: dict[int, Any] = {}
    for row, blob in enumerate(_ciphertexts(values)):
        if blob is None:
            out.append(None)
            continue
        key_id, body = _split(blob, row, 12 + 16)
        aead = cache.get(key_id)
        if aead is None:
            aead = cache[key_id] = key._version(key_id).gcm()
        try:
            out.append(aead.decrypt(body[:12], body[12:], None))
        except InvalidTag:
            raise _auth_error(row) from None
    return _plain_out(out, output)


def encrypt_deterministic(values: Any, key: FieldKey, *, output: str = "binary") -> pa.Array:
    """AES-SIV (RFC 5297, no associated data): equal inputs give equal outputs."""
    siv = key._version().siv()
    header = _header(key.current_id)
    out: list[bytes | None] = []
    memo: dict[bytes, bytes] = {}  # repeated values (the point of deterministic columns)
    for v in _bytes_in(values):
        if v is None:
            out.append(None)
            continue
        c = memo.get(v)
        if c is None:
            c = header + siv.encrypt(v, None)
            if len(memo) < 65536:
                memo[v] = c
        out.append(c)
    return _out(out, output)


def decrypt_deterministic(values: Any, key: FieldKey, *, output: str = "string") -> pa.Array:
    """Check and decrypt :func:`encrypt_deterministic`'s output."""
    out: list[bytes | None] = []
    cache: dict[int, Any] = {}
    for row, blob in enumerate(_ciphertexts(values)):
        if blob is None:
            out.append(None)
            continue
        key_id, body = _split(blob, row, 16)
        siv = cache.get(key_id)
        if siv is None:
            siv = cache[key_id] = key._version(key_id).siv()
        try:
            out.append(siv.decrypt(body, None))
        except InvalidTag:
            raise _auth_error(row) from None
    return _plain_out(out, output)
