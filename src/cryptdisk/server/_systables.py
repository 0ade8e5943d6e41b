"""``system.users``, ``system.roles`` and ``system.grants`` for any query.

``SELECT * FROM system.X`` is answered by :mod:`._users` itself. Any other query (``SELECT``
or ``WITH``) that names one of the three runs as ``information_schema``'s do
(:func:`._infoschema.private_query`): in a private in-memory DuckDB that holds these three
tables, filled from the session's view of the user store, with file and network access off
and none of the engine's tables, so column lists, ``WHERE``, ``ORDER BY``, joins between them
and parameters work, and a query cannot reach a table the user has no grant on. The tables
hold what ``SELECT *`` shows everyone, never a verifier::

    users   (name text, is_admin bool, auth text, iterations int8)
    roles   (role text, members text)
    grants  (user text, table text, privilege text, role text, admin_option bool)
"""

from __future__ import annotations

import functools
import re
from typing import Any

from . import _sqltext
from ._engines import EngineSession, Result, StatementError
from ._infoschema import add_table, private_query, private_text

__all__ = ["handles", "parameter_types", "query"]

_SCHEMA = "cd_system"  # the name the query runs under (DuckDB has a `system` catalog)
_NAMES = re.compile(r"\bsystem\s*\.\s*(users|roles|grants)\b", re.I)
#: each table's columns and their Arrow types ("s" string, "b" bool, "i" int64)
_COLUMNS = {
    "users": [("name", "s"), ("is_admin", "b"), ("auth", "s"), ("iterations", "i")],
    "roles": [("role", "s"), ("members", "s")],
    "grants": [("user", "s"), ("table", "s"), ("privilege", "s"), ("role", "s"),
               ("admin_option", "b")],
}


@functools.lru_cache(maxsize=1024)
def handles(sql: str) -> bool:
    """Whether ``sql`` is a query naming ``system.users``, ``system.roles`` or
    ``system.grants`` (cached per text, as it is asked of every query)."""
    if "system" not in sql.lower() or \
            (_sqltext.first_words(sql, 1) or [""])[0] not in ("SELECT", "WITH"):
        return False
    try:
        return _NAMES.search(_sqltext.strip_strings(sql)) is not None
    except Exception:
        return False


def _rows(name: str, store: Any, engine: EngineSession) -> list[tuple[Any, ...]]:
    if name == "users":
        return list(store.rows())
    if name == "roles":
        return list(store.role_rows())
    try:  # grants are kept by the lower-case name; show the declared one
        declared = {n.lower(): n for n, _kind in engine.relations()}
    except StatementError:
        declared = {}
    return [(user, declared.get(table, table) if table else table, *rest)
            for user, table, *rest in store.grant_rows()]


def _arrow(name: str, rows: list[tuple[Any, ...]]) -> Any:
    import pyarrow as pa

    kinds = {"s": pa.string(), "b": pa.bool_(), "i": pa.int64()}
    return pa.table({column: pa.array([r[i] for r in rows], kinds[kind])
                     for i, (column, kind) in enumerate(_COLUMNS[name])})


def parameter_types(sql: str, count: int) -> list[int]:
    """The type OID that its context gives each of ``sql``'s ``count`` parameters (0: none),
    as :meth:`._engines.EngineSession.parameter_types` gives them for the engine's tables."""
    from . import _paramtypes, _types

    oids = {"s": _types.TEXT, "b": _types.BOOL, "i": _types.INT8}
    tables = {name: name for name in _COLUMNS}
    return _paramtypes.infer(_NAMES.sub(lambda m: m[1].lower(), sql), count, tables,
                             lambda name: [(c, oids[k]) for c, k in _COLUMNS[name]])


def query(sql: str, params: list[Any], engine: EngineSession, store: Any) -> Result:
    """Run ``sql`` (see :func:`handles`) over ``store``'s users, roles and grants."""
    text = private_text(sql, params, "system", _SCHEMA)
    named = {m.lower() for m in _NAMES.findall(_sqltext.strip_strings(sql))}

    def load(con: Any) -> None:
        con.execute(f"CREATE SCHEMA {_SCHEMA}")
        for name in _COLUMNS:
            if name in named:  # a query reads only the tables it names
                add_table(con, f"{_SCHEMA}.{name}", _arrow(name, _rows(name, store, engine)))

    return private_query(text, load, engine, (_SCHEMA, "system"))
