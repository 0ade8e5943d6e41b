"""Changing a table's name and columns, and making a table from a query.

``CREATE TABLE t [ORDER BY ...] [SETTINGS ...] AS query`` takes its columns' names and
types from DuckDB's description of the query, writes the query's rows as new parts and
publishes the table and its parts in one catalog commit: a crash before it leaves no
table (the parts are orphans the next writer removes), after it the whole table.

``ALTER TABLE t RENAME TO u`` changes the catalog alone (a table's files are under its
id, not its name). ``ADD``, ``DROP``, ``RENAME COLUMN`` and ``ALTER COLUMN ... TYPE``
rewrite every part in the new columns (a new column all NULL, a dropped one left out, a
retyped one cast by DuckDB), one part at a time into
a part of its own (so each keeps its key order and range), then publish the new parts
and columns in one catalog commit and delete the old parts, as ``MODIFY SETTING
storage_policy`` moves a table: a crash leaves the old table or the new one.

Masking and row access policies (``PATH.policies``, kept by ``cryptdisk serve``) name
tables and columns: a rename carries them. The file is written first with the policies
under both the old and the new name, then the catalog is committed, then the file is
written with the new name only; a crash between leaves a policy on a name that no
table has, never a table without its policy. A column named by a row access policy is
not renamed or dropped, nor a masked column dropped: the error says to unset the policy
first.

``DROP TABLE`` removes the table's policy attachments after its catalog commit (the
policies themselves stay). What a crash leaves on a name no table has never reaches a
later table of that name: ``CREATE TABLE``, ``CREATE TABLE ... AS`` and ``RENAME TO``
remove the attachments under the name before their own commit
(:meth:`SchemaMixin._forget_policies`), and ``cryptdisk serve`` removes them as it
starts.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from ..errors import DatabaseError
from ..format import open_file
from ._columns import stored_type
from ._constraints import check_default
from ._names import fold, twin_error
from ._partread import read_part
from ._parts import verify_part, write_parts
from ._policies import read_policies, role_check_statement, role_query
from ._storage import policy_disk

if TYPE_CHECKING:
    from . import _sql
    from ._catalog import PartMeta, TableMeta
    from ._state import DatabaseState
else:
    DatabaseState = object  # the type checker's view only: see _state

__all__ = ["SchemaMixin", "alter_table_statement", "table_statement"]


def alter_table_statement(sql: str) -> Any:
    """The ``ALTER TABLE`` change of a table's name or columns that ``sql`` is (an object
    with ``name``, ``action`` -- ``rename``, ``add``, ``drop``, ``rename_column`` --,
    ``column`` and ``new_name``), or None for any other statement."""
    from . import _sql

    try:
        st = _sql.parse(sql)
    except DatabaseError:
        return None
    return st if isinstance(st, _sql.AlterTable) else None


def table_statement(sql: str) -> Any:
    """The statement that creates, drops, renames or changes one of the database's tables
    that ``sql`` is (``CREATE TABLE``, ``DROP TABLE``, ``ALTER TABLE``: an object with
    ``name``), or None for any other statement."""
    from . import _sql

    try:
        st = _sql.parse(sql)
    except DatabaseError:
        return None
    return st if isinstance(st, (_sql.CreateTable, _sql.DropTable, _sql.AlterTable)) \
        else None


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
        parts = self._insert_rows(meta, schema, disk, query, None,
                                  f"CREATE TABLE {st.name} AS", "raise memory_limit")
        meta.parts = parts
        try:
            self._forget_policies(meta.name)  # a dropped table's, left by a crash
        except BaseException:
            self._discard_unpublished(parts)
            raise
        self.catalog.tables[meta.name] = meta
        with self._committing(lambda: self.catalog.tables.pop(meta.name), parts):
            self._commit()

    def _query_columns(self, table: str, query: str) -> list[tuple[str, str]]:
        """The columns of ``query``'s result as DuckDB describes them: (name, type)."""
        described = self._run_duckdb(f"DESCRIBE {query}")
        assert described is not None
        names = described.column("column_name").to_pylist()
        types = described.column("column_type").to_pylist()
        seen: dict[str, str] = {}
        for name in names:
            if fold(name) in seen:
                raise DatabaseError(
                    f"CREATE TABLE {table} AS: the query gives two columns named {name} "
                    "(in any case, a name is one column)",
                    hint="name each column of the query once: SELECT a, a AS a2 ...")
            seen[fold(name)] = name
        for name, typ in zip(names, types, strict=True):
            if typ == '"NULL"':  # (a bare NULL: no type to store it as)
                raise DatabaseError(
                    f"CREATE TABLE {table} AS: column {name} is NULL without a type",
                    hint=f"give it one: CAST(NULL AS VARCHAR) AS {name}")
        return list(zip(names, types, strict=True))

    # -- ALTER TABLE ------------------------------------------------------------------

    def _alter_table(self, st: _sql.AlterTable) -> None:
        meta = self.table(st.name)
        role_check_statement(self, f"ALTER TABLE ... {_WORDS[st.action]}", meta.name)
        if st.action == "rename":
            self._rename_table(meta, st.new_name or "")
            return
        names = [c for c, _t in meta.columns]
        column = meta.column_name(st.column)
        if st.action == "add":
            if column in names:
                if st.if_exists:
                    return
                raise DatabaseError(f"ALTER TABLE {meta.name} ADD COLUMN {st.column}: the "
                                    f"table has a column {column}")
            self._add_column(meta, str(st.column), str(st.type), st.not_null, st.default)
            return
        if column not in names:
            if st.if_exists:
                return
            raise DatabaseError(f"ALTER TABLE {meta.name}: no column {st.column} (columns: "
                                f"{', '.join(names)})")
        if st.action in ("set_default", "drop_default", "set_not_null", "drop_not_null"):
            self._alter_constraint(meta, column, st.action, st.default)
        elif st.action == "drop":
            self._drop_column(meta, column)
        elif st.action == "type":
            self._retype_column(meta, column, str(st.type))
        else:
            self._rename_column(meta, column, str(st.new_name))

    def _rename_table(self, meta: TableMeta, new: str) -> None:
        found = self.catalog.tables.name(new)
        if found == meta.name and new == meta.name:
            return
        if found is not None and found != meta.name:
            raise DatabaseError(f"ALTER TABLE {meta.name} RENAME TO {new}: a table {found} "
                                "exists", hint=f"DROP TABLE {found} first, or pick another "
                                "name")
        if found is None:
            twin_error(f"ALTER TABLE {meta.name} RENAME TO {new}", new, self.catalog.tables,
                       self.catalog.views, own=meta.name)
        view = self.catalog.views.name(new)
        if view is not None:
            raise DatabaseError(f"ALTER TABLE {meta.name} RENAME TO {new}: a view {view} has "
                                "the name", hint=f"DROP VIEW {view} first, or pick another name")
        if self._temporary_table(new):
            raise DatabaseError(f"ALTER TABLE {meta.name} RENAME TO {new}: a temporary table "
                                f"{new} of this connection has the name")
        old = meta.name
        if old.lower() != new.lower():
            self._forget_policies(new)  # a dropped table's, left by a crash

        def carry(data: dict[str, Any], both: bool) -> None:
            for kind in ("columns", "rows"):
                entry = data[kind].get(old.lower())
                if entry is not None:
                    data[kind][new.lower()] = copy.deepcopy(entry)
                    if not both and old.lower() != new.lower():
                        del data[kind][old.lower()]

        def commit() -> None:
            del self.catalog.tables[old]
            meta.name = new
            self.catalog.tables[new] = meta

            def undo() -> None:
                del self.catalog.tables[new]
                meta.name = old
                self.catalog.tables[old] = meta

            with self._committing(undo):
                self._commit()
            self._schemas.clear()

        self._with_policies(old, carry, commit)

    def _with_policies(self, table: str, carry: Callable[[dict[str, Any], bool], None],
                       commit: Callable[[], None]) -> None:
        """Run ``commit`` (the catalog's change) with ``table``'s policies carried by
        ``carry(data, both)``: written with both names before, the new one alone after."""
        data = self._policy_data()
        key = table.lower()
        if data is None or (not data["columns"].get(key) and data["rows"].get(key) is None):
            commit()
            return
        both = copy.deepcopy(data)
        carry(both, True)
        self._write_policies(both)
        commit()
        carry(data, False)
        self._write_policies(data)

    def _forget_policies(self, table: str) -> None:
        """Remove the masking and row access policy attachments kept under the name
        ``table`` (any case) from the policy file, the policies themselves left. Called
        after a ``DROP TABLE``'s catalog commit (so a crash never leaves a table without
        its policies) and before the commit of a table given the name (``CREATE TABLE``,
        ``CREATE TABLE ... AS``, ``RENAME TO``), which removes what a drop killed before
        its clean-up left: a new table never gets an old table's policies."""
        data = self._policy_data()
        key = table.lower()
        if data is None or (key not in data["columns"] and key not in data["rows"]):
            return
        data["columns"].pop(key, None)
        data["rows"].pop(key, None)
        self._write_policies(data)

    def _policy_data(self) -> dict[str, Any] | None:
        """The policy file's policies (None: no file)."""
        path = getattr(self, "policies_path", None)
        if self._remote is not None or path is None or not os.path.exists(path):
            return None
        return read_policies(path, self.keyring)

    def _write_policies(self, data: dict[str, Any]) -> None:
        """Replace the policy file (atomic, as ``cryptdisk serve``'s PolicyStore writes it)."""
        blob = json.dumps({**data, "version": 1}, sort_keys=True).encode()
        with open_file(self.policies_path, "wb", keys=self.keyring) as f:
            f.write(blob)

    def _protected(self, meta: TableMeta, column: str) -> tuple[bool, bool]:
        """(whether ``column`` of ``meta`` has a masking policy, whether the table's row
        access policy names it)."""
        data = self._policy_data()
        if data is None:
            return False, False
        low = column.lower()
        masks = data["columns"].get(meta.name.lower()) or {}
        rows = data["rows"].get(meta.name.lower())
        return (any(c.lower() == low for c in masks),
                rows is not None and any(c.lower() == low for c in rows[1]))

    def _add_column(self, meta: TableMeta, column: str, typ: str, not_null: bool = False,
                    default: str | None = None) -> None:
        """``ADD COLUMN``: the rows there are get the column's ``DEFAULT`` (evaluated by
        DuckDB for each part), or NULL, which a ``NOT NULL`` column refuses."""
        what = f"ALTER TABLE {meta.name} ADD COLUMN {column}"
        if not_null and default is None and meta.rows:
            raise DatabaseError(f"{what}: the column is NOT NULL, and the table's {meta.rows} "
                                "rows would hold NULL in it",
                                hint=f"give it a DEFAULT for those rows: ADD COLUMN {column} "
                                f"{typ} NOT NULL DEFAULT <value>")
        columns = [*meta.columns, (column, typ)]
        self._check_columns(meta, columns)
        if default is not None:
            check_default(self.con, f"ALTER TABLE {meta.name} ADD COLUMN", column, typ,
                          default, not_null)
        self._rewrite_columns(meta, columns, {c: c for c, _t in meta.columns}, meta.order_by,
                              fills={column: default} if default is not None else None,
                              not_null=[*meta.not_null, column] if not_null
                              else meta.not_null,
                              defaults={**meta.defaults, column: default}
                              if default is not None else meta.defaults)

    def _alter_constraint(self, meta: TableMeta, column: str, action: str,
                          default: str | None) -> None:
        """``ALTER COLUMN c SET|DROP DEFAULT|NOT NULL``: the catalog alone (``SET NOT
        NULL`` after a query finds no NULL in the column)."""
        what = f"ALTER TABLE {meta.name} ALTER COLUMN {column}"
        not_null, defaults = list(meta.not_null), dict(meta.defaults)
        typ = dict(meta.columns)[column]
        if action == "set_not_null" and column not in not_null:
            found = self._run_duckdb(f"SELECT count(*) FROM {_quote(meta.name)} WHERE "
                                     f"{_quote(column)} IS NULL")
            nulls = found.column(0)[0].as_py() if found is not None else 0
            if nulls:
                raise DatabaseError(f"{what} SET NOT NULL: {nulls} rows hold NULL in the "
                                    "column", hint=f"UPDATE {meta.name} SET {column} = ... "
                                    f"WHERE {column} IS NULL first")
            not_null.append(column)
        elif action == "drop_not_null":
            not_null = [c for c in not_null if c != column]
        elif action == "drop_default":
            defaults.pop(column, None)
        elif action == "set_default":
            if default is None:
                defaults.pop(column, None)
            else:
                check_default(self.con, f"ALTER TABLE {meta.name} ALTER COLUMN", column, typ,
                              default, column in not_null)
                defaults[column] = default
        if (not_null, defaults) == (meta.not_null, meta.defaults):
            return
        saved = meta.not_null, meta.defaults
        meta.not_null, meta.defaults = not_null, defaults

        def undo() -> None:
            meta.not_null, meta.defaults = saved

        with self._committing(undo):
            self._commit()

    def _drop_column(self, meta: TableMeta, column: str) -> None:
        if column in meta.order:
            raise DatabaseError(
                f"ALTER TABLE {meta.name} DROP COLUMN {column}: the column is in the table's "
                f"ORDER BY ({', '.join(meta.order)}), which sorts its parts",
                hint=f"CREATE TABLE a new table ORDER BY another column AS SELECT ... FROM "
                f"{meta.name}")
        if len(meta.columns) == 1:
            raise DatabaseError(f"ALTER TABLE {meta.name} DROP COLUMN {column}: a table "
                                "needs at least one column", hint=f"DROP TABLE {meta.name}")
        masked, row = self._protected(meta, column)
        if masked or row:
            what = ("a masking policy" if masked else "the table's row access policy")
            raise DatabaseError(
                f"ALTER TABLE {meta.name} DROP COLUMN {column}: {what} is set on the column",
                hint=f"ALTER TABLE {meta.name} ALTER COLUMN {column} UNSET MASKING POLICY"
                if masked else f"ALTER TABLE {meta.name} DROP ROW ACCESS POLICY <name>, "
                "through cryptdisk serve, first")
        columns = [(c, t) for c, t in meta.columns if c != column]
        self._rewrite_columns(meta, columns, {c: c for c, _t in columns}, meta.order_by,
                              not_null=[c for c in meta.not_null if c != column],
                              defaults={c: e for c, e in meta.defaults.items() if c != column})

    def _rename_column(self, meta: TableMeta, column: str, new: str) -> None:
        if new == column:
            return
        clash = meta.column_name(new)
        if clash != new or new in [c for c, _t in meta.columns]:
            if fold(clash) != fold(column):
                raise DatabaseError(f"ALTER TABLE {meta.name} RENAME COLUMN {column} TO "
                                    f"{new}: the table has a column {clash}")
        if "," in new and column in meta.order:
            raise DatabaseError(f"RENAME COLUMN {column} TO {new}: the name of a key column "
                                "cannot hold a comma", hint="give the column a name without one")
        _masked, row = self._protected(meta, column)  # (a masking policy is carried)
        if row:
            raise DatabaseError(
                f"ALTER TABLE {meta.name} RENAME COLUMN {column}: the table's row access "
                "policy names the column",
                hint=f"ALTER TABLE {meta.name} DROP ROW ACCESS POLICY <name> through "
                "cryptdisk serve, rename, then ADD it again ON the new name")
        columns = [(new if c == column else c, t) for c, t in meta.columns]
        order = ",".join(new if c == column else c for c in meta.order) or None
        sources = {(new if c == column else c): c for c, _t in meta.columns}
        self._check_columns(meta, columns)
        table = meta.name

        # masking policies are kept under a column's name in lower case: one kept under
        # the name of another column too (``Ä`` beside ``ä``) stays (it may be that one's),
        # and one kept under the new name (another column's) is never replaced
        twin = any(c != column and c.lower() == column.lower() for c, _t in meta.columns)

        def carry(data: dict[str, Any], both: bool) -> None:
            masks = data["columns"].get(table.lower()) or {}
            if new.lower() != column.lower() and new.lower() in masks:
                raise DatabaseError(
                    f"ALTER TABLE {meta.name} RENAME COLUMN {column} TO {new}: a masking "
                    f"policy is kept for the name {new.lower()} (of another column in any "
                    "case of its letters), which the column would take",
                    hint="give the column another name")
            for name in [c for c in masks if c.lower() == column.lower()]:
                masks[new.lower()] = masks[name]
                if not both and not twin and name != new.lower():
                    del masks[name]

        not_null = [new if c == column else c for c in meta.not_null]
        defaults = {(new if c == column else c): e for c, e in meta.defaults.items()}
        self._with_policies(table, carry,
                            lambda: self._rewrite_columns(meta, columns, sources, order,
                                                          not_null=not_null,
                                                          defaults=defaults))

    def _retype_column(self, meta: TableMeta, column: str, typ: str) -> None:
        """``ALTER COLUMN c TYPE t``: every value cast by DuckDB as ``CAST(c AS t)`` casts
        it (a value that does not cast fails the statement, which then changes nothing)."""
        if column in meta.order:
            raise DatabaseError(
                f"ALTER TABLE {meta.name} ALTER COLUMN {column} TYPE: the column is in the "
                "table's ORDER BY (a new type may sort its values in another order)",
                hint=f"CREATE TABLE a new table ORDER BY {column} AS SELECT ..., CAST({column} "
                f"AS {typ}) AS {column} FROM {meta.name}")
        masked, row = self._protected(meta, column)
        if masked or row:  # (a policy takes its column's type)
            raise DatabaseError(
                f"ALTER TABLE {meta.name} ALTER COLUMN {column} TYPE: "
                f"{'a masking policy is set on' if masked else 'a row access policy names'} "
                "the column, and takes its type",
                hint=f"ALTER TABLE {meta.name} ALTER COLUMN {column} UNSET MASKING POLICY"
                if masked else f"ALTER TABLE {meta.name} DROP ROW ACCESS POLICY <name>"
                " through cryptdisk serve first, then set a policy of the new type")
        columns = [(c, typ if c == column else t) for c, t in meta.columns]
        self._check_columns(meta, columns)
        if column in meta.defaults:  # (it stays the column's: of the new type too)
            check_default(self.con, f"ALTER TABLE {meta.name} ALTER COLUMN", column, typ,
                          meta.defaults[column], column in meta.not_null)
        self._rewrite_columns(meta, columns, {c: c for c, _t in columns}, meta.order_by,
                              {column: typ})

    def _check_columns(self, meta: TableMeta, columns: list[tuple[str, str]]) -> None:
        """Refuse ``columns`` for ``meta`` as CREATE TABLE refuses them."""
        lower = {fold(c) for c, _t in columns}
        if len(lower) != len(columns):
            raise DatabaseError(f"ALTER TABLE {meta.name}: two columns would have one name "
                                "(in any case, a name is one column)")
        probe = dataclasses.replace(meta, columns=columns, parts=[], name=meta.name)
        try:
            self._check_types(probe, f"ALTER TABLE {meta.name}")
        except duckdb.Error as exc:
            raise DatabaseError(f"ALTER TABLE {meta.name}: {exc}") from None

    def _rewrite_columns(self, meta: TableMeta, columns: list[tuple[str, str]],
                         sources: dict[str, str], order_by: str | None,
                         casts: dict[str, str] | None = None,
                         fills: dict[str, str] | None = None, **changes: Any) -> None:
        """Publish ``meta`` with ``columns`` (each read from the old column ``sources``
        names, or the SQL ``fills`` gives it, or NULL; cast by DuckDB to the type ``casts``
        gives it), ``order_by`` and ``changes`` (its NOT NULL and DEFAULT columns): every
        part rewritten into a new part, then one catalog commit (the old parts deleted
        after it)."""
        new_meta = dataclasses.replace(meta, columns=columns, order_by=order_by, parts=[])
        schema = self.arrow_schema(new_meta)
        new: list[PartMeta] = []
        try:
            self._rewrite_parts(meta, columns, sources, casts or {}, new_meta, schema, new,
                                fills or {})
        except BaseException:
            self._remove_parts(new)  # (written for no catalog: gone now, not at next open)
            raise
        self._replace_parts(meta, new, columns=columns, order_by=order_by, **changes)
        self._schemas.clear()

    def _rewrite_parts(self, meta: TableMeta, columns: list[tuple[str, str]],
                       sources: dict[str, str], casts: dict[str, str], new_meta: TableMeta,
                       schema: pa.Schema, new: list[PartMeta],
                       fills: dict[str, str] | None = None) -> None:
        """Write each part of ``meta`` again in ``columns``, appending to ``new``."""
        disk = policy_disk(self.policy(meta.policy))
        version = self.catalog.version + 1
        fills = fills or {}
        for part in meta.parts:
            source = self.config.disks[part.disk]
            verify_part(source, part)
            old = read_part(source, part, None)
            arrays = [old.column(sources[c]) if c in sources
                      else self._fill(fills[c], t, f.type, old.num_rows) if c in fills
                      else pa.nulls(old.num_rows, f.type)
                      for (c, t), f in zip(columns, schema, strict=True)]
            for i, ((c, t), f) in enumerate(zip(columns, schema, strict=True)):
                if c in casts:
                    arrays[i] = self._cast(meta, old.column(sources[c]), c, t, f.type)
            table = pa.Table.from_arrays(arrays, schema=schema)
            del old, arrays
            new += write_parts(disk, meta.prefix(self.catalog.db_id),
                               table.to_batches(max_chunksize=1 << 20), schema,
                               version=version, max_rows=max(table.num_rows, 1),
                               key=new_meta.key, null_free=True)


    def _fill(self, expr: str, typ: str, arrow: pa.DataType, rows: int) -> Any:
        """``rows`` values of DEFAULT ``expr`` for a column of type ``typ`` (as Arrow
        ``arrow``), evaluated by DuckDB for each row as an insert does."""
        got = self.con.sql(f"SELECT CAST(({expr}) AS {stored_type(typ)}) AS v "
                           f"FROM range({int(rows)})"
                           ).to_arrow_table()
        return got.column(0).cast(arrow)

    def _cast(self, meta: TableMeta, values: Any, column: str, typ: str,
              arrow: pa.DataType) -> Any:
        """``values`` cast by DuckDB to ``typ`` (as Arrow ``arrow``)."""
        view = "__cd_alter_values"
        # under its own name: DuckDB's error for a value that does not cast names it
        self.con.register(view, pa.table({column: values}))
        try:
            got = self.con.sql(f"SELECT CAST({_quote(column)} AS {stored_type(typ)}) FROM {view}"
                               ).to_arrow_table()
        except duckdb.Error as exc:
            raise DatabaseError(f"ALTER TABLE {meta.name} ALTER COLUMN {column} TYPE {typ}: "
                                f"{str(exc).splitlines()[0]}",
                                hint="the table is as it was; fix or leave out the values "
                                "that do not cast") from None
        finally:
            self.con.unregister(view)
        return got.column(0).cast(arrow)


_WORDS = {"rename": "RENAME TO", "add": "ADD COLUMN", "drop": "DROP COLUMN",
          "rename_column": "RENAME COLUMN", "type": "ALTER COLUMN ... TYPE",
          "set_default": "ALTER COLUMN ... SET DEFAULT",
          "drop_default": "ALTER COLUMN ... DROP DEFAULT",
          "set_not_null": "ALTER COLUMN ... SET NOT NULL",
          "drop_not_null": "ALTER COLUMN ... DROP NOT NULL"}


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
