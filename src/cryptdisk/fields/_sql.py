"""SQL functions of the embedded database.

The keyed functions are DuckDB Python UDFs over Arrow batches. Key arguments are
names resolved from the config's ``[fields.keys]``; the material stays in this
process's :class:`FieldKey` objects, never in SQL text, plans or messages.
Functions with options are SQL macros with named defaults over internal UDFs
(DuckDB cannot overload a Python UDF)::

    fpe_encrypt(v, 'cards' [, col := 'pan'] [, alphabet := 'digits'] [, version := 2])
    tokenize(v, 'cards' [, col := 'pan'] [, keep_first := 6] [, keep_last := 4]
             [, luhn := true] [, version := 2])
    mask_hash(v, 'ids' [, version := 2])

``version`` (NULL unless given) is the key id FF1, tokens and ``mask_hash`` compute
under, required when the key has several (:meth:`FieldKey.named_version`); their UDFs
take NULL arguments (DuckDB's ``null_handling="special"``) so a missing version reaches
them.

``decrypt`` and ``decrypt_deterministic`` take a ciphertext as base64 ``VARCHAR`` (what
``encrypt`` returns) or as its bytes (``BLOB``, what the Python API's ``encrypt``
returns by default): each is a macro that picks, by the argument's type (DuckDB folds
the choice when it binds the query), one of two UDFs (:data:`DECRYPT_MACROS`).

The masks without a key (``mask_full``, ``mask_last4``, ``mask_email``,
``mask_null``) are SQL macros over DuckDB's own string functions (:data:`MASK_MACROS`):
they run inside DuckDB's vectorised engine on all its threads, with no trip through
Python, and give the same text as :mod:`._mask`'s functions (characters are Unicode
code points in both).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import CryptdiskError, FieldError
from ._aead import decrypt, decrypt_deterministic, encrypt, encrypt_deterministic
from ._fpe import fpe_decrypt, fpe_encrypt
from ._keys import FieldKey, FieldKeys
from ._mask import mask_hash
from ._scanfns import FieldExtension
from ._tokens import detokenize, tokenize

__all__ = ["DECRYPT_MACROS", "MASK_MACROS", "SQL_FUNCTIONS", "config_hook",
           "register_sql_functions"]

SQL_FUNCTIONS = ("encrypt", "decrypt", "encrypt_deterministic", "decrypt_deterministic",
                 "fpe_encrypt", "fpe_decrypt", "tokenize", "detokenize", "mask_full",
                 "mask_last4", "mask_email", "mask_null", "mask_hash")

V = "VARCHAR"

_STARS = "'" + "*" * 64 + "'"
#: name -> body of the keyless masks as DuckDB macros of one VARCHAR ``v``: the same
#: output as cryptdisk.fields.mask_full etc. (tests/fields/test_sql.py compares them).
#: ``left`` of a constant row of stars costs less than ``repeat`` for values of up
#: to 64 characters.
MASK_MACROS = {
    "mask_full": f"CASE WHEN length(v) <= 64 THEN left({_STARS}, length(v)) "
                 "ELSE repeat('*', length(v)) END",
    "mask_last4": f"CASE WHEN length(v) <= 4 THEN mask_full(v) WHEN length(v) <= 68 THEN "
                  f"left({_STARS}, length(v) - 4) || substr(v, -4) "
                  "ELSE repeat('*', length(v) - 4) || substr(v, -4) END",
    "mask_email": "CASE WHEN contains(v, '@') THEN '****@' || split_part(v, '@', -1) "
                  "ELSE mask_full(v) END",
    "mask_null": "CAST(NULL AS VARCHAR)",
}


_OFFSETS: dict[tuple[int, int], bytes] = {}


#: name -> body of the decrypting macros of ``v`` (a ciphertext) and ``k`` (a key name):
#: ``BLOB`` goes to the UDF over bytes, anything else to the one over base64 text
DECRYPT_MACROS = {
    fn: f"CASE WHEN typeof(v) = 'BLOB' THEN __cd_{fn}_bytes(CAST(v AS BLOB), k) "
        f"ELSE __cd_{fn}(CAST(v AS VARCHAR), k) END"
    for fn in ("decrypt", "decrypt_deterministic")}


def _constant(arr: pa.Array) -> bool:
    """Whether every row of ``arr`` holds one value (all null counts as one), checked on
    the buffers with two byte comparisons: a constant argument is a whole batch of copies."""
    n = len(arr)
    if n <= 1 or arr.null_count == n:
        return True
    if arr.null_count:
        return False
    if arr.type not in (pa.string(), pa.binary()):
        values = arr.to_numpy(zero_copy_only=False)
        return bool((values == values[0]).all())
    _validity, offsets_buf, data = arr.buffers()
    offsets = offsets_buf.slice(4 * arr.offset, 4 * (n + 1)).to_pybytes()
    start = int.from_bytes(offsets[:4], sys.byteorder, signed=True)
    width = int.from_bytes(offsets[4:8], sys.byteorder, signed=True) - start
    want = _OFFSETS.get((n, width)) if start == 0 else None
    if want is None:
        want = (np.arange(n + 1, dtype=np.int32) * width + start).tobytes()
        if start == 0 and len(_OFFSETS) < 64:
            _OFFSETS[(n, width)] = want
    if offsets != want:
        return False
    return width == 0 or data.slice(start, width * n).to_pybytes() == \
        data.slice(start, width).to_pybytes() * n


def _const(arr: Any, what: str) -> Any:
    """The one value of a constant argument column (key names, options)."""
    if isinstance(arr, pa.ChunkedArray):  # one chunk (DuckDB's batches): no copy
        arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
    if len(arr) == 0:
        return None
    if not _constant(arr):
        raise FieldError(f"{what} must be the same for every row (a constant)")
    return arr[0].as_py()


_ROW = re.compile(r"\brow (\d+)")


def _in_batch(exc: CryptdiskError) -> CryptdiskError:
    """``exc`` (same class and attributes) saying that the row it names is one of the
    batch DuckDB handed the function (2,048 values), not a row of a table."""
    located = type(exc).__new__(type(exc))
    located.__dict__.update(getattr(exc, "__dict__", {}))
    located.args = (_ROW.sub(r"row \1 of DuckDB's batch of values", str(exc), count=1),)
    return located


def _option(arr: Any, what: str) -> Any:
    """A constant option that may not be NULL (``col``, ``alphabet``, the token options)."""
    value = _const(arr, what)
    if value is None:
        raise FieldError(f"{what} must not be NULL")
    return value


def register_sql_functions(con: Any, keys: FieldKeys | Callable[[], FieldKeys]) -> None:
    """Create the field functions (:data:`SQL_FUNCTIONS`) on a DuckDB connection, with
    ``keys`` (or the keys ``keys()`` gives at each call)."""

    def key(arr: Any) -> FieldKey:
        name = _const(arr, "the key name")
        if not isinstance(name, str):
            raise FieldError("a field key name is a string constant such as 'cards'")
        current = keys() if callable(keys) else keys
        return current[name]

    def udf(name: str, fn: Callable[..., Any], params: list[str], *,
            side_effects: bool = False, nulls: bool = False) -> None:
        def run(cols: tuple[Any, ...]) -> Any:
            if len(cols[0]) == 0:
                return pa.array([], pa.string())
            try:
                return fn(*cols)
            except CryptdiskError as exc:
                raise _in_batch(exc) from None
        # DuckDB counts the parameters of the Python function: give it the exact arity.
        arity: dict[int, Callable[..., Any]] = {
            1: lambda a: run((a,)), 2: lambda a, b: run((a, b)),
            3: lambda a, b, c: run((a, b, c)),
            5: lambda a, b, c, d, e: run((a, b, c, d, e)),
            7: lambda a, b, c, d, e, f, g: run((a, b, c, d, e, f, g))}
        # nulls: the function gets NULL arguments too (a missing ``version``), and keeps
        # a NULL value NULL itself
        con.create_function(name, arity[len(params)], params, V, type="arrow",
                            side_effects=side_effects,
                            null_handling="special" if nulls else "default")

    udf("encrypt", lambda v, k: encrypt(v, key(k), output="base64"), [V, V],
        side_effects=True)  # a fresh nonce per call: never fold or share results
    udf("__cd_decrypt", lambda v, k: decrypt(v, key(k)), [V, V])
    udf("__cd_decrypt_bytes", lambda v, k: decrypt(v, key(k)), ["BLOB", V])
    udf("encrypt_deterministic",
        lambda v, k: encrypt_deterministic(v, key(k), output="base64"), [V, V])
    udf("__cd_decrypt_deterministic", lambda v, k: decrypt_deterministic(v, key(k)), [V, V])
    udf("__cd_decrypt_deterministic_bytes", lambda v, k: decrypt_deterministic(v, key(k)),
        ["BLOB", V])
    fpe_params = [V, V, V, V, "BIGINT"]
    udf("__cd_fpe_encrypt", lambda v, k, c, a, ver: fpe_encrypt(
        v, key(k), _option(c, "col"), alphabet=_option(a, "alphabet"),
        version=_const(ver, "version")), fpe_params, nulls=True)
    udf("__cd_fpe_decrypt", lambda v, k, c, a, ver: fpe_decrypt(
        v, key(k), _option(c, "col"), alphabet=_option(a, "alphabet"),
        version=_const(ver, "version")), fpe_params, nulls=True)
    token_params = [V, V, V, "INTEGER", "INTEGER", "BOOLEAN", "BIGINT"]
    udf("__cd_tokenize", lambda v, k, c, f, la, lu, ver: tokenize(
        v, key(k), _option(c, "col"), keep_first=_option(f, "keep_first"),
        keep_last=_option(la, "keep_last"), luhn=bool(_option(lu, "luhn")),
        version=_const(ver, "version")), token_params, nulls=True)
    udf("__cd_detokenize", lambda v, k, c, f, la, lu, ver: detokenize(
        v, key(k), _option(c, "col"), keep_first=_option(f, "keep_first"),
        keep_last=_option(la, "keep_last"), luhn=bool(_option(lu, "luhn")),
        version=_const(ver, "version")), token_params, nulls=True)
    udf("__cd_mask_hash", lambda v, k, ver: mask_hash(
        v, key(k), version=_const(ver, "version")), [V, V, "BIGINT"], nulls=True)
    register_temp_macros(con)


def register_temp_macros(con: Any) -> None:
    """The field functions that are DuckDB macros, on ``con``: temporary, so each
    connection (a :class:`cryptdisk.db.Reader`'s cursor too) needs its own; the Python
    functions they call belong to the database instance."""
    for name, body in MASK_MACROS.items():  # mask_full first: the others use it
        con.execute(f"CREATE OR REPLACE TEMP MACRO {name}(v VARCHAR) AS {body}")
    for name, body in DECRYPT_MACROS.items():
        con.execute(f"CREATE OR REPLACE TEMP MACRO {name}(v, k) AS {body}")
    for fn in ("fpe_encrypt", "fpe_decrypt"):
        con.execute(f"CREATE OR REPLACE TEMP MACRO {fn}(v, k, col := '', "
                    "alphabet := 'digits', version := NULL) AS "
                    f"__cd_{fn}(v, k, col, alphabet, version)")
    for fn in ("tokenize", "detokenize"):
        con.execute(f"CREATE OR REPLACE TEMP MACRO {fn}(v, k, col := '', "
                    "keep_first := 0, keep_last := 0, luhn := false, version := NULL) AS "
                    f"__cd_{fn}(v, k, col, keep_first, keep_last, luhn, version)")
    con.execute("CREATE OR REPLACE TEMP MACRO mask_hash(v, k, version := NULL) AS "
                "__cd_mask_hash(v, k, version)")


def config_hook(con: Any, config: Any) -> FieldExtension:
    """A :func:`cryptdisk.db.add_connection_hook` hook: the field functions on every
    database connection, with the field keys of the database's TOML config (read again
    before a statement when the file changed), and the functions its scans compute
    (:class:`._scanfns.FieldExtension`)."""
    ext = FieldExtension(config)
    register_sql_functions(con, ext.current)
    return ext
