"""The analytical engine's Arrow results as the rows the server sends: Python's values
(:func:`cryptdisk.db.python_rows`), with the dates, timestamps and times Python cannot
hold as PostgreSQL sends them (:mod:`._pgdatetime`), nanosecond timestamps rounded to
microseconds (PostgreSQL's precision), and each list of lists checked to be
a PostgreSQL array (rectangular: a statement error 2202E before any row is sent, not a
failure while its rows go out)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from . import _pgdatetime, _types
from ._engines import StatementError

__all__ = ["result_rows"]


def _nested(t: pa.DataType) -> bool:
    return _types.is_list(t) and _types.is_list(t.value_type)


def _micros(chunk: pa.Array) -> pa.Array:
    """A ``timestamp[ns]`` array in microseconds, rounded (half up)."""
    import numpy as np

    ints = chunk.view(pa.int64())
    micros = (np.asarray(ints.fill_null(0)) + 500) // 1000
    return pa.array(micros, pa.int64(), mask=np.asarray(ints.is_null())).view(
        pa.timestamp("us", chunk.type.tz))


def result_rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """The rows of ``table`` (see the module)."""
    from ..db import python_rows

    special = {}
    for i, field in enumerate(table.schema):
        if _pgdatetime.temporal(field.type):
            column = table.column(i)
            if any(_pgdatetime.has_special(chunk) for chunk in column.chunks):
                special[i] = [v for chunk in column.chunks for v in _pgdatetime.values(chunk)]
                table = table.set_column(i, field.name, pa.nulls(table.num_rows))
            elif pa.types.is_timestamp(field.type) and field.type.unit == "ns":
                # PostgreSQL keeps microseconds: a TIMESTAMP_NS rounded to them, as its
                # input rounds '...05.123456789' to '...05.123457'
                table = table.set_column(i, field.name, pa.chunked_array(
                    [_micros(c) for c in column.chunks], pa.timestamp("us", field.type.tz)))
    rows = python_rows(table)
    if special:
        rows = [tuple(special[i][r] if i in special else v for i, v in enumerate(row))
                for r, row in enumerate(rows)]
    for i, field in enumerate(table.schema):
        if _nested(field.type):
            for row in rows:
                if row[i] is not None and not _types.rectangular(row[i]):
                    raise StatementError(_types.RAGGED, "2202E")
    return rows
