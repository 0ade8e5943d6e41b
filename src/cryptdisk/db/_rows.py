"""A query's Arrow result as Python rows (``Database.query``, ``cryptdisk sql``, the server).

Column by column, so that columns sharing a name (``SELECT 1 AS a, 2 AS a``, ``SELECT *``
of a self-join) each keep their values (``Table.to_pylist`` makes one dict per row, in
which the last of them wins). A column Python's types cannot hold as pyarrow converts it
(``'infinity'::DATE``, a ``TIMESTAMP`` before year 1 or past 9999) is converted as DuckDB
converts it (``date.max``, ``datetime.min``...), so a query answers as DuckDB's
``fetchall`` would instead of failing in pyarrow.
"""

from __future__ import annotations

import decimal
from typing import Any, NamedTuple

import duckdb
import pyarrow as pa

__all__ = ["TIME_ZONE", "Rows", "exact_table", "exact_uhugeint", "has_wide", "python_rows",
           "query_rows"]

#: DuckDB's TimeZone on every connection of a database and the scratch ones beside it
#: (``SET TimeZone`` changes it for a connection): TIMESTAMPTZ values in UTC on every
#: machine, whatever its TZ
TIME_ZONE = "UTC"


def _values(column: pa.ChunkedArray) -> list[Any]:
    try:
        return column.to_pylist()  # type: ignore[no-any-return]
    except (OverflowError, ValueError, pa.ArrowException):
        con = duckdb.connect()
        try:
            con.execute(f"SET TimeZone = '{TIME_ZONE}'")
            return [r[0] for r in con.from_arrow(pa.table({"v": column})).fetchall()]
        finally:
            con.close()


def python_rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """The rows of ``table`` as tuples, one value per column, in the columns' order."""
    if not table.num_columns:
        return [() for _ in range(table.num_rows)]
    return list(zip(*(_values(c) for c in table.columns), strict=True))


class Rows(NamedTuple):
    """A query's result fetched as DuckDB's ``fetchall`` gives it (``Database.query``):
    its columns' names and its rows."""

    names: list[str]
    rows: list[tuple[Any, ...]]


def query_rows(con: duckdb.DuckDBPyConnection, result: pa.Table | Rows | None,
               ) -> list[tuple[Any, ...]]:
    """``result`` as DuckDB's ``fetchall`` on ``con`` gives it: the rows a query fetched
    so, or a table cryptdisk computed (statistics, ``SHOW TABLES``) read through ``con``
    (DuckDB's Python values, in its ``TimeZone``), not pyarrow's (``MAP`` as pairs,
    ``INTERVAL`` as ``MonthDayNano``, ``TIMESTAMP_NS`` as pandas ``Timestamp``)."""
    if result is None:
        return []
    if isinstance(result, Rows):
        return result.rows
    if not result.num_columns:
        return [() for _ in range(result.num_rows)]
    if all(_same_in_python(f.type) for f in result.schema):  # (no 2 ms of a DuckDB read)
        return python_rows(result)
    return con.from_arrow(result).fetchall()


def _same_in_python(typ: pa.DataType) -> bool:
    """Whether pyarrow gives a value of Arrow type ``typ`` as DuckDB's ``fetchall`` gives
    the DuckDB type it reads it as (integers, floats, text, bytes, booleans, decimals,
    dates and naive microsecond timestamps)."""
    return bool(pa.types.is_integer(typ) or pa.types.is_floating(typ)
                or pa.types.is_string(typ) or pa.types.is_large_string(typ)
                or pa.types.is_binary(typ) or pa.types.is_large_binary(typ)
                or pa.types.is_boolean(typ) or pa.types.is_decimal(typ)
                or pa.types.is_date32(typ) or pa.types.is_null(typ)
                or (pa.types.is_timestamp(typ) and typ.tz is None and typ.unit == "us"))


#: 2^128: a UHUGEINT above 2^127 - 1 in DuckDB's Arrow export is its value less this
_UHUGEINT_WRAP = 1 << 128


def has_wide(t: pa.DataType) -> bool:
    """Whether Arrow type ``t`` has a ``DECIMAL(38,0)`` (alone or nested in lists, structs
    and maps' keys and values), which may be a
    ``UHUGEINT`` DuckDB's Arrow export wrapped (see :func:`exact_result`)."""
    if pa.types.is_decimal(t):
        return bool(t.precision == 38 and t.scale == 0)
    if pa.types.is_map(t):
        return has_wide(t.key_type) or has_wide(t.item_type)
    if pa.types.is_struct(t):
        return any(has_wide(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return has_wide(t.value_type)
    return False


def _duckdb_parts(typ: str) -> tuple[str, list[str]]:
    """DuckDB's column type ``typ`` as (kind, the types in it): ("list", [element]) for
    ``T[]``/``T[n]``, ("struct", [field types in order]) for ``STRUCT(a T, ...)``,
    ("map", [key, value]) for ``MAP(K, V)``, else (the type's name in upper case, [])."""
    typ = typ.strip()
    if typ.endswith("]") and "[" in typ:
        return "list", [typ[:typ.rindex("[")]]
    if typ.upper().startswith("MAP(") and typ.endswith(")"):
        parts = _split_top(typ[4:-1])
        if len(parts) == 2:
            return "map", [parts[0].strip(), parts[1].strip()]
    if typ.upper().startswith("STRUCT(") and typ.endswith(")"):
        fields = []
        for part in _split_top(typ[7:-1]):
            part = part.strip()
            if part.startswith('"'):  # a quoted name: "a ""b""" T
                end = 1
                while end < len(part):
                    if part[end] == '"' and part[end + 1:end + 2] != '"':
                        break
                    end += 2 if part[end] == '"' else 1
                fields.append(part[end + 1:])
            else:
                fields.append(part.split(None, 1)[1] if " " in part else part)
        return "struct", fields
    return typ.upper(), []


def _split_top(text: str) -> list[str]:
    """``text`` split at its commas outside parentheses, brackets and double quotes."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, c in enumerate(text):
        if c == '"':
            quoted = not quoted
        elif not quoted and c in "([":
            depth += 1
        elif not quoted and c in ")]":
            depth -= 1
        elif not quoted and depth == 0 and c == ",":
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def exact_uhugeint(column: pa.ChunkedArray, typ: str) -> pa.ChunkedArray:
    """``column`` (DuckDB's Arrow export of a column of DuckDB type ``typ``) with each
    ``UHUGEINT`` in it, alone or in lists, structs and maps, as its value: DuckDB exports one as
    a ``DECIMAL(38,0)`` and wraps a value above 2^127 - 1 to a negative number (2^128 - 1
    as -1); here it is a ``DECIMAL(39,0)`` of the value."""
    # (in integers: Decimal rounds to 28 digits)
    chunks = [_unwrapped(c, typ) for c in column.chunks] or \
        [_unwrapped(pa.array([], column.type), typ)]
    return pa.chunked_array(chunks)


def exact_table(table: pa.Table, kinds: list[str]) -> pa.Table:
    """DuckDB's Arrow result ``table`` with each column of a DuckDB type (``kinds``, in
    order) that has a ``UHUGEINT`` made exact (:func:`exact_uhugeint`), in a ``MAP``'s
    keys and values too."""
    if len(kinds) != table.num_columns or not any("UHUGEINT" in k.upper() for k in kinds):
        return table
    for i, field in enumerate(table.schema):
        if "UHUGEINT" in kinds[i].upper() and has_wide(field.type):
            table = table.set_column(i, field.name, exact_uhugeint(table.column(i), kinds[i]))
    return table


def _map_type(t: pa.MapType, key: pa.DataType, item: pa.DataType) -> pa.MapType:
    """Map type ``t`` with keys of type ``key`` and items of type ``item``."""
    return pa.map_(key, item, keys_sorted=t.keys_sorted)


def _unwrapped(array: pa.Array, typ: str) -> pa.Array:
    """``array`` of DuckDB type ``typ`` with its ``UHUGEINT`` values exact (see
    :func:`exact_uhugeint`); what it cannot match is left as it is."""
    kind, inner = _duckdb_parts(typ)
    t = array.type
    if kind == "UHUGEINT" and pa.types.is_decimal(t):
        return pa.array([None if v is None else decimal.Decimal(int(v) % _UHUGEINT_WRAP)
                         for v in array.to_pylist()], pa.decimal256(39, 0))
    if kind == "list" and (pa.types.is_list(t) or pa.types.is_large_list(t)):
        values = _unwrapped(array.flatten(), inner[0])
        import pyarrow.compute as pc

        offsets = pc.subtract(array.offsets, array.offsets[0])
        cls = pa.ListArray if pa.types.is_list(t) else pa.LargeListArray
        return cls.from_arrays(offsets, values, mask=array.is_null())
    if kind == "list" and pa.types.is_fixed_size_list(t):
        return pa.FixedSizeListArray.from_arrays(
            _unwrapped(array.flatten(), inner[0]), t.list_size, mask=array.is_null())
    if kind == "map" and pa.types.is_map(t):
        import pyarrow.compute as pc

        if not len(array):
            return pa.array([], _map_type(t, _unwrapped(array.keys, inner[0]).type,
                                          _unwrapped(array.items, inner[1]).type))
        # (the keys and items of every map of the array, a slice's too: its own only)
        start = array.offsets[0].as_py()
        size = array.offsets[-1].as_py() - start
        keys = _unwrapped(array.keys.slice(start, size), inner[0])
        items = _unwrapped(array.items.slice(start, size), inner[1])
        offsets = pc.subtract(array.offsets, array.offsets[0])
        return pa.MapArray.from_arrays(offsets, keys, items, mask=array.is_null())
    if kind == "struct" and pa.types.is_struct(t) and len(inner) == t.num_fields:
        children = [_unwrapped(c, k) for c, k in zip(array.flatten(), inner, strict=True)]
        return pa.StructArray.from_arrays(
            children, fields=[t.field(i).with_type(c.type) for i, c in enumerate(children)],
            mask=array.is_null())
    return array
