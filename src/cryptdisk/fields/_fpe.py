"""Format-preserving encryption of string columns with FF1: same length, same alphabet.

Values are grouped by length and each group goes through FF1 as one batch
(:mod:`._ff1`). ASCII alphabets are mapped with numpy lookup tables over the Arrow
buffers; other alphabets (radix up to 2**16) character by character. The tweak is
the column name (UTF-8) unless one is given, so the same value in two columns
encrypts differently; nulls stay null.

Tokens (:mod:`._tokens`) are FF1 under the same subkey with the tweak ``"token:" +
column`` (:data:`TOKEN_TWEAK`): a column or tweak of ``fpe_encrypt`` / ``fpe_decrypt``
beginning with it is refused, or ``fpe_decrypt(v, key, "token:pan")`` would detokenize
the tokens of column ``pan`` outside the token options and policies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import FieldError
from ._arrays import field_key
from ._ff1 import ff1_decrypt, ff1_encrypt
from ._keys import FieldKey

__all__ = ["ALPHABETS", "TOKEN_TWEAK", "Alphabet", "ff1_group", "fpe_decrypt", "fpe_encrypt"]

#: What begins the FF1 tweak of a token (``"token:" + column``); no FF1 tweak of
#: ``fpe_encrypt`` / ``fpe_decrypt`` may begin with it (see the module docstring).
TOKEN_TWEAK = b"token:"

_DIGITS = "0123456789"
_LOWER = "abcdefghijklmnopqrstuvwxyz"
ALPHABETS = {
    "digits": _DIGITS,
    "hex": _DIGITS + "abcdef",
    "lower": _DIGITS + _LOWER,
    "upper": _DIGITS + _LOWER.upper(),
    "alnum": _DIGITS + _LOWER + _LOWER.upper(),
}


class Alphabet:
    """The characters of a column, in order: ``digits``, ``hex``, ``lower`` (0-9a-z),
    ``upper`` (0-9A-Z), ``alnum`` (0-9a-zA-Z) or a declared string of distinct characters."""

    chars: str

    def __init__(self, spec: str | Alphabet) -> None:
        if isinstance(spec, Alphabet):
            spec = str(spec.chars)
        if not isinstance(spec, str):
            raise TypeError("an alphabet is a name or a string of characters")
        chars: str = ALPHABETS.get(spec, spec)
        if len(chars) < 2 or len(set(chars)) != len(chars) or len(chars) > 2**16:
            raise FieldError(f"alphabet must be one of {', '.join(ALPHABETS)} or 2 to 65536 "
                             "distinct characters")
        self.chars = chars
        self.radix = len(chars)
        self.ascii = all(ord(c) < 128 for c in chars)
        if self.ascii:
            self.table = np.full(256, -1, dtype=np.int32)
            for i, c in enumerate(chars):
                self.table[ord(c)] = i
            self.codes = np.frombuffer(chars.encode("ascii"), dtype=np.uint8)
        self.index = {c: i for i, c in enumerate(chars)}

    def __repr__(self) -> str:
        return f"<Alphabet radix={self.radix}>"


def _strings(values: Any) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        try:
            values = pa.array(values, pa.string())
        except (pa.ArrowTypeError, pa.ArrowInvalid, UnicodeError):  # (a lone surrogate)
            raise FieldError("format-preserving functions take text (str values or an "
                             "Arrow string array)") from None
    if pa.types.is_large_string(values.type) or pa.types.is_string_view(values.type):
        values = values.cast(pa.string())
    if not pa.types.is_string(values.type):
        raise FieldError(f"format-preserving functions take text, not {values.type}")
    return values


def map_groups(values: Any, alphabet: Alphabet, what: str,
               fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> pa.Array:
    """Apply ``fn(rows, numerals)`` to each group of equal-length values; nulls stay null.

    ``rows`` are the group's row numbers in ``values``; ``fn`` returns numerals of the
    same shape. The result is a string array in the order of ``values``.
    """
    arr = _strings(values)
    n = len(arr)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if alphabet.ascii:
        lengths = pc.fill_null(pc.binary_length(arr), -1).to_numpy(zero_copy_only=False)
    else:
        lengths = pc.fill_null(pc.utf8_length(arr), -1).to_numpy(zero_copy_only=False)
    order: list[np.ndarray] = []
    pieces: list[pa.Array] = []
    nulls = np.nonzero(~valid)[0]
    if len(nulls):
        order.append(nulls)
        pieces.append(pa.nulls(len(nulls), pa.string()))
    for length in np.unique(lengths[valid]):
        rows = np.nonzero(valid & (lengths == length))[0]
        group = arr.take(pa.array(rows))
        x = _to_numerals(group, int(length), alphabet, rows, what)
        pieces.append(_from_numerals(fn(rows, x), alphabet))
        order.append(rows)
    if not pieces:
        return pa.array([], pa.string())
    result = pa.concat_arrays(pieces)
    positions = np.concatenate(order)
    inverse = np.empty(n, dtype=np.int64)
    inverse[positions] = np.arange(n)
    return result.take(pa.array(inverse))


def _to_numerals(group: pa.Array, length: int, alphabet: Alphabet, rows: np.ndarray,
                 what: str) -> np.ndarray:
    count = len(group)
    if alphabet.ascii:
        offsets = np.frombuffer(group.buffers()[1], dtype=np.int32)[group.offset:]
        start = int(offsets[0])
        data = group.buffers()[2]
        raw = (np.frombuffer(data, dtype=np.uint8)[start:start + count * length]
               if data is not None else np.zeros(0, dtype=np.uint8))
        x = alphabet.table[raw].reshape(count, length)
        bad = np.nonzero((x < 0).any(axis=1))[0]
    else:
        lists = [[alphabet.index.get(c, -1) for c in s] for s in group.to_pylist()]
        x = np.array(lists, dtype=np.int32).reshape(count, length)
        bad = np.nonzero((x < 0).any(axis=1))[0]
    if len(bad):
        raise FieldError(f"{what}: row {int(rows[bad[0]])} has a character outside the "
                         f"alphabet ({alphabet.radix} characters)")
    return x


def _from_numerals(x: np.ndarray, alphabet: Alphabet) -> pa.Array:
    count, length = x.shape
    if alphabet.ascii:
        data = alphabet.codes[x].astype(np.uint8).tobytes()
        offsets = (np.arange(count + 1, dtype=np.int32) * length).tobytes()
        return pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data))
    chars = alphabet.chars
    return pa.array(["".join(chars[int(d)] for d in row) for row in x], pa.string())


def ff1_group(step: Callable[..., np.ndarray], cipher: Any, radix: int, tweak: bytes,
              x: np.ndarray, what: str, rows: np.ndarray, length: str = "") -> np.ndarray:
    """``step`` (:func:`ff1_encrypt` or :func:`ff1_decrypt`) over one group's numerals.

    A group FF1 cannot take (fewer than 2 numerals, under the Rev. 1 minimum domain)
    raises a :class:`FieldError` naming ``what``, the group's first row and its length
    (``length``, else the numerals' count), never a value.
    """
    try:
        return step(cipher, radix, tweak, x)
    except FieldError as exc:
        raise FieldError(f"{what}: row {int(rows[0])} has {length or x.shape[1]} "
                         f"characters: {exc}") from None


def _tweak(column: str | None, tweak: bytes | None, what: str) -> bytes:
    if tweak is not None:
        if not isinstance(tweak, (bytes, bytearray)):
            raise TypeError("tweak must be bytes")
        out = bytes(tweak)
    elif column is None:
        return b""
    elif not isinstance(column, str):
        raise TypeError("column must be a str (the tweak is its name)")
    else:
        out = column.encode("utf-8")
    if out.startswith(TOKEN_TWEAK):
        named = "a tweak" if tweak is not None else "a column name"
        raise FieldError(
            f"{what}: {named} beginning with 'token:' is refused: tokenize tweaks FF1 with "
            "'token:' + its column under the same key, so this would read or make the "
            "tokens of another column",
            hint="name the column without the 'token:' prefix; values made under such a "
            "name are that column's tokens: detokenize(v, 'KEY', col := 'COLUMN') reads "
            "them")
    return out


def fpe_encrypt(values: Any, key: FieldKey, column: str | None = None, *,
                alphabet: str | Alphabet = "digits", tweak: bytes | None = None,
                version: int | None = None) -> pa.Array:
    """FF1-encrypt text values keeping their length and alphabet.

    The tweak is ``column``'s name (so equal values in different columns encrypt
    differently) unless ``tweak`` is given; with neither it is empty. Each value
    must have ``radix**length >= 1,000,000`` (6 digits, 4 alphanumerics).
    The output names no key version: ``version`` is the key id to use, required when
    the key has several (:meth:`FieldKey.named_version`).
    """
    alpha = Alphabet(alphabet)
    cipher = field_key(key, "fpe_encrypt").named_version(version, "fpe_encrypt").ff1_cipher()
    tw = _tweak(column, tweak, "fpe_encrypt")
    return map_groups(values, alpha, "fpe_encrypt", lambda rows, x: ff1_group(
        ff1_encrypt, cipher, alpha.radix, tw, x, "fpe_encrypt", rows))


def fpe_decrypt(values: Any, key: FieldKey, column: str | None = None, *,
                alphabet: str | Alphabet = "digits", tweak: bytes | None = None,
                version: int | None = None) -> pa.Array:
    """The inverse of :func:`fpe_encrypt` (same key version, column or tweak, alphabet)."""
    alpha = Alphabet(alphabet)
    cipher = field_key(key, "fpe_decrypt").named_version(version, "fpe_decrypt").ff1_cipher()
    tw = _tweak(column, tweak, "fpe_decrypt")
    return map_groups(values, alpha, "fpe_decrypt", lambda rows, x: ff1_group(
        ff1_decrypt, cipher, alpha.radix, tw, x, "fpe_decrypt", rows))
