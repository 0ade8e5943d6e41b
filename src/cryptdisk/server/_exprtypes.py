"""The types of a query's computed columns on ``--sqlite``, before it runs (a Describe).

SQLite declares a type for a result column only where it is a table's column; an
expression has none until a row holds a value. A Describe must say every column's type
before the statement runs (pg8000 and asyncpg read the rows by it, and the server sends
the rows in it), so the server reads the type of each item of the select list off the
text where the text settles it:

- a cast: ``$1::int``, ``CAST(x AS REAL)`` (integers as int8, SQLite's integer);
- an integer literal: int8; a decimal literal: float8 (SQLite's REAL);
- ``count``, ``length``, ``instr``, ``unicode``: int8; ``avg``, ``total``: float8;
  ``sum``, ``min``, ``max``, ``abs`` of a typed operand: its type; the text functions
  (``upper``, ``lower``, ``trim``, ``substr``, ``replace``, ``||``): text;
- a table's column inside an expression: its declared type;
- arithmetic (``+ - * / %``) over typed numbers: int8 when all are integers, else float8
  (numeric when one is numeric and none is a float), as SQLite computes it.

- a comparison (``=``, ``<``, ``IS``, ``LIKE``, ``IN``, ``BETWEEN``), ``AND``, ``OR``,
  ``NOT``, ``EXISTS``, ``true``, ``false``: bool (SQLite's 0 and 1).

Anything else (``CASE``, other functions, an untyped parameter) is 0: the caller
describes it as text.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from . import _types as T
from ._paramtypes import OPERAND_AFTER, _closing, _Tok, _tokens
from ._types import type_oid

__all__ = ["select_types"]

_ENDS = frozenset({"FROM", "WHERE", "GROUP", "HAVING", "ORDER", "LIMIT", "OFFSET", "UNION",
                   "EXCEPT", "INTERSECT", "WINDOW", ";"})
_ARITH = frozenset({"+", "-", "*", "/", "%"})
_INTEGER_FUNCTIONS = frozenset({"COUNT", "LENGTH", "INSTR", "UNICODE", "CHANGES",
                                "TOTAL_CHANGES", "OCTET_LENGTH"})
_FLOAT_FUNCTIONS = frozenset({"AVG", "TOTAL"})
_SAME_FUNCTIONS = frozenset({"SUM", "MIN", "MAX", "ABS"})
_TEXT_FUNCTIONS = frozenset({"UPPER", "LOWER", "TRIM", "LTRIM", "RTRIM", "SUBSTR",
                             "SUBSTRING", "REPLACE", "HEX", "QUOTE", "TYPEOF", "PRINTF",
                             "FORMAT", "CONCAT", "CONCAT_WS"})
_NUMBERS = frozenset({T.INT8, T.FLOAT8, T.NUMERIC})


def _sqlite(oid: int) -> int:
    """A cast's type as SQLite holds it: integers are int8, floats float8."""
    if oid in (T.INT2, T.INT4, T.INT8):
        return T.INT8
    if oid in (T.FLOAT4, T.FLOAT8):
        return T.FLOAT8
    return oid


@functools.lru_cache(maxsize=512)
def _items(sql: str) -> tuple[tuple[_Tok, ...], ...] | None:
    """The items of ``sql``'s (outermost, last) select list, each without its alias; None
    where the list has a ``*`` or no select list is found."""
    toks = _tokens(sql)
    depth, start = 0, None
    for i, tok in enumerate(toks):
        if tok.text == "(":
            depth += 1
        elif tok.text == ")":
            depth -= 1
        elif depth == 0 and tok.kind == "ref" and tok.text == "SELECT":
            start = i + 1  # (the last top-level SELECT: after WITH's CTEs)
            break
    if start is None:
        return None
    while start < len(toks) and toks[start].text in ("DISTINCT", "ALL"):
        start += 1
    items: list[list[_Tok]] = [[]]
    depth = 0
    for tok in toks[start:]:
        if tok.text == "(":
            depth += 1
        elif tok.text == ")":
            depth -= 1
        if depth == 0 and (tok.text in _ENDS and tok.kind in ("ref", "op")) and not (
                tok.text == "FROM" and items[-1] and items[-1][-1].text == "DISTINCT"):
            break  # (x IS DISTINCT FROM y is an item)
        if depth == 0 and tok.text == ",":
            items.append([])
            continue
        items[-1].append(tok)
    out = []
    for item in items:
        if not item or item[-1].text == "*":
            return None
        if len(item) >= 3 and item[-2].text == "AS":
            item = item[:-2]
        elif len(item) >= 2 and item[-1].kind == "ref" and len(item[-1].parts) == 1 and \
                (item[-2].kind in ("ref", "num", "str", "param") or item[-2].text == ")") and \
                item[-2].text not in ("::", "AS") and item[-2].text not in OPERAND_AFTER:
            item = item[:-1]  # an alias without AS
        out.append(tuple(item))
    return tuple(out)


def select_types(sql: str, column: Callable[[str], int]) -> list[int] | None:
    """The OID each select-list item of ``sql`` has by its text (0: not settled); None when
    the list cannot be read (a ``*``). ``column(name)``: the type of a column the
    statement's tables hold (0: unknown or ambiguous)."""
    items = _items(sql)
    if items is None:
        return None
    return [_expr(list(item), column) for item in items]


def _split(toks: list[_Tok], ops: frozenset[str]) -> list[list[_Tok]]:
    """``toks`` split at the top-level operators ``ops`` (a leading sign is no split)."""
    parts: list[list[_Tok]] = [[]]
    depth = 0
    for tok in toks:
        if tok.text == "(":
            depth += 1
        elif tok.text == ")":
            depth -= 1
        if depth == 0 and tok.kind == "op" and tok.text in ops and parts[-1]:
            parts.append([])
            continue
        parts[-1].append(tok)
    return parts


#: words of a boolean expression at its top level (outside a CASE)
_BOOLEAN_WORDS = frozenset({"AND", "OR", "NOT", "IS", "LIKE", "ILIKE", "GLOB", "MATCH", "BETWEEN",
                            "IN", "ISNULL", "NOTNULL", "EXISTS"})
_COMPARISONS = frozenset({"=", "<>", "!=", "<", "<=", ">", ">="})


#: calls whose value is one of their arguments': a boolean where one of those is (NULLIF:
#: its first)
_PASSING_CALLS = frozenset({"COALESCE", "IFNULL", "NULLIF", "GREATEST", "LEAST"})


def _boolean(toks: list[_Tok]) -> bool:
    """Whether ``toks`` is a boolean expression: a comparison, ``AND``, ``OR``, ``NOT``,
    ``EXISTS``, ``true``, ``false`` at its top level, or ``coalesce()`` (``nullif()``,
    ...) of one."""
    if len(toks) == 1:
        return toks[0].kind == "ref" and toks[0].text in ("TRUE", "FALSE")
    first = toks[0]
    if first.kind == "ref" and first.text in _PASSING_CALLS and len(first.parts) == 1 \
            and toks[1].text == "(" and _closing(toks, 1) == len(toks) - 1:
        args = _split(toks[2:-1], frozenset({","}))
        return any(_boolean(a) for a in (args[:1] if first.text == "NULLIF" else args))
    depth, cases = 0, 0
    for i, tok in enumerate(toks):
        depth += tok.text == "("
        depth -= tok.text == ")"
        if depth:
            continue
        if tok.kind == "ref" and len(tok.parts) == 1:
            if tok.text == "CASE":
                cases += 1
            elif tok.text == "END":
                cases -= 1
            elif cases == 0 and tok.text in _BOOLEAN_WORDS:
                return True
        elif cases == 0 and tok.kind == "op" and tok.text in _COMPARISONS:
            before = toks[i - 1] if i else None
            after = toks[i + 1] if i + 1 < len(toks) else None
            if not ((before is not None and before.stop == tok.start and
                     before.text in ("-", "<", ">")) or
                    (after is not None and after.start == tok.stop and
                     after.text in ("<", ">"))):  # (<<, >>, ->, ->>: no comparison)
                return True
    return False


def _expr(toks: list[_Tok], column: Callable[[str], int]) -> int:
    if not toks:
        return 0
    if _boolean(toks):
        return T.BOOL
    if any(t.kind == "op" and t.text == "||" for t in toks):
        return T.TEXT if _depth0(toks, "||") else _operand(toks, column)
    operands = _split(toks, _ARITH)
    if len(operands) == 1:
        return _operand(toks, column)
    types = [_operand(o, column) for o in operands]
    if any(t not in _NUMBERS for t in types):
        return 0
    if T.FLOAT8 in types:
        return T.FLOAT8
    return T.NUMERIC if T.NUMERIC in types else T.INT8


def _depth0(toks: list[_Tok], op: str) -> bool:
    depth = 0
    for tok in toks:
        depth += tok.text == "("
        depth -= tok.text == ")"
        if depth == 0 and tok.text == op:
            return True
    return False


def _operand(toks: list[_Tok], column: Callable[[str], int]) -> int:
    if toks and toks[0].text in ("-", "+") and len(toks) > 1:
        return _operand(toks[1:], column)
    # a cast at the end: x::type (the type's words after the last top-level ::)
    depth, cast = 0, -1
    for i, tok in enumerate(toks):
        depth += tok.text == "("
        depth -= tok.text == ")"
        if depth == 0 and tok.text == "::":
            cast = i
    if cast > 0:
        words = [t.parts[-1] for t in toks[cast + 1:] if t.kind == "ref"]
        return _sqlite(type_oid(" ".join(words)))
    first = toks[0]
    if len(toks) == 1:
        if first.kind == "num":
            return T.INT8 if first.text.isdigit() and int(first.text) < 2 ** 63 else T.FLOAT8
        if first.kind == "str":
            return T.TEXT
        if first.kind == "ref":
            return column(first.parts[-1]) if first.parts else 0
        return 0
    if first.text == "(" and toks[-1].text == ")" and _closes_at_end(toks):
        return _expr(toks[1:-1], column)
    if first.kind == "ref" and len(first.parts) == 1 and toks[1].text == "(" and \
            toks[-1].text == ")" and _closes_at_end(toks[1:]):
        name, args = first.text, toks[2:-1]
        if name == "CAST":
            at = max((i for i, t in enumerate(args) if t.text == "AS"), default=-1)
            words = [t.parts[-1] for t in args[at + 1:] if t.kind == "ref"]
            return _sqlite(type_oid(" ".join(words))) if at > 0 else 0
        if name in _INTEGER_FUNCTIONS:
            return T.INT8
        if name in _FLOAT_FUNCTIONS:
            return T.FLOAT8
        if name in _TEXT_FUNCTIONS:
            return T.TEXT
        if name in _SAME_FUNCTIONS and args and args[0].text != "DISTINCT" and \
                len(_split(args, frozenset({","}))) == 1:
            found = _expr(args, column)
            return found if name != "ABS" or found in _NUMBERS else 0
    return 0


def _closes_at_end(toks: list[_Tok]) -> bool:
    """Whether the ``(`` at ``toks[0]`` closes at the last token."""
    depth = 0
    for i, tok in enumerate(toks):
        depth += tok.text == "("
        depth -= tok.text == ")"
        if depth == 0:
            return i == len(toks) - 1
    return False
