"""Tokens: format-preserving, deterministic stand-ins for identifiers and card numbers.

A token is FF1 (:mod:`._ff1`) over the middle of a value, under the key's FF1
subkey with the tweak ``"token:" + column``, so one key and column always give the
same token for a value (joins on tokens work) and another column gives another.
``fpe_encrypt`` and ``fpe_decrypt`` refuse a column or tweak beginning with
``"token:"``, so they never compute a token.
Options keep the first and last characters in clear (``keep_first=6, keep_last=4``
for a card number's BIN and last four) and keep Luhn validity (``luhn=True``): the
middle is re-encrypted until the whole number passes the Luhn check (cycle
walking, about ten rounds on average), which stays a permutation of the Luhn-valid
numbers with those kept digits, so :func:`detokenize` inverts it.

The kept characters are not part of the tweak: two values that differ only in
their kept characters get the same middle. A token names no key version: ``version``
is the key id to use, required when the key has several.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import FieldError
from ._arrays import field_key
from ._ff1 import ff1_decrypt, ff1_encrypt
from ._fpe import TOKEN_TWEAK, Alphabet, ff1_group, map_groups
from ._keys import FieldKey

__all__ = ["detokenize", "luhn_valid", "tokenize"]


def luhn_valid(digits: np.ndarray) -> np.ndarray:
    """Which rows of a numeral matrix (radix 10) pass the Luhn check."""
    x = np.asarray(digits, dtype=np.int64)[:, ::-1].copy()
    doubled = x[:, 1::2] * 2
    x[:, 1::2] = np.where(doubled > 9, doubled - 9, doubled)
    result: np.ndarray = x.sum(axis=1) % 10 == 0
    return result


def _run(values: Any, key: FieldKey, column: str | None, keep_first: int, keep_last: int,
         luhn: bool, alphabet: str, decrypt: bool, version: int | None) -> pa.Array:
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
               for n in (keep_first, keep_last)):
        raise FieldError("keep_first and keep_last are numbers of characters (0 or more)")
    alpha = Alphabet(alphabet)
    if luhn and alpha.radix != 10:
        raise FieldError("luhn=True needs the digits alphabet")
    what = "detokenize" if decrypt else "tokenize"
    cipher = field_key(key, what).named_version(version, what).ff1_cipher()
    tweak = TOKEN_TWEAK + (column or "").encode("utf-8")
    step = ff1_decrypt if decrypt else ff1_encrypt

    def one(rows: np.ndarray, x: np.ndarray) -> np.ndarray:
        n = x.shape[1]
        end = n - keep_last
        kept = f"{n} characters; keeping {keep_first} + {keep_last} leaves"
        if end - keep_first < 2:
            raise FieldError(f"{what}: row {int(rows[0])} has {kept} too few to tokenize")
        out = x.astype(np.uint32)
        if luhn:
            bad = np.nonzero(~luhn_valid(out))[0]
            if len(bad):
                raise FieldError(f"{what}: row {int(rows[bad[0]])} fails the Luhn check "
                                 "(luhn=True takes valid card numbers only)")
        todo = np.arange(len(out))
        while len(todo):
            out[todo, keep_first:end] = ff1_group(
                step, cipher, alpha.radix, tweak, out[todo, keep_first:end], what, rows[todo],
                f"{kept} {end - keep_first}" if keep_first or keep_last else "")
            if not luhn:
                break
            todo = todo[~luhn_valid(out[todo])]
        return out

    return map_groups(values, alpha, what, one)


def tokenize(values: Any, key: FieldKey, column: str | None = None, *, keep_first: int = 0,
             keep_last: int = 0, luhn: bool = False, alphabet: str = "digits",
             version: int | None = None) -> pa.Array:
    """Format-preserving tokens for text values (see the module docstring)."""
    return _run(values, key, column, keep_first, keep_last, luhn, alphabet, False, version)


def detokenize(values: Any, key: FieldKey, column: str | None = None, *, keep_first: int = 0,
               keep_last: int = 0, luhn: bool = False, alphabet: str = "digits",
               version: int | None = None) -> pa.Array:
    """The values :func:`tokenize` made these tokens from (same key, version, column and
    options)."""
    return _run(values, key, column, keep_first, keep_last, luhn, alphabet, True, version)
