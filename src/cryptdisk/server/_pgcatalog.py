"""The few ``pg_catalog`` queries the server answers itself: psql's ``\\dt``, ``\\dv``, ``\\d``.

psql lists relations with one fixed query over ``pg_class`` and ``pg_namespace``;
it is recognized by its shape and answered from the engine's own list of
tables and views (schema ``public``, owner ``cryptdisk``). Other catalog queries
(psql's ``\\d table``, ``information_schema``) are not emulated.
"""

from __future__ import annotations

import re

from ._engines import EngineSession, Result
from ._types import TEXT

__all__ = ["psql_list"]

_SIGNATURE = re.compile(r"pg_catalog\.pg_get_userbyid\(c\.relowner\).*FROM\s+pg_catalog\."
                        r"pg_class\s+c\s.*c\.relkind\s+IN\s+\(([^)]*)\)", re.S)
_SIGNATURE_FIRST = re.compile(r"^\s*SELECT\s+n\.nspname\s+as\s+\"Schema\"", re.I)
_KINDS = {"r": "table", "v": "view"}


def psql_list(sql: str, engine: EngineSession) -> Result | None:
    """psql's relation list answered, or None when ``sql`` is not that query."""
    if not _SIGNATURE_FIRST.match(sql):
        return None
    m = _SIGNATURE.search(sql)
    if not m:
        return None
    wanted = {k for k in re.findall(r"'(\w?)'", m[1]) if k in _KINDS}
    name_filter = re.search(r"c\.relname\s+OPERATOR\(pg_catalog\.~\)\s+'((?:[^']|'')*)'", sql)
    rows = []
    for name, kind in engine.relations():
        if kind not in wanted:
            continue
        if name_filter and not re.search(name_filter[1].replace("''", "'"), name):
            continue
        rows.append(("public", name, _KINDS[kind], "cryptdisk"))
    rows.sort()
    columns = [("Schema", TEXT), ("Name", TEXT), ("Type", TEXT), ("Owner", TEXT)]
    return Result(columns, rows, f"SELECT {len(rows)}")
