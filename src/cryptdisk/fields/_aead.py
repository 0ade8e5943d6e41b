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

A column's Arrow buffers go whole to the C extension ``_cfields`` (one call per
batch; its loops run without the GIL, with AES-GCM and AES-SIV from libgcrypt or
OpenSSL, base64 included). Without the extension (not built), each value is one
``cryptography`` call, straight from the Arrow buffers into one output buffer
(``encrypt_into``); both give the same bytes. Nulls stay null. Output is ``binary``
or, with ``output="base64"``, base64 text.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import os
from typing import Any

import numpy as np
import pyarrow as pa
from cryptography.exceptions import InvalidTag

from ..errors import AuthenticationError, FormatError
from ._arrays import as_array, as_text, field_key
from ._keys import FieldKey

try:  # the C extension, which has no type stubs (Any)
    _cfields: Any = importlib.import_module(f"{__package__}._cfields")
except ImportError:  # pragma: no cover - the C extension was not built (setup.py says why)
    _cfields = None

__all__ = ["decrypt", "decrypt_deterministic", "encrypt", "encrypt_deterministic",
           "native_library"]

VERSION = 1
_HEADER = 5


def _as_array(values: Any) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):  # one chunk (DuckDB's batches): no copy
        values = values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(values)
    return values


def _checked(values: Any, key: Any, what: str, *, ciphertexts: bool = False) -> pa.Array:
    """``values`` as an Arrow array of text or bytes, the function's input: dictionaries
    as their values, views as ``string`` or ``binary``, other types as their text
    (ciphertexts: as the bytes of their text). Values of no such type, or a ``key`` that is no
    :class:`FieldKey`, raise before any work, and the error quotes no value."""
    field_key(key, what)
    arr = as_array(values, what)
    if pa.types.is_dictionary(arr.type):  # (pandas' categoricals): as their values
        arr = arr.dictionary_decode()
    t = arr.type
    if t in _TEXT or t in _BYTES:
        return arr
    if pa.types.is_null(t):
        return pa.nulls(len(arr), pa.binary())
    if pa.types.is_binary_view(t):
        return as_text(arr, what, pa.binary())
    text = as_text(arr, what)
    return as_text(text, what, pa.binary()) if ciphertexts and not (
        pa.types.is_string_view(t)) else text


class _Column:
    """A binary view of an Arrow column: offsets, one data buffer, validity; no copies."""

    def __init__(self, values: Any) -> None:
        arr = _as_array(values)
        t = arr.type
        if pa.types.is_null(t):
            arr = pa.nulls(len(arr), pa.binary())
        elif pa.types.is_string(t):
            arr = arr.cast(pa.binary())
        elif pa.types.is_large_string(t):
            arr = arr.cast(pa.large_binary())
        elif not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            arr = arr.cast(pa.string()).cast(pa.binary())
        width = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
        self.count = len(arr)
        offsets = np.frombuffer(arr.buffers()[1], dtype=width)
        self.offsets = offsets[arr.offset:arr.offset + self.count + 1].astype(np.int64)
        data = arr.buffers()[2]
        self.data = memoryview(data).cast("B") if data is not None else memoryview(b"")
        self.np_data = np.frombuffer(self.data, dtype=np.uint8)
        self.valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        self.lengths = np.diff(self.offsets)
        self.validity = arr.buffers()[0] if arr.null_count else None
        self.arr = arr

    def rows(self) -> np.ndarray:
        rows: np.ndarray = np.nonzero(self.valid)[0]
        return rows


def _layout(col: _Column, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Output offsets for ``sizes`` bytes per valid row, and the output buffer."""
    sizes = np.where(col.valid, sizes, 0)
    offsets = np.zeros(col.count + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets, np.empty(int(offsets[-1]), dtype=np.uint8)


def _binary(col: _Column, offsets: np.ndarray, out: np.ndarray) -> pa.Array:
    large = offsets[-1] >= 2**31
    typ = pa.large_binary() if large else pa.binary()
    offs = offsets if large else offsets.astype(np.int32)
    validity = None
    if col.validity is not None:
        validity = pa.array(col.valid).buffers()[1]
    return pa.Array.from_buffers(typ, col.count, [validity, pa.py_buffer(offs),
                                                  pa.py_buffer(out)])


def _out(col: _Column, offsets: np.ndarray, out: np.ndarray, output: str) -> pa.Array:
    arr = _binary(col, offsets, out)
    if output == "binary":
        return arr
    if output == "base64":
        return pa.array([None if v is None else base64.b64encode(v).decode("ascii")
                         for v in arr.to_pylist()], pa.string())
    raise ValueError(f"output must be 'binary' or 'base64', not {output!r}")


def _ciphertexts(values: Any) -> _Column:
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
        return _Column(pa.array(out, pa.binary()))
    return _Column(arr)


def _plain_out(col: _Column, offsets: np.ndarray, out: np.ndarray, output: str) -> pa.Array:
    return _as_text(_binary(col, offsets, out), output)


def _as_text(arr: pa.Array, output: str) -> pa.Array:
    if output == "binary":
        return arr
    if output == "string":
        try:
            text = arr.cast(pa.large_string() if pa.types.is_large_binary(arr.type)
                            else pa.string())
            text.validate(full=True)
        except pa.ArrowInvalid:
            row = next(i for i, v in enumerate(arr.to_pylist())
                       if v is not None and not _is_utf8(v))
            raise FormatError(f"row {row}: a decrypted value is not UTF-8 text; decrypt with "
                              "output='binary'") from None
        return text
    raise ValueError(f"output must be 'string' or 'binary', not {output!r}")


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _header(key_id: int) -> np.ndarray:
    return np.frombuffer(bytes([VERSION]) + key_id.to_bytes(4, "big"), dtype=np.uint8)


def _put_headers(out: np.ndarray, starts: np.ndarray, key_id: int) -> None:
    out[starts[:, None] + np.arange(_HEADER)] = _header(key_id)


def _check_headers(col: _Column, minimum: int) -> tuple[np.ndarray, np.ndarray]:
    """Valid rows and each one's key id; a short or unknown-version value is a FormatError."""
    rows = col.rows()
    starts = col.offsets[:-1][rows]
    short = col.lengths[rows] < _HEADER + minimum
    if short.any():
        row = int(rows[np.argmax(short)])
        raise FormatError(f"row {row}: not a cryptdisk field ciphertext ("
                          f"{int(col.lengths[row])} bytes)")
    version = col.np_data[starts]
    if (version != VERSION).any():
        row = int(rows[np.argmax(version != VERSION)])
        raise FormatError(f"row {row}: not a cryptdisk field ciphertext (version "
                          f"{int(col.np_data[col.offsets[row]])})")
    ids = col.np_data[starts[:, None] + np.arange(1, _HEADER)].astype(np.uint32)
    key_ids = (ids[:, 0] << 24) | (ids[:, 1] << 16) | (ids[:, 2] << 8) | ids[:, 3]
    return rows, key_ids


def _auth_error(row: int) -> AuthenticationError:
    return AuthenticationError(f"field value at row {row} does not authenticate (tampered, "
                               "or encrypted under another key)", offset=row)


def native_module() -> Any:
    """The C extension ``_cfields``, or None (not built; tests set it to None)."""
    return _cfields


def native_library() -> str | None:
    """The cipher libraries of the C loops (``"libgcrypt 1.10.1"``, or ``"libgcrypt
    1.10.1, AES-GCM from intel-ipsec-mb 1.3.0 (AVX-512)"`` when the build found
    intel-ipsec-mb), or None when the extension was not built and each value is one
    ``cryptography`` call."""
    return str(_cfields.library()) if _cfields is not None else None


# -- the C path: whole columns -------------------------------------------------------------

_TEXT = (pa.string(), pa.large_string())
_BYTES = (pa.binary(), pa.large_binary())


def _buffers(arr: pa.Array) -> tuple[Any, Any, Any, bool]:
    """validity (empty without nulls), offsets, data and whether offsets are int64."""
    validity, offsets, data = arr.buffers()[:3]
    return (validity if arr.null_count and validity is not None else b"", offsets,
            data if data is not None else b"",
            arr.type in (pa.large_string(), pa.large_binary()))


def _validity_out(arr: pa.Array) -> pa.Buffer | None:
    if not arr.null_count:
        return None
    if arr.offset == 0:
        return arr.buffers()[0]
    return arr.is_valid().buffers()[1]


def _from_c(arr: pa.Array, wide: bool, offsets: bytes, data: pa.Buffer, text: bool) -> pa.Array:
    typ = (pa.large_string() if wide else pa.string()) if text else \
        (pa.large_binary() if wide else pa.binary())
    return pa.Array.from_buffers(typ, len(arr), [_validity_out(arr), pa.py_buffer(offsets),
                                                 data])


def _c_seal(values: Any, key: FieldKey, siv: bool, output: str) -> pa.Array | None:
    """Encrypted values, or None for the Python path (a batch this build cannot do)."""
    if output not in ("binary", "base64"):
        raise ValueError(f"output must be 'binary' or 'base64', not {output!r}")
    arr = _as_array(values)
    if pa.types.is_null(arr.type):
        arr = pa.nulls(len(arr), pa.binary())
    elif arr.type not in _TEXT and arr.type not in _BYTES:
        arr = arr.cast(pa.string())
    version = key._version()
    validity, offsets, data, wide = _buffers(arr)
    done = _cfields.seal_column(
        siv, version.siv_key() if siv else version.gcm_key(), _header(key.current_id).tobytes(),
        validity, offsets, data, wide, len(arr), arr.offset, output == "base64",
        pa.allocate_buffer)
    if done is None:  # an empty value for AES-SIV with OpenSSL 3.0 (see _cfields)
        return None
    return _from_c(arr, done[0], done[1], done[2], output == "base64")


def _c_open(values: Any, key: FieldKey, siv: bool, output: str) -> pa.Array | None:
    """Decrypted values, or None for the Python path (inputs it handles, errors it words)."""
    if output not in ("string", "binary"):
        raise ValueError(f"output must be 'string' or 'binary', not {output!r}")
    arr = _as_array(values)
    if arr.type not in _TEXT and arr.type not in _BYTES:
        return None
    validity, offsets, data, wide = _buffers(arr)
    # an extension built before API 2 cannot check UTF-8: the Arrow check below does
    in_c = output == "string" and getattr(_cfields, "API", 1) >= 2
    wide_out, offs, out, failed, reason = _cfields.open_column(
        siv, (lambda k: key._version(k).siv_key()) if siv else
        (lambda k: key._version(k).gcm_key()), validity, offsets, data, wide, len(arr),
        arr.offset, arr.type in _TEXT, pa.allocate_buffer, *([True] if in_c else []))
    if reason == 4:
        raise _auth_error(failed)
    if reason == 7:  # checked by the C loop as it wrote each value
        raise FormatError(f"row {failed}: a decrypted value is not UTF-8 text; decrypt with "
                          "output='binary'")
    if reason:
        return None  # not base64, short, unknown version, many key versions, see _cfields
    if output == "string" and not in_c:
        return _as_text(_from_c(arr, wide_out, offs, out, False), output)
    return _from_c(arr, wide_out, offs, out, output == "string")


def encrypt(values: Any, key: FieldKey, *, output: str = "binary") -> pa.Array:
    """AES-256-GCM with a fresh random nonce per value, under ``key``'s current version."""
    values = _checked(values, key, "encrypt")
    if _cfields is not None and (done := _c_seal(values, key, False, output)) is not None:
        return done
    col = _Column(values)
    aead = key._version().gcm()
    offsets, out = _layout(col, col.lengths + _HEADER + 12 + 16)
    rows = col.rows()
    starts = offsets[:-1][rows]
    _put_headers(out, starts, key.current_id)
    nonces = os.urandom(12 * len(rows))
    out[starts[:, None] + np.arange(_HEADER, _HEADER + 12)] = np.frombuffer(
        nonces, dtype=np.uint8).reshape(len(rows), 12)
    view, data = out.data, col.data
    src = col.offsets
    for j, i in enumerate(rows.tolist()):
        s = int(starts[j]) + _HEADER + 12
        aead.encrypt_into(nonces[12 * j:12 * j + 12], data[src[i]:src[i + 1]], None,
                          view[s:int(offsets[i + 1])])
    return _out(col, offsets, out, output)


def decrypt(values: Any, key: FieldKey, *, output: str = "string") -> pa.Array:
    """Check and decrypt :func:`encrypt`'s output (binary, or base64 text)."""
    values = _checked(values, key, "decrypt", ciphertexts=True)
    if _cfields is not None and (done := _c_open(values, key, False, output)) is not None:
        return done
    col = _ciphertexts(values)
    rows, key_ids = _check_headers(col, 12 + 16)
    offsets, out = _layout(col, col.lengths - _HEADER - 12 - 16)
    view, data, src = out.data, col.data, col.offsets
    ciphers = {int(k): key._version(int(k)).gcm() for k in np.unique(key_ids)}
    for j, i in enumerate(rows.tolist()):
        s = int(src[i])
        try:
            ciphers[int(key_ids[j])].decrypt_into(
                bytes(data[s + _HEADER:s + _HEADER + 12]), data[s + _HEADER + 12:src[i + 1]],
                None, view[offsets[i]:offsets[i + 1]])
        except InvalidTag:
            raise _auth_error(i) from None
    return _plain_out(col, offsets, out, output)


def encrypt_deterministic(values: Any, key: FieldKey, *, output: str = "binary") -> pa.Array:
    """AES-SIV (RFC 5297, no associated data): equal inputs give equal outputs."""
    values = _checked(values, key, "encrypt_deterministic")
    if _cfields is not None and (done := _c_seal(values, key, True, output)) is not None:
        return done
    col = _Column(values)
    siv = key._version().siv()
    offsets, out = _layout(col, col.lengths + _HEADER + 16)
    rows = col.rows()
    _put_headers(out, offsets[:-1][rows], key.current_id)
    view, data, src = out.data, col.data, col.offsets
    for i in rows.tolist():
        siv.encrypt_into(data[src[i]:src[i + 1]], None,
                         view[offsets[i] + _HEADER:offsets[i + 1]])
    return _out(col, offsets, out, output)


def decrypt_deterministic(values: Any, key: FieldKey, *, output: str = "string") -> pa.Array:
    """Check and decrypt :func:`encrypt_deterministic`'s output."""
    values = _checked(values, key, "decrypt_deterministic", ciphertexts=True)
    if _cfields is not None and (done := _c_open(values, key, True, output)) is not None:
        return done
    col = _ciphertexts(values)
    rows, key_ids = _check_headers(col, 16)
    offsets, out = _layout(col, col.lengths - _HEADER - 16)
    view, data, src = out.data, col.data, col.offsets
    ciphers = {int(k): key._version(int(k)).siv() for k in np.unique(key_ids)}
    for j, i in enumerate(rows.tolist()):
        try:
            ciphers[int(key_ids[j])].decrypt_into(data[src[i] + _HEADER:src[i + 1]], None,
                                                  view[offsets[i]:offsets[i + 1]])
        except InvalidTag:
            raise _auth_error(i) from None
    return _plain_out(col, offsets, out, output)
