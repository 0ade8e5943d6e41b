"""``information_schema``'s ``tables``, ``columns``, ``schemata``, ``views``,
``table_privileges``, ``role_table_grants``, ``enabled_roles`` and
``applicable_roles``, filtered by the user's grants.

A query that names ``information_schema`` (``SELECT`` or ``WITH``) runs in a
private in-memory DuckDB that holds these views as tables, filled for the
session's user: the tables and views of the engine the user may read
(``SELECT`` granted to them or one of their roles; admins: all), their
columns and view definitions (admins only, as PostgreSQL shows them to a
view's owner), the schemata, the table privileges granted to the user's
enabled roles (its current role and the roles that one is a member of; an
admin also holds every privilege on every table, as an owner does), and those
roles. The query runs there as it was written (joins, filters, ``ORDER BY``,
parameters), with DuckDB's access to files and the network switched off and
locked, so it sees nothing else. Tables live in schema ``public``; a column's
``data_type`` is the PostgreSQL type the server reports for it in results.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from . import _sqltext, _types
from ._engines import (
    EngineSession,
    Result,
    StatementError,
    _cancelled,
    _duckdb_sqlstate,
    bytea_spelling,
    sql_literal,
)

__all__ = ["add_table", "handles", "private_query", "query"]

_SCHEMA = "cd_information_schema"  # the name the query runs under (DuckDB has its own)
_CATALOG = "cryptdisk"
_NAMES = {_types.BOOL: ("boolean", "bool"), _types.BYTEA: ("bytea", "bytea"),
          _types.INT8: ("bigint", "int8"), _types.INT2: ("smallint", "int2"),
          _types.INT4: ("integer", "int4"), _types.TEXT: ("text", "text"),
          _types.FLOAT4: ("real", "float4"), _types.FLOAT8: ("double precision", "float8"),
          _types.DATE: ("date", "date"), _types.TIME: ("time without time zone", "time"),
          _types.TIMESTAMP: ("timestamp without time zone", "timestamp"),
          _types.TIMESTAMPTZ: ("timestamp with time zone", "timestamptz"),
          _types.INTERVAL: ("interval", "interval"), _types.NUMERIC: ("numeric", "numeric"),
          _types.UUID: ("uuid", "uuid"), _types.JSON: ("json", "json")}
#: (numeric_precision, radix, scale) of the fixed-size numbers
_PRECISION = {_types.INT2: (16, 2, 0), _types.INT4: (32, 2, 0), _types.INT8: (64, 2, 0),
              _types.FLOAT4: (24, 2, None), _types.FLOAT8: (53, 2, None)}
_DATETIME = {_types.DATE: 0, _types.TIME: 6, _types.TIMESTAMP: 6, _types.TIMESTAMPTZ: 6,
             _types.INTERVAL: 6}

_TABLES = ["table_catalog", "table_schema", "table_name", "table_type",
           "self_referencing_column_name", "reference_generation", "user_defined_type_catalog",
           "user_defined_type_schema", "user_defined_type_name", "is_insertable_into",
           "is_typed", "commit_action"]
_COLUMNS = ["table_catalog", "table_schema", "table_name", "column_name", "ordinal_position",
            "column_default", "is_nullable", "data_type", "character_maximum_length",
            "character_octet_length", "numeric_precision", "numeric_precision_radix",
            "numeric_scale", "datetime_precision", "interval_type", "interval_precision",
            "character_set_catalog", "character_set_schema", "character_set_name",
            "collation_catalog", "collation_schema", "collation_name", "domain_catalog",
            "domain_schema", "domain_name", "udt_catalog", "udt_schema", "udt_name",
            "is_identity", "is_generated", "is_updatable"]
_INT_COLUMNS = {"ordinal_position", "character_maximum_length", "character_octet_length",
                "numeric_precision", "numeric_precision_radix", "numeric_scale",
                "datetime_precision", "interval_precision"}
_VIEWS = ["table_catalog", "table_schema", "table_name", "view_definition", "check_option",
          "is_updatable", "is_insertable_into", "is_trigger_updatable",
          "is_trigger_deletable", "is_trigger_insertable_into"]
_TABLE_PRIVILEGES = ["grantor", "grantee", "table_catalog", "table_schema", "table_name",
                     "privilege_type", "is_grantable", "with_hierarchy"]
_APPLICABLE_ROLES = ["grantee", "role_name", "is_grantable"]
_ENABLED_ROLES = ["role_name"]
_OWNER = "cryptdisk"  # the owner pg_catalog reports; cryptdisk records no grantor
_SCHEMATA = ["catalog_name", "schema_name", "schema_owner", "default_character_set_catalog",
             "default_character_set_schema", "default_character_set_name", "sql_path"]


@functools.lru_cache(maxsize=1024)
def handles(sql: str) -> bool:
    """Whether ``sql`` is a query over ``information_schema`` (answered here); cached per
    text, as it is asked of every query."""
    if "information_schema" not in sql.lower() or \
            (_sqltext.first_words(sql, 1) or [""])[0] not in ("SELECT", "WITH"):
        return False
    try:
        return re.search(r"\binformation_schema\b", _sqltext.strip_strings(sql), re.I) \
            is not None
    except Exception:
        return False


def _visible(engine: EngineSession, privileges: Any) -> list[tuple[str, str]]:
    """(name, kind) of the tables and views this session may read: a view (which takes no
    grant) when its query would pass the grant check, as reading it does."""
    def readable(name: str, kind: str) -> bool:
        if privileges is None or privileges.allowed(name, "SELECT"):
            return True
        if kind != "v":
            return False
        try:
            quoted = '"' + name.replace('"', '""') + '"'
            engine.authorize(f"SELECT * FROM {quoted}", privileges)  # noqa: S608 (quoted)
        except StatementError:
            return False
        return True

    return sorted((n, k) for n, k in engine.relations() if readable(n, k))


def column_oids(engine: EngineSession, name: str, kind: str,
                described: list[tuple[Any, ...]]) -> list[int]:
    """The type OIDs of relation ``name``'s columns (``described``: ``engine.columns``):
    the engine's for a table (``kind`` "r"); from the declared types on SQLite, for a view,
    or where the engine cannot say."""
    try:
        oids = [o for _, o in engine.column_types(name)] if kind == "r" else []
    except StatementError:
        oids = []
    if len(oids) != len(described):
        oids = [_types.sqlite_declared_oid(t) for _, t, _, _ in described]
    return oids


def _column_rows(engine: EngineSession, name: str, kind: str) -> list[tuple[Any, ...]]:
    described = engine.columns(name)
    oids = column_oids(engine, name, kind, described)
    rows = []
    for i, ((column, type_name, notnull, default), oid) in enumerate(
            zip(described, oids, strict=True)):
        data_type, udt = _NAMES.get(oid, ("text", "text"))
        precision, radix, scale = _PRECISION.get(oid, (None, None, None))
        if oid == _types.NUMERIC:
            m = re.search(r"\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)", type_name)
            precision, radix = (int(m[1]), 10) if m else (None, 10)
            scale = int(m[2] or 0) if m else None
        values = {
            "table_catalog": _CATALOG, "table_schema": "public", "table_name": name,
            "column_name": column, "ordinal_position": i + 1, "column_default": default,
            "is_nullable": "NO" if notnull else "YES", "data_type": data_type,
            "numeric_precision": precision, "numeric_precision_radix": radix,
            "numeric_scale": scale, "datetime_precision": _DATETIME.get(oid),
            "udt_catalog": _CATALOG, "udt_schema": "pg_catalog", "udt_name": udt,
            "is_identity": "NO", "is_generated": "NEVER",
            "is_updatable": "YES" if kind == "r" else "NO"}
        rows.append(tuple(values.get(c) for c in _COLUMNS))
    return rows


def _privilege_rows(engine: EngineSession, privileges: Any,
                    visible: list[tuple[str, str]]) -> list[tuple[Any, ...]]:
    """table_privileges: the grants to the enabled roles on tables and views that exist;
    for an admin, also every privilege on every table, as PostgreSQL lists an owner's."""
    if privileges is None:
        return []
    from ._grants import ACTIONS

    enabled = privileges.roles
    names = {n.lower(): n for n, _ in engine.relations()}
    rows = {(grantee, names[table], action)
            for grantee, table, action, _role, _option in privileges.store.grant_rows()
            if table is not None and grantee in enabled and table in names}
    if privileges.admin:
        rows |= {(privileges.current_user, n, a) for n, _ in visible for a in ACTIONS}
    return [(_OWNER, grantee, _CATALOG, "public", table, action, "NO",
             "YES" if action == "SELECT" else "NO")
            for grantee, table, action in sorted(rows)]


def _role_rows(privileges: Any) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(applicable_roles, enabled_roles): the memberships of the enabled roles, and those."""
    if privileges is None:
        return [], []
    enabled = privileges.roles
    applicable = [(grantee, role, "YES" if option else "NO")
                  for grantee, table, action, role, option in privileges.store.grant_rows()
                  if table is None and action == "MEMBER" and grantee in enabled]
    return sorted(applicable), [(r,) for r in sorted(enabled)]


def _arrow(names: list[str], rows: list[tuple[Any, ...]]) -> Any:
    import pyarrow as pa

    return pa.table({n: pa.array([r[i] for r in rows],
                                 pa.int32() if n in _INT_COLUMNS else pa.string())
                     for i, n in enumerate(names)})


_MEMORY_LIMIT = "256MB"


def query(sql: str, params: list[Any], engine: EngineSession, privileges: Any) -> Result:
    """Run ``sql`` (see :func:`handles`) over this session's information_schema."""
    visible = _visible(engine, privileges)
    admin = privileges is None or privileges.admin
    granted: list[Any] = []

    def privilege_rows() -> list[tuple[Any, ...]]:
        if not granted:
            granted.append(_privilege_rows(engine, privileges, visible))
        return list(granted[0])

    views: dict[str, tuple[list[str], Callable[[], list[tuple[Any, ...]]]]] = {
        "tables": (_TABLES, lambda: [
            (_CATALOG, "public", n, "BASE TABLE" if k == "r" else "VIEW", None, None, None,
             None, None, "YES" if k == "r" else "NO", "NO", None) for n, k in visible]),
        "columns": (_COLUMNS, lambda: [row for n, k in visible
                                       for row in _column_rows(engine, n, k)]),
        "schemata": (_SCHEMATA, lambda: [
            (_CATALOG, s, "cryptdisk", None, None, "UTF8", None)
            for s in ("information_schema", "pg_catalog", "public")]),
        "views": (_VIEWS, lambda: [
            (_CATALOG, "public", n, engine.view_definition(n) if admin else None, "NONE",
             "NO", "NO", "NO", "NO", "NO") for n, k in visible if k == "v"]),
        "table_privileges": (_TABLE_PRIVILEGES, privilege_rows),
        "role_table_grants": (_TABLE_PRIVILEGES, privilege_rows),
        "applicable_roles": (_APPLICABLE_ROLES, lambda: _role_rows(privileges)[0]),
        "enabled_roles": (_ENABLED_ROLES, lambda: _role_rows(privileges)[1]),
    }

    text = private_text(sql, params, "information_schema", _SCHEMA)

    def load(con: Any) -> None:
        con.execute(f"CREATE SCHEMA {_SCHEMA}")
        words = {w.lower() for w in re.findall(r"\w+", text)}
        for name, (cols, make) in views.items():
            if name not in words:  # a query reads only the views it names
                continue
            add_table(con, f"{_SCHEMA}.{name}", _arrow(cols, make()))

    return private_query(text, load, engine, (_SCHEMA, "information_schema"))


def add_table(con: Any, name: str, table: Any) -> None:
    """Create table ``name`` in the private DuckDB ``con`` holding Arrow ``table``."""
    con.register("__cd_source", table)
    con.execute(f"CREATE TABLE {name} AS SELECT * FROM __cd_source")  # noqa: S608
    con.unregister("__cd_source")


_MISSING = re.compile(r"Catalog Error: Table with name (\w+) does not exist")


def private_query(text: str, load: Callable[[Any], None], engine: EngineSession,
                  shown: tuple[str, str]) -> Result:
    """Run the query ``text`` in a private in-memory DuckDB that ``load(con)`` fills, with
    file and network access off and locked; ``shown``: (the name of the schema the query
    runs under, the name its errors say instead)."""
    import duckdb

    con = duckdb.connect()
    try:
        load(con)
        # a huge query (a cross join with range()) fails inside a small memory budget
        # instead of spilling the catalog's names into ./.tmp or taking the server's memory
        con.execute("SET temp_directory = ''")
        con.execute(f"SET memory_limit = '{_MEMORY_LIMIT}'")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        engine.interrupt_also = con.interrupt  # a CancelRequest or statement_timeout stops it
        try:
            relation = con.sql(text)
            if relation is None:
                raise StatementError(f"{shown[1]} is read by queries only", "42601")
            kinds = [str(t) for t in relation.types]
            table = _types.exact_result(relation.to_arrow_table(), kinds)
        except duckdb.Error as exc:
            message = str(exc).replace(shown[0], shown[1])
            missing = _MISSING.match(message)
            if missing is not None:  # one of PostgreSQL's the server does not hold
                raise StatementError(
                    f'relation "{shown[1]}.{missing[1]}" does not exist', "42P01",
                    hint=f"the server's {shown[1]} holds what drivers, ORMs and psql read "
                    "(docs/server-protocol.md)") from None
            code = _duckdb_sqlstate(message)
            if code == "57014":  # DuckDB's "INTERRUPT Error", said as PostgreSQL says it
                raise _cancelled() from None
            raise StatementError(message, code) from None
        finally:
            engine.interrupt_also = None
    finally:
        con.close()
    out_columns = [(f.name, _types.array_oid(f.type) or _types.arrow_oid(f.type))
                   for f in table.schema]
    from ..db import python_rows

    out_rows = python_rows(table)
    arrays = [(i, _types.arrow_oid(f.type.value_type)) for i, f in enumerate(table.schema)
              if _types.array_oid(f.type) is not None]
    if arrays:  # lists as PostgreSQL's arrays (indkey, array_agg(attname)), as drivers read them
        for r, row in enumerate(out_rows):
            values = list(row)
            for i, element in arrays:
                if values[i] is not None:
                    values[i] = _types.PgArray(values[i], element)
            out_rows[r] = tuple(values)
    return Result(out_columns, out_rows, f"SELECT {len(out_rows)}")


def private_text(sql: str, params: list[Any], schema: str, private: str) -> str:
    """``sql`` for a private DuckDB: its ``$n`` parameters as literals, and the schema word
    ``schema`` (any case) as that database's ``private`` schema."""
    def literal(n: int) -> str:
        if n < 1 or n > len(params):
            raise StatementError(f"there is no parameter ${n}", "42P02")
        return sql_literal(params[n - 1])

    text = _sqltext.substitute(bytea_spelling(sql) if "bytea" in sql.lower() else sql, literal)
    return _sqltext.replace_words(text, lambda w: private if w.lower() == schema else None)
