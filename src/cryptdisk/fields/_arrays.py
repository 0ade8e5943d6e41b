"""The values and key a field function takes, checked before any of its work.

Values are one Arrow array (an ``Array``, a ``ChunkedArray`` or a Python sequence
Arrow can type). Anything else is a :class:`FieldError` that quotes no value: Arrow's
own conversion errors quote the value they stopped at (``Could not convert
'4111111111111111' with type str``), which would put clear data into logs. The key
must be a :class:`FieldKey`, else a ``TypeError``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ..errors import FieldError
from ._keys import FieldKey

__all__ = ["as_array", "as_text", "field_key"]

#: What Arrow raises building an array from Python values or casting one: a mix of
#: types (ArrowInvalid, ArrowTypeError), a lone surrogate (UnicodeEncodeError), an int
#: past 64 bits (OverflowError), a nested type without a text form (ArrowNotImplementedError).
_ARROW_ERRORS = (pa.ArrowException, UnicodeError, OverflowError)


def as_array(values: Any, what: str) -> pa.Array:
    """``values`` as one Arrow array of the type Arrow infers (a ``ChunkedArray`` of
    one chunk without a copy)."""
    if isinstance(values, pa.ChunkedArray):
        return values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    if isinstance(values, pa.Array):
        return values
    try:
        return pa.array(values)
    except _ARROW_ERRORS:
        raise FieldError(f"{what}: the values are not of one type that has a text form "
                         "(str, bytes, numbers), or hold text that is not Unicode; pass a "
                         "column's values, as str or an Arrow array") from None


def as_text(arr: pa.Array, what: str, to: pa.DataType | None = None) -> pa.Array:
    """``arr`` cast to ``to`` (default ``string``); a type with no text form (a list, a
    struct) or bytes that are not UTF-8 are a :class:`FieldError` naming the type, never
    a value."""
    try:
        return arr.cast(pa.string() if to is None else to)
    except _ARROW_ERRORS:
        raise FieldError(f"{what}: values of type {arr.type} cannot be taken as text (a "
                         "list or a struct, or bytes that are not UTF-8); pass text, bytes "
                         "or numbers") from None


def field_key(key: Any, what: str) -> FieldKey:
    """``key`` if it is a :class:`FieldKey`, else a ``TypeError`` saying where one comes from."""
    if not isinstance(key, FieldKey):
        raise TypeError(f"{what}: the key must be a cryptdisk FieldKey "
                        "(FieldKeys.from_config(path)[name]), not " + type(key).__name__)
    return key
