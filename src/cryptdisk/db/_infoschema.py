"""DuckDB's catalog views with the database's tables in them.

``information_schema.tables``, ``information_schema.columns``, ``duckdb_tables()`` and
``duckdb_columns()`` of the connection list DuckDB's own tables and views (temporary
tables, views, attached databases); the database's tables are in no DuckDB catalog (see
:mod:`._sql`). A statement that names one of them reads instead a table of the same
columns holding DuckDB's own rows and, in schema ``main`` of the connection's database,
one row per table (or column) of the database: DuckDB describes those itself, from
empty tables of the same columns made in a private in-memory DuckDB, so the types,
precisions, defaults and nullability read as DuckDB's own tables' do.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from ._constraints import column_definitions

__all__ = ["catalog_views", "rewrite_catalog_views"]

#: a string (left as it is), or a catalog view: information_schema.x or duckdb_x()
_VIEWS = re.compile(r"'(?:[^']|'')*'|(?<![\w$\".])(?i:\"?information_schema\"?\s*\.\s*"
                    r"(?:(tables|columns)\b|\"(tables|columns)\")"
                    r"|\"?(duckdb_tables|duckdb_columns|duckdb_views)\"?\s*\(\s*\))")
_SQL = {"information_schema_tables": "information_schema.tables",
        "information_schema_columns": "information_schema.columns",
        "duckdb_tables": "duckdb_tables()", "duckdb_columns": "duckdb_columns()",
        "duckdb_views": "duckdb_views()"}
PREFIX = "__cd_catalog_"


def rewrite_catalog_views(sql: str) -> tuple[str, set[str]]:
    """``sql`` reading each catalog view it names from ``__cd_catalog_<view>``, and the
    views named (``information_schema_tables``, ``duckdb_columns``, ...)."""
    low = sql.lower()
    if "information_schema" not in low and "duckdb_" not in low:
        return sql, set()
    wanted: set[str] = set()

    def sub(m: re.Match[str]) -> str:
        if m.group(1) or m.group(2):
            name = "information_schema_" + (m.group(1) or m.group(2)).lower()
        elif m.group(3):
            name = m.group(3).lower()
        else:
            return m.group(0)
        wanted.add(name)
        return PREFIX + name

    return _VIEWS.sub(sub, sql), wanted


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def catalog_views(con: Any, tables: list[Any], wanted: set[str], views: Sequence[Any] = (),
                  read: dict[str, list[str]] | None = None) -> dict[str, pa.Table]:
    """``PREFIX + view`` -> the rows of each view in ``wanted``: those of ``con`` (the
    statement's DuckDB connection), then the database's ``tables`` and ``views``
    (catalog entries; a view whose query DuckDB cannot bind over the tables alone, one
    that calls a field function or reads a file, is left out). ``read``: each table's
    column types as queries read them (``DESCRIBE t``: a ``HUGEINT`` column is a
    ``DECIMAL(38,0)``, a ``UUID`` one a ``VARCHAR``), which the views show."""
    own = {name: con.sql(f"SELECT * FROM {_SQL[name]}").to_arrow_table()
           for name in sorted(wanted)}
    database = con.sql("SELECT current_database()").fetchall()[0][0]
    scratch = duckdb.connect(":memory:")
    try:
        for meta in tables:
            types = (read or {}).get(meta.name)
            if types is not None and len(types) == len(meta.columns):
                meta = copy.copy(meta)  # (its types as read, its constraints as declared)
                meta.columns = [(c, t) for (c, _t), t in zip(meta.columns, types, strict=True)]
            try:
                scratch.execute(f"CREATE TABLE {_quote(meta.name)} ("
                                f"{column_definitions(meta)})")
            except duckdb.Error:  # a type of con's own (CREATE TYPE): as DuckDB names it
                described = con.sql("DESCRIBE SELECT " + ", ".join(
                    f"CAST(NULL AS {t}) AS {_quote(c)}" for c, t in meta.columns)).fetchall()
                scratch.execute(f"CREATE TABLE {_quote(meta.name)} (" + ", ".join(
                    f"{_quote(row[0])} {row[1]}" for row in described) + ")")
                # (DEFAULT and NOT NULL left out: the rest of the description stands)
        _make_views(scratch, views)
        rows = {t.name: t.rows for t in tables}
        out = {}
        for name, theirs in own.items():
            mine = scratch.sql(f"SELECT * FROM {_SQL[name]}").to_arrow_table()
            for col in ("database_name", "table_catalog"):
                if col in mine.column_names:  # (the connection's database: both in memory)
                    mine = mine.set_column(mine.column_names.index(col), col,
                                           pa.array([database] * len(mine), pa.string()))
            if name == "duckdb_tables":  # the rows each table holds
                mine = mine.set_column(
                    mine.column_names.index("estimated_size"), "estimated_size",
                    pa.array([rows[t] for t in mine.column("table_name").to_pylist()],
                             mine.schema.field("estimated_size").type))
            out[PREFIX + name] = pa.concat_tables([theirs, mine.cast(theirs.schema)])
        return out
    finally:
        scratch.close()


def _make_views(scratch: Any, views: Sequence[Any]) -> None:
    """Make ``views`` in ``scratch``, a view over views after them; leave out those that
    do not bind there."""
    left = list(views)
    while left:
        failed = []
        for view in left:
            try:
                scratch.execute(f"CREATE VIEW {_quote(view.name)} AS {view.body()}")
            except duckdb.Error:
                failed.append(view)
        if len(failed) == len(left):
            return
        left = failed
