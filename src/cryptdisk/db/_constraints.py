"""``NOT NULL`` and ``DEFAULT`` of a table's columns, the only constraints a table takes.

Both are kept in the catalog (``TableMeta.not_null``, ``TableMeta.defaults``). Every
write path checks ``NOT NULL`` before anything is published: DuckDB evaluates the rows
of an insert with each ``NOT NULL`` column's value read through ``coalesce(value,
error(...))``, which fails the statement at the first ``NULL`` (the parts written so far
are discarded, or left as orphans that the next writer removes, never published); an
Arrow insert that DuckDB does not read is checked batch by batch; ``UPDATE`` checks
its new values the same way. A column an insert leaves out gets its ``DEFAULT``,
evaluated by DuckDB as the insert runs (``now()``, ``current_date``: the statement's).
"""

from __future__ import annotations

import re
from typing import Any

import duckdb
import pyarrow as pa

from ..errors import DatabaseError
from ._columns import stored_type

__all__ = ["NOT_NULL_FAILED", "check_default", "check_not_null_batch", "column_definitions",
           "constraint_error", "default_sql", "not_null_sql"]

#: the words of DuckDB's own error, kept in cryptdisk's (see :func:`constraint_error`)
NOT_NULL_FAILED = "NOT NULL constraint failed"
_FAILED = re.compile(NOT_NULL_FAILED + r": ([^\n]*)")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def column_definitions(meta: Any) -> str:
    """``meta``'s columns as ``CREATE TABLE`` declares them, constraints included."""
    return ", ".join(
        f"{_quote(c)} {t}" + (f" DEFAULT ({meta.defaults[c]})" if c in meta.defaults else "")
        + (" NOT NULL" if c in meta.not_null else "") for c, t in meta.columns)


def default_sql(meta: Any, column: str, typ: str) -> str:
    """The value an insert that leaves ``column`` out gives it: its DEFAULT, or NULL."""
    expr = meta.defaults.get(column)
    typ = stored_type(typ)
    return f"CAST(NULL AS {typ})" if expr is None else f"CAST(({expr}) AS {typ})"


def not_null_sql(meta: Any, column: str, expr: str) -> str:
    """``expr`` (the SQL of ``column``'s new value), failing the statement where it is
    NULL if the column is ``NOT NULL``."""
    if column not in meta.not_null:
        return expr
    message = f"{NOT_NULL_FAILED}: {meta.name}.{column}"
    return f"coalesce({expr}, error({_literal(message)}))"


def constraint_error(what: str, text: str, names: dict[str, str] | None = None
                     ) -> DatabaseError | None:
    """A DuckDB error ``text`` about a ``NOT NULL`` column as cryptdisk says it (None for
    any other error); ``names`` maps a temporary table's name to the table's."""
    # (not in the statement DuckDB quotes after it, "LINE 1: ... error('NOT NULL ...":
    # a value that does not cast, beside the check, is that error)
    m = _FAILED.search(text.split("\nLINE ", 1)[0])
    if m is None:
        return None
    target = m.group(1).strip()
    for temp, table in (names or {}).items():
        target = target.replace(temp, table)
    return DatabaseError(f"{what}: {NOT_NULL_FAILED}: {target} (the column is NOT NULL, and "
                         "a row gives it NULL; nothing is written)",
                         hint="give the column a value in every row, or leave the column out "
                         "of the statement where it has a DEFAULT")


def check_not_null_batch(meta: Any, batch: pa.RecordBatch | pa.Table, what: str) -> None:
    """Refuse ``batch`` (in the table's columns) if a ``NOT NULL`` column holds a NULL."""
    for column in meta.not_null:
        if batch.column(batch.schema.get_field_index(column)).null_count:
            raise DatabaseError(f"{what}: {NOT_NULL_FAILED}: {meta.name}.{column} (the column "
                                "is NOT NULL, and a row gives it NULL; nothing is written)",
                                hint="give the column a value in every row, or leave the "
                                "column out of the data where it has a DEFAULT")


def check_default(con: Any, what: str, column: str, typ: str, expr: str,
                  not_null: bool) -> None:
    """Refuse a ``DEFAULT`` that DuckDB would not take for a column of type ``typ`` (a
    column name, a subquery, a value that does not cast; NULL for a NOT NULL column)."""
    probe = "__cd_default_probe"
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {probe} (v {typ} DEFAULT ({expr}))")
        # (evaluated only if that has no effect: nextval would use up a value)
        value = not _volatile(con, expr) and \
            con.execute(f"SELECT CAST(({expr}) AS {typ}) IS NULL").fetchall()[0][0]
    except duckdb.Error as exc:
        raise DatabaseError(f"{what}: column {column}: DEFAULT {expr}: "
                            f"{str(exc).splitlines()[0]}",
                            hint="a DEFAULT is a constant or an expression without columns or "
                            "subqueries (now(), current_date)") from None
    finally:
        con.execute(f"DROP TABLE IF EXISTS temp.{probe}")
    if value and not_null:
        raise DatabaseError(f"{what}: column {column} is NOT NULL, and its DEFAULT {expr} is "
                            "NULL")


def _volatile(con: Any, expr: str) -> bool:
    """Whether expression ``expr`` calls a function DuckDB calls volatile (``nextval``,
    ``random``, ``sleep_ms``, ...) or one whose stability it does not know (a UDF)."""
    from ._columns import serialize_sql

    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, dict):
            if node.get("class") == "FUNCTION" and isinstance(node.get("function_name"), str):
                names.add(node["function_name"].lower())
            for value in node.values():
                walk(value)

    walk(serialize_sql(f"SELECT ({expr})", con))
    if not names:
        return False
    stable = {str(n).lower() for (n,) in con.execute(  # (one volatile overload: volatile)
        "SELECT function_name FROM duckdb_functions() GROUP BY function_name HAVING "
        "bool_and(coalesce(stability, '') IN "
        "('CONSISTENT', 'CONSISTENT_WITHIN_QUERY')) AND lower(function_name) IN "
        "(SELECT unnest(?))", [sorted(names)]).fetchall()}
    return not names <= stable
