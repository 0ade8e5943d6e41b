"""Table privileges of non-admin users: checked before or as a statement runs.

Admins may do anything. Other users need a grant per table and action
(``SELECT``, ``INSERT``, ``UPDATE``, ``DELETE``), to themselves or to a role
they are a member of (directly or through other roles). ``SET ROLE r`` makes
the session act as ``r``: with r's privileges (and its roles') only, as in
PostgreSQL; ``RESET ROLE`` goes back to the login user.

- Encrypted SQLite: the connection's authorizer (``sqlite3_set_authorizer``)
  sees every table a statement reads or writes, including through views,
  triggers, CTEs and subqueries, as SQLite compiles it; anything else than
  reading and writing granted tables (DDL, ``PRAGMA``, ``ATTACH``) is refused.
- The analytical engine: non-admin users may run queries (``SELECT``,
  ``WITH``, ``VALUES``) and ``INSERT INTO t [(c, ...) | BY NAME | BY POSITION]
  {SELECT|VALUES|WITH|FROM} ...``
  (and ``COPY t FROM STDIN``) with ``INSERT`` on ``t``; DuckDB's own parser
  (``json_serialize_sql``) lists every table a query (or an INSERT's source)
  names, in subqueries and CTEs too, each of which needs ``SELECT``; table
  functions other than ``range``, ``generate_series`` and
  ``unnest`` (``read_parquet``, ``read_csv``, ...) and file paths used as tables
  are refused, and so are the keyed field functions (``decrypt``,
  ``fpe_encrypt``, ``tokenize``, ``mask_hash``, ... of ``cryptdisk.fields``):
  they use the server's field keys, and an encrypting one lets a caller test
  guesses against stored deterministic ciphertexts or tokens. The masks
  without a key (``mask_full``, ``mask_last4``, ``mask_email``, ``mask_null``)
  stay open.

  Any user may also run the ``SET`` / ``RESET`` that change only its own
  session's DuckDB settings (:func:`sets_own_setting`: its ``TimeZone``, its
  ``search_path`` back to the database's schema), as any PostgreSQL user sets
  its own session's; DuckDB's other settings (``threads``, ``memory_limit``,
  ... of the whole database, ``SET GLOBAL``) and ``PRAGMA`` stay an admin's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import apsw

from ..db import serialize_sql
from ._engines import StatementError
from ._sqltext import DEFAULT_SCHEMAS, unqualified_parts

if TYPE_CHECKING:
    from ._users import UserStore

__all__ = ["ACTIONS", "KEYED_FIELD_FUNCTIONS", "Privileges", "query_references",
           "sets_own_setting"]

ACTIONS = ("SELECT", "INSERT", "UPDATE", "DELETE")
_SAFE_TABLE_FUNCTIONS = {"range", "generate_series", "unnest"}
#: cryptdisk.fields' SQL functions that use a field key, and the UDFs behind its macros.
KEYED_FIELD_FUNCTIONS = frozenset({
    "encrypt", "decrypt", "encrypt_deterministic", "decrypt_deterministic", "fpe_encrypt",
    "fpe_decrypt", "tokenize", "detokenize", "mask_hash", "__cd_fpe_encrypt",
    "__cd_fpe_decrypt", "__cd_tokenize", "__cd_detokenize", "__cd_decrypt",
    "__cd_decrypt_bytes", "__cd_decrypt_deterministic", "__cd_decrypt_deterministic_bytes",
    "__cd_mask_hash"})
_SQLITE_ALWAYS = {apsw.SQLITE_SELECT, apsw.SQLITE_TRANSACTION, apsw.SQLITE_SAVEPOINT,
                  apsw.SQLITE_FUNCTION, apsw.SQLITE_RECURSIVE}
_SQLITE_WRITES = {apsw.SQLITE_INSERT: "INSERT", apsw.SQLITE_UPDATE: "UPDATE",
                  apsw.SQLITE_DELETE: "DELETE"}
_SCHEMA_TABLES = {"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"}


def _denied(action: str, table: str) -> StatementError:
    return StatementError(f"permission denied: {action} on table {table}", "42501",
                          hint="an admin can GRANT it")


class Privileges:
    """What one session may do, read live from ``store`` (a GRANT takes effect at once).

    The session's identity, for code that decides per user or role (e.g. masking), at
    ``session.privileges`` and ``engine_session.privileges`` (None on a server without
    users)::

        p.session_user   # the user who logged in
        p.current_user   # the same, or the role chosen by SET ROLE
        p.roles          # frozenset: current_user and every role it belongs to, transitively
        p.has_role("analyst")
        p.admin          # current_user is an admin (admins may do anything)
        p.allowed("sales", "SELECT")

    These read the user store live, so a GRANT or REVOKE shows at the next call.
    :meth:`UserStore.member_of` gives the roles of any user or role, and
    :attr:`UserStore.roles` the roles themselves.
    """

    def __init__(self, store: UserStore, user: str) -> None:
        self.store = store
        self.session_user = user
        self.current_user = user

    def __repr__(self) -> str:
        return f"<Privileges session_user={self.session_user!r} " \
            f"current_user={self.current_user!r}>"

    @property
    def user(self) -> str:
        """The name privileges are checked for: :attr:`current_user`."""
        return self.current_user

    def set_role(self, role: str | None) -> None:
        """Act as ``role`` (None: the login user again). The caller checks the membership."""
        self.current_user = self.session_user if role is None else role

    @property
    def version(self) -> tuple[int, str]:
        """Changes whenever what this session may do can change (a user, role or grant
        changed, or SET ROLE): a check cached under one version holds while it stays."""
        return self.store.generation, self.current_user

    @property
    def roles(self) -> frozenset[str]:
        """:attr:`current_user` and every role it is a member of, transitively (live)."""
        return self.store.member_of(self.current_user) | {self.current_user}

    def has_role(self, role: str) -> bool:
        return role in self.roles

    @property
    def admin(self) -> bool:
        return self.store.is_admin(self.current_user)

    def allowed(self, table: str, action: str) -> bool:
        if self.admin:
            return True
        table = table.lower()
        return any(action in self.store.actions(name, table) for name in self.roles)

    # -- SQLite ------------------------------------------------------------------------

    def sqlite_authorizer(self) -> Callable[..., int]:
        def authorize(op: int, one: str | None, two: str | None, database: str | None,
                      view: str | None) -> int:
            if op in _SQLITE_ALWAYS or self.admin:
                return apsw.SQLITE_OK
            if op == apsw.SQLITE_READ and one is not None:
                # (the schema tables name every table and hold their DDL: a user sees the
                # tables it may read through information_schema and pg_catalog)
                if one.lower() not in _SCHEMA_TABLES and self.allowed(one, "SELECT"):
                    return apsw.SQLITE_OK
                return apsw.SQLITE_DENY
            if op in _SQLITE_WRITES and one is not None:
                return apsw.SQLITE_OK if self.allowed(one, _SQLITE_WRITES[op]) \
                    else apsw.SQLITE_DENY
            return apsw.SQLITE_DENY

        return authorize

    # -- the analytical engine ------------------------------------------------------------

    def _check_change(self, sql: str, change: re.Match[str], con: Any
                      ) -> tuple[str, str | None]:
        """A ``DELETE`` or ``UPDATE`` (``change`` matched its head): refused without that
        privilege on its table; returns the query of what it reads (its ``WHERE``, its
        ``SET`` expressions and their subqueries, over its table), which needs SELECT on
        each table it names, and the changed table (its grants' key) when the statement
        does not read its columns (no WHERE, no SET from a column): its FROM then needs
        no SELECT."""
        from ..db import change_statement
        from ..errors import DatabaseError

        action = "DELETE" if change[1].upper().startswith("DELETE") else "UPDATE"
        table = _table_name(change[2])
        if not self.allowed(table, action):
            raise _denied(action, table)
        try:
            st = change_statement(sql)
        except DatabaseError:
            return "SELECT 1", None  # refused when it runs, having read nothing
        if st is None:
            return "SELECT 1", None  # pragma: no cover
        exprs = [e for _c, e in getattr(st, "assignments", [])]
        alias = '"' + (st.alias or st.table).replace('"', '""') + '"'
        target = '"' + st.table.replace('"', '""') + '"'
        # the statement's own text, parsed for what it reads (never run)
        reads = f"SELECT {', '.join(exprs) or '1'} FROM {target} AS {alias}" + (  # noqa: S608
            f" WHERE {st.where}" if st.where else "")
        reads_table = st.where is not None or (
            bool(exprs) and _reads_columns(f"SELECT {', '.join(exprs)}", con))
        return reads, None if reads_table else table

    def check_analytical(self, sql: str, con: Any,
                         owners: dict[str, str | None] | None = None,
                         reads: bool = True) -> None:
        """Refuse ``sql`` unless it is a query over tables this user may SELECT, an
        INSERT into a table this user may INSERT into from such a query, or a DELETE or
        UPDATE of a table this user may DELETE or UPDATE whose WHERE and SET expressions
        are such a query's (see :meth:`_check_change`). ``owners``: the views with their
        owner's rights (lower-case name -> owner), left named in ``sql``: reading one needs
        SELECT on it, and its owner must still be an admin (what it reads is the owner's
        to read); one with no owner (made through the Python API, by whoever holds the
        database's key) reads as an admin's. ``reads=False``: the tables are not checked,
        the functions are (those of ``sql`` with every view written out: a view's
        functions are its reader's to call, as in PostgreSQL)."""
        if self.admin or sets_own_setting(sql):
            return
        change = _CHANGE.match(sql)
        unread = None  # the changed table, when the statement reads none of its columns
        if change is not None:
            sql, unread = self._check_change(sql, change, con)
        insert = None if change is not None else _INSERT.match(sql)
        if insert is not None:
            table = _table_name(insert[1])
            if not self.allowed(table, "INSERT"):
                raise _denied("INSERT", table)
            rest = sql[insert.end():].strip()
            by = re.match(r"BY\s+(NAME|POSITION)\b", rest, re.I)  # (how columns match)
            if by is not None:
                rest = rest[by.end():].strip()
            elif rest.startswith("(") and not re.match(r"\(\s*(SELECT|WITH|VALUES|FROM)\b",
                                                       rest, re.I):
                close = _close_paren(rest)
                rest = rest[close + 1:].strip()  # the column list
            if re.fullmatch(r"DEFAULT\s+VALUES\s*;?", rest, re.I):
                return  # one row of the columns' defaults (a DEFAULT reads no table)
            sql = rest
        found = query_references(sql, con)
        setting = _SETTING.match(sql) if found is None else None
        if setting is not None:
            raise StatementError(
                f"permission denied: {setting[1].upper()} {setting[2]} (admin users only)",
                "42501", hint="a user that is not an admin may set its own session's "
                "settings only: TimeZone, application_name, statement_timeout, "
                "client_min_messages, extra_float_digits, search_path to public, ...")
        if found is None:
            raise StatementError("permission denied: only admin users may run statements "
                                 "other than queries and INSERT on the analytical database",
                                 "42501")
        tables, functions = found
        for name in functions:
            if name == SHOW_ALL_TABLES:
                raise StatementError("permission denied: SHOW ALL TABLES lists every table "
                                     "(admin users only); SHOW TABLES lists the tables "
                                     "this user may read", "42501")
            if name.lower() not in _SAFE_TABLE_FUNCTIONS:
                raise StatementError(f"permission denied: table function {name} "
                                     "(admin users only)", "42501")
        for table in tables if reads else ():
            if unread is not None and table.lower() == unread:
                unread = None  # (its FROM, read for no column: other references need it)
                continue
            if owners and table.lower() in owners:
                owner = owners[table.lower()]  # (None: made by the key's holder, through
                if owner is not None and not self.store.is_admin(owner):  # the Python API)
                    raise StatementError(
                        f"permission denied: view {table} has its owner's rights, and its "
                        f"owner {owner} is not an admin", "42501",
                        hint=f"an admin can CREATE OR REPLACE VIEW {table} WITH "
                        "(security_invoker = false) AS ..., becoming its owner")
            if not self.allowed(table, "SELECT"):
                raise _denied("SELECT", table)
        for name in _scalar_functions(sql, con) & KEYED_FIELD_FUNCTIONS:
            raise StatementError(f"permission denied: function {name} uses a field key "
                                 "(admin users only)", "42501")


#: a SET or RESET of the session's own DuckDB settings: its TimeZone (a quoted or plain
#: value alone: nothing can follow it), and RESET search_path (what the server's RESET ALL
#: and SET search_path = public run). A search_path naming another schema is not one: the
#: grants name tables without their schema.
_OWN_SETTING = re.compile(
    r"\s*(?:SET\s+(?:SESSION\s+|LOCAL\s+)?(?:TIME\s+ZONE\s+|\"?TimeZone\"?\s*(?:=|\bTO\b)\s*)"
    r"(?:'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|[A-Za-z0-9_/+:.-]+)"
    r"|RESET\s+(?:\"?TimeZone\"?|search_path))\s*;?\s*", re.I)

#: the SET or RESET of another setting: (SET or RESET, its name)
_SETTING = re.compile(r"\s*(SET|RESET)\s+((?:GLOBAL\s+|SESSION\s+|LOCAL\s+)?"
                      r"(?:TIME\s+ZONE|\"(?:[^\"]|\"\")+\"|[A-Za-z_][A-Za-z0-9_]*))", re.I)


def sets_own_setting(sql: str) -> bool:
    """Whether ``sql`` changes only its session's own DuckDB settings (see
    :data:`_OWN_SETTING`), which any user may, as in PostgreSQL."""
    return _OWN_SETTING.fullmatch(sql) is not None


#: what :func:`query_references` names among a statement's table functions for a
#: ``SHOW ALL TABLES`` (no table function has a name with spaces)
SHOW_ALL_TABLES = "SHOW ALL TABLES"
_PART = r'(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)'
_INSERT = re.compile(rf"\s*INSERT\s+INTO\s+({_PART}(?:\s*\.\s*{_PART})?)", re.I)
_CHANGE = re.compile(rf"\s*(DELETE\s+FROM|UPDATE)\s+({_PART}(?:\s*\.\s*{_PART})?)", re.I)


def _reads_columns(sql: str, con: Any) -> bool:
    """Whether the expressions of ``SELECT ...`` text ``sql`` name a column."""
    import json

    return '"COLUMN_REF"' in json.dumps(serialize_sql(sql, con))


def _table_name(text: str) -> str:
    """A possibly quoted, possibly schema-qualified name as the grants key it (``main.``
    and ``public.`` dropped: see :func:`._sqltext.unqualify`)."""
    parts = [p[1:-1].replace('""', '"') if p.startswith('"') else p.lower()
             for p in re.findall(_PART, text)]
    return ".".join(unqualified_parts(parts)).lower()


def _close_paren(text: str) -> int:
    """The index of the ``)`` closing the ``(`` at 0 (strings and quoted names skipped)."""
    depth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c in "'\"":
            end = text.find(c, i + 1)
            while end >= 0 and end + 1 < n and text[end + 1] == c:
                end = text.find(c, end + 2)
            if end < 0:
                break
            i = end
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise StatementError("unbalanced parentheses in INSERT", "42601")


def query_references(sql: str, con: Any) -> tuple[list[str], list[str]] | None:
    """(tables, table functions) a query names, from DuckDB's parser; None: not a query."""
    tree = serialize_sql(sql, con)
    if tree.get("error"):
        return None
    tables: list[str] = []
    functions: list[str] = []
    _walk(tree, tables, functions, frozenset())
    return tables, functions


def _scalar_functions(sql: str, con: Any) -> set[str]:
    """The (lower-cased) names of every function a query calls, at any depth."""
    names: set[str] = set()
    stack: list[Any] = [serialize_sql(sql, con)]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "FUNCTION" and isinstance(node.get("function_name"), str):
                names.add(node["function_name"].lower())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return names


def _walk(node: Any, tables: list[str], functions: list[str], ctes: frozenset[str]) -> None:
    """Collect table and table-function references; a name is a CTE only where it is visible
    (in the subtree of the node that defines it, after it: a CTE's own body, and earlier
    ones, see the table of that name, as DuckDB resolves them; a recursive CTE sees
    itself), so a CTE cannot hide a table."""
    if isinstance(node, dict):
        if node.get("type") == "RECURSIVE_CTE_NODE" and isinstance(node.get("cte_name"), str):
            ctes = ctes | {node["cte_name"].lower()}
        cte_map = node.get("cte_map")
        if isinstance(cte_map, dict):
            for entry in cte_map.get("map", []):
                _walk(entry, tables, functions, ctes)
                if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                    ctes = ctes | {entry["key"].lower()}
            node = {k: v for k, v in node.items() if k != "cte_map"}
        kind = node.get("type")
        if kind == "BASE_TABLE":
            schema, name = node.get("schema_name") or "", node.get("table_name") or ""
            full = f"{schema}.{name}" if schema and schema not in DEFAULT_SCHEMAS else name
            if schema or name.lower() not in ctes:
                tables.append(full)
        elif kind == "TABLE_FUNCTION":
            function = node.get("function") or {}
            functions.append(str(function.get("function_name", "?")))
        elif kind == "SHOW_REF" and node.get("query") is None \
                and str(node.get("table_name")).startswith("__show_tables_expanded"):
            # SHOW ALL TABLES: every table and view of the database with its columns and
            # types (cryptdisk.db answers it from duckdb_columns()): admin users only
            functions.append(SHOW_ALL_TABLES)
        elif kind == "SHOW_REF" and node.get("query") is None and node.get("table_name") \
                and not str(node["table_name"]).startswith("__show_tables"):
            # SHOW t: DuckDB describes the table of that name (its columns and types);
            # (SHOW TABLES of a user that is not an admin lists what it may read: ._engines)
            schema, name = node.get("schema_name") or "", str(node["table_name"])
            tables.append(f"{schema}.{name}" if schema and schema not in DEFAULT_SCHEMAS
                          else name)
        for value in node.values():
            _walk(value, tables, functions, ctes)
    elif isinstance(node, list):
        for value in node:
            _walk(value, tables, functions, ctes)
