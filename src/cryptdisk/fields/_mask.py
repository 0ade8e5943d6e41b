"""Masking: irreversible views of a text column.

Each mask is one call of the C extension ``_cfields`` over the column's Arrow buffers
when it is built, else a few ``pyarrow.compute`` kernels (the same output).
``mask_hash`` is keyed (HMAC-SHA-256 under the key's HMAC subkey, hex): equal
values give equal hashes under one key version, for pseudonymous joins, and without
the key nobody can test a guess; without the extension it runs value by value.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from . import _aead
from ._arrays import as_array, as_text, field_key
from ._keys import FieldKey

__all__ = ["mask_email", "mask_full", "mask_hash", "mask_last4", "mask_null"]


def _text(values: Any, what: str) -> pa.Array:
    """``values`` as a ``string`` array: numbers as their text; values of no one type,
    lists, structs and bytes that are not UTF-8 are a :class:`FieldError` quoting none."""
    arr = as_array(values, what)
    return arr if pa.types.is_string(arr.type) else as_text(arr, what)


def _c_mask(kind: str, arr: pa.Array) -> pa.Array | None:
    """The C mask of a string array, or None without the extension."""
    native = _aead.native_module()
    if native is None:
        return None
    validity, offsets, data, wide = _aead._buffers(arr)
    wide_out, offs, out = native.mask_column(kind, validity, offsets, data, wide, len(arr),
                                             arr.offset, pa.allocate_buffer)
    if offs is None:  # all ASCII: each masked value where the input's was (API 3)
        buffers = arr.buffers()
        return pa.Array.from_buffers(arr.type, len(arr), [buffers[0], buffers[1], out],
                                     null_count=arr.null_count, offset=arr.offset)
    return _aead._from_c(arr, wide_out, offs, out, True)


def _stars(counts: pa.Array, char: str) -> pa.Array:
    return pc.binary_repeat(pa.scalar(char), counts).cast(pa.string())


def mask_full(values: Any, char: str = "*") -> pa.Array:
    """Every character replaced by ``char`` (the length shows)."""
    arr = _text(values, "mask_full")
    if char == "*" and (done := _c_mask("full", arr)) is not None:
        return done
    return pc.if_else(arr.is_valid(), _stars(pc.utf8_length(arr), char),
                      pa.scalar(None, pa.string()))


def mask_last4(values: Any, char: str = "*") -> pa.Array:
    """All but the last four characters masked; values of four or fewer are masked whole."""
    arr = _text(values, "mask_last4")
    if char == "*" and (done := _c_mask("last4", arr)) is not None:
        return done
    length = pc.utf8_length(arr)
    head = _stars(pc.max_element_wise(pc.subtract(length, 4), 0), char)
    joined = pc.binary_join_element_wise(head, pc.utf8_slice_codeunits(arr, -4), "")
    return pc.if_else(pc.greater(length, 4), joined, mask_full(arr, char))


def mask_email(values: Any) -> pa.Array:
    """``****@domain``: the local part hidden, the domain kept; no ``@``: masked whole."""
    arr = _text(values, "mask_email")
    if (done := _c_mask("email", arr)) is not None:
        return done
    kept = pc.replace_substring_regex(arr, r"^(?s).*@", "****@")
    return pc.if_else(pc.match_substring(arr, "@"), kept, mask_full(arr))


def mask_null(values: Any) -> pa.Array:
    """Nulls of the same type."""
    arr = as_array(values, "mask_null")
    return pa.nulls(len(arr), arr.type)


def mask_hash(values: Any, key: FieldKey, *, version: int | None = None) -> pa.Array:
    """HMAC-SHA-256 of each value's UTF-8 bytes under ``key``'s HMAC subkey, as hex.

    A hash names no key version: ``version`` is the key id to use, required when the
    key has several (:meth:`FieldKey.named_version`), so hashes made under one version
    keep matching after another is added.
    """
    secret = field_key(key, "mask_hash").named_version(version, "mask_hash").hmac_key()
    native = _aead.native_module()
    if native is not None:
        text = _text(values, "mask_hash")
        validity, offsets, data, wide = _aead._buffers(text)
        _wide, offs, out = native.hmac_column(secret, validity, offsets, data, wide, len(text),
                                              text.offset, pa.allocate_buffer)
        return _aead._from_c(text, False, offs, out, True)
    arr = _text(values, "mask_hash").cast(pa.binary())
    return pa.array([None if v is None else hmac.new(secret, v, hashlib.sha256).hexdigest()
                     for v in arr.to_pylist()], pa.string())
