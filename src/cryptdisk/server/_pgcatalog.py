"""The ``pg_catalog`` queries psql sends for ``\\dt``, ``\\dv``, ``\\d``, ``\\d NAME``, ``\\du``,
``\\dp`` / ``\\z`` and ``\\dL``.

psql describes with fixed queries over ``pg_class``, ``pg_attribute``,
``pg_roles`` and friends; each is recognized by its shape and answered from
the tables and views of the engine the session may read (``SELECT`` granted to
its user or one of its roles; admins: all), as ``information_schema`` and
``pg_catalog``'s tables list them (schema ``public``, owner ``cryptdisk``), and
the user store. A relation's OID is a stable hash of its name. Other catalog
queries (``\\d+``, ``\\l``, ...) are not emulated; ``information_schema`` is
:mod:`._infoschema`.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

from . import _sqltext
from ._engines import EngineSession, Result, StatementError
from ._infoschema import _visible
from ._types import BOOL, INT2, INT4, INT8, TEXT

__all__ = ["answers", "catalog_query", "psql_list", "relation_oid"]

_SIGNATURE = re.compile(r"pg_catalog\.pg_get_userbyid\(c\.relowner\).*FROM\s+pg_catalog\."
                        r"pg_class\s+c\s.*c\.relkind\s+IN\s+\(([^)]*)\)", re.S)
_SIGNATURE_FIRST = re.compile(r"^\s*SELECT\s+n\.nspname\s+as\s+\"Schema\"", re.I)
_KINDS = {"r": "table", "v": "view"}
_LOOKUP = re.compile(r"^\s*SELECT\s+c\.oid,\s*n\.nspname,\s*c\.relname\s+FROM\s+pg_catalog\."
                     r"pg_class\s+c\b", re.I)
_RELINFO = re.compile(r"^\s*SELECT\s+c\.relchecks,\s*c\.relkind\b.*\bWHERE\s+c\.oid\s*=\s*"
                      r"'(\d+)'", re.I | re.S)
#: \d NAME's columns (\d+ NAME's, with a.attstorage and more, is :mod:`._pgtables`')
_ATTRS = re.compile(r"^\s*SELECT\s+a\.attname,(?:(?!attstorage).)*FROM\s+pg_catalog\.pg_attribute"
                    r"\s+a\s+WHERE\s+a\.attrelid\s*=\s*'(\d+)'", re.I | re.S)
#: the footers of psql's \d (indexes, policies, statistics, publications, inheritance, ...):
#: none exist in cryptdisk, so each is an empty result
_FOOTER = re.compile(r"pg_catalog\.pg_(?:index|policy|statistic_ext|publication|inherits|"
                     r"trigger|rewrite|constraint)\b.*'(\d+)'", re.I | re.S)
#: \d NAME's footers of indexes and foreign keys: answered from pg_index and pg_constraint
#: (:mod:`._pgtables`; SQLite's keys and indexes)
_KEY_FOOTERS = re.compile(r"^\s*SELECT\s+(?:c2\.relname,\s*i\.indisprimary\b|true\s+as\s+"
                          r"sametable,\s*conname\b)", re.I)
#: \dp and \z: the tables and views with their grants
_PRIVILEGES = re.compile(r'^\s*SELECT\s+n\.nspname\s+as\s+"Schema",\s*c\.relname\s+as\s+"Name",'
                         r'.*"Access privileges".*FROM\s+pg_catalog\.pg_class\s+c\b', re.I | re.S)
#: \dL: the procedural languages (cryptdisk has none)
_LANGUAGES = re.compile(r"^\s*SELECT\s+l\.lanname\s+AS\s+\"Name\".*FROM\s+pg_catalog\."
                        r"pg_language\s+l\b", re.I | re.S)
#: PostgreSQL's letters for the privileges, in the order its ACLs list them
_ACL_LETTERS = (("INSERT", "a"), ("SELECT", "r"), ("UPDATE", "w"), ("DELETE", "d"))
_ROLES = re.compile(r"^\s*SELECT\s+r\.rolname,\s*r\.rolsuper\b.*FROM\s+pg_catalog\.pg_roles\s+r\b",
                    re.I | re.S)


def relation_oid(name: str) -> int:
    """The OID psql sees for a table or view: stable for its name."""
    return 16384 + zlib.crc32(name.encode()) % (1 << 30)


def _pattern(sql: str, column: str, *, tables: bool = True) -> re.Pattern[str] | None:
    """The regular expression psql compares ``column`` with (None: none). psql lower-cases
    the letters of an unquoted pattern, as PostgreSQL folds names; cryptdisk keeps a name's
    declared case and matches names in any case, so a pattern without capitals matches in
    any case (``\\dt sal*`` finds ``Sales``), one with capitals (only a quoted pattern has
    them: ``\\dt "Sales"``) exactly. ``tables=False`` (role names, which PostgreSQL's rules
    fold): exactly as written."""
    m = re.search(rf"{column}\s+OPERATOR\(pg_catalog\.~\)\s+'((?:[^']|'')*)'", sql)
    if not m:
        return None
    text = m[1].replace("''", "'")
    try:
        exact = not tables or re.search(r"(?<!\\)[A-Z]", text) is not None
        return re.compile(text, 0 if exact else re.I)
    except re.error as exc:
        raise StatementError(f"invalid regular expression: {exc}", "2201B") from None


def _result(columns: list[tuple[str, int]], rows: list[tuple[Any, ...]]) -> Result:
    return Result(columns, rows, f"SELECT {len(rows)}")


def answers(sql: str) -> bool:
    """Whether ``sql`` is a catalog query the server answers itself (open to every user)."""
    if _sqltext.first_words(sql, 1) != ["SELECT"] or "pg_catalog." not in sql:
        return False
    if "pg_cursors" in sql and re.search(r"pg_catalog\.pg_cursors\b", sql):
        return True
    return bool((_SIGNATURE_FIRST.match(sql) and _SIGNATURE.search(sql)) or _LOOKUP.match(sql)
                or _RELINFO.match(sql) or _ATTRS.match(sql) or _ROLES.match(sql)
                or _PRIVILEGES.match(sql) or _LANGUAGES.match(sql) or _FOOTER.search(sql))


def catalog_query(sql: str, engine: EngineSession, privileges: Any,
                  session_user: str) -> Result | None:
    """One of psql's catalog queries answered, or None when ``sql`` is none of them."""
    listed = psql_list(sql, engine, privileges)
    if listed is not None:
        return listed
    if not (_LOOKUP.match(sql) or _RELINFO.match(sql) or _ATTRS.match(sql)):
        visible: list[tuple[str, str]] = []
    else:  # a table the session may not read is one that does not exist
        visible = _visible(engine, privileges)
    if _LOOKUP.match(sql):
        names, schema = _pattern(sql, r"c\.relname"), _pattern(sql, r"n\.nspname")
        if schema is not None and not schema.search("public"):
            return _result([("oid", INT8), ("nspname", TEXT), ("relname", TEXT)], [])
        found = sorted(n for n, _ in visible if names is None or names.search(n))
        return _result([("oid", INT8), ("nspname", TEXT), ("relname", TEXT)],
                       [(relation_oid(n), "public", n) for n in found])
    m = _RELINFO.match(sql)
    if m:
        kinds = {relation_oid(n): k for n, k in visible}
        by_name = {relation_oid(n): n for n, _ in visible}
        kind = kinds.get(int(m[1]))
        columns = [("relchecks", INT2), ("relkind", TEXT), ("relhasindex", BOOL),
                   ("relhasrules", BOOL), ("relhastriggers", BOOL), ("relrowsecurity", BOOL),
                   ("relforcerowsecurity", BOOL), ("relhasoids", BOOL),
                   ("relispartition", BOOL), ("?column?", TEXT), ("reltablespace", INT8),
                   ("reloftype", TEXT), ("relpersistence", TEXT), ("relreplident", TEXT),
                   ("amname", TEXT)]
        keys = engine.keys(by_name[int(m[1])]) if kind == "r" else None
        indexed = keys is not None and bool(keys.primary or keys.indexes)
        referring = keys is not None and bool(keys.foreign)  # (PostgreSQL: their triggers)
        rows: list[tuple[Any, ...]] = [] if kind is None else [
            (0, kind, indexed, False, referring, False, False, False, False, "", 0, "", "p",
             "d", "heap" if kind == "r" else None)]
        return _result(columns, rows)
    m = _ATTRS.match(sql)
    if m:
        by_oid = {relation_oid(n): n for n, _ in visible}
        name = by_oid.get(int(m[1]))
        columns = [("attname", TEXT), ("format_type", TEXT), ("pg_get_expr", TEXT),
                   ("attnotnull", BOOL), ("attcollation", TEXT), ("attidentity", TEXT),
                   ("attgenerated", TEXT)]
        rows = [] if name is None else [(col, typ, default, notnull, None, "", "")
                                        for col, typ, notnull, default in engine.columns(name)]
        return _result(columns, rows)
    if _ROLES.match(sql):
        return _roles(sql, privileges, session_user)
    if _PRIVILEGES.match(sql):
        return _privileges(sql, engine, privileges)
    if _LANGUAGES.match(sql):
        return _result([("Name", TEXT), ("Owner", TEXT), ("Trusted", BOOL),
                        ("Description", TEXT)], [])
    if _KEY_FOOTERS.match(sql):
        from ._pgtables import query

        return query(sql, [], engine, privileges)
    if _FOOTER.search(sql) and sql.lstrip()[:6].upper() == "SELECT":
        return _result([("?column?", TEXT)], [])
    return None


def _privileges(sql: str, engine: EngineSession, privileges: Any) -> Result:
    """psql's ``\\dp`` / ``\\z``: the tables and views the session may read, each with the
    grants on it as PostgreSQL writes an ACL (``bob=ar/cryptdisk``: INSERT, SELECT; ``w``
    UPDATE, ``d`` DELETE), one grantee a line. An admin sees every grant; another user the
    grants to itself and its roles, as ``information_schema.table_privileges``."""
    columns = [("Schema", TEXT), ("Name", TEXT), ("Type", TEXT), ("Access privileges", TEXT),
               ("Column privileges", TEXT), ("Policies", TEXT)]
    schema = _pattern(sql, r"n\.nspname")
    if schema is not None and not schema.search("public"):
        return _result(columns, [])
    names = _pattern(sql, r"c\.relname")
    store = getattr(privileges, "store", None)
    grantees: dict[str, dict[str, list[str]]] = {}
    if store is not None:
        shown = None if privileges.admin else set(privileges.roles)
        for name in sorted([*store.users, *store.roles]):
            if shown is None or name in shown:
                grantees[name] = store.grants(name)
    rows = []
    for name, kind in sorted(_visible(engine, privileges)):
        if names is not None and not names.search(name):
            continue
        acl = []
        for grantee, grants in grantees.items():
            held = set(grants.get(name.lower(), ()))
            letters = "".join(letter for action, letter in _ACL_LETTERS if action in held)
            if letters:
                acl.append(f"{_acl_name(grantee)}={letters}/cryptdisk")
        rows.append(("public", name, _KINDS.get(kind, "table"), "\n".join(acl) or None, "",
                     ""))
    return _result(columns, rows)


def _acl_name(name: str) -> str:
    """A grantee's name as an ACL writes it (quoted when it needs to be)."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_$]*", name) else \
        '"' + name.replace('"', '""') + '"'


def _roles(sql: str, privileges: Any, session_user: str) -> Result:
    columns = [("rolname", TEXT), ("rolsuper", BOOL), ("rolinherit", BOOL),
               ("rolcreaterole", BOOL), ("rolcreatedb", BOOL), ("rolcanlogin", BOOL),
               ("rolconnlimit", INT4), ("rolvaliduntil", TEXT), ("memberof", TEXT),
               ("rolreplication", BOOL), ("rolbypassrls", BOOL)]
    store = getattr(privileges, "store", None)
    entries: list[tuple[str, bool, bool, list[str]]] = []  # name, admin, login, member of
    if store is None:
        entries.append((session_user, True, True, []))
    else:
        for name, user in store.users.items():
            entries.append((name, bool(user.get("admin")), True, list(user.get("roles", ()))))
        for name, role in store.roles.items():
            entries.append((name, False, False, list(role.get("roles", ()))))
    wanted = _pattern(sql, r"r\.rolname", tables=False)
    rows = []
    for name, admin, login, member_of in sorted(entries):
        if wanted is not None and not wanted.search(name):
            continue
        rows.append((name, admin, True, admin, admin, login, -1, None,
                     "{" + ",".join(sorted(member_of)) + "}", False, admin))
    return _result(columns, rows)


def psql_list(sql: str, engine: EngineSession, privileges: Any) -> Result | None:
    """psql's relation list (the tables and views the session may read) answered, or None
    when ``sql`` is not that query."""
    if not _SIGNATURE_FIRST.match(sql):
        return None
    m = _SIGNATURE.search(sql)
    if not m:
        return None
    wanted = {k for k in re.findall(r"'(\w?)'", m[1]) if k in _KINDS}
    name_filter = _pattern(sql, r"c\.relname")
    rows = []
    for name, kind in _visible(engine, privileges):
        if kind not in wanted:
            continue
        if name_filter is not None and not name_filter.search(name):
            continue
        rows.append(("public", name, _KINDS[kind], "cryptdisk"))
    rows.sort()
    columns = [("Schema", TEXT), ("Name", TEXT), ("Type", TEXT), ("Owner", TEXT)]
    return Result(columns, rows, f"SELECT {len(rows)}")
