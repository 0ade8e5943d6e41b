"""DuckDB's parse tree of a simple query, written out here without asking DuckDB.

Every query that reads a table starts with its parse tree (``json_serialize_sql``, a
statement of its own: about 1.5M instructions, a third of a cold point query's main
thread before DuckDB runs it). A query of the few forms below gets the tree
:func:`simple_tree` builds from its text instead, node for node and offset for offset
what DuckDB gives, so every analysis of the tree (columns, filters, pushdown, privileges,
views) sees the same tree either way::

    SELECT item [, item ...] FROM table
        [WHERE cond [AND cond ...]] [ORDER BY column [ASC | DESC]] [LIMIT n]

where an item is a column, ``count(*)`` or ``count``, ``sum``, ``avg``, ``min`` or
``max`` of a column; a cond is ``column op integer`` (op one of ``= < <= > >=``, spaces
around it) or ``column BETWEEN integer AND integer``; names unquoted ASCII identifiers
that are no keyword of DuckDB's. Anything else (a quote, a dot, a comment, a ``;``, an
alias, another word or character) gives None: the statement asks DuckDB as before.

:func:`agrees` checks the builder against the DuckDB it runs with, once per process at
its first ``connect`` (a statement using every form, parsed by both); on any difference the
builder is not used.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

__all__ = ["KEYWORDS", "agrees", "probe_text", "simple_tree"]

#: DuckDB's keywords (``duckdb_keywords()``, every category), none of which is taken as a
#: name here (tests check the installed DuckDB has no other).
KEYWORDS = frozenset("""
abort absolute access action add admin after aggregate all also alter always analyse analyze
and anti any approx array as asc asof assertion assignment asymmetric at attach attribute
authorization backward before begin between bigint binary bit boolean both by cache call
called cascade cascaded case cast catalog centuries century chain char character
characteristics check checkpoint class close cluster coalesce collate collation column columns
comment comments commit committed compression concurrently configuration conflict connect
connection constraint constraints content continue conversion copy cost create cross csv cube
current cursor cycle data database day days deallocate dec decade decades decimal declare
default defaults deferrable deferred definer delete delimiter delimiters depends desc describe
destroy detach dictionary disable discard disconnect distance distinct do document domain
double drop each else enable encoding encrypted end enum error escape event exact except
exclude excluding exclusive execute exists explain export export_state extension extensions
external extract false family fetch filter first float following for force foreign forward
freeze from full function functions generated glob global grant granted group grouping
grouping_id groups handler having header hold hour hours identity if ignore ilike immediate
immutable implicit import in include including increment index indexes inherit inherits
initially inline inner inout input insensitive insert install instead int integer intersect
interval into invoker is isnull isolation join json key label lambda language large last
lateral leading leakproof left level like limit listen load local location lock locked logged
macro map mapping match matched materialized maxvalue merge method microsecond microseconds
millennia millennium millisecond milliseconds minute minutes minvalue mode month months move
name names national natural nchar nearest new next no none not nothing notify notnull nowait
null nullif nulls numeric object of off offset oids old on only operator option options or
order ordinality others out outer over overlaps overlay overriding owned owner parallel parser
partial partition partitioned passing password percent persistent pivot pivot_longer
pivot_wider placing plans policy position positional pragma preceding precision prepare
prepared preserve primary prior privileges procedural procedure program publication qualify
quarter quarters quote range read real reassign recheck recursive ref references referencing
refresh register reindex relative release rename repeatable replace replica reset resource
resources respect restart restrict returning returns revoke right role rollback rollup row
rows rule sample savepoint schema schemas scope scroll search second seconds secret secure
security select semi sequence sequences serializable server session set setof sets share show
similar similarity simple skip smallint snapshot some sorted source sql stable standalone
start statement statistics stdin stdout storage stored strict strip struct subscription
substring summarize symmetric sysid system table tables tablesample tablespace target temp
template temporary text then ties time timestamp to trailing transaction transform treat
trigger trim true truncate trusted try_cast tuple type types unbounded uncommitted unencrypted
union unique unknown unlisten unlogged unpack unpivot until update use user using vacuum valid
validate validator value values varchar variable variadic varying verbose version view views
virtual volatile week weeks when where whitespace window with within without work wrapper
write xml xmlattributes xmlconcat xmlelement xmlexists xmlforest xmlnamespaces xmlparse xmlpi
xmlroot xmlserialize xmltable year years yes zone
""".split())

_AGGREGATES = frozenset({"count", "sum", "avg", "min", "max"})
_COMPARISONS = {"=": "COMPARE_EQUAL", "<": "COMPARE_LESSTHAN", "<=": "COMPARE_LESSTHANOREQUALTO",
                ">": "COMPARE_GREATERTHAN", ">=": "COMPARE_GREATERTHANOREQUALTO"}
_ORDERS = {"": "ORDER_DEFAULT", "asc": "ASCENDING", "desc": "DESCENDING"}
#: a word, an integer (at most 38 digits), an operator, or punctuation, after spaces
_TOKEN = re.compile(r"[ \t\r\n]*(?:(?P<w>[A-Za-z_][A-Za-z0-9_]*)|(?P<n>-?[0-9]{1,38})"
                    r"|(?P<o><=|>=|[=<>])|(?P<p>[(),*]))")
_SPACE = frozenset(" \t\r\n")
_Token = tuple[str, str, int, int]  # kind (w, n, o, p), text, start, end


def _tokens(sql: str) -> list[_Token] | None:
    """The tokens of ``sql``, or None at anything else. A word or integer is followed by a
    space, punctuation or the end (``5a``, ``-5-`` are not two tokens here); an operator
    has a space on each side (``a<-5`` and ``a=>b`` are DuckDB's to read)."""
    out: list[_Token] = []
    i, n = 0, len(sql)
    while True:
        m = _TOKEN.match(sql, i)
        if m is None or m.end() == i:
            return out if sql[i:].strip(" \t\r\n") == "" else None
        kind = m.lastgroup or ""
        start, end = m.start(kind), m.end()
        if kind in "wn" and end < n and sql[end] not in _SPACE and sql[end] not in "(),":
            return None
        if kind == "o" and (start == 0 or sql[start - 1] not in _SPACE
                            or end >= n or sql[end] not in _SPACE):
            return None
        out.append((kind, sql[start:end], start, end))
        i = end


def _column(name: str, at: int) -> dict[str, Any]:
    return {"class": "COLUMN_REF", "type": "COLUMN_REF", "alias": "", "query_location": at,
            "query_location_length": len(name), "column_names": [name]}


def _constant(text: str, at: int) -> dict[str, Any]:
    return {"class": "CONSTANT", "type": "VALUE_CONSTANT", "alias": "", "query_location": at,
            "query_location_length": len(text), "literal": {"kind": "INTEGER", "text": text}}


def _function(name: str, args: list[dict[str, Any]], at: int, end: int) -> dict[str, Any]:
    return {"class": "FUNCTION", "type": "FUNCTION", "alias": "", "query_location": at,
            "query_location_length": end - at, "function_name": name, "schema": "",
            "filter": None, "order_bys": {"type": "ORDER_MODIFIER", "orders": []},
            "distinct": False, "is_operator": False, "export_state": False, "catalog": "",
            "arguments": [{"name": "", "expression": a} for a in args],
            "qualified_name": {"path": [name]}, "is_legacy_function_call": False}


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.t, self.i = tokens, 0

    def peek(self, k: int = 0) -> _Token | None:
        return self.t[self.i + k] if self.i + k < len(self.t) else None

    def word(self, *words: str) -> _Token | None:
        """The next token if it is one of the keywords ``words`` (any case)."""
        tok = self.peek()
        if tok is not None and tok[0] == "w" and tok[1].lower() in words:
            self.i += 1
            return tok
        return None

    def expect(self, *words: str) -> _Token:
        tok = self.word(*words)
        if tok is None:
            raise ValueError
        return tok

    def punct(self, text: str) -> _Token:
        tok = self.peek()
        if tok is None or tok[0] != "p" or tok[1] != text:
            raise ValueError
        self.i += 1
        return tok

    def name(self) -> _Token:
        tok = self.peek()
        if tok is None or tok[0] != "w" or tok[1].lower() in KEYWORDS:
            raise ValueError
        self.i += 1
        return tok

    def integer(self) -> _Token:
        tok = self.peek()
        if tok is None or tok[0] != "n":
            raise ValueError
        self.i += 1
        return tok

    def item(self) -> dict[str, Any]:
        first, after = self.peek(), self.peek(1)
        if first is not None and after is not None and after[1] == "(" and after[0] == "p" \
                and first[0] == "w" and first[1].lower() in _AGGREGATES:
            self.i += 2
            fname = first[1].lower()
            star = self.peek()
            if fname == "count" and star is not None and star[:2] == ("p", "*"):
                self.i += 1
                end = self.punct(")")[3]
                return _function("count_star", [], first[2], end)
            col = self.name()
            end = self.punct(")")[3]
            return _function(fname, [_column(col[1], col[2])], first[2], end)
        col = self.name()
        return _column(col[1], col[2])

    def condition(self) -> tuple[dict[str, Any], int, int]:
        """A condition's node, where its text starts and ends."""
        col = self.name()
        between = self.word("between")
        if between is not None:
            lo = self.integer()
            self.expect("and")
            hi = self.integer()
            return ({"class": "BETWEEN", "type": "COMPARE_BETWEEN", "alias": "",
                     "query_location": between[2], "query_location_length": hi[3] - between[2],
                     "input": _column(col[1], col[2]), "lower": _constant(lo[1], lo[2]),
                     "upper": _constant(hi[1], hi[2])}, col[2], hi[3])
        op = self.peek()
        if op is None or op[0] != "o":
            raise ValueError
        self.i += 1
        value = self.integer()
        return ({"class": "COMPARISON", "type": _COMPARISONS[op[1]], "alias": "",
                 "query_location": col[2], "query_location_length": value[3] - col[2],
                 "left": _column(col[1], col[2]), "right": _constant(value[1], value[2])},
                col[2], value[3])

    def select(self) -> dict[str, Any]:
        self.expect("select")
        items = [self.item()]
        while (tok := self.peek()) is not None and tok[:2] == ("p", ","):
            self.i += 1
            items.append(self.item())
        self.expect("from")
        table = self.name()
        where = None
        if self.word("where") is not None:
            conds = [self.condition()]
            while self.word("and") is not None:
                conds.append(self.condition())
            if len(conds) == 1:
                where = conds[0][0]
            else:
                at = conds[0][1]
                where = {"class": "CONJUNCTION", "type": "CONJUNCTION_AND", "alias": "",
                         "query_location": at, "query_location_length": conds[-1][2] - at,
                         "children": [c[0] for c in conds]}
        modifiers: list[dict[str, Any]] = []
        if self.word("order") is not None:
            self.expect("by")
            col = self.name()
            direction = self.word("asc", "desc")
            modifiers.append({"type": "ORDER_MODIFIER", "orders": [{
                "type": _ORDERS[direction[1].lower() if direction else ""],
                "null_order": "ORDER_DEFAULT", "expression": _column(col[1], col[2])}]})
        if self.word("limit") is not None:
            n = self.integer()
            if n[1].startswith("-"):
                raise ValueError
            modifiers.append({"type": "LIMIT_MODIFIER", "limit": _constant(n[1], n[2]),
                              "offset": None, "limit_type": "ROW_COUNT"})
        if self.peek() is not None:
            raise ValueError
        node: dict[str, Any] = {
                "type": "SELECT_NODE", "modifiers": modifiers, "cte_map": {"map": []},
                "select_list": items,
                "from_table": {"type": "BASE_TABLE", "alias": "", "sample": None,
                               "query_location": table[2], "query_location_length":
                               len(table[1]), "schema_name": "", "table_name": table[1],
                               "column_name_alias": [], "catalog_name": "",
                               "at_clause": None, "qualified_name": {"path": [table[1]]}},
                "where_clause": where, "group_expressions": [], "group_sets": [],
                "aggregate_handling": "STANDARD_HANDLING", "having": None, "sample": None,
                "qualify": None}
        return {"error": False, "statements": [{"node": node, "named_param_map": []}]}


def simple_tree(sql: str) -> dict[str, Any] | None:
    """The parse tree DuckDB's ``json_serialize_sql`` gives ``sql`` (as :mod:`._columns`
    reads it), if ``sql`` is a query of the forms in this module's description and the
    builder matches this DuckDB (:func:`agrees`, decided by ``connect``, which parses
    :func:`probe_text` as its first JSON function); otherwise None."""
    if _AGREES is not True or not sql.isascii():
        return None
    return _build(sql)


def _build(sql: str) -> dict[str, Any] | None:
    tokens = _tokens(sql)
    if not tokens:
        return None
    try:
        return _Parser(tokens).select()
    except ValueError:
        return None


def probe_text() -> str:
    """A statement of every form :func:`simple_tree` builds."""
    return ("SELECT a, count(*), SUM(b), Avg(c), min(d), max(e), count(f) FROM t "
            "WHERE a = -1 AND b BETWEEN 2 AND 99999999999999999999 AND c < 3 AND d <= 4 "
            "AND e > 5 AND f >= 6 ORDER BY a DESC LIMIT 7")


_AGREES: bool | None = None
_AGREES_LOCK = threading.Lock()


def agrees(serialized: str | None) -> bool:
    """Whether the builder gives the tree ``serialized`` (DuckDB's ``json_serialize_sql``
    of :func:`probe_text`, None if it failed): decided by the process's first call, and
    :func:`simple_tree` builds trees only if it did."""
    global _AGREES
    with _AGREES_LOCK:
        if _AGREES is None:
            try:
                ok = serialized is not None and json.loads(serialized) == _build(probe_text())
            except ValueError:
                ok = False
            _AGREES = ok
        return _AGREES
