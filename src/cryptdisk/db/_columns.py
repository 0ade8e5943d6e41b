"""Which tables and columns a query reads, so only those are decrypted and decoded.

DuckDB parses the query (``json_serialize_sql``); every column reference is
collected. Anything this analysis does not understand (a ``*``, a whole-row
reference, a lambda parameter, a statement that is not a SELECT) makes it
load every column of the tables the query names: it may load too much, never
too little.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import duckdb

from ..errors import DatabaseError
from ._names import fold

__all__ = ["ALL", "UNQUOTED_IDENT", "base_tables", "forget_walks", "has_where",
           "matching_paren",
           "needed_columns", "parse_tree", "parse_tree_text", "referenced_tables",
           "rewrite_system_tables", "share_walks", "unquoted_words"]

ALL = None  # marker: every column
#: An unquoted identifier as DuckDB's scanner reads one (PostgreSQL's rule): a letter, ``_``
#: or any character past ASCII, then those, digits and ``$`` (``ünï``, ``名前``).
UNQUOTED_IDENT = r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*"
_WORD = re.compile(rf'"((?:[^"]|"")+)"|`([^`]+)`|({UNQUOTED_IDENT})')
SYSTEM_TABLES = ("disks", "storage_policies", "tables", "columns", "parts", "keys", "views")
_SYSTEM = re.compile(r"(?i)\bsystem\s*\.\s*(" + "|".join(SYSTEM_TABLES) + r")\b")


def rewrite_system_tables(sql: str) -> tuple[str, bool]:
    """Map ``system.parts`` etc. to the views that hold them (DuckDB owns a ``system`` catalog)."""
    out, n = _SYSTEM.subn(lambda m: f"__cd_system_{m.group(1).lower()}", sql)
    return out, n > 0


_LITERAL = re.compile(r"'(?:[^']|'')*'|--[^\n]*|/\*.*?\*/", re.S)


def referenced_tables(sql: str, names: set[str]) -> set[str]:
    """The names in ``names`` that appear as identifiers in ``sql`` (outside literals), in
    any case, quoted or not (as DuckDB finds a table)."""
    lower = {fold(n): n for n in names}
    found = set()
    for m in _WORD.finditer(_LITERAL.sub(" ", sql)):
        word = m.group(1).replace('""', '"') if m.group(1) else m.group(2) or m.group(3) or ""
        name = lower.get(fold(word))
        if name is not None:
            found.add(name)
    return found


def has_where(sql: str) -> bool:
    """Whether ``sql`` holds the keyword WHERE (outside literals, comments and quotes)."""
    return "where" in unquoted_words(sql)


def unquoted_words(sql: str) -> set[str]:
    """The unquoted words of ``sql`` (outside literals, comments and quotes), lower case."""
    return {m.group(3).lower() for m in _WORD.finditer(_LITERAL.sub(" ", sql)) if m.group(3)}


_SCALARS = frozenset({str, int, float, bool, type(None)})


class _SharedWalk(threading.local):
    """The statements of the tree a statement is analysed by (see :func:`share_walks`)
    and, once walked, their nodes: this thread's."""

    root: Any = None
    nodes: list[dict[str, Any]] | None = None


_SHARED = _SharedWalk()


def share_walks(tree: dict[str, Any] | None) -> None:
    """Let every later :func:`_walk` of ``tree["statements"]`` on this thread share one
    walk, until another tree is shared or :func:`forget_walks`: a statement's analyses
    (which tables, which columns, filters, top-N, min/max...) walk its tree some ten
    times, and none changes it. Whatever changes the tree in place must call
    :func:`forget_walks`."""
    _SHARED.root = tree.get("statements") if isinstance(tree, dict) else None
    _SHARED.nodes = None


def forget_walks() -> None:
    """The shared tree changed (or goes): walk it again when asked."""
    _SHARED.nodes = None


def _walk(node: Any) -> list[dict[str, Any]]:
    """Every dict under ``node`` (itself included), through dicts and lists nested in any
    way, each before what it holds, in the order of the values. A list, not a generator
    (a recursive generator passed every node up through a generator per level: twice the
    cost), shared by the walks of the statements of the tree :func:`share_walks` names;
    callers only read it."""
    if node is _SHARED.root and node is not None:
        nodes = _SHARED.nodes
        if nodes is None:
            nodes = _SHARED.nodes = _walk_all(node)
        return nodes
    return _walk_all(node)


def _walk_all(node: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    add = out.append

    def visit(n: Any) -> None:
        if isinstance(n, dict):
            add(n)
            n = n.values()
        for v in n:
            if type(v) not in _SCALARS and isinstance(v, (dict, list)):
                visit(v)

    if isinstance(node, dict | list):
        visit(node)
    return out


def scalar(con: Any, sql: str, params: list[Any] | None = None) -> Any:
    """The first value of a one-row query on a DuckDB connection (None without a row).

    It fetches the whole result: a ``fetchone()`` that returns the only row leaves the
    result unfinished and its transaction open until the connection's next statement,
    which keeps the row versions of every later change to the database in memory (and
    a parsing connection sits idle between statements)."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0][0] if rows else None


def current_settings(con: Any, names: tuple[str, ...]) -> tuple[Any, ...]:
    """DuckDB's settings ``names`` (identifiers of cryptdisk's own) on connection ``con``,
    read by one statement."""
    items = ", ".join("current_setting('" + n.replace("'", "''") + "')" for n in names)
    rows = con.execute(f"SELECT {items}").fetchall()  # (all of it: see scalar)
    return tuple(rows[0]) if rows else (None,) * len(names)


def parser_cursor(con: Any) -> Any:
    """A cursor of the DuckDB connection ``con`` to parse with (:func:`serialize_sql`):
    its session pins the settings DuckDB's parser reads (``integer_division`` makes ``/``
    parse as ``//``, ``preserve_identifier_case`` lowers names) to their defaults, so a
    tree it gives depends on the statement's text alone, whatever ``SET`` (even ``SET
    GLOBAL``) ran on ``con``, and a tree or rewrite kept by that text never goes stale.
    Text made from a tree (``json_deserialize_sql``) is parsed again where it runs, under
    that connection's settings. A cursor, not a connection (see ``_forksafe``); one
    thread at a time, as any DuckDB connection."""
    parser = con.cursor()
    parser.execute("SET SESSION integer_division = false")
    parser.execute("SET SESSION preserve_identifier_case = true")
    return parser


def serialize_sql(sql: str, con: Any) -> Any:
    """DuckDB's parse tree of ``sql`` (``json_serialize_sql``), ``{"error": True, ...}``
    if it does not parse."""
    text = scalar(con, "SELECT json_serialize_sql(?)", [sql])
    return json.loads(text) if text is not None else {"error": True}


def parse_tree(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, Any] | None:
    """DuckDB's parse tree of a SELECT, or None (not a SELECT, or not parseable)."""
    found = parse_tree_text(con, sql)
    return None if found is None else found[0]


def parse_tree_text(con: duckdb.DuckDBPyConnection, sql: str
                    ) -> tuple[dict[str, Any], str] | None:
    """:func:`parse_tree` and the JSON text DuckDB gave it as (to keep: a tree is loaded
    from its text again, never shared, as a statement's analysis may rewrite it)."""
    try:
        text = scalar(con, "SELECT json_serialize_sql(?)", [sql])
        tree = json.loads(text) if text is not None else None
    except (duckdb.Error, ValueError):
        return None
    if not isinstance(tree, dict) or tree.get("error"):
        return None
    return tree, text


def base_tables(tree: dict[str, Any], names: set[str]) -> set[str]:
    """The tables in ``names`` that the parse tree reads (FROM / JOIN)."""
    lower = {fold(n): n for n in names}
    found = set()
    for node in _walk(tree.get("statements", [])):
        if node.get("type") == "BASE_TABLE" and not node.get("schema_name"):
            name = lower.get(fold(str(node.get("table_name", ""))))
            if name is not None:
                found.add(name)
    return found


def schema_qualified_tables(tree: dict[str, Any], names: set[str],
                            attached: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """References (``main.t``, ``memory.main.t``) to the tables in ``names`` qualified by
    a schema or catalog: the statement's scans of them are not in one, so as written they
    name no table. ``attached``: the names (lower case) of attached databases, whose
    tables (``o.t``, ``o.main.t``) are not the database's."""
    lower = {fold(n) for n in names}
    found = []
    for node in _walk(tree.get("statements", [])):
        if node.get("type") == "BASE_TABLE" and (node.get("schema_name")
                                                 or node.get("catalog_name")) \
                and fold(str(node.get("table_name", ""))) in lower \
                and str(node.get("catalog_name") or node.get("schema_name")).lower() \
                not in attached:
            found.append(".".join(str(node[k]) for k in ("catalog_name", "schema_name",
                                                          "table_name") if node.get(k)))
    return found


def _expression_aliases(tree: dict[str, Any]) -> set[str]:
    """Names given to select-list expressions (``substr(c, 1, 2) AS p``) that name no
    relation: an unqualified reference to one reads what its expression reads. A name that
    is also a table, alias or CTE name might be a whole-row reference, so it is left out."""
    exprs, relations = set(), set()
    for node in _walk(tree.get("statements", [])):
        for item in node.get("select_list") or []:
            if isinstance(item, dict) and item.get("alias"):
                exprs.add(fold(str(item["alias"])))
        if "class" not in node:  # a table reference, a query node, a CTE map...
            for key in ("alias", "table_name"):
                if node.get(key):
                    relations.add(fold(str(node[key])))
            for entry in (node.get("cte_map") or {}).get("map") or []:
                relations.add(fold(str(entry.get("key", ""))))
    return exprs - relations


def needed_columns(tree: dict[str, Any] | None, tables: dict[str, list[str]],
                   derived: set[str] | frozenset[str] = frozenset()
                   ) -> dict[str, list[str] | None]:
    """For each table in ``tables`` (name -> columns): the columns the query may read
    (``derived``: names of derived columns, see ._derived, which are none of them)."""
    everything: dict[str, list[str] | None] = {t: ALL for t in tables}
    if tree is None:
        return everything
    known = {fold(c) for cols in tables.values() for c in cols}
    aliases = _expression_aliases(tree)
    refs: set[str] = set()
    for node in _walk(tree.get("statements", [])):
        cls = node.get("class")
        if cls == "STAR" or node.get("type") in ("STAR", "COLUMNS"):
            return everything
        if node.get("ref_type") in ("NATURAL", "POSITIONAL") or cls == "POSITIONAL_REFERENCE":
            return everything  # a column by position, or joins on every common column
        if cls == "COLUMN_REF":
            names = node.get("column_names") or [""]
            name = fold(str(names[-1]))
            if name in derived:
                continue
            if name not in known:
                if len(names) == 1 and name in aliases:
                    continue  # a select-list alias (GROUP BY p): its expression is walked
                return everything  # a whole-row or lambda reference: be safe
            refs.add(name)
        for col in node.get("using_columns") or []:
            refs.add(fold(str(col)))
    return {t: [c for c in cols if fold(c) in refs] for t, cols in tables.items()}


def matching_paren(text: str, start: int, statement: str) -> int:
    """The index of the ``)`` that closes the ``(`` at ``text[start]`` (quotes skipped);
    unbalanced parentheses raise :class:`~cryptdisk.errors.DatabaseError` naming
    ``statement`` (e.g. "CREATE TABLE")."""
    depth, quote = 0, ""
    for i in range(start, len(text)):
        c = text[i]
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"`":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
    raise DatabaseError(f"unbalanced parentheses in {statement}")


_WIDE_INTEGER = re.compile(
    r'"(?:[^"]|"")*"|\'(?:[^\']|\'\')*\'|\b(U?HUGEINT|U?INT128)\b(?=\s*(?:[,)\[]|$))',
    re.IGNORECASE)


def stored_type(typ: str) -> str:
    """Column type ``typ`` as a part stores it, for the ``CAST`` of what is written to
    it: a ``HUGEINT`` or ``UHUGEINT`` (alone or nested) is a ``DECIMAL(38,0)`` in
    Arrow and Parquet, so a value beyond 38 digits fails the cast rather than being
    written as a number that column cannot hold (a ``UHUGEINT`` above 2^127 - 1 became
    negative)."""
    if "INT128" not in typ.upper() and "HUGEINT" not in typ.upper():
        return typ
    return _WIDE_INTEGER.sub(lambda m: "DECIMAL(38,0)" if m.group(1) else m.group(0), typ)
