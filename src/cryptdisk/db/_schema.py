"""Changing a table's name and columns, and making a table from a query.

``CREATE TABLE t [ORDER BY ...] [SETTINGS ...] AS query`` takes its columns' names and
types from DuckDB's description of the query, writes the query's rows as new parts and
publishes the table and its parts in one catalog commit: a crash before it leaves no
table (the parts are orphans the next writer removes), after it the whole table.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import duckdb

from ..errors import DatabaseError
from ._memory import out_of_memory
from ._policies import role_query
from ._storage import policy_disk

if TYPE_CHECKING:
    from . import _sql
    from ._state import DatabaseState
else:
    DatabaseState = object  # the type checker's view only: see _state

__all__ = ["SchemaMixin"]


class SchemaMixin(DatabaseState):
    """``CREATE TABLE ... AS`` and ``ALTER TABLE`` of :class:`~cryptdisk.db.Database`."""

    def _create_as(self, st: _sql.CreateTable) -> None:
        """``CREATE TABLE t ... AS query``: the table and the query's rows, one commit."""
        assert st.query is not None
        query = st.query
        if self.role is not None:  # the rows and values a role may read, as its queries
            query = role_query(self, query)
        columns = self._query_columns(st.name, query)
        meta = self._new_table(dataclasses.replace(st, columns=columns, query=None))
        schema = self.arrow_schema(meta)
        disk = policy_disk(self.policy(meta.policy))
        try:
            prepared = self._query_text(self._prepare(query, False))
            parts = self._write(meta, schema, disk, prepared, None,
                                self.catalog.version + 1, None)
        except duckdb.OutOfMemoryException as exc:
            raise out_of_memory(f"CREATE TABLE {st.name} AS", exc,
                                "raise memory_limit") from None
        except duckdb.Error as exc:
            raise DatabaseError(f"CREATE TABLE {st.name} AS: {exc}") from None
        finally:
            self._release()
        meta.parts = parts
        self.catalog.tables[meta.name] = meta
        try:
            self._commit()
        except BaseException:
            del self.catalog.tables[meta.name]
            raise

    def _query_columns(self, table: str, query: str) -> list[tuple[str, str]]:
        """The columns of ``query``'s result as DuckDB describes them: (name, type)."""
        described = self._run_duckdb(f"DESCRIBE {query}")
        assert described is not None
        names = described.column("column_name").to_pylist()
        types = described.column("column_type").to_pylist()
        seen: dict[str, str] = {}
        for name in names:
            if name.lower() in seen:
                raise DatabaseError(
                    f"CREATE TABLE {table} AS: the query gives two columns named {name} "
                    "(in any case, a name is one column)",
                    hint="name each column of the query once: SELECT a, a AS a2 ...")
            seen[name.lower()] = name
        for name, typ in zip(names, types, strict=True):
            if typ == '"NULL"':  # (a bare NULL: no type to store it as)
                raise DatabaseError(
                    f"CREATE TABLE {table} AS: column {name} is NULL without a type",
                    hint=f"give it one: CAST(NULL AS VARCHAR) AS {name}")
        return list(zip(names, types, strict=True))
