"""Views: named queries kept in the catalog, read as if their text were written in place.

``CREATE [OR REPLACE] VIEW [IF NOT EXISTS] v [(c1, ...)] AS query`` keeps the query's
text in the catalog (sealed like the rest of it), ``DROP VIEW [IF EXISTS] v`` and
``ALTER VIEW v RENAME TO w`` change it, each one catalog commit. A statement that
reads a view is rewritten before anything else looks at it (the scans' pushdown, a
role's masking and row access policies, the server's grant checks): each reference to
the view in its FROM clauses (in subqueries, CTEs, joins and ``UNION`` branches too,
unless a CTE of that name hides it) becomes the parenthesised query, the reference's
alias kept (the view's name if it has none). DuckDB's parser finds the references
(``json_serialize_sql``, which gives each table reference's byte offset in the text),
and only the name's bytes are replaced: the rest of the statement is run as written. A
view over a view is rewritten in turn; one that reads itself, directly or through
others, is refused.

Views have the rights of the user who reads them (invoker rights) unless made ``WITH
(security_invoker = false)`` (PostgreSQL's option, also ``ALTER VIEW v SET (...)``): such
a view keeps the name of the user who made it (:func:`view_owner`, set by the server),
and the server checks the tables it reads against that owner rather than the reader
(:func:`expand_statement`'s ``keep``). Whatever the mode, the text is written out the
same way for the run, so a role's masking and row access policies apply to the reader.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import DatabaseError
from ._columns import UNQUOTED_IDENT, matching_paren, referenced_tables
from ._names import NameDict, fold

__all__ = ["AlterView", "CreateView", "DropView", "SetView", "ViewMeta", "Views",
           "expand_views", "parse_view_statement", "view_owner", "view_reads"]

_IDENT = rf'(?:"(?:[^"]|"")+"|`[^`]+`|{UNQUOTED_IDENT})'
#: expansions a :class:`Views` keeps (least recently used dropped first)
_EXPANSIONS = 256
#: how deep views may nest (a view over a view over ...)
MAX_DEPTH = 32


@dataclass
class ViewMeta:
    name: str
    query: str  # the text after AS, as written
    columns: list[str] | None = None  # the names given after the view's name, if any
    reads: list[str] = field(default_factory=list)  # the tables and views it names
    #: False: read with the rights of :attr:`owner` (``WITH (security_invoker = false)``)
    security_invoker: bool = True
    owner: str | None = None  # who made it (through the server; None: the Python API)

    def document(self) -> dict[str, Any]:
        """The catalog's entry (the mode and owner only when the view has the owner's
        rights, so a catalog of invoker views reads as before)."""
        doc: dict[str, Any] = {"name": self.name, "query": self.query,
                               "columns": self.columns, "reads": self.reads}
        if not self.security_invoker:
            doc.update(security_invoker=False, owner=self.owner)
        return doc

    def body(self) -> str:
        """The query the view stands for (its column names given, if it has any)."""
        if not self.columns:
            return self.query
        cols = ", ".join(_quote(c) for c in self.columns)
        return f"SELECT * FROM ({self.query}) AS {_quote(self.name)}({cols})"


class Views(NameDict[ViewMeta]):
    """The catalog's views by the name each was created with, found in any case (see
    :class:`~._names.NameDict`); it keeps the statements it rewrote, forgotten on any
    change of its views."""

    __slots__ = ("expanded",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        #: statement text -> (its text with the views written out, the views it read)
        #: (statement text, owner-rights views kept) -> (its text with the views written
        #: out, the views it read)
        self.expanded: collections.OrderedDict[tuple[str, bool],
                                               tuple[str, tuple[str, ...]]] = \
            collections.OrderedDict()

    def _changed(self) -> None:
        self.expanded.clear()


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _unquote(ident: str) -> str:
    if ident.startswith('"') and ident.endswith('"'):
        return ident[1:-1].replace('""', '"')
    if ident.startswith("`") and ident.endswith("`"):
        return ident[1:-1]
    return ident


# -- statements ------------------------------------------------------------------------


_OWNER: contextvars.ContextVar[str | None] = contextvars.ContextVar("view_owner",
                                                                    default=None)


@contextlib.contextmanager
def view_owner(user: str | None) -> Iterator[None]:
    """Record ``user`` as the owner of the views the block makes with the owner's rights
    (the server runs an admin's ``CREATE VIEW`` in it)."""
    token = _OWNER.set(user)
    try:
        yield
    finally:
        _OWNER.reset(token)


def current_view_owner() -> str | None:
    return _OWNER.get()


@dataclass
class CreateView:
    name: str
    query: str
    columns: list[str] | None = None
    or_replace: bool = False
    if_not_exists: bool = False
    security_invoker: bool = True


@dataclass
class SetView:
    """``ALTER VIEW v SET (security_invoker = ...)`` / ``RESET (security_invoker)``."""
    name: str
    security_invoker: bool


@dataclass
class DropView:
    name: str
    if_exists: bool = False


@dataclass
class AlterView:
    name: str
    new_name: str


_CREATE = re.compile(rf"(?is)CREATE\s+(OR\s+REPLACE\s+)?VIEW\s+(IF\s+NOT\s+EXISTS\s+)?"
                     rf"({_IDENT})\s*(\.\s*{_IDENT}\s*)?")
_DROP = re.compile(rf"(?is)DROP\s+VIEW\s+(IF\s+EXISTS\s+)?({_IDENT})(\s*\.\s*{_IDENT})?"
                   r"(?:\s+(CASCADE|RESTRICT))?")
_ALTER = re.compile(rf"(?is)ALTER\s+VIEW\s+(?:IF\s+EXISTS\s+)?({_IDENT})\s+RENAME\s+TO\s+"
                    rf"({_IDENT})")
_QUERY_START = re.compile(r"(?is)\(?\s*(SELECT|WITH|VALUES|FROM)\b")


def parse_view_statement(sql: str) -> CreateView | DropView | AlterView | SetView | None:
    """``sql`` read as a statement on views (None: another statement; ``CREATE TEMP
    VIEW`` is DuckDB's, for the connection alone). One that does not read raises
    :class:`~cryptdisk.errors.DatabaseError`."""
    s = sql.strip().rstrip(";").strip()
    head = s[:7].upper()
    if head.startswith("CREATE") and (m := _CREATE.match(s)) is not None:
        name = _unquote(m.group(3))
        if m.group(4):
            raise DatabaseError(f"CREATE VIEW {m.group(3)}{''.join(m.group(4).split())}: a "
                                "view is named without a schema (cryptdisk's views are in "
                                "no DuckDB schema)", hint="CREATE VIEW v AS SELECT ...")
        rest = s[m.end():]
        columns = None
        if rest.startswith("("):
            close = _close(rest)
            columns = [_unquote(c.strip()) for c in rest[1:close].split(",")]
            if not all(columns) or not all(re.fullmatch(_IDENT, c.strip())
                                           for c in rest[1:close].split(",")):
                raise DatabaseError(f"CREATE VIEW {name}: cannot read the column names "
                                    f"({rest[1:close].strip()})",
                                    hint=f"CREATE VIEW {name} (a, b) AS SELECT ...")
            rest = rest[close + 1:].lstrip()
        invoker = True
        wm = re.match(r"(?is)WITH\s*\(", rest)
        if wm is not None:
            close = wm.end() - 1 + _close(rest[wm.end() - 1:])
            invoker = _view_options(f"CREATE VIEW {name}", rest[wm.end():close])
            rest = rest[close + 1:].lstrip()
        am = re.match(r"(?is)AS\b\s*", rest)
        query = rest[am.end():].strip() if am else ""
        if not am or not _QUERY_START.match(query):
            raise DatabaseError(f"CREATE VIEW {name}: expected AS and a query",
                                hint=f"CREATE VIEW {name} AS SELECT ...")
        if m.group(1) and m.group(2):
            raise DatabaseError("CREATE OR REPLACE VIEW ... IF NOT EXISTS: give one of them")
        return CreateView(name, query, columns, bool(m.group(1)), bool(m.group(2)), invoker)
    if head.startswith("DROP") and (m := _DROP.fullmatch(s)) is not None:
        if m.group(3):
            raise DatabaseError(f"DROP VIEW {m.group(2)}{''.join(m.group(3).split())}: a view "
                                "is named without a schema", hint="DROP VIEW v")
        if (m.group(4) or "").upper() == "CASCADE":
            raise DatabaseError("DROP VIEW ... CASCADE is not supported: views that read "
                                "the view fail when read, naming it",
                                hint="DROP VIEW v (and the views that read it, each)")
        return DropView(_unquote(m.group(2)), bool(m.group(1)))
    if head.startswith("ALTER") and re.match(r"(?is)ALTER\s+VIEW\b", s):
        m = _ALTER.fullmatch(s)
        sm = _ALTER_SET.fullmatch(s)
        if sm is not None:
            name = _unquote(sm.group(1))
            if sm.group(2).upper() == "RESET":
                if [o.strip().lower() for o in sm.group(3).split(",")] != ["security_invoker"]:
                    raise DatabaseError(f"ALTER VIEW {name} RESET: unknown view option "
                                        f"({sm.group(3).strip()})",
                                        hint=f"ALTER VIEW {name} RESET (security_invoker)")
                return SetView(name, True)
            return SetView(name, _view_options(f"ALTER VIEW {name}", sm.group(3)))
        if m is None:
            raise DatabaseError(f"cannot read {s[:60]!r}: a view changes by ALTER VIEW v "
                                "RENAME TO w", hint="CREATE OR REPLACE VIEW v AS ... "
                                "changes its query")
        return AlterView(_unquote(m.group(1)), _unquote(m.group(2)))
    return None


_ALTER_SET = re.compile(rf"(?is)ALTER\s+VIEW\s+(?:IF\s+EXISTS\s+)?({_IDENT})\s+(SET|RESET)\s*"
                        r"\(([^()]*)\)")
_TRUE = frozenset({"true", "on", "yes", "1", "t", "y"})
_FALSE = frozenset({"false", "off", "no", "0", "f", "n"})


def _view_options(statement: str, text: str) -> bool:
    """``security_invoker`` of a view's options (``security_invoker [= true|false]``, as
    PostgreSQL's); any other option is refused."""
    invoker = True
    for option in text.split(","):
        m = re.fullmatch(r"(?is)\s*(\w+)\s*(?:=\s*'?(\w+)'?)?\s*", option)
        if m is None or m.group(1).lower() != "security_invoker":
            raise DatabaseError(f"{statement}: unknown view option ({option.strip()}): a view "
                                "takes security_invoker only",
                                hint="WITH (security_invoker = false) gives the view its "
                                "owner's rights")
        value = (m.group(2) or "true").lower()
        if value not in _TRUE | _FALSE:
            raise DatabaseError(f"{statement}: security_invoker is true or false, not "
                                f"{m.group(2)}")
        invoker = value in _TRUE
    return invoker


def _close(text: str) -> int:
    return matching_paren(text, 0, "CREATE VIEW")


# -- reading views ---------------------------------------------------------------------

Parse = Callable[[str], Any]  # SQL text -> DuckDB's parse tree (``{"error": ...}`` if none)


def _references(node: Any, names: dict[str, str], ctes: frozenset[str],
                out: list[tuple[int, str, bool, frozenset[str]]]) -> None:
    """``(byte offset, view name, has alias, CTE names in scope)`` of each reference to a
    view of ``names`` (lower case -> declared) in the tree ``node``, outside the CTE names
    in scope (a CTE's own body, and the earlier ones, see the view of that name; a
    recursive CTE sees itself), as DuckDB resolves them."""
    if isinstance(node, list):
        for value in node:
            _references(value, names, ctes, out)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "BASE_TABLE":
        name = fold(str(node.get("table_name") or ""))
        if not node.get("schema_name") and not node.get("catalog_name") \
                and name in names and name not in ctes:
            out.append((int(node["query_location"]), names[name], bool(node.get("alias")),
                        ctes))
        return
    if node.get("type") == "RECURSIVE_CTE_NODE" and isinstance(node.get("cte_name"), str):
        ctes = ctes | {fold(node["cte_name"])}
    cte_map = node.get("cte_map")
    if isinstance(cte_map, dict):
        for entry in cte_map.get("map") or []:
            _references(entry, names, ctes, out)
            if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                ctes = ctes | {fold(entry["key"])}
    for key, value in node.items():
        if key != "cte_map" and isinstance(value, (dict, list)):
            _references(value, names, ctes, out)


_UNQUOTED = re.compile(UNQUOTED_IDENT)


def _expand_query(sql: str, views: Views, parse: Parse, stack: tuple[str, ...],
                  used: list[str], outer: frozenset[str] = frozenset(),
                  keep: bool = False) -> str:
    """``sql`` (a query) with each view it reads written out (see the module); ``outer``:
    the CTE names (lower case) in scope where ``sql`` is written out; ``keep``: the
    views with their owner's rights are left as they are named (their reader's check)."""
    if not referenced_tables(sql, set(views)):
        return sql
    tree = parse(sql)
    if not isinstance(tree, dict) or tree.get("error"):
        return sql  # DuckDB says what is wrong with it
    names = {fold(n): n for n in views}
    found: list[tuple[int, str, bool, frozenset[str]]] = []
    _references(tree.get("statements", []), names, frozenset(), found)
    if not found:
        return sql
    data = sql.encode()
    for offset, name, aliased, ctes in sorted(found, reverse=True):
        if fold(name) in stack:
            chain = " -> ".join((*stack, fold(name)))
            raise DatabaseError(f"view {name} reads itself ({chain})",
                                hint=f"CREATE OR REPLACE VIEW {name} AS a query that does "
                                "not read it")
        if len(stack) >= MAX_DEPTH:
            raise DatabaseError(f"views nest more than {MAX_DEPTH} deep (at view {name})")
        meta = views[name]
        scope = outer | ctes
        hidden = sorted(r for r in meta.reads if fold(r) in scope)
        if hidden:  # written out there, the view's query would read the CTE instead
            raise DatabaseError(
                f"view {name} reads {hidden[0]}, which a CTE named {hidden[0]} of the "
                "statement hides where the view is read",
                hint=f"give the CTE another name than {hidden[0]}")
        if name not in used:
            used.append(name)
        if keep and not meta.security_invoker:
            continue
        body = _expand_query(meta.body(), views, parse, (*stack, fold(name)), used, scope,
                             keep)
        end = _name_end(data, offset)
        text = f"({body})" + ("" if aliased else f" AS {_quote(name)}")
        data = data[:offset] + text.encode() + data[end:]
    return data.decode()


def _name_end(data: bytes, start: int) -> int:
    """The byte offset after the name written at byte ``start`` of ``data`` (quoted or
    not: DuckDB's offset of a table reference is its name's)."""
    quote = data[start:start + 1]
    if quote in (b'"', b"`"):
        i = start + 1
        while True:
            i = data.index(quote, i)
            if quote == b'"' and data[i + 1:i + 2] == b'"':  # "" inside
                i += 2
                continue
            return i + 1
    m = _UNQUOTED.match(data[start:start + 1024].decode("utf-8", "ignore"))
    if m is None:  # pragma: no cover
        raise DatabaseError("internal error: a view reference not found in the statement")
    return start + len(m.group(0).encode())


def expand_views(sql: str, views: Views, parse: Parse,
                 exists: Callable[[str], bool], keep: bool = False) -> tuple[str, list[str]]:
    """``sql`` (a query: ``SELECT``, ``WITH``, ``FROM``, ``VALUES``) with every view it
    reads written out, and the views it reads (empty: ``sql`` as it is). ``parse`` gives
    DuckDB's tree of a text; ``exists(name)`` says whether a table or view of that name
    is in the catalog: a view that reads one gone fails, naming both. ``keep``: the
    views with their owner's rights stay as named (what the reader's grants must allow)."""
    if not views:
        return sql, []
    key = (sql, keep)
    kept = views.expanded.get(key)
    if kept is None:
        used: list[str] = []
        text = _expand_query(sql, views, parse, (), used, keep=keep)
        kept = (text, tuple(used))
        views.expanded[key] = kept
        # (the server's sessions share the views from their threads: an entry another
        # one dropped meanwhile is no error)
        with contextlib.suppress(KeyError):
            while len(views.expanded) > _EXPANSIONS:
                views.expanded.popitem(last=False)
    else:
        with contextlib.suppress(KeyError):
            views.expanded.move_to_end(key)
    text, used_views = kept
    for name in used_views:
        meta = views.get(name)
        for read in meta.reads if meta is not None else ():
            if not exists(read):
                raise DatabaseError(
                    f"view {name} reads {read}, which does not exist (dropped or renamed "
                    "after the view was made)",
                    hint=f"CREATE OR REPLACE VIEW {name} AS ... over the tables as they "
                    f"are now, or DROP VIEW {name}")
    return text, list(used_views)


def view_reads(query: str, names: set[str], parse: Parse) -> list[str]:
    """The names of ``names`` (tables and views, any case) that ``query`` reads in its
    FROM clauses (CTEs of those names excepted), as declared, sorted."""
    tree = parse(query)
    if not isinstance(tree, dict) or tree.get("error"):
        return []
    found: list[tuple[int, str, bool, frozenset[str]]] = []
    _references(tree.get("statements", []), {fold(n): n for n in names}, frozenset(), found)
    return sorted({name for _o, name, _a, _c in found})


#: ``EXPLAIN [ANALYZE] [(options)] statement``: where the statement starts
_EXPLAINED = re.compile(r"(?is)EXPLAIN\s+(?:ANALY[SZ]E\s+)?(?:\([^)]*\)\s*)?")
_DESCRIBED = re.compile(rf"(?is)(DESCRIBE|SUMMARIZE|SHOW)\s+({_IDENT})\s*")
_QUALIFIERS = rf"((?:\s*\.\s*{_IDENT}){{0,2}})"
_HEADS = {  # (a name qualified by an attached database's is not the database's)
    "INSERT": re.compile(rf"(?is)INSERT\s+INTO\s+({_IDENT}){_QUALIFIERS}"),
    "DELETE": re.compile(rf"(?is)DELETE\s+FROM\s+({_IDENT}){_QUALIFIERS}"),
    "UPDATE": re.compile(rf"(?is)UPDATE\s+({_IDENT}){_QUALIFIERS}"),
}
_TARGET = rf"{_IDENT}(?:\s*\.\s*{_IDENT}){{0,2}}"
_SOURCE_WORD = r"(?=\(?\s*(?:SELECT|WITH|VALUES|FROM)\b)"
#: where the query of an ``INSERT INTO t ...`` or a ``CREATE TABLE t ... AS`` starts
_SOURCES = {
    "INSERT": re.compile(rf"(?is)INSERT\s+INTO\s+{_TARGET}\s*(?:BY\s+(?:NAME|POSITION)\s+|"
                         rf"\((?!\s*(?:SELECT|WITH|VALUES|FROM)\b)[^()]*\)\s*)?{_SOURCE_WORD}"),
    "CREATE": re.compile(rf"(?is)CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?{_TARGET}\s*"
                         rf"(?:[^()']|'[^']*'|\([^()]*\))*?\bAS\s+{_SOURCE_WORD}"),
}
_QUERY_WORDS = frozenset({"SELECT", "WITH", "FROM", "VALUES"})


def expand_statement(sql: str, views: Views, parse: Parse,
                     exists: Callable[[str], bool], keep: bool = False) -> str:
    """Statement ``sql`` with every view it reads written out (:func:`expand_views`): a
    query, and the query in ``EXPLAIN``, ``COPY (query) TO``, ``DESCRIBE`` / ``SUMMARIZE``
    / ``SHOW`` (of a query, or of a view by its name), ``PREPARE p AS``, ``INSERT INTO t
    ...``, ``CREATE TABLE t ... AS``, and the ``WHERE`` and ``SET`` of ``DELETE`` and
    ``UPDATE``. A statement that changes a view (``INSERT INTO v``, ``DELETE FROM v``)
    is refused; any other is left as it is (DuckDB names the view it does not know).
    ``keep``: see :func:`expand_views`."""
    if not views or not referenced_tables(sql, set(views)):
        return sql
    from ._sql import _top_level_words, first_word

    lead = len(sql) - len(sql.lstrip())
    body = sql[lead:]
    word = first_word(body)

    def inner(start: int, end: int | None = None) -> str:
        """``sql`` with the statement between ``start`` and ``end`` (of ``body``) expanded."""
        stop = len(body) if end is None else end
        piece = expand_statement(body[start:stop], views, parse, exists, keep)
        return sql[:lead] + body[:start] + piece + body[stop:]

    if word in _QUERY_WORDS or body.startswith("("):
        return sql[:lead] + expand_views(body, views, parse, exists, keep)[0]
    if word == "EXPLAIN":
        m = _EXPLAINED.match(body)
        return inner(m.end()) if m else sql
    if word == "PREPARE":
        m = re.match(rf"(?is)PREPARE\s+{_IDENT}\s*(?:\([^)]*\)\s*)?AS\s+", body)
        return inner(m.end()) if m else sql
    if word in ("DESCRIBE", "SUMMARIZE", "SHOW"):
        m = _DESCRIBED.fullmatch(body.rstrip(";"))
        if m is not None:
            name = views.name(_unquote(m.group(2)))
            if name is None:
                return sql
            query = expand_views(f"SELECT * FROM {_quote(name)}", views, parse, exists,
                                 keep)[0]
            return f"{sql[:lead]}{m.group(1).upper()} {query}"
        m = re.match(r"(?is)(?:DESCRIBE|SUMMARIZE)\s+", body)
        return inner(m.end()) if m else sql
    if word == "COPY":
        m = re.match(r"(?is)COPY\s*\(", body)
        if m is None:
            return sql
        try:
            close = m.end() - 1 + _close(body[m.end() - 1:])
        except DatabaseError:
            return sql  # (DuckDB says what is wrong with it)
        return inner(m.end(), close)
    if word in _HEADS:
        m = _HEADS[word].match(body)
        target = views.name(_unquote(m.group(1))) if m is not None and not m.group(2) \
            else None
        if target is not None:
            verb = {"INSERT": "INSERT INTO", "DELETE": "DELETE FROM"}.get(word, word)
            raise DatabaseError(f"{verb} {target}: {target} is a view, which holds no rows",
                                hint=f"{verb} the table it reads (SELECT query FROM "
                                "system.views shows which)")
        if word == "INSERT":
            return _source(body, word, inner, sql)
        if m is None:
            return sql
        rest = m.end()
        words = _top_level_words(body[rest:])
        clause = next(((at, w) for at, w in words if w in ("WHERE", "SET")), None)
        if clause is None:
            return sql
        at = rest + clause[0]
        if clause[1] == "WHERE":  # "SELECT 1 WHERE cond" reads what the WHERE does
            prefix, start = "SELECT 1 ", at
        else:  # "SELECT c = e, ... WHERE cond": the SET's expressions too
            prefix, start = "SELECT ", at + 3
        done = expand_views(prefix + body[start:], views, parse, exists, keep)[0]
        return sql[:lead] + body[:start] + done[len(prefix):]
    if word in ("CREATE", "INSERT"):
        return _source(body, word, inner, sql)
    return sql


def _source(body: str, word: str, inner: Callable[[int, int], str], sql: str) -> str:
    """``INSERT INTO t ... query`` or ``CREATE TABLE t ... AS query`` (``t`` may be an
    attached database's) with its query's views written out (``inner``); ``sql`` as it
    is for another statement."""
    m = _SOURCES[word].match(body)
    if m is None:
        return sql
    end = len(body.rstrip().rstrip(";").rstrip())
    return inner(m.end(), end)
