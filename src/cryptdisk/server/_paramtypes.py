"""The types of a statement's ``$n`` parameters, from where they stand, for a Describe.

PostgreSQL gives each parameter a client leaves untyped (OID 0) the type its context
asks for, and says so in the ParameterDescription; clients that encode by that type
(asyncpg, pg8000) send an ``int`` for ``WHERE id = $1`` only when it says ``int8``.
Neither engine has that step (DuckDB leaves a prepared parameter's type unknown until it
is bound, SQLite has none), so the server reads it off the statement's text:

- a cast: ``$1::int``, ``CAST($1 AS DATE)``;
- a column beside it in a comparison or arithmetic (``price > $1``, ``$1 = t.id``,
  ``SET n = $1``), ``IN ($1, $2)``, ``BETWEEN $1 AND $2``: the column's type;
- ``INSERT INTO t [(columns)] VALUES ($1, ...)``: the type of the column at its place;
- ``LIMIT $n`` / ``OFFSET $n``: int8; an integer literal beside it in arithmetic
  (``$1 + 1``): int8; a decimal one: numeric; ``LIKE $1``, ``|| $1``: text.

Columns are looked up in the tables the statement names that the caller lets it see.
What none of these settle is text, as before (0 is returned for it: the caller decides).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

from . import _sqltext
from . import _types as T

__all__ = ["bytea_concats", "bytea_strings", "float_numbers", "infer", "null_order",
           "parameter_columns", "typed_strings", "written_expressions"]

_TOKEN = re.compile(r"""
    (?P<ws>\s+|--[^\n]*|/\*.*?\*/)
  | (?P<str>[eE]'(?:[^'\\]|''|\\.)*'|'(?:[^']|'')*')
  | (?P<qid>"(?:[^"]|"")+")
  | (?P<dollar>\$(?P<tag>(?:[A-Za-z_][A-Za-z0-9_]*)?)\$.*?\$(?P=tag)\$)
  | (?P<param>\$\d+)
  | (?P<num>0[xX][0-9A-Fa-f]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<op>::|<=|>=|<>|!=|\|\||[-+*/%=<>(),.;\[\]])
  | (?P<other>.)
""", re.S | re.X)

_COMPARE = frozenset({"=", "<>", "!=", "<", "<=", ">", ">="})
_ARITH = frozenset({"+", "-", "*", "/", "%"})
_SCHEMAS = frozenset({"public", "main"})

class _Tok(NamedTuple):
    kind: str  # "param", "num", "str", "ref" (a dotted name), "op", "word" (a keyword)
    text: str  # the upper-cased keyword or operator, the parameter's number, the number
    parts: tuple[str, ...] = ()  # a ref's names, lower-cased unless quoted
    end: int = 0  # where a string literal ends in the text
    start: int = -1  # where the token starts in the text (-1: not from the text)
    stop: int = -1  # where it ends


def _tokens(sql: str) -> list[_Tok]:
    raw: list[tuple[str, str, int, int]] = [
        (m.lastgroup or "other", m.group(), m.end(), m.start()) for m in _TOKEN.finditer(sql)
        if m.lastgroup != "ws"]
    out: list[_Tok] = []
    i = 0
    while i < len(raw):
        kind, text, end, start = raw[i]
        if kind in ("word", "qid"):
            parts = [_name(kind, text)]
            while i + 2 < len(raw) and raw[i + 1][:2] == ("op", ".") and \
                    raw[i + 2][0] in ("word", "qid"):
                parts.append(_name(*raw[i + 2][:2]))
                i += 2
            out.append(_Tok("ref", text.upper() if kind == "word" else text, tuple(parts),
                            start=start, stop=raw[i][2]))
        elif kind == "param":
            out.append(_Tok("param", text[1:], start=start, stop=end))
        elif kind == "str":
            out.append(_Tok(kind, text, (), end, start, end))
        elif kind == "dollar":  # a string literal: its text as a standard literal's
            body = text[text.index("$", 1) + 1:text.rindex("$", 0, len(text) - 1)]
            out.append(_Tok("str", "'" + body.replace("'", "''") + "'", (), end, start, end))
        else:
            out.append(_Tok(kind, text.upper(), start=start, stop=end))
        i += 1
    return out


def _name(kind: str, text: str) -> str:
    return text[1:-1].replace('""', '"') if kind == "qid" else text.lower()


def _cast_type(toks: list[_Tok], at: int) -> int:
    """The type named from ``toks[at]`` on (after ``::`` or ``AS``)."""
    words = []
    for t in toks[at:at + 4]:
        parts = t.parts[1:] if t.parts[:1] == ("pg_catalog",) else t.parts
        if t.kind != "ref" or len(parts) != 1:
            break
        words.append(parts[0])
    end = at + len(words)
    if end < len(toks) and toks[end].text == "(":  # numeric(10, 2), varchar(20)
        end = next((i + 1 for i in range(end, len(toks)) if toks[i].text == ")"), end)
    if end < len(toks) and toks[end].text == "[":  # an array: not described, but oid[]
        return T.OID_ARRAY if words == ["oid"] else 0  # (asyncpg's type lookup sends one)
    return T.type_oid(" ".join(words))


Columns = Callable[[str], "list[tuple[str, int]] | None"]


def infer(sql: str, count: int, tables: dict[str, str], columns: Columns) -> list[int]:
    """The OID of each of ``sql``'s ``count`` parameters that its context gives (0: none).

    ``tables``: lower-cased name -> name of each table the statement may look at;
    ``columns(name)``: (column, OID) of that table (None: not readable)."""
    try:
        toks = _tokens(sql)
    except re.error:  # pragma: no cover - the pattern matches every character
        return [0] * count
    return _infer(toks, count, tables, columns)


def bytea_strings(sql: str, tables: dict[str, str], columns: Columns) -> list[int]:
    """Where each string literal of ``sql`` with a backslash in it that its context makes
    a ``bytea`` (as :func:`infer` types a parameter in its place: ``INSERT INTO t VALUES
    ('\\x0102')`` into a bytea column, ``b = '\\x01'`` beside one) ends in the text:
    PostgreSQL reads such a literal by bytea's input (``\\x0102`` is two bytes), the
    engines by their own string-to-blob cast. In ``b = ANY(ARRAY['...', ...])`` every
    string is one (DuckDB compares no BLOB with a list of VARCHAR), and so is every
    string that ``||`` joins to a bytea (``b || 'abc'``: the engines join a BLOB and a
    string as text)."""
    if "[" not in sql and "||" not in sql:
        return [t.end for t in typed_strings(sql, tables, columns, T.BYTEA,
                                             lambda text: "\\" in text)]
    toks = _tokens(sql)
    listed = set()
    for k, t in enumerate(toks):
        if t.kind == "str":
            j = k - 1
            while j > 0 and toks[j].text == "," and toks[j - 1].kind in ("param", "num", "str"):
                j -= 2
            if _array_of_any(toks, j) or toks[k - 1].text == "||" or \
                    (k + 1 < len(toks) and toks[k + 1].text == "||"):
                listed.add(t.end)
    return [t.end for t in typed_strings(sql, tables, columns, T.BYTEA, lambda text: True)
            if "\\" in t.text or t.end in listed]


def bytea_concats(sql: str, tables: dict[str, str], columns: Columns
                  ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(where in ``sql`` each chain ``x || y || ...`` is that PostgreSQL makes a bytea,
    ``b || '\\x03'``; where each bytea operand of a chain it makes a text is, ``s || b``,
    whose text is the bytea's output, ``\\x01``), as (start, end)."""
    toks = _tokens(sql)
    if not any(t.text == "||" for t in toks):
        return [], []
    ref_type, _ = _ref_types(toks, tables, columns)
    blobs: list[tuple[int, int]] = []
    texts: list[tuple[int, int]] = []
    for chain, kinds, _types, result in _typed_chains(toks, ref_type):
        if result == T.BYTEA:
            blobs.append((toks[chain[0][0]].start, toks[chain[-1][1] - 1].stop))
        elif "text" in kinds and "other" not in kinds:  # (else not known: left alone)
            texts.extend((toks[a].start, toks[b - 1].stop)
                         for (a, b), kind in zip(chain, kinds, strict=True) if kind == "bytea")
    return blobs, texts


def _array_of_any(toks: list[_Tok], j: int) -> bool:
    """Whether ``toks[j]`` opens the ``ARRAY[`` of ``x = ANY(ARRAY[...])`` (or ``ALL``,
    ``SOME``, another comparison)."""
    return 4 <= j < len(toks) and toks[j].text == "[" and toks[j - 1].text == "ARRAY" and \
        toks[j - 2].text == "(" and toks[j - 3].text in ("ANY", "ALL", "SOME") and \
        toks[j - 4].text in _COMPARE


def typed_strings(sql: str, tables: dict[str, str], columns: Columns, oid: int,
                  which: Callable[[str], bool]) -> list[_Tok]:
    """The string literals of ``sql`` (their text: ``which`` of it true) without a cast
    that their context makes type ``oid``, as :func:`infer` types a parameter in their
    place."""
    toks = _tokens(sql)
    count = max((int(t.text) for t in toks if t.kind == "param"), default=0)
    lifted, strings = [], []
    for k, t in enumerate(toks):
        typed = (k + 1 < len(toks) and toks[k + 1].text in ("::", "AS")) or \
            (k > 0 and toks[k - 1].kind == "ref" and  # '...'::bytea, bytea '...'
             T.type_oid(toks[k - 1].parts[-1]) != 0)
        if t.kind == "str" and which(t.text) and not typed:
            strings.append(t)
            t = _Tok("param", str(count + len(strings)))
        lifted.append(t)
    if not strings:
        return []
    types = _infer(lifted, count + len(strings), tables, columns)[count:]
    return [t for t, found in zip(strings, types, strict=True) if found == oid]


#: what a sign after which is unary follows (``VALUES (-1.5``, ``x = -1.5``)
_UNARY_BEFORE = frozenset({"(", ",", "=", "<>", "!=", "<", "<=", ">", ">=", "SELECT",
                           "VALUES", "SET", "WHERE", "AND", "OR", "NOT", "WHEN", "THEN",
                           "ELSE", "BETWEEN", "IN", "IS", "RETURNING"})


def float_numbers(sql: str, tables: dict[str, str], columns: Columns,
                  which: Callable[[str], bool]) -> list[_Tok]:
    """The number literals of ``sql`` (their text: ``which`` of it true) that PostgreSQL
    reads as a float: cast to float4 or float8 (``1.5::float8``, ``CAST(1.5 AS REAL)``)
    or without a cast where their context makes them one, as :func:`infer` types a
    parameter in their place (``INSERT INTO t(x) VALUES (1.5)`` of a float column)."""
    toks = _tokens(sql)
    count = max((int(t.text) for t in toks if t.kind == "param"), default=0)
    lifted: list[_Tok] = []
    numbers: list[_Tok] = []
    cast: list[_Tok] = []
    for k, t in enumerate(toks):
        if t.kind == "num" and which(t.text):
            if k + 2 < len(toks) and toks[k + 1].text in ("::", "AS") and \
                    toks[k + 2].kind == "ref":  # 1.5::float8, CAST(1.5 AS DOUBLE PRECISION)
                if T.type_oid(toks[k + 2].parts[-1]) in (T.FLOAT4, T.FLOAT8):
                    cast.append(t)
            else:
                numbers.append(t)
                t = _Tok("param", str(count + len(numbers)))
                if lifted and lifted[-1].text in ("-", "+") and (
                        len(lifted) < 2 or lifted[-2].text in _UNARY_BEFORE):
                    lifted.pop()  # -1.5: the parameter's place is the signed number's
        lifted.append(t)
    if not numbers:
        return cast
    types = _infer(lifted, count + len(numbers), tables, columns)[count:]
    return cast + [t for t, found in zip(numbers, types, strict=True)
                   if found in (T.FLOAT4, T.FLOAT8)]


#: what ends an ORDER BY list (besides a ``)`` closing its bracket and ``;``)
_ORDER_ENDS = frozenset({"LIMIT", "OFFSET", "FETCH", "FOR", "UNION", "INTERSECT", "EXCEPT",
                         "WINDOW", "RANGE", "ROWS", "GROUPS"})


def null_order(sql: str) -> str:
    """``sql`` with PostgreSQL's place for NULLs written out on each ``ORDER BY`` item
    that does not say it (in a query, a window's ``OVER``, an aggregate's arguments):
    ``NULLS LAST`` ascending, ``NULLS FIRST`` descending, as PostgreSQL sorts NULL above
    every value; SQLite sorts it below."""
    toks = _tokens(sql)
    edits: list[int] = []
    edits_kind: list[bool] = []
    i = 0
    while i + 1 < len(toks):
        if not (toks[i].text == "ORDER" and toks[i + 1].text == "BY"):
            i += 1
            continue
        i += 2
        depth = 0
        last: _Tok | None = None
        descending = nulls = False
        while i <= len(toks):
            t = toks[i] if i < len(toks) else None
            ends = t is None or (depth == 0 and (
                t.text in (",", ";", ")") or (t.kind == "ref" and t.text in _ORDER_ENDS)))
            if ends:
                if last is not None and not nulls:
                    edits.append(last.stop)
                    edits_kind.append(descending)
                if t is None or t.text != ",":
                    break
                last, descending, nulls = None, False, False
            else:
                assert t is not None
                if t.text == "(":
                    depth += 1
                elif t.text == ")":
                    depth -= 1
                if depth == 0 and t.kind == "ref":
                    descending = descending or t.text == "DESC"
                    nulls = nulls or t.text == "NULLS"
                last = t
            i += 1
    for at, desc in sorted(zip(edits, edits_kind, strict=True), reverse=True):
        sql = sql[:at] + (" NULLS FIRST" if desc else " NULLS LAST") + sql[at:]
    return sql


def _operand_end(toks: list[_Tok], i: int, hi: int) -> int:
    """Where the operand of ``||`` from ``toks[i]`` on ends (a column, literal, parameter,
    call or parenthesized expression, with its ``::`` casts), -1 for none there."""
    t = toks[i]
    if t.text in _OPEN or (t.kind == "ref" and i + 1 < hi and toks[i + 1].text == "("
                           and t.text not in _NOT_OPERAND):
        close = _closing(toks, i if t.text in _OPEN else i + 1)
        if close < 0 or close >= hi:
            return -1
        j = close + 1
    elif t.kind in ("ref", "str", "param", "num") and t.text not in _NOT_OPERAND:
        j = i + 1
    else:
        return -1
    while j + 1 < hi and toks[j].text == "::" and toks[j + 1].kind == "ref":
        j += 2
        while j < hi and toks[j].text in _OPEN:  # varchar(5), int[]
            close = _closing(toks, j)
            if close < 0 or close >= hi:
                return -1
            j = close + 1
    return j


#: words that are no operand of ``||``
_NOT_OPERAND = frozenset({"SELECT", "FROM", "WHERE", "AND", "OR", "NOT", "CASE", "WHEN",
                          "THEN", "ELSE", "END", "AS", "IN", "IS", "LIKE", "ILIKE", "ON",
                          "SET", "VALUES", "BY", "HAVING", "RETURNING", "USING", "BETWEEN",
                          "DISTINCT", "ALL", "ANY", "SOME", "INTO", "LIMIT", "OFFSET"})


def _concat_chains(toks: list[_Tok]) -> list[list[tuple[int, int]]]:
    """The operands (their ``toks[start:end]``) of each chain ``x || y || ...`` of
    ``toks``, inside brackets too."""
    chains: list[list[tuple[int, int]]] = []

    def inside(lo: int, hi: int) -> None:  # the brackets of toks[lo:hi]
        k = lo
        while k < hi:
            close = _closing(toks, k) if toks[k].text in _OPEN else -1
            if 0 <= close < hi:
                scan(k + 1, close)
                k = close
            k += 1

    def scan(lo: int, hi: int) -> None:
        i = lo
        while i < hi:
            end = _operand_end(toks, i, hi)
            if end < 0:
                i += 1
                continue
            inside(i, end)
            chain = [(i, end)]
            while end + 1 < hi and toks[end].text == "||":
                nxt = _operand_end(toks, end + 1, hi)
                if nxt < 0:
                    break
                inside(end + 1, nxt)
                chain.append((end + 1, nxt))
                end = nxt
            if len(chain) > 1:
                chains.append(chain)
            i = end

    scan(0, len(toks))
    return chains


def _ref_types(toks: list[_Tok], tables: dict[str, str], columns: Columns
               ) -> tuple[Callable[[_Tok], int], Callable[[str], dict[str, int]]]:
    """(the type OID of a column a ref token of ``toks`` names (0: not known), the
    (column -> OID) of a table)."""
    named = {t.parts[-1].lower() for t in toks if t.kind == "ref"
             and (len(t.parts) == 1 or (len(t.parts) == 2 and t.parts[0].lower() in _SCHEMAS))}
    cache: dict[str, dict[str, int]] = {}

    def table_columns(name: str) -> dict[str, int]:
        key = tables.get(name.lower())
        if key is None:
            return {}
        if key not in cache:
            cols = columns(key)
            cache[key] = {c.lower(): oid for c, oid in cols or []}
        return cache[key]

    in_scope = [t for t in named if t in tables]

    def ref_type(tok: _Tok) -> int:
        if tok.kind != "ref" or not tok.parts:
            return 0
        col = tok.parts[-1].lower()
        if len(tok.parts) >= 2 and tok.parts[-2].lower() in tables:
            return table_columns(tok.parts[-2]).get(col, 0)
        found = {table_columns(t).get(col, 0) for t in in_scope} - {0}
        return found.pop() if len(found) == 1 else 0

    return ref_type, table_columns


def _operand_kind(toks: list[_Tok], a: int, b: int, ref_type: Callable[[_Tok], int]) -> str:
    """Of the operand ``toks[a:b]`` of ``||``: "bytea", "text" (a text column, a cast to
    text), "unknown" (a literal or parameter) or "other" (not known)."""
    oid = 0
    if b - a == 1:
        t = toks[a]
        if t.kind in ("str", "param"):
            return "unknown"
        oid = ref_type(t)
    elif (toks[b - 2].text == "::" and toks[b - 1].kind == "ref") or \
            (toks[a].text == "CAST" and toks[b - 3].text == "AS" and toks[b - 1].text == ")"):
        name = toks[b - 1] if toks[b - 2].text == "::" else toks[b - 2]
        oid = T.type_oid(name.parts[-1]) if name.kind == "ref" else 0
    elif b - a >= 5 and toks[a].text == "(" and toks[a + 1].text == "SELECT" and \
            toks[a + 3].text == "FROM" and _closing(toks, a) == b - 1:
        oid = ref_type(toks[a + 2])  # (SELECT b FROM t ...): its column's
    return "bytea" if oid == T.BYTEA else "text" if oid in _TEXTS else "other"


_TEXTS = frozenset({T.TEXT, T.VARCHAR, T.BPCHAR, T.NAME})


def _typed_chains(toks: list[_Tok], ref_type: Callable[[_Tok], int]
                  ) -> list[tuple[list[tuple[int, int]], list[str], list[int], int]]:
    """Each chain ``x || y || ...`` of ``toks``: its operands (:func:`_concat_chains`),
    their kinds (:func:`_operand_kind`), the type PostgreSQL gives each unknown one (a
    literal or parameter is ``bytea`` beside a bytea, ``b || '\\x03'``, ``'x' || b``, or
    after a chain that is one, else ``text``; 0 for the others) and the chain's type
    (``bytea`` or ``text``)."""
    out = []
    for chain in _concat_chains(toks):
        kinds = [_operand_kind(toks, a, b, ref_type) for a, b in chain]
        left = "bytea" if kinds[0] == "unknown" and kinds[1] == "bytea" else kinds[0]
        types = [T.BYTEA if left == "bytea" else T.TEXT if kinds[0] == "unknown" else 0]
        for kind in kinds[1:]:
            types.append(0 if kind != "unknown" else T.BYTEA if left == "bytea" else T.TEXT)
            left = "bytea" if (left == "bytea" and kind in ("bytea", "unknown")) else "text"
        out.append((chain, kinds, types, T.BYTEA if left == "bytea" else T.TEXT))
    return out


def _infer(toks: list[_Tok], count: int, tables: dict[str, str],
           columns: Columns) -> list[int]:
    result = [0] * count
    ref_type, table_columns = _ref_types(toks, tables, columns)

    def literal_type(tok: _Tok) -> int:
        if tok.kind != "num":
            return 0
        return T.INT8 if tok.text.isdigit() or tok.text[:2] == "0X" else T.NUMERIC

    def operand_type(i: int, step: int, arithmetic: bool) -> int:
        """The type of the operand from ``toks[i]`` on (going by ``step``): its first
        column's in a chain of columns and literals joined by arithmetic (``c * 2``); else,
        beside arithmetic, its first literal's."""
        literal = 0
        while True:
            tok = at(i)
            found = ref_type(tok)
            if found:
                return found
            if tok.kind == "num":
                literal = literal or literal_type(tok)
            elif tok.kind != "param":
                break
            if at(i + step).text not in _ARITH:
                break
            arithmetic = True
            i += 2 * step
        return literal if arithmetic else 0

    def at(i: int) -> _Tok:
        return toks[i] if 0 <= i < len(toks) else _Tok("end", "")

    known: list[dict[int, int]] = []

    def concatenated() -> dict[int, int]:
        """The type of each literal or parameter operand of ``||`` (by its place), and
        ``bytea`` by the place of the first and of the last token of a chain that is one
        (``b || 'x' = '\\x0178'``: the string is compared with a bytea), negated."""
        if not known:
            chains = _typed_chains(toks, ref_type) if any(t.text == "||" for t in toks) \
                else []
            found = {chain[n][0]: types[n] for chain, kinds, types, _ in chains
                     for n in range(len(chain)) if kinds[n] == "unknown"}
            for chain, _kinds, _types, result in chains:
                if result == T.BYTEA:
                    found[-1 - chain[0][0]] = found[-1 - (chain[-1][1] - 1)] = T.BYTEA
            known.append(found)
        return known[0]

    def context(k: int) -> int:
        before, after = at(k - 1), at(k + 1)
        if after.text == "::":
            return _cast_type(toks, k + 2)
        if after.text == "AS" and before.text == "(" and at(k - 2).text == "CAST":
            return _cast_type(toks, k + 2)
        if before.text in ("LIMIT", "OFFSET"):
            return T.INT8
        if before.text in ("LIKE", "ILIKE"):
            return T.TEXT
        if before.text == "||" or after.text == "||":
            return concatenated().get(k, T.TEXT)
        if before.text in _COMPARE:
            found = concatenated().get(-1 - (k - 2), 0)  # b || 'x' = '\x0178'
            if found:
                return found
        if after.text in _COMPARE:
            found = concatenated().get(-1 - (k + 2), 0)  # '\x0178' = b || 'x'
            if found:
                return found
        if before.text in _COMPARE or before.text in _ARITH:
            found = operand_type(k - 2, -1, before.text in _ARITH)
            if found:
                return found
        if after.text in _COMPARE or after.text in _ARITH:
            found = operand_type(k + 2, 1, after.text in _ARITH)
            if found:
                return found
        if before.text == "BETWEEN":
            return ref_type(at(k - 2 - (at(k - 2).text == "NOT")))
        if before.text == "AND" and at(k - 3).text == "BETWEEN":
            return ref_type(at(k - 4 - (at(k - 4).text == "NOT")))
        j = k - 1  # an IN list: col IN ($1, $2, ...)
        while at(j).text == "," and at(j - 1).kind in ("param", "num", "str"):
            j -= 2
        if at(j).text == "(" and at(j - 1).text == "IN":
            return ref_type(at(j - 2 - (at(j - 2).text == "NOT")))
        if _array_of_any(toks, j):  # col = ANY(ARRAY[$1, $2, ...])
            return operand_type(j - 5, -1, False)
        return 0

    for k, tok in enumerate(toks):
        if tok.kind == "param":
            n = int(tok.text)
            if 1 <= n <= count and not result[n - 1]:
                result[n - 1] = context(k)
    _insert_values(toks, result, table_columns, tables)
    return result


def _insert_values(toks: list[_Tok], result: list[int],
                   table_columns: Callable[[str], dict[str, int]],
                   tables: dict[str, str]) -> None:
    """``INSERT INTO t [(a, b)] VALUES ($1, $2), ...``: each parameter that is a whole
    value takes its column's type."""
    if len(toks) < 4 or toks[0].text != "INSERT" or toks[1].text != "INTO" or \
            toks[2].kind != "ref":
        return
    parts = toks[2].parts
    if parts[-1].lower() not in tables:
        return
    cols = table_columns(parts[-1])
    if not cols:
        return
    i = 3
    if toks[i].kind == "ref" and toks[i].text not in ("VALUES", "SELECT", "DEFAULT"):
        i += 1  # an alias
    names: list[str] = list(cols)
    if i < len(toks) and toks[i].text == "(":
        names = []
        i += 1
        while i < len(toks) and toks[i].text != ")":
            if toks[i].kind == "ref":
                names.append(toks[i].parts[-1].lower())
            i += 1
        i += 1
    if i >= len(toks) or toks[i].text != "VALUES":
        return
    i += 1
    while i < len(toks) and toks[i].text == "(":
        i += 1
        place, depth = 0, 0
        items: list[_Tok] = []
        while i < len(toks):
            t = toks[i]
            if depth == 0 and t.text in (",", ")"):
                if len(items) == 1 and items[0].kind == "param" and place < len(names):
                    n = int(items[0].text)
                    if 1 <= n <= len(result) and not result[n - 1]:
                        result[n - 1] = cols.get(names[place], 0)
                place, items = place + 1, []
                if t.text == ")":
                    break
            else:
                depth += (t.text == "(") - (t.text == ")")
                items.append(t)
            i += 1
        i += 1
        if i < len(toks) and toks[i].text == ",":
            i += 1


#: what ends an UPDATE's SET list
_SET_END = frozenset({"FROM", "WHERE", "RETURNING", "ORDER", "LIMIT", ";"})


def written_expressions(sql: str, tables: dict[str, str], columns: Columns,
                        oid: int, parameters: bool = False) -> list[tuple[int, int]]:
    """(start, stop) in ``sql`` of each expression an ``INSERT`` or ``UPDATE`` writes into
    a column of type ``oid`` (``INSERT INTO t (c) VALUES (x || y)``, ``INSERT INTO t (c)
    SELECT s FROM u``, the first query's items only; ``UPDATE t SET c = upper(s)``), but
    ``NULL``, ``DEFAULT``, a column of that type, and in ``VALUES`` or ``SET`` a lone
    parameter or string literal (:func:`infer` and :func:`typed_strings` type those). A
    ``*`` in the select list, a column list in ``SET`` and a shape not known give none.
    ``parameters``: the lone parameters in ``VALUES`` or ``SET`` only (``$1`` of ``VALUES
    ($1)``, or cast: ``$1::date``), which a client may send untyped with no Describe to
    type them (a parameter's cast is dropped, see :func:`._sqltext.drop_casts`)."""
    toks = _tokens(sql)
    if len(toks) < 4 or toks[0].text not in ("INSERT", "UPDATE"):
        return []
    ref_type, table_columns = _ref_types(toks, tables, columns)
    found: list[tuple[int, int]] = []

    def add(item: list[_Tok], typed_alone: bool) -> None:
        if parameters:  # ($1, or $1::date, CAST($1 AS date): a parameter's cast is dropped)
            if typed_alone and item and (
                    (item[0].kind == "param" and (len(item) == 1 or (
                        item[1].text == "::" and _cast_target(item, 2)[0] == len(item)))) or
                    (len(item) > 5 and item[0].text == "CAST" and item[1].text == "(" and
                     item[2].kind == "param" and item[3].text == "AS" and
                     _cast_target(item, 4)[0] == len(item) - 1 and item[-1].text == ")")):
                found.append((item[0].start, item[-1].stop))
            return
        if not item:
            return
        if len(item) == 1:
            one = item[0]
            if one.kind == "ref" and one.text in ("NULL", "DEFAULT"):
                return
            if ref_type(one) == oid or (typed_alone and one.kind in ("param", "str")):
                return
        found.append((item[0].start, item[-1].stop))

    if toks[0].text == "UPDATE":
        i = 1
        if toks[i].text == "OR":
            i += 2
        if toks[i].kind != "ref" or toks[i].parts[-1].lower() not in tables:
            return []
        cols = table_columns(toks[i].parts[-1])
        i += 1
        if toks[i].text == "AS":
            i += 1
        if toks[i].text != "SET":
            i += 1  # an alias
        if i >= len(toks) or toks[i].text != "SET":
            return []
        i += 1
        while i + 2 < len(toks) and toks[i].kind == "ref" and toks[i + 1].text == "=":
            name, i = toks[i].parts[-1].lower(), i + 2
            item: list[_Tok] = []
            depth = 0
            while i < len(toks):
                t = toks[i]
                if depth == 0 and (t.text == "," or (t.kind in ("ref", "op") and
                                                     t.text in _SET_END)):
                    break
                depth += (t.text in _OPEN) - (t.text in _CLOSE)
                item.append(t)
                i += 1
            if cols.get(name) == oid:
                add(item, True)
            if i >= len(toks) or toks[i].text != ",":
                break
            i += 1
        return found
    if toks[1].text != "INTO" or toks[2].kind != "ref" or \
            toks[2].parts[-1].lower() not in tables:
        return []
    cols = table_columns(toks[2].parts[-1])
    i = 3
    if toks[i].text == "AS":
        i += 1
    if toks[i].kind == "ref" and toks[i].text not in ("VALUES", "SELECT", "DEFAULT"):
        i += 1  # an alias
    names: list[str] = list(cols)
    if i < len(toks) and toks[i].text == "(":
        close = _closing(toks, i)
        if close < 0:
            return []
        names = [t.parts[-1].lower() for t in toks[i + 1:close] if t.kind == "ref"]
        i = close + 1
    if i < len(toks) and toks[i].text == "SELECT":
        listed = _select_items(toks[i:])
        if listed is None:
            return []
        for place, item in enumerate(listed[0]):
            if not item or item[-1].text == "*" or place >= len(names):
                break
            if _item_alias(item) is not None:
                item = item[:-2] if len(item) > 2 and item[-2].text == "AS" else item[:-1]
            if cols.get(names[place]) == oid:
                add(item, False)
        return found
    if i >= len(toks) or toks[i].text != "VALUES":
        return []
    i += 1
    while i < len(toks) and toks[i].text == "(":
        close = _closing(toks, i)
        if close < 0:
            break
        for place, item in enumerate(_split_items(toks[i + 1:close])):
            if place < len(names) and cols.get(names[place]) == oid:
                add(item, True)
        i = close + 1
        if i < len(toks) and toks[i].text == ",":
            i += 1
    return found


def _split_items(toks: list[_Tok]) -> list[list[_Tok]]:
    """``toks`` split at its top-level commas."""
    items: list[list[_Tok]] = [[]]
    depth = 0
    for t in toks:
        if depth == 0 and t.text == ",":
            items.append([])
            continue
        depth += (t.text in _OPEN) - (t.text in _CLOSE)
        items[-1].append(t)
    return items


#: the words that end a select list
_SELECT_END = frozenset({"FROM", "WHERE", "GROUP", "HAVING", "ORDER", "LIMIT", "OFFSET",
                         "UNION", "INTERSECT", "EXCEPT", "WINDOW", "INTO", "FETCH", "FOR",
                         ";"})
#: the name PostgreSQL gives ``$1::type`` (the type's own name), by the name written
_CAST_COLUMN = {
    **dict.fromkeys(("int", "integer", "int4"), "int4"),
    **dict.fromkeys(("bigint", "int8"), "int8"),
    **dict.fromkeys(("smallint", "int2"), "int2"),
    **dict.fromkeys(("real", "float4"), "float4"),
    **dict.fromkeys(("float", "float8", "double precision"), "float8"),
    **dict.fromkeys(("bool", "boolean"), "bool"),
    **dict.fromkeys(("numeric", "decimal"), "numeric"),
    **dict.fromkeys(("varchar", "character varying"), "varchar"),
    **dict.fromkeys(("char", "character", "bpchar"), "bpchar"),
    **dict.fromkeys(("timestamptz", "timestamp with time zone"), "timestamptz"),
    **dict.fromkeys(("timestamp", "timestamp without time zone"), "timestamp"),
    **dict.fromkeys(("time", "time without time zone"), "time"),
}


@functools.lru_cache(maxsize=256)
def parameter_columns(sql: str) -> tuple[tuple[int, str], ...]:
    """(place, name) of each column of a ``SELECT``'s select list that is a parameter
    alone, ``$1`` (PostgreSQL names it ``?column?``), or cast, ``$1::int`` (named after
    its type, ``int4``), without an alias: the engines name such a column after the value
    written in (DuckDB: ``5``, ``CAST(6 AS INTEGER)``) or ``?1`` (SQLite); an expression
    holding a parameter as :func:`_expression_name` names it (``upper($1)``: ``upper``,
    not DuckDB's ``upper('s3cr3t')``). Nothing after a ``*`` in the list (its place is
    not known)."""
    try:
        toks = _tokens(sql)
    except re.error:  # pragma: no cover - the pattern matches every character
        return ()
    return _select_names(toks)


def _select_items(toks: list[_Tok]) -> tuple[list[list[_Tok]], int] | None:
    """The items of the select list of ``toks`` (a ``SELECT``) and where the list ends
    (its ``FROM``...), None for no ``SELECT`` or a ``DISTINCT ON``."""
    if not toks or toks[0].text != "SELECT":
        return None
    i = 1
    if i < len(toks) and toks[i].text in ("ALL", "DISTINCT"):
        i += 1
        if toks[i - 1].text == "DISTINCT" and i < len(toks) and toks[i].text == "ON":
            return None
    items: list[list[_Tok]] = [[]]
    depth = 0
    for k in range(i, len(toks)):
        t = toks[k]
        if depth == 0 and (t.kind in ("ref", "op") and t.text in _SELECT_END) and not (
                t.text == "FROM" and items[-1] and items[-1][-1].text == "DISTINCT"):
            return items, k  # (x IS DISTINCT FROM y is an item)
        if depth == 0 and t.text == ",":
            items.append([])
            continue
        depth += (t.text in _OPEN) - (t.text in _CLOSE)
        items[-1].append(t)
    return items, len(toks)


def _select_names(toks: list[_Tok], ctes: dict[str, list[_Tok]] | None = None
                  ) -> tuple[tuple[int, str], ...]:
    """:func:`parameter_columns` of the tokens of a ``SELECT`` (or ``WITH ... SELECT``;
    ``ctes``: the queries of the common table expressions in scope, by name)."""
    if toks and toks[0].kind == "ref" and toks[0].text == "WITH":
        parsed = _with_clause(toks)
        if parsed is None:
            return ()
        found, at = parsed
        ctes = {**(ctes or {}), **found}
        toks = toks[at:]
    listed = _select_items(toks)
    if listed is None:
        return ()
    items, end = listed
    if len(items) == 1 and [t.text for t in items[0]] == ["*"]:
        return _star_names(toks[end:], ctes or {})
    out: list[tuple[int, str]] = []
    for place, item in enumerate(items):
        if not item or (item[-1].text == "*" and (len(item) == 1 or item[-2].text == ".")) \
                or item[0].text == "*" or (len(item) > 2 and item[1].text == "." and
                                           item[2].text == "*") or (
                item[0].kind == "ref" and item[0].text in ("COLUMNS", "UNPACK")):
            break  # (a star, * EXCLUDE (a), COLUMNS(...): the places after it are not known)
        before = len(out)
        if item[0].kind == "param" and len(item) == 1:
            out.append((place, "?column?"))
        elif item[0].kind == "param" and len(item) >= 3 and item[1].text == "::":
            words = []
            for t in item[2:]:
                if t.kind != "ref" or t.text in _AFTER_TYPE:
                    break
                words.append(t.parts[-1].lower())
            rest = item[2 + len(words):]
            if words and (not rest or (rest[0].text == "(" and rest[-1].text == ")")):
                written = " ".join(words)
                out.append((place, _CAST_COLUMN.get(written, written)))
        if len(out) == before:  # an expression (with a parameter or not)
            named = _expression_name(item)
            if named is not None:
                out.append((place, named))
    return tuple(out)


#: what may follow the derived table of ``SELECT * FROM (SELECT ...) s``
_AFTER_FROM = frozenset({"WHERE", "ORDER", "LIMIT", "OFFSET", "FETCH", "FOR", ";"})


def _star_names(rest: list[_Tok], ctes: dict[str, list[_Tok]]
                ) -> tuple[tuple[int, str], ...]:
    """The names of ``SELECT *`` whose ``FROM`` (``rest``) is one subquery, ``FROM
    (SELECT count(*) FROM t) s``, or one common table expression of ``ctes`` without a
    column list: its columns are the query's, named as PostgreSQL names them
    (``count``, not DuckDB's ``count_star()``)."""
    if len(rest) >= 2 and rest[0].text == "FROM" and rest[1].kind == "ref" and \
            len(rest[1].parts) == 1 and rest[1].parts[0] in ctes:
        k = 2
        if k < len(rest) and rest[k].kind == "ref" and rest[k].text == "AS":
            k += 1
        if k < len(rest) and rest[k].kind == "ref" and rest[k].text not in _AFTER_FROM:
            k += 1
        if k < len(rest) and rest[k].text not in _AFTER_FROM:
            return ()
        return _select_names(ctes[rest[1].parts[0]], ctes)
    if len(rest) < 5 or rest[0].text != "FROM" or rest[1].text != "(" or \
            rest[2].text != "SELECT":
        return ()
    close = _closing(rest, 1)
    if close < 0:
        return ()
    k = close + 1
    if k < len(rest) and rest[k].kind == "ref" and rest[k].text == "AS":
        k += 1
    if k < len(rest) and rest[k].kind == "ref" and rest[k].text not in _AFTER_FROM:
        k += 1  # (the alias; an alias with a column list names the columns itself)
    if k < len(rest) and rest[k].text not in _AFTER_FROM:
        return ()
    return _select_names(rest[2:close], ctes)


def _with_clause(toks: list[_Tok]) -> tuple[dict[str, list[_Tok]], int] | None:
    """(the query of each common table expression of ``WITH ...`` (``toks``) that has no
    column list, by name; where the statement after them starts), None for a shape not
    known."""
    ctes: dict[str, list[_Tok]] = {}
    i = 1
    if i < len(toks) and toks[i].kind == "ref" and toks[i].text == "RECURSIVE":
        i += 1
    while True:
        if i >= len(toks) or toks[i].kind != "ref" or len(toks[i].parts) != 1:
            return None
        name, listed = toks[i].parts[0], False
        i += 1
        if i < len(toks) and toks[i].text == "(":  # name (a, b): the list names them
            i, listed = _closing(toks, i) + 1, True
            if i <= 0:
                return None
        if i >= len(toks) or toks[i].text != "AS":
            return None
        i += 1
        while i < len(toks) and toks[i].kind == "ref" and toks[i].text in (
                "NOT", "MATERIALIZED"):
            i += 1
        if i >= len(toks) or toks[i].text != "(":
            return None
        close = _closing(toks, i)
        if close < 0:
            return None
        if not listed:
            ctes[name] = toks[i + 1:close]
        i = close + 1
        if i < len(toks) and toks[i].text == ",":
            i += 1
            continue
        return ctes, i


def _item_alias(item: list[_Tok]) -> str | None:
    """The alias of the select-list item ``item`` (``a + 1 AS b``, ``a + 1 b``), None for
    none."""
    if len(item) >= 2 and item[-2].kind == "ref" and item[-2].text == "AS" and \
            item[-1].kind == "ref":
        return item[-1].parts[-1]
    if len(item) >= 2 and item[-1].kind == "ref" and item[-1].text not in _NOT_ALIAS and (
            item[-2].kind in ("param", "num", "str", "ref") or item[-2].text in _CLOSE) and \
            item[-2].text not in OPERAND_AFTER:
        return item[-1].parts[-1]
    return None


def _subquery_name(inner: list[_Tok]) -> str | None:
    """The name PostgreSQL gives a scalar subquery, ``(SELECT a FROM t)``: its first
    column's (``inner``: the tokens of the ``SELECT``), None where that is not known (a
    ``*``)."""
    listed = _select_items(inner)
    if listed is None or not listed[0][0]:
        return None
    first = listed[0][0]
    alias = _item_alias(first)
    if alias is not None:
        return alias
    if first[-1].text == "*":
        return None
    if len(first) == 1 and first[0].kind == "ref" and first[0].text not in (
            "TRUE", "FALSE", "NULL"):
        return first[0].parts[-1]
    if first[0].kind == "param" and len(first) == 1:
        return "?column?"
    return _expression_name(first) or "?column?"


def _case_name(item: list[_Tok]) -> str:
    """The name of ``CASE ... END`` (``item``): its ``ELSE``'s where that is a name
    PostgreSQL keeps (a column, a call: ``CASE WHEN c THEN 0 ELSE a END`` is ``a``),
    else ``case``."""
    depth, cases, at = 0, 0, -1
    for k in range(1, len(item) - 1):
        t = item[k]
        depth += (t.text in _OPEN) - (t.text in _CLOSE)
        if depth == 0 and t.kind == "ref":
            if t.text == "CASE":
                cases += 1
            elif t.text == "END":
                cases -= 1
            elif t.text == "ELSE" and cases == 0:
                at = k
    if at < 0 or item[-1].text != "END":
        return "case"
    default = item[at + 1:-1]
    if default and default[0].kind == "ref" and default[0].text == "CASE":
        return _case_name(default)  # (its ELSE's name, or case)
    return _operand_name(default) or "case"


#: words that end a cast's type name (``$1::int IS NULL``: the node is the IS)
_AFTER_TYPE = frozenset({"AS", "IS", "ISNULL", "NOTNULL", "NOT", "AND", "OR", "IN", "LIKE",
                         "ILIKE", "SIMILAR", "BETWEEN", "COLLATE", "AT", "GLOB", "REGEXP"})
_OPEN = frozenset({"(", "["})
_CLOSE = frozenset({")", "]"})
#: words that end an expression and are no alias (``CASE ... END``, ``$1 IS NULL``)
_NOT_ALIAS = frozenset({"END", "NULL", "TRUE", "FALSE", "UNKNOWN"})
#: words after which a name is an operand, not an alias (``NOT ok``, ``x IS NOT b``)
OPERAND_AFTER = frozenset({"NOT", "AND", "OR", "IS", "IN", "LIKE", "ILIKE", "BETWEEN", "CASE",
                           "WHEN", "THEN", "ELSE", "EXISTS", "DISTINCT", "FROM", "SELECT"})


def _closing(item: list[_Tok], k: int) -> int:
    """The place in ``item`` of the bracket closing the one at ``k`` (-1: none)."""
    depth = 0
    for j in range(k, len(item)):
        depth += (item[j].text in _OPEN) - (item[j].text in _CLOSE)
        if depth == 0:
            return j
    return -1


def _expression_name(item: list[_Tok]) -> str | None:
    """The name PostgreSQL gives a select-list expression holding a parameter and no alias
    (the function called, ``case``, ``array``, a cast's type, else ``?column?``), where
    the engines name it after the text with the value written in (DuckDB:
    ``upper('s3cr3t')``, ``('s3cr3t' || 'x')``); None for no parameter, an alias, a
    subquery (named by its own select list) or a shape not known."""
    depth = 0
    for t in item:
        depth += (t.text in _OPEN) - (t.text in _CLOSE)
        if depth == 0 and t.kind == "ref" and t.text == "AS":
            return None
    if len(item) >= 2 and item[-1].kind == "ref" and item[-1].text not in _NOT_ALIAS and (
            item[-2].kind in ("param", "num", "str", "ref") or item[-2].text in _CLOSE) and \
            item[-2].text not in OPERAND_AFTER:  # (NOT ok: an operand, no alias)
        return None  # (an alias without AS, or a shape not known: x IS NOT DISTINCT ...)
    while item[0].text == "(" and _closing(item, 0) == len(item) - 1:
        item = item[1:-1]  # (parentheses are no node: (upper($1)) is upper)
        if not item:
            return None
        if item[0].kind == "ref" and item[0].text == "SELECT":  # (SELECT a FROM t): a
            return _subquery_name(item)
    first = item[0]
    if first.kind == "ref" and len(item) == 1 and first.text in ("TRUE", "FALSE", "NULL"):
        return "?column?"  # (PostgreSQL 15's boolean constant; 14's was a cast to bool)
    if first.kind == "ref" and first.text == "EXISTS" and len(item) >= 3 and \
            item[1].text == "(" and _closing(item, 1) == len(item) - 1:
        return "exists"
    cast = _cast_name(item)
    if cast is not None:
        return cast
    if first.kind == "ref" and first.text not in _NOT_OPERAND and len(item) >= 3 and \
            item[1].text == "(" and (
            _closing(item, 1) == len(item) - 1 or (
            _closing(item, 1) > 0 and item[_closing(item, 1) + 1].kind == "ref" and
            item[_closing(item, 1) + 1].text in ("FILTER", "OVER", "WITHIN"))):
        if first.text == "CAST":
            at = _cast_as(item)
            operand = _operand_name(item[2:at]) if at > 0 else None
            if operand is not None:
                return operand
            words = [t.parts[-1].lower() for t in item[at + 1:-1] if t.kind == "ref"]
            if at < 0 or not words:
                return None
            written = " ".join(words)
            if written == "blob":  # (the server's own cast of b || b on SQLite: its node
                return _expression_name(item[2:at]) or "?column?"  # is the ||)
            return _CAST_COLUMN.get(written, written)
        return first.parts[-1].lower()
    if _is_case(first) and _case_end(item, 0) == len(item) - 1:  # (not CASE ... END + 1)
        return _case_name(item)
    if first.kind == "ref" and first.text == "ARRAY" and len(item) >= 3 and \
            item[1].text in _OPEN and _closing(item, 1) == len(item) - 1:
        return "array"
    if first.kind == "ref" and len(item) == 1:
        return None  # (a column, or a word such as current_date: the engines name it)
    if first.kind == "ref" and item[-1].kind == "str" and all(
            t.kind == "ref" and t.text not in _NOT_TYPE for t in item[:-1]) and \
            first.text not in ("U", "B", "X"):  # (not s LIKE 'x', an operator)
        written = " ".join(t.parts[-1].lower() for t in item[:-1])  # date '2026-01-01'
        return _CAST_COLUMN.get(written, written)
    return "?column?"


#: words no type's name holds: ``s LIKE 'x'`` is an operator, not a typed literal
_NOT_TYPE = _NOT_OPERAND | frozenset({"SIMILAR", "GLOB", "REGEXP", "MATCH", "ESCAPE",
                                      "COLLATE", "OPERATOR", "OVERLAPS"})


def _cast_name(item: list[_Tok]) -> str | None:
    """The type's name of ``item`` when its outermost node is a ``::`` cast (``1::int``:
    ``int4``, ``(a + b)::numeric``, ``x::text``; not ``1 + 2::int``, whose node is the
    ``+``), else None."""
    at = next((k for k in range(len(item) - 1, 0, -1) if item[k].text == "::"), -1)
    if at < 1:
        return None
    words = []
    for t in item[at + 1:]:
        if t.kind != "ref" or t.text in _AFTER_TYPE:
            break
        words.append(t.parts[-1].lower())
    rest = item[at + 1 + len(words):]
    if not words or (rest and not (rest[0].text in _OPEN and rest[-1].text in _CLOSE)):
        return None  # (varchar(10) and int[] are named by their base type)
    head = item[:at]
    operand = _operand_name(head)
    if operand is not None:
        return operand
    if head[-1].text in _CLOSE:  # (a + b)::t, f(x)::t, ARRAY[1]::t
        opened = next((k for k in range(len(head)) if _closing(head, k) == len(head) - 1),
                      -1)
        if not (opened == 0 or (opened == 1 and head[0].kind == "ref")):
            return None
    elif (len(head) != 1 or head[0].kind not in ("num", "str", "param", "ref")) and \
            not _whole_case(head):  # (CASE ... END::text: the cast's node is the CASE)
        if not (len(head) >= 3 and head[-2].text == "::" and _cast_name(head) is not None):
            return None  # (1 + 2::int: the node is the +; x::text::int: the last cast)
    written = " ".join(words)
    return _CAST_COLUMN.get(written, written)


def _whole_case(head: list[_Tok]) -> bool:
    """Whether ``head`` is one ``CASE ... END``."""
    if len(head) < 2 or head[0].text != "CASE" or head[-1].text != "END":
        return False
    cases = 0
    for k, t in enumerate(head):
        if t.kind == "ref" and t.text in ("CASE", "END"):
            cases += 1 if t.text == "CASE" else -1
            if cases == 0:
                return k == len(head) - 1
    return False


def _cast_as(item: list[_Tok]) -> int:
    """Where the ``AS`` of ``CAST(x AS t)`` (``item``) is, -1 for none."""
    depth = 0
    for k, t in enumerate(item):
        depth += (t.text in _OPEN) - (t.text in _CLOSE)
        if depth == 1 and t.kind == "ref" and t.text == "AS":
            return k
    return -1


def _operand_name(head: list[_Tok]) -> str | None:
    """The name a cast's operand ``head`` has that PostgreSQL keeps over the cast's type
    (FigureColname: ``a::text`` is ``a``, ``count(*)::int`` ``count``,
    ``CAST(a::int AS text)`` ``a``, ``ARRAY[1]::text`` ``array``, a scalar subquery its
    column's, ``CASE`` its ``ELSE``'s where that is one of these), None where the type
    names the cast (a literal, a parameter, an operator, another ``CASE``)."""
    while len(head) > 2 and head[0].text == "(" and _closing(head, 0) == len(head) - 1:
        head = head[1:-1]
    if not head:
        return None
    first = head[0]
    if len(head) == 1:
        if first.kind == "ref" and first.text not in ("TRUE", "FALSE", "NULL"):
            return first.parts[-1]  # (a column, current_date: lower-cased unless quoted)
        return None
    depth, at = 0, -1
    for k, t in enumerate(head):
        depth += (t.text in _OPEN) - (t.text in _CLOSE)
        if depth == 0 and t.text == "::":
            at = k
    if at > 0:  # a::bigint::text: the inner cast's operand, if it has a name
        return _operand_name(head[:at])
    if first.kind == "ref" and first.text == "SELECT":  # (SELECT a FROM t)::text: a
        return _subquery_name(head)
    if first.kind == "ref" and first.text == "CASE" and head[-1].text == "END":
        named = _case_name(head)
        return None if named == "case" else named
    if first.kind == "ref" and head[1].text in _OPEN and _closing(head, 1) == len(head) - 1:
        if first.text in ("ROW", "ARRAY"):  # (as calls: ARRAY[1]::text is array)
            return first.text.lower()
        if first.text == "CAST":
            inner = _cast_as(head)
            return _operand_name(head[2:inner]) if inner > 0 else None
        return first.parts[-1].lower()
    return None


#: SQLite's CAST target of a PostgreSQL type's name in a ``::`` cast; "" where the value
#: is of the type already as SQLite holds it (the cast is dropped: a date is text, a bool
#: an integer)
_SQLITE_CAST_TYPES = {
    # (the number types' targets are :func:`._sqltext.cast_sql`'s: PostgreSQL's cast)
    **_sqltext.NUMBER_CASTS,
    **dict.fromkeys(("text", "varchar", "character varying", "char", "character", "bpchar",
                     "name"), "TEXT"),
    "bytea": "BLOB",
    # types SQLite has no CAST to: a value is held as text or a number without its type,
    # and dropping the cast would answer with the operand unchanged (a timestamp for
    # ``x::date``, 5 for ``5::bool``), so such a cast is refused (CastRefused)
    **dict.fromkeys(("numeric", "decimal", "bool", "boolean", "date", "time", "timestamp",
                     "timestamptz", "time without time zone", "timestamp with time zone",
                     "timestamp without time zone", "uuid", "json", "jsonb", "interval"),
                    ""),
}


class CastRefused(ValueError):
    """A ``x::type`` the SQLite engine cannot run as PostgreSQL does; ``args[0]`` is the
    type as written."""


def _null(operand: list[_Tok]) -> bool:
    """Whether a cast's operand is ``NULL`` (a NULL of any type: the cast is dropped)."""
    return len(operand) == 1 and operand[0].kind == "ref" and operand[0].text == "NULL"


class UnknownType(ValueError):
    """A cast to a type PostgreSQL does not have (``5::bogus``); ``args[0]`` is its name
    as written."""


#: the first word of the name of each type PostgreSQL 15 has (pg_catalog's pg_type, but
#: arrays and composite types, and the SQL standard's names its grammar reads), which a
#: cast may name: a cast to any other fails with 42704, as there
_PG_TYPE_WORDS = frozenset("""
    aclitem any anyarray anycompatible anycompatiblearray anycompatiblemultirange
    anycompatiblenonarray anycompatiblerange anyelement anyenum anymultirange anynonarray
    anyrange bit bool box bpchar bytea char cid cidr circle cstring date datemultirange
    daterange event_trigger fdw_handler float4 float8 gtsvector index_am_handler inet int2
    int2vector int4 int4multirange int4range int8 int8multirange int8range internal
    interval json jsonb jsonpath language_handler line lseg macaddr macaddr8 money name
    numeric nummultirange numrange oid oidvector path pg_brin_bloom_summary
    pg_brin_minmax_multi_summary pg_ddl_command pg_dependencies pg_lsn pg_mcv_list
    pg_ndistinct pg_node_tree pg_snapshot point polygon record refcursor regclass
    regcollation regconfig regdictionary regnamespace regoper regoperator regproc
    regprocedure regrole regtype table_am_handler text tid time timestamp timestamptz timetz
    trigger tsm_handler tsmultirange tsquery tsrange tstzmultirange tstzrange tsvector
    txid_snapshot unknown uuid varbit varchar void xid xid8 xml
    int integer smallint bigint real float double decimal dec boolean character national
    nchar""".split())

#: words that go on a type's name (``double precision``, ``timestamp with time zone``)
_TYPE_WORDS = frozenset({"PRECISION", "VARYING", "WITH", "WITHOUT", "TIME", "ZONE"})


def sqlite_casts(sql: str, stored: bool = False) -> str:
    """``sql`` for SQLite, which has no ``::`` casts, with each ``x::type`` as SQLite's
    ``CAST(x AS type)``, or for an integer type the function that casts as PostgreSQL does
    (:func:`._sqltext.cast_sql`) (``a::text``, ``(a + 1)::text``, ``count(*)::int``,
    ``a::bigint::text``, ``CASE ... END::text``); a cast to a type SQLite has no CAST to
    (``x::date``, ``x::boolean``, ``x::numeric``) raises :class:`CastRefused`; a cast to a
    type not known here or to an array is left for SQLite to refuse. Strings, quoted names,
    comments and dollar-quoted strings holding ``::`` are left alone. ``stored``: a
    definition SQLite keeps, whose integer casts are SQLite's (:func:`._sqltext.cast_sql`)."""
    toks = _tokens(sql)
    # each cast found on the one tokenization of the text (re-reading the whole text for
    # each cast took seconds for a statement of a few hundred of them): (where it starts,
    # where it ends, where its operand ends, SQLite's type or "") in the text
    casts: list[tuple[int, int, int, str, bool]] = []  # (and: the operand is a numeric
    # literal, PostgreSQL's numeric, whose halves an integer cast rounds away from zero)
    made: dict[int, int] = {}  # the token after a cast rewritten -> where its operand starts
    for k, t in enumerate(toks):
        if t.kind != "op" or t.text != "::":
            continue
        start = made[k] if k in made else _cast_operand(toks, k)
        end, written = _cast_target(toks, k + 1)
        target = _SQLITE_CAST_TYPES.get(written) if end > 0 else None
        if start < 0 or target is None:
            continue
        if not target and not _null(toks[start:k]):  # (NULL::interval: a NULL)
            raise CastRefused(written)
        made[end] = start  # (a::bigint::text: the second's operand is the first cast)
        literal = _numeric_literal(toks[start:k])
        if target == "TEXT" and _boolean_operand(toks[start:k]):
            target = _BOOL_TEXT  # (SQLite's CAST of its 1 or 0: '1', not 'true')
        casts.append((toks[start].start, toks[end - 1].stop, toks[k - 1].stop, target,
                      literal))
    if not casts:
        return sql
    # the text with each outermost cast rewritten, the casts inside its operand first; a
    # stack of the casts whose operand is being written, not recursion (a chain may be long)
    casts.sort(key=lambda c: (c[0], -c[1]))
    stack: list[tuple[int, int, str, bool, list[str]]] = []  # (operand's end, cast's end,
    parts: list[str] = []  # type, numeric literal, the text written around the cast: the
    # text written so far)
    pos = 0  # where the text not yet written starts

    def close(limit: int) -> None:  # the casts whose operand ends by ``limit``
        nonlocal parts, pos
        while stack and stack[-1][0] <= limit:
            op_end, cast_end, target, literal, outer = stack.pop()
            parts.append(sql[pos:op_end])
            inner = "".join(parts)
            parts = outer
            parts.append(_bool_text(inner) if target == _BOOL_TEXT else
                         _sqltext.cast_sql(inner, target, literal, stored) if target
                         else inner)
            pos = cast_end  # (a cast inside the type's name goes with it)

    for c_start, c_end, op_end, target, literal in casts:
        close(c_start)
        if c_start < pos or (stack and c_end > stack[-1][0]):
            continue  # (in a type's name, gone with it; or not nested: left as written)
        parts.append(sql[pos:c_start])
        stack.append((op_end, c_end, target, literal, parts))
        parts, pos = [], c_start
    close(len(sql))
    parts.append(sql[pos:])
    return "".join(parts)


def _cast_operand(toks: list[_Tok], k: int) -> int:
    """Where the operand of the ``::`` at ``toks[k]`` starts, -1 for a shape not known."""
    if k == 0:
        return -1
    last = toks[k - 1]
    if last.text == ")":
        depth = 0
        for j in range(k - 1, -1, -1):
            depth += (toks[j].text == ")") - (toks[j].text == "(")
            if depth == 0:
                before = toks[j - 1] if j > 0 else None
                if before is not None and before.kind == "ref" and \
                        before.text not in _NOT_OPERAND and before.text not in (
                            "EXISTS", "ARRAY", "ROW", "JOIN", "USING", "OVER", "FILTER"):
                    return j - 1  # f(x)::t
                return j
        return -1
    if last.kind == "ref" and last.text == "END":
        cases = 0
        for j in range(k - 1, -1, -1):
            if toks[j].kind == "ref" and toks[j].text in ("END", "CASE"):
                cases += 1 if toks[j].text == "END" else -1
                if cases == 0:
                    return j
        return -1
    if last.kind in ("str", "num", "param") or (
            last.kind == "ref" and last.text not in _NOT_OPERAND):
        if last.kind == "str" and k >= 2 and toks[k - 2].kind == "ref" and \
                toks[k - 2].text not in _NOT_OPERAND and toks[k - 2].start >= 0:
            return -1  # (date '2026-01-01'::text: a typed literal, left alone)
        return k - 1
    return -1


def _numeric_literal(operand: Sequence[_Tok]) -> bool:
    """Whether ``operand`` is a numeric literal (``2.5``, ``-2.5``, ``(-2.5)``, ``1e3``):
    PostgreSQL's numeric, whose halves an integer cast rounds away from zero."""
    nums = [t for t in operand if t.kind == "num"]
    return len(nums) == 1 and nums[0].text[:2] != "0X" and \
        any(c in nums[0].text for c in ".eE") and \
        all(t.kind == "num" or (t.kind == "op" and t.text in ("(", ")", "+", "-"))
            for t in operand)


def _cast_target(toks: list[_Tok], i: int) -> tuple[int, str]:
    """(where the type's name from ``toks[i]`` on ends, its words lower-cased); (-1, "")
    for no name or an array type."""
    if i >= len(toks) or toks[i].kind != "ref":
        return -1, ""
    parts = toks[i].parts
    if len(parts) == 2 and parts[0].lower() == "pg_catalog":
        parts = parts[1:]
    if len(parts) != 1:
        return -1, ""
    words = [parts[0].lower()]
    j = i + 1
    while j < len(toks) and toks[j].kind == "ref" and toks[j].text in _TYPE_WORDS:
        words.append(toks[j].text.lower())
        j += 1
    if j < len(toks) and toks[j].text == "(":  # varchar(5), numeric(10, 2)
        close = _closing(toks, j)
        if close < 0:
            return -1, ""
        j = close + 1
    if j < len(toks) and toks[j].text == "[":
        return -1, ""
    return j, " ".join(words)


#: words an arithmetic operand never is (keywords, a typed literal's type): a column of
#: such a name ends the operand too, which leaves the text as written
_ARITH_STOP = _NOT_OPERAND | frozenset({
    "ORDER", "GROUP", "ESCAPE", "COLLATE", "UNION", "INTERSECT", "EXCEPT", "JOIN", "LEFT",
    "RIGHT", "INNER", "OUTER", "CROSS", "FULL", "NULLS", "FIRST", "LAST", "ASC", "DESC",
    "WITH", "OVER", "FILTER", "PARTITION", "WINDOW", "ROWS", "RANGE", "EXISTS", "ISNULL",
    "NOTNULL", "GLOB", "MATCH", "REGEXP", "SIMILAR", "DATE", "TIME", "TIMESTAMP",
    "INTERVAL", "ARRAY", "ROW", "UPDATE", "DELETE", "INSERT", "CONFLICT", "DO"})


def _arith_atom(toks: list[_Tok], j: int, hi: int) -> int:
    """Where the operand of arithmetic at ``toks[j]`` ends (a literal, parameter, column,
    call, ``CASE ... END`` or bracketed expression), -1 for none there."""
    if j >= hi:
        return -1
    t = toks[j]
    if t.text == "(" and t.kind == "op":
        close = _closing(toks, j)
        return close + 1 if 0 <= close < hi else -1
    if t.kind in ("num", "str", "param"):
        return j + 1
    if _is_case(t):  # CASE ... END: one operand
        end = _case_end(toks, j)
        return end + 1 if 0 <= end < hi else -1
    if t.kind != "ref" or (len(t.parts) == 1 and t.text in _ARITH_STOP):
        return -1  # (a quoted name's text keeps its quotes: no keyword)
    if j + 1 < hi and toks[j + 1].text == "(":  # a call
        close = _closing(toks, j + 1)
        return close + 1 if 0 <= close < hi else -1
    return j + 1


def _is_case(t: _Tok) -> bool:
    return t.kind == "ref" and len(t.parts) == 1 and t.text == "CASE"


def _case_end(toks: list[_Tok], k: int) -> int:
    """The place of the ``END`` closing the ``CASE`` at ``toks[k]`` (-1: none)."""
    depth, cases = 0, 0
    for j in range(k, len(toks)):
        t = toks[j]
        depth += (t.text in _OPEN) - (t.text in _CLOSE)
        if depth < 0:
            return -1
        if depth == 0 and t.kind == "ref" and len(t.parts) == 1:
            cases += (t.text == "CASE") - (t.text == "END")
            if cases == 0:
                return j
    return -1


def _arith_run(toks: list[_Tok], i: int, hi: int) -> tuple[int, int]:
    """(where the arithmetic ``a + b * -c ...`` from ``toks[i]`` ends, -1 for none there;
    its operands' count)."""
    j, end, atoms = i, -1, 0
    while True:
        while j < hi and toks[j].kind == "op" and toks[j].text in ("+", "-"):
            j += 1  # (a sign)
        e = _arith_atom(toks, j, hi)
        if e < 0:
            return end, atoms
        end, atoms = e, atoms + 1
        if e < hi and toks[e].kind == "op" and toks[e].text in _ARITH:
            j = e + 1
            continue
        return end, atoms


#: the longest statement text whose rewrites are cached (see :func:`_text_cache`)
_CACHED_TEXT = 4096


def _text_cache(rewrite: Callable[[str], str]) -> Callable[[str], str]:
    """``rewrite`` of a statement's text, cached by the text (an lru_cache of 1024: a
    prepared or repeated statement sends the same text) when it is at most
    :data:`_CACHED_TEXT` characters long; a longer one (a bulk INSERT's, rarely repeated)
    is rewritten each time and not kept: the cache's memory stays bounded."""
    cached = functools.lru_cache(maxsize=1024)(rewrite)

    @functools.wraps(rewrite)
    def text_rewrite(sql: str) -> str:
        return cached(sql) if len(sql) <= _CACHED_TEXT else rewrite(sql)

    return text_rewrite


@_text_cache
def check_cast_types(sql: str) -> str:
    """``sql`` itself, once each type a ``x::type`` or ``CAST(x AS type)`` of it names is
    one PostgreSQL has (or, in ``CAST``, one SQLite's CAST reads: ``BLOB``); else raises
    :class:`UnknownType` (SQLite reads ``CAST(5 AS bogus)`` as a number and ``::`` not at
    all)."""
    toks = _tokens(sql)
    calls: list[bool] = []  # for each bracket open: whether it is CAST('s
    for k, t in enumerate(toks):
        if t.text in _OPEN:
            calls.append(k > 0 and toks[k - 1].kind == "ref" and toks[k - 1].text == "CAST")
            continue
        if t.text in _CLOSE:
            if calls:
                calls.pop()
            continue
        if not ((t.kind == "op" and t.text == "::") or
                (t.kind == "ref" and t.text == "AS" and calls and calls[-1])):
            continue
        at = k + 1
        if at >= len(toks) or toks[at].kind != "ref" or toks[at].text.startswith('"'):
            continue
        parts = toks[at].parts
        qualified = len(parts) == 2 and parts[0].lower() == "pg_catalog"
        if len(parts) > 2 or (len(parts) == 2 and not qualified):
            continue  # (a user's schema: not a type here either, but left to SQLite)
        word = parts[-1].lower()
        if word not in _PG_TYPE_WORDS and (t.text == "::" or qualified or
                                           word not in T._CAST_NAMES):
            raise UnknownType(".".join(parts))
    return sql


@_text_cache
def sqlite_concat_precedence(sql: str) -> str:
    """``sql`` with each operand of ``||`` that is arithmetic (``1 + 2 || 'x'``) in
    brackets: PostgreSQL's ``||`` binds less tightly than ``+ - * / %`` (``'3x'``),
    SQLite's more (``1 + (2 || 'x')``, 3)."""
    if "||" not in sql:
        return sql
    toks = _tokens(sql)
    wraps: list[tuple[int, int]] = []  # (token where a bracket opens, token it closes after)
    levels = [(0, len(toks))]
    while levels:
        lo, hi = levels.pop()
        k = lo
        while k < hi:  # the brackets and CASE ... END inside this level: levels of their own
            if toks[k].text in _OPEN or _is_case(toks[k]):
                close = _closing(toks, k) if toks[k].text in _OPEN else _case_end(toks, k)
                if close < 0 or close >= hi:
                    return sql  # (unbalanced: left to the engine to refuse)
                levels.append((k + 1, close))
                k = close
            k += 1
        runs: dict[int, tuple[int, int]] = {}  # start -> (end, operands)
        ends: dict[int, int] = {}  # end -> start
        i = lo
        while i < hi:
            end, atoms = _arith_run(toks, i, hi)
            if end < 0:
                i += 1
                continue
            runs[i], ends[end] = (end, atoms), i
            i = end
        for k in range(lo, hi):
            if toks[k].kind != "op" or toks[k].text != "||":
                continue
            left = ends.get(k)
            if left is not None and runs[left][1] > 1:
                wraps.append((left, k))
            right = runs.get(k + 1)
            if right is not None and right[1] > 1:
                wraps.append((k + 1, right[0]))
    if not wraps:
        return sql
    marks = sorted({(toks[a].start, "(") for a, _ in wraps} |
                   {(toks[b - 1].stop, ")") for _, b in wraps}, key=lambda m: m[0])
    out, pos = [], 0
    for at, mark in sorted(set(marks), key=lambda m: (m[0], m[1] == "(")):
        out.append(sql[pos:at])
        out.append(mark)
        pos = at
    out.append(sql[pos:])
    return "".join(out)


#: the target of a boolean expression's cast to text (see :func:`_bool_text`)
_BOOL_TEXT = "bool text"
#: a :class:`_CastCall`'s target for a string or parameter cast to interval
_INTERVAL_TEXT = "interval text"


def _boolean_operand(operand: list[_Tok]) -> bool:
    """Whether a cast's operand is a boolean expression (a comparison, ``AND``, ``NOT``,
    ``true``, ...: :func:`._exprtypes._boolean`), its brackets aside."""
    from ._exprtypes import _boolean

    while len(operand) > 2 and operand[0].text == "(" and \
            _closing(operand, 0) == len(operand) - 1:
        operand = operand[1:-1]
    return bool(operand) and _boolean(operand)


def _bool_text(operand: str) -> str:
    """SQLite's text of a boolean expression (1, 0 or NULL there) as PostgreSQL's
    ``bool::text``: 'true', 'false' or NULL."""
    return f"(CASE ({operand}) WHEN 1 THEN 'true' WHEN 0 THEN 'false' END)"


class _CastCall(NamedTuple):
    start: int  # where ``CAST`` starts in the text
    stop: int  # where its ``)`` ends
    operand: tuple[int, int]  # where the operand starts and ends
    toks: tuple[_Tok, ...]  # the operand's tokens
    target: str  # :data:`_SQLITE_CAST_TYPES`' value for the type


@_text_cache
def sqlite_cast_calls(sql: str) -> str:
    """``sql`` with each ``CAST(x AS type)`` as PostgreSQL runs it: to an integer type the
    function that casts as PostgreSQL does (:func:`._sqltext.cast_sql`: SQLite's CAST
    truncates 2.5 to 2, reads 'abc' as 0); to a type SQLite has no CAST to (``date``,
    ``numeric``, ``boolean``, ...) a parameter or string literal as it is (as
    :func:`._sqltext.drop_casts` does; to ``interval`` the text PostgreSQL writes for it,
    as ``::interval``), any other operand :class:`CastRefused`; other types as written."""
    toks = _tokens(sql)
    calls: list[_CastCall] = []
    for k, t in enumerate(toks):
        if not (t.kind == "ref" and t.text == "CAST" and len(t.parts) == 1 and
                k + 1 < len(toks) and toks[k + 1].text == "("):
            continue
        close = _closing(toks, k + 1)
        if close < 0:
            continue
        depth, at = 0, -1
        for j in range(k + 2, close):
            depth += (toks[j].text in _OPEN) - (toks[j].text in _CLOSE)
            if depth == 0 and toks[j].kind == "ref" and toks[j].text == "AS":
                at = j
        if at < 0 or at == k + 2:
            continue
        end, written = _cast_target(toks, at + 1)
        target = _SQLITE_CAST_TYPES.get(written) if end == close else None
        operand = tuple(toks[k + 2:at])
        if target == "TEXT" and _boolean_operand(list(operand)):
            target = _BOOL_TEXT  # (SQLite's CAST of its 1 or 0: '1', not 'true')
        elif written == "interval" and end == close and len(operand) == 1 and \
                operand[0].kind in ("param", "str"):
            target = _INTERVAL_TEXT  # (as ``::interval``: PostgreSQL's text of it)
        elif target is None or target in ("REAL", "TEXT", "BLOB"):
            continue  # (SQLite's CAST answers as PostgreSQL's)
        if not target and not (len(operand) == 1 and operand[0].kind in ("param", "str")) \
                and not _null(list(operand)):
            raise CastRefused(written)  # (CAST(NULL AS date): a NULL, as it is)
        calls.append(_CastCall(t.start, toks[close].stop,
                               (operand[0].start, operand[-1].stop), operand, target))
    if not calls:
        return sql

    def rewrite(lo: int, hi: int, inside: list[_CastCall]) -> str:
        out, pos, n = [], lo, 0
        while n < len(inside):
            call = inside[n]
            nested = [c for c in inside[n + 1:] if c.start < call.stop]
            out.append(sql[pos:call.start])
            operand = rewrite(*call.operand, nested)
            if not call.target:  # a parameter or a string literal: as it is
                out.append(operand)
            elif call.target == _BOOL_TEXT:
                out.append(_bool_text(operand))
            elif call.target == _INTERVAL_TEXT:
                out.append(_sqltext.interval_literal(operand) if call.toks[0].kind == "str"
                           else f"{_sqltext.INTERVAL_CAST_FUNCTION}({operand})")
            else:
                out.append(_sqltext.cast_sql(operand, call.target,
                                             _numeric_literal(call.toks)))
            pos = call.stop
            n += 1 + len(nested)
        out.append(sql[pos:hi])
        return "".join(out)

    return rewrite(0, len(sql), calls)


_SUBQUERY = re.compile(r"\(\s*select\b", re.I)


@_text_cache
def subquery_names(sql: str) -> str:
    """``sql`` with each select-list expression of a subquery (``(SELECT count(*) FROM t)
    s``, a common table expression's) that has no alias given PostgreSQL's name for it as
    an alias (``count(*) AS "count"``): a query outside reads it by that name (``s.count``),
    where DuckDB names it ``count_star()`` and SQLite ``count(*)``. The statement's own
    select list is left alone (the server names its columns)."""
    if _SUBQUERY.search(sql) is None:
        return sql
    toks = _tokens(sql)
    inserts: list[int] = []  # where an alias goes in the text
    names: list[str] = []
    for k, t in enumerate(toks):
        if t.text != "(" or t.kind != "op" or k + 1 >= len(toks) or \
                toks[k + 1].kind != "ref" or toks[k + 1].text != "SELECT":
            continue
        close = _closing(toks, k)
        if close < 0:
            return sql
        listed = _select_items(toks[k + 1:close])
        if listed is None:
            continue
        for item in listed[0]:
            if not item or item[-1].text == "*" or _item_alias(item) is not None or \
                    (len(item) == 1 and item[0].kind == "ref"):
                continue
            name = _expression_name(item)
            if name is None or name == "?column?":
                continue
            inserts.append(item[-1].stop)
            names.append(name)
    if not inserts:
        return sql
    out, pos = [], 0
    for at, name in sorted(zip(inserts, names, strict=True)):
        out.append(sql[pos:at])
        out.append(' AS "' + name.replace('"', '""') + '"')
        pos = at
    out.append(sql[pos:])
    return "".join(out)


_LIKE = re.compile(r"(?<![\w$])i?like(?![\w$])", re.I)
#: what may follow a ``LIKE`` pattern that ends it (no operator continues the pattern)
_AFTER_PATTERN = frozenset({")", ",", ";", "AND", "OR", "THEN", "ELSE", "END", "WHEN",
                            "ORDER", "GROUP", "LIMIT", "OFFSET", "HAVING", "UNION", "EXCEPT",
                            "INTERSECT", "RETURNING", "FROM", "AS", "WINDOW", "IS", "ON",
                            "JOIN", "LEFT", "RIGHT", "INNER", "CROSS", "FULL", "WHERE"})


@_text_cache
def like_escapes(sql: str) -> str:
    """``sql`` with ``ESCAPE '\\'`` after each ``LIKE`` / ``ILIKE`` pattern that is a string
    literal holding a backslash, or a parameter, and has no ``ESCAPE``: PostgreSQL's LIKE
    reads ``\\`` as its escape character (``'a_c' LIKE 'a\\_c'`` is true); the engines'
    have none unless one is written."""
    if _LIKE.search(sql) is None:
        return sql
    toks = _tokens(sql)
    at: list[int] = []
    for k, t in enumerate(toks[:-1]):
        if t.kind != "ref" or t.text not in ("LIKE", "ILIKE") or len(t.parts) != 1:
            continue
        pattern = toks[k + 1]
        if not (pattern.kind == "param" or (pattern.kind == "str" and "\\" in pattern.text)):
            continue
        after = toks[k + 2] if k + 2 < len(toks) else None
        if after is None or after.text in _AFTER_PATTERN:
            at.append(pattern.stop)
    if not at:
        return sql
    out, pos = [], 0
    for stop in at:
        out.append(sql[pos:stop])
        out.append(" ESCAPE '\\'")
        pos = stop
    out.append(sql[pos:])
    return "".join(out)
