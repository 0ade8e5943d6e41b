"""The session functions and settings drivers and ORMs ask for when they connect.

SQLAlchemy runs ``select pg_catalog.version()``, ``select current_schema()``, ``show
standard_conforming_strings`` and ``show transaction isolation level`` on its first
connection; JDBC drivers and BI tools ask for ``current_database()``, ``SHOW search_path``
and the like. Neither engine knows them (SQLite has no ``SHOW``; DuckDB's ``version()`` is
its own), so the server answers them itself, as PostgreSQL 15 would for this session:
``SELECT`` of one or more of the functions below (no ``FROM``, optional aliases), and
``SHOW name`` of the settings below. Anything else goes to the engine.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .. import __version__
from ._engines import Result
from ._types import INT4, TEXT

__all__ = ["answer", "answers"]

#: function -> (result type, value for the session)
_FUNCTIONS: dict[str, tuple[int, Callable[[Any], Any]]] = {
    "version": (TEXT, lambda s: f"PostgreSQL 15.0 (cryptdisk {__version__})"),
    "current_schema": (TEXT, lambda s: "public"),
    "current_database": (TEXT, lambda s: s.database),
    "current_catalog": (TEXT, lambda s: s.database),
    "pg_backend_pid": (INT4, lambda s: s.pid),
}
_ITEM = re.compile(r"\s*(?:pg_catalog\s*\.\s*)?([A-Za-z_]+)\s*\(\s*\)"
                   r"(?:\s+(?:AS\s+)?(\"(?:[^\"]|\"\")+\"|[A-Za-z_][A-Za-z0-9_]*))?\s*", re.I)
_SELECT = re.compile(r"\s*SELECT\s+(.*?)\s*;?\s*", re.I | re.S)
_SHOW = re.compile(r"\s*SHOW\s+([A-Za-z_][A-Za-z0-9_]*(?:\s+[A-Za-z_]+)*)\s*;?\s*", re.I)


#: The settings ``SHOW`` answers that are the same for every session, by lower-case name.
_FIXED = {
    "server_version": "15.0", "server_version_num": "150000",
    "server_encoding": "UTF8", "client_encoding": "UTF8", "datestyle": "ISO, MDY",
    "intervalstyle": "postgres", "timezone": "UTC", "integer_datetimes": "on",
    "standard_conforming_strings": "on", "search_path": '"$user", public',
    "max_identifier_length": "63", "lc_collate": "C", "lc_ctype": "C",
    "default_transaction_read_only": "off",
}


def _isolation(session: Any) -> str:
    # SQLite's transactions are serializable; the analytical engine's queries see
    # every statement committed before they start, as PostgreSQL's default
    return "serializable" if session.server.engine.transactions else "read committed"


def _timeout(session: Any) -> str:
    timeout = session.server.statement_timeout
    return f"{int(timeout * 1000)}ms" if timeout else "0"


def _constant(value: str) -> Callable[[Any], str]:
    return lambda _session: value


#: Every setting ``SHOW`` answers, by lower-case name: its value for a session.
_SETTINGS: dict[str, Callable[[Any], str]] = {
    **{name: _constant(value) for name, value in _FIXED.items()},
    "transaction_isolation": _isolation,
    "default_transaction_isolation": _isolation,
    "statement_timeout": _timeout,
    "application_name": lambda session: session.application_name,
    "is_superuser": lambda session: "on" if session.server.is_admin(session.user) else "off",
    "session_authorization": lambda session: session.user,
    "transaction_read_only": lambda session: "on" if session.read_only_block() else "off",
}


def _parse(sql: str) -> str | list[tuple[str, str]] | None:
    """The setting a ``SHOW`` names, or the (function, column name) a ``SELECT`` calls;
    None when ``sql`` is neither (see the module)."""
    head = sql.lstrip()[:4].upper()
    if head == "SHOW":
        m = _SHOW.fullmatch(sql)
        if m is None:
            return None
        name = " ".join(m[1].lower().split())
        name = {"transaction isolation level": "transaction_isolation",
                "time zone": "timezone"}.get(name, name)
        return name if name in _SETTINGS else None
    if head != "SELE" or "(" not in sql:
        return None
    m = _SELECT.fullmatch(sql)
    if m is None:
        return None
    calls = []
    for item in m[1].split(","):
        call = _ITEM.fullmatch(item)
        if call is None or call[1].lower() not in _FUNCTIONS:
            return None
        alias = call[2]
        if alias is not None:
            alias = alias[1:-1].replace('""', '"') if alias.startswith('"') else alias.lower()
        calls.append((call[1].lower(), alias or call[1].lower()))
    return calls


def answers(sql: str) -> bool:
    """Whether :func:`answer` answers ``sql`` (the text alone decides it)."""
    return _parse(sql) is not None


def answer(sql: str, session: Any) -> Result | None:
    """``sql`` answered for ``session`` (see the module), or None when it is none of these."""
    parsed = _parse(sql)
    if parsed is None:
        return None
    if isinstance(parsed, str):
        value = _SETTINGS[parsed](session)
        return Result([(parsed, TEXT)], [(value,)], "SHOW")
    columns = [(name, _FUNCTIONS[function][0]) for function, name in parsed]
    values = tuple(_FUNCTIONS[function][1](session) for function, _ in parsed)
    return Result(columns, [values], "SELECT 1")
