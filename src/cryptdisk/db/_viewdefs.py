"""``CREATE VIEW``, ``DROP VIEW``, ``ALTER VIEW ... RENAME TO`` and the reading of views,
methods of :class:`~cryptdisk.db.Database` (see :mod:`._views`).

A view is one entry of the catalog: made, replaced, renamed or dropped by one catalog
commit, as a table is (the same sealed, authenticated, atomically replaced file; a
crash leaves the catalog before or after it). ``CREATE VIEW`` checks its query as a
read of the view would run it (DuckDB binds it, reading no row), so a view that names
no table, or reads itself through other views, is refused then. Dropping, renaming or
changing a table a view reads does not look at the views: the view fails when read,
naming what it misses (as DuckDB's and ClickHouse's views do).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import duckdb

from ..errors import DatabaseError, FieldPolicyError, KeyNotFoundError, NotSupportedError
from ._columns import serialize_sql
from ._names import twin_error
from ._policies import role_has_policies
from ._views import (
    AlterView,
    CreateView,
    DropView,
    SetView,
    ViewMeta,
    Views,
    current_view_owner,
    expand_statement,
    expand_views,
    view_reads,
)

if TYPE_CHECKING:
    from ._state import DatabaseState
else:
    DatabaseState = object

__all__ = ["ViewMixin"]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@functools.cache
def _duckdb_names() -> frozenset[str]:
    """The names (lower case) DuckDB itself gives its catalog: its views (``duckdb_tables``,
    ``pg_tables``, ``information_schema``'s), its catalog table functions
    (``duckdb_settings()``, ``pragma_table_info()``) and its schemas. A view of such a
    name would stand, in statements that name it, for what DuckDB answers."""
    with duckdb.connect() as con:
        rows = con.execute(
            "SELECT view_name FROM duckdb_views() WHERE internal "
            "UNION SELECT function_name FROM duckdb_functions() WHERE function_type = 'table'"
            " AND (starts_with(function_name, 'duckdb_') "
            "OR starts_with(function_name, 'pragma_')) "
            "UNION SELECT schema_name FROM duckdb_schemas()").fetchall()
    return frozenset(str(r[0]).lower() for r in rows) | {"information_schema", "pg_catalog",
                                                         "system", "temp", "main"}


def _check_view_name(statement: str, name: str) -> None:
    if name.lower() in _duckdb_names():
        raise DatabaseError(f"{statement}: {name} is a name of DuckDB's catalog (its views, "
                            "catalog functions and schemas keep their names)",
                            hint="give the view another name")


class ViewMixin(DatabaseState):
    """View methods of :class:`~cryptdisk.db.Database`."""

    _parser: Any

    def expand_views(self, sql: str, parser: Any = None, keep: bool = False) -> str:
        """Statement ``sql`` with every view it reads written out as its query (see
        :func:`._views.expand_statement`), as this database runs it: what a grant check
        or a policy rewrite must look at. ``parser``: a DuckDB cursor that only parses
        (:func:`~cryptdisk.db.parser_cursor`), for a caller on another thread than the
        database's (by default the database's own, under its lock). ``keep``: the views
        with their owner's rights are left as named (:func:`._views.expand_views`)."""
        if parser is None:
            with self._mutex:
                return self._expand(sql, keep)
        views = self.catalog.views
        if not views:
            return sql
        return expand_statement(sql, views, lambda text: serialize_sql(text, parser),
                                self._relation_exists, keep)

    def _expand(self, sql: str, keep: bool = False) -> str:
        """:meth:`expand_views` on the database's parser (the caller holds its lock)."""
        if self.read_only or self._remote is not None:  # the views others committed
            try:
                self.refresh()
            except KeyNotFoundError:
                if not (self.read_only and self.own_keys):
                    raise
                # Another process rotated to a key made after this one opened (as a
                # query's own refresh does in Database._run_duckdb_once).
                self._reload_own_keys()  # type: ignore[attr-defined]
                self._stamp = None
                self.refresh()
        views = self.catalog.views
        if not views:
            return sql
        return expand_statement(sql, views, lambda text: serialize_sql(text, self._parser),
                                self._relation_exists, keep)

    def _relation_exists(self, name: str) -> bool:
        return name in self.catalog.tables or name in self.catalog.views

    def view(self, name: str) -> ViewMeta:
        """The catalog entry of view ``name`` (any case)."""
        meta = self.catalog.views.get(name)
        if meta is None:
            raise DatabaseError(f"no view {name!r} in {self.path}",
                                hint="SELECT name FROM system.views lists the views")
        return meta  # type: ignore[no-any-return]

    def _view_statement(self, st: CreateView | DropView | AlterView | SetView) -> None:
        self._writable(f"{type(st).__name__} {st.name}")
        self._role_check_view(st)
        if isinstance(st, CreateView):
            self._create_view(st)
        elif isinstance(st, DropView):
            self._drop_view(st)
        elif isinstance(st, SetView):
            self._set_view(st)
        else:
            self._rename_view(st)

    def _role_check_view(self, st: CreateView | DropView | AlterView | SetView) -> None:
        """On a connection opened with ``role=``: refuse to replace, drop or rename a view
        that reads (itself or through other views) a table with a masking or row access
        policy, as ``DROP TABLE`` of such a table is refused (whoever reads the view would
        run the role's query); making a new view runs, as ``CREATE TABLE`` does."""
        if getattr(self, "role", None) is None:
            return
        views = self.catalog.views
        old = views.get(st.name)
        if old is None or (isinstance(st, CreateView) and not st.or_replace):
            return
        seen: set[str] = set()
        todo = list(old.reads)
        while todo:
            read = todo.pop()
            if read.lower() in seen:
                continue
            seen.add(read.lower())
            view = views.get(read)
            if view is not None:
                todo.extend(view.reads)
                continue
            table = self.catalog.tables.name(read) or read
            if role_has_policies(self, table):
                verb = {CreateView: "CREATE OR REPLACE VIEW", DropView: "DROP VIEW",
                        AlterView: "ALTER VIEW ... RENAME TO",
                        SetView: "ALTER VIEW ... SET"}[type(st)]
                raise FieldPolicyError(
                    f"permission denied: {verb} {old.name}: the view reads {table}, which "
                    f"has policies, and the connection has role {self.role!r}",
                    hint="change the view on a connection without role=")

    def _create_view(self, st: CreateView) -> None:
        name, views = st.name, self.catalog.views
        _check_view_name(f"CREATE VIEW {name}", name)
        table = self.catalog.tables.name(name)
        if table is not None or self._temporary_table(name):
            raise DatabaseError(f"CREATE VIEW {name}: a table {table or name} has the name "
                                "(tables and views share their names)",
                                hint="give the view another name")
        twin_error(f"CREATE VIEW {name}", name, self.catalog.tables, views)
        old = views.get(name)
        if old is not None and not st.or_replace:
            if st.if_not_exists:
                return
            raise DatabaseError(f"view {old.name} already exists",
                                hint=f"CREATE OR REPLACE VIEW {name} AS ... replaces it")
        meta = ViewMeta(name, st.query, st.columns, security_invoker=st.security_invoker,
                        owner=None if st.security_invoker else current_view_owner())
        trial = Views(views)
        trial[name] = meta  # (a cycle through the view itself is found as it is read)

        def parse(text: str) -> Any:
            return serialize_sql(text, self._parser)

        reads = view_reads(st.query, set(self.catalog.tables) | set(trial), parse)
        query, _used = expand_views(f"SELECT * FROM {_quote(name)}", trial, parse,
                                    lambda n: n in self.catalog.tables or n in trial)
        try:
            self._run_duckdb(f"DESCRIBE {query}")  # bound by DuckDB: no row read
        except DatabaseError as exc:
            raise DatabaseError(f"CREATE VIEW {name}: {exc}", hint=exc.hint) from None
        meta.reads = reads
        self._publish_views(trial)

    def _drop_view(self, st: DropView) -> None:
        views = self.catalog.views
        old = views.get(st.name)
        if old is None:
            if st.if_exists:
                return
            table = self.catalog.tables.name(st.name)
            if table is not None:
                raise DatabaseError(f"{table} is a table, not a view",
                                    hint=f"DROP TABLE {table}")
            raise DatabaseError(f"no view {st.name!r} in {self.path}",
                                hint="SELECT name FROM system.views lists the views")
        changed = Views(views)
        del changed[old.name]
        self._publish_views(changed)

    def _rename_view(self, st: AlterView) -> None:
        views = self.catalog.views
        table = self.catalog.tables.name(st.name)
        if table is not None:
            raise NotSupportedError(f"ALTER VIEW {table}: {table} is a table, not a view",
                                    hint=f"ALTER TABLE {table} RENAME TO {st.new_name}")
        old = self.view(st.name)
        new = st.new_name
        if old.name == new:
            return
        _check_view_name(f"ALTER VIEW {old.name} RENAME TO {new}", new)
        clash = self.catalog.tables.name(new) or (views.name(new) if new.lower()
                                                  != old.name.lower() else None)
        if clash is not None or self._temporary_table(new):
            raise DatabaseError(f"ALTER VIEW {old.name} RENAME TO {new}: a table or view "
                                f"{clash or new} has the name", hint="pick another name")
        changed = Views(views)
        del changed[old.name]
        changed[new] = ViewMeta(new, old.query, old.columns, old.reads,
                                old.security_invoker, old.owner)
        self._publish_views(changed)

    def _set_view(self, st: SetView) -> None:
        """``ALTER VIEW v SET (security_invoker = ...)``: the owner of a view given its
        owner's rights is whoever gives them (the server's admin)."""
        table = self.catalog.tables.name(st.name)
        if table is not None:
            raise NotSupportedError(f"ALTER VIEW {table}: {table} is a table, not a view")
        old = self.view(st.name)
        changed = Views(self.catalog.views)
        changed[old.name] = ViewMeta(old.name, old.query, old.columns, old.reads,
                                     st.security_invoker,
                                     None if st.security_invoker else current_view_owner())
        self._publish_views(changed)

    def _publish_views(self, views: Views) -> None:
        """Commit the catalog with ``views`` as its views. The catalog's views are replaced
        whole, never changed in place: a statement being checked on another thread (the
        server's sessions) keeps reading the ones it started with."""
        before = self.catalog.views
        self.catalog.views = views

        def undo() -> None:
            self.catalog.views = before

        with self._committing(undo):
            self._commit()
