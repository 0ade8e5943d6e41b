"""A query's Arrow result as Python rows (``Database.query``, ``cryptdisk sql``, the server).

Column by column, so that columns sharing a name (``SELECT 1 AS a, 2 AS a``, ``SELECT *``
of a self-join) each keep their values (``Table.to_pylist`` makes one dict per row, in
which the last of them wins). A column Python's types cannot hold as pyarrow converts it
(``'infinity'::DATE``, a ``TIMESTAMP`` before year 1 or past 9999) is converted as DuckDB
converts it (``date.max``, ``datetime.min``...), so a query answers as DuckDB's
``fetchall`` would instead of failing in pyarrow.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import duckdb
import pyarrow as pa

__all__ = ["TIME_ZONE", "Rows", "python_rows", "query_rows"]

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
