"""Arithmetic PostgreSQL's way on the SQLite engine, read from a statement's text.

SQLite's ``/``, ``%`` and ``mod()`` give NULL for a zero divisor, where PostgreSQL fails
with 22012: :func:`checked_divisors` passes each divisor through the server's function
:data:`DIVISOR_FUNCTION`, which fails so. SQLite holds dates, times and timestamps as
text, which its ``+`` and ``-`` read as the number they start with (``'2024-01-31' + 1``
is 2025): :func:`date_operands` finds the operands of arithmetic that are such values
(typed literals, casts, ``current_date``, SQLite's ``date()``) or columns that may be (the
engine looks up their declared types), for the engine to refuse.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from . import _sqltext
from . import _types as T
from ._paramtypes import _ARITH, _CLOSE, _OPEN, _arith_atom, _closing, _text_cache, _Tok, _tokens

__all__ = ["DIVISOR_FUNCTION", "DateOperands", "checked_divisors", "date_operands"]

#: the SQLite function of the server a divisor passes through (fails with 22012 on zero)
DIVISOR_FUNCTION = "cryptdisk_divisor"

#: SQLite's types of dates and times (as the server describes a declared type or a cast)
DATE_TYPES = frozenset({T.DATE, T.TIME, T.TIMETZ, T.TIMESTAMP, T.TIMESTAMPTZ, T.INTERVAL})
#: the words of a typed literal (``DATE '2024-01-01'``, ``INTERVAL '1 day'``)
_TYPED = frozenset({"DATE", "TIME", "TIMESTAMP", "TIMESTAMPTZ", "INTERVAL"})
#: SQLite's functions that give a date or time as text
_DATE_CALLS = frozenset({"DATE", "TIME", "DATETIME"})
#: the current date or time, as text in SQLite
_NOW = frozenset({"CURRENT_DATE", "CURRENT_TIME", "CURRENT_TIMESTAMP", "LOCALTIME",
                  "LOCALTIMESTAMP"})
#: functions whose result has the type of their first argument
_PASSING = frozenset({"MAX", "MIN", "COALESCE", "IFNULL", "NULLIF"})
#: words after which ``+`` and ``-`` are signs, not operators
_BEFORE_SIGN = frozenset({"SELECT", "WHERE", "AND", "OR", "NOT", "CASE", "WHEN", "THEN",
                          "ELSE", "AS", "IN", "IS", "LIKE", "ILIKE", "ON", "SET", "VALUES",
                          "BY", "HAVING", "RETURNING", "BETWEEN", "DISTINCT", "ALL", "ANY",
                          "SOME", "LIMIT", "OFFSET", "RETURN", "GLOB", "MATCH", "REGEXP",
                          "ESCAPE", "COLLATE", "UNION", "EXCEPT", "INTERSECT", "FROM"})
_SIGNS = frozenset({"+", "-", "~"})


def _word(t: _Tok) -> str | None:
    """The keyword a token is (an unquoted name of one part, upper-cased), else None."""
    return t.text if t.kind == "ref" and len(t.parts) == 1 and t.text[:1] != '"' else None


def _param_at(toks: list[_Tok], j: int) -> bool:
    """Whether ``toks[j]`` starts SQLite's numbered parameter ``?N`` (a lifted literal)."""
    return toks[j].text == "?" and j + 1 < len(toks) and toks[j + 1].kind == "num"


def _atom_end(toks: list[_Tok], j: int) -> int:
    """Where the operand from ``toks[j]`` on ends (:func:`._paramtypes._arith_atom`, and
    ``?N``), -1 for none there."""
    if j < len(toks) and _param_at(toks, j):
        return j + 2
    return _arith_atom(toks, j, len(toks))


@_text_cache
def checked_divisors(sql: str) -> str:
    """``sql`` with each right operand of ``/`` and ``%`` (but a nonzero number), and the
    second argument of ``mod()``, as ``cryptdisk_divisor(operand)``; the text as it is
    where an operand's end is not clear."""
    if "mod" in sql.lower():
        sql = _sqltext.replace_calls(sql, "mod", _mod_call)
    if "/" not in sql and "%" not in sql:
        return sql
    toks = _tokens(sql)
    wraps: list[tuple[int, int, str]] = []  # (start, stop, what closes the call)
    for k, t in enumerate(toks):
        if t.kind != "op" or t.text not in ("/", "%") or k == 0:
            continue
        j = k + 1
        while j < len(toks) and toks[j].kind == "op" and toks[j].text in _SIGNS:
            j += 1
        end = _atom_end(toks, j)
        if end < 0:
            continue
        if end == j + 1 and toks[j].kind == "num" and _number(toks[j].text) != 0:
            continue  # x / 2, x / 0x10: never zero
        dividend = _dividend(toks, k)
        close = ")" if dividend is None else f", {sql[dividend[0]:dividend[1]]})"
        wraps.append((toks[k + 1].start, toks[end - 1].stop, close))
    if not wraps:
        return sql
    marks = sorted([(start, DIVISOR_FUNCTION + "(") for start, _, _ in wraps] +
                   [(stop, close) for _, stop, close in wraps])  # (a divisor may hold another)
    out, pos = [], 0
    for at, mark in marks:
        out += [sql[pos:at], mark]
        pos = at
    out.append(sql[pos:])
    return "".join(out)


def _number(text: str) -> float:
    """The value of a number token (``2``, ``1.5e3``, SQLite's hexadecimal ``0x1F``)."""
    return int(text, 16) if text[:2] in ("0x", "0X") else float(text)


#: what, just before a left operand, makes it only part of the dividend (``x * y / z``)
_NOT_WHOLE = frozenset({"*", "/", "%", "||", "::", ".", "COLLATE"})


def _dividend(toks: list[_Tok], k: int) -> tuple[int, int] | None:
    """Where the left operand of the ``/`` or ``%`` at ``toks[k]`` is in the text, when it
    is one column, parameter, call or bracketed expression (not a subquery) and the whole
    dividend: its divisor's function is given it too, for a NULL dividend is NULL over
    zero in PostgreSQL (``sum(n) / count(*)`` of no rows), not 22012. None otherwise."""
    i = k - 1
    t = toks[i]
    if t.text == ")":
        depth, j = 0, i
        while j >= 0:
            depth += (toks[j].text in _CLOSE) - (toks[j].text in _OPEN)
            if depth == 0:
                break
            j -= 1
        if j < 0 or j + 1 >= i or _word(toks[j + 1]) in ("SELECT", "WITH", "VALUES"):
            return None
        if j > 0 and toks[j - 1].kind == "ref" and _word(toks[j - 1]) not in _BEFORE_SIGN:
            j -= 1  # a call: f(...)
        start = j
    elif t.kind == "param" or (t.kind == "ref" and _word(t) not in _BEFORE_SIGN | {"END"}):
        start = i
    elif t.kind == "num" and i > 0 and toks[i - 1].text == "?":
        start = i - 1  # ?N
    else:
        return None
    if start > 0 and (toks[start - 1].text in _NOT_WHOLE or _word(toks[start - 1]) in (
            "COLLATE", "ESCAPE")):
        return None
    if toks[start].start < 0 or t.stop < 0:
        return None
    return toks[start].start, t.stop


def _mod_call(args: str) -> str:
    """SQLite's ``mod(a, b)`` (its arguments ``args``) with ``b`` checked."""
    parts = _sqltext.split_arguments(args)
    if len(parts) != 2:
        return f"mod({args})"
    return f"mod({parts[0]}, {DIVISOR_FUNCTION}({parts[1]}, {parts[0]}))"


class DateOperands(NamedTuple):
    """What :func:`date_operands` finds of a statement."""

    #: the first typed literal (``DATE '...'``) in it, as written; None for none
    typed_literal: str | None
    #: the first operator with an operand that is a date, time, timestamp or interval (a
    #: typed literal, a cast to one, ``current_date``, ``date(...)``); None for none
    operator: str | None
    #: (operator, column reference's names) for the columns that are operands of
    #: arithmetic: a date if their declared type is one
    columns: tuple[tuple[str, tuple[str, ...]], ...]
    #: every name in the statement, lower-cased (the tables it may read among them)
    names: frozenset[str]
    #: (alias, the name before it) of each ``name [AS] alias`` (``FROM t a``), lower-cased
    aliases: tuple[tuple[str, str], ...] = ()


_NOTHING = DateOperands(None, None, (), frozenset())
_MAY_HAVE = re.compile(r"[-+*/%']")


@functools.lru_cache(maxsize=1024)
def date_operands(sql: str) -> DateOperands:
    """The typed literals of ``sql`` and the date operands of its ``+ - * / %``."""
    if _MAY_HAVE.search(sql) is None:
        return _NOTHING
    toks = _tokens(sql)
    literal = next((sql[t.start:toks[k + 1].stop] for k, t in enumerate(toks[:-1])
                    if _word(t) in _TYPED and toks[k + 1].kind == "str"), None)
    operator: str | None = None
    columns: list[tuple[str, tuple[str, ...]]] = []
    for k, t in enumerate(toks):
        if t.kind != "op" or t.text not in _ARITH:
            continue
        sides = [_right(toks, k + 1)]
        if k > 0 and _ends_operand(toks[k - 1]):
            sides.append(_left(toks, k - 1))
        for side in sides:
            if side is True and operator is None:
                operator = t.text
            elif isinstance(side, tuple):
                columns.append((t.text, side))
    if literal is None and operator is None and not columns:
        return _NOTHING
    names = frozenset(p.lower() for t in toks if t.kind == "ref" for p in t.parts)
    return DateOperands(literal, operator, tuple(columns), names, _aliases(toks))


def _aliases(toks: list[_Tok]) -> tuple[tuple[str, str], ...]:
    """(alias, name) of each name followed by another (``t a``, ``t AS a``): a table's
    alias where the first is a table (a column's alias otherwise, never a qualifier)."""
    found = []
    for k, t in enumerate(toks[:-1]):
        if t.kind != "ref" or _word(t) in _BEFORE_SIGN:
            continue
        j = k + 2 if _word(toks[k + 1]) == "AS" else k + 1
        if j < len(toks) and toks[j].kind == "ref" and len(toks[j].parts) == 1 and \
                (j + 1 == len(toks) or toks[j + 1].text != "("):
            found.append((toks[j].parts[0].lower(), t.parts[-1].lower()))
    return tuple(found)


def _ends_operand(t: _Tok) -> bool:
    """Whether an operator after ``t`` is binary (``t`` ends its left operand)."""
    if t.kind in ("num", "str", "param") or t.text in _CLOSE:
        return True
    return t.kind == "ref" and _word(t) not in _BEFORE_SIGN


#: what an operand is to :func:`date_operands`: True a date, a column's names (a date if
#: declared one), None neither or not known
_Side = bool | tuple[str, ...] | None


def _cast_side(toks: list[_Tok], at: int) -> _Side:
    """A cast to the type named at ``toks[at]``: a date or not."""
    return at < len(toks) and toks[at].kind == "ref" and \
        T.type_oid(toks[at].parts[-1]) in DATE_TYPES


def _call_side(toks: list[_Tok], name: int, close: int) -> _Side:
    """The call ``toks[name](...)`` closed at ``toks[close]``: a date or not."""
    word = _word(toks[name])
    if word in _DATE_CALLS:
        return True
    if word in _PASSING:  # max(d): its first argument's type
        return _inner_side(toks, name + 1, close)
    if word == "CAST":  # CAST(x AS type): the AS at its bracket's depth
        depth = 0
        for j in range(name + 1, close):
            depth += (toks[j].text in _OPEN) - (toks[j].text in _CLOSE)
            if depth == 1 and _word(toks[j]) == "AS":
                return _cast_side(toks, j + 1)
    return None


def _inner_side(toks: list[_Tok], open_: int, close: int) -> _Side:
    """What is in the brackets ``toks[open_]`` to ``toks[close]``: one operand (its first
    when they hold a list), or a scalar subquery's one column."""
    j = open_ + 1
    if _word(toks[j]) == "SELECT":
        j += 1
    end = _atom_end(toks, j)
    if end < 0 or end > close or not (toks[end].text in (",", ")") or
                                       _word(toks[end]) in ("FROM", "AS")):
        return None
    return _atom_side(toks, j, end)


def _atom_side(toks: list[_Tok], j: int, end: int) -> _Side:
    """The operand ``toks[j:end]`` (one atom, without its casts)."""
    t = toks[j]
    word = _word(t)
    if word in _NOW:
        return True
    if word in _TYPED and j + 1 < len(toks) and toks[j + 1].kind == "str":
        return True
    if t.kind == "ref" and end - j > 1 and toks[j + 1].text == "(":
        return _call_side(toks, j, end - 1)
    if t.kind == "ref" and end - j == 1:
        return t.parts
    if t.text == "(" and end - j > 2:
        return _inner_side(toks, j, end - 1)
    return None


def _right(toks: list[_Tok], j: int) -> _Side:
    """The operand of an operator that starts at ``toks[j]``, with its ``::`` casts."""
    while j < len(toks) and toks[j].kind == "op" and toks[j].text in _SIGNS:
        j += 1
    if j >= len(toks):
        return None
    if _word(toks[j]) in _TYPED and j + 1 < len(toks) and toks[j + 1].kind == "str":
        end = j + 2  # (a typed literal: _arith_atom stops at its word)
    else:
        end = _atom_end(toks, j)
    if end < 0:
        return None
    side = _atom_side(toks, j, end)
    while end + 1 < len(toks) and toks[end].text == "::":  # x::date, x::int: the last cast
        side = _cast_side(toks, end + 1)
        end += 2
        while end < len(toks) and toks[end].text in _OPEN:  # varchar(5)
            close = _closing(toks, end)
            if close < 0:
                return None
            end = close + 1
    return side


def _left(toks: list[_Tok], i: int) -> _Side:
    """The operand of an operator that ends at ``toks[i]``."""
    for back in range(i, max(i - 5, 0), -1):  # x::date, x::timestamp with time zone
        if toks[back - 1].text == "::" and toks[back].kind == "ref":
            if all(toks[b].kind == "ref" for b in range(back, i + 1)):
                return _cast_side(toks, back)
            break
    t = toks[i]
    if t.text == ")":
        depth = 0
        for j in range(i, -1, -1):
            depth += (toks[j].text in _CLOSE) - (toks[j].text in _OPEN)
            if depth == 0:
                if j > 0 and toks[j - 1].kind == "ref" and _word(toks[j - 1]) not in _BEFORE_SIGN:
                    return _call_side(toks, j - 1, i)
                return _inner_side(toks, j, i) if i - j > 1 else None
        return None
    if t.kind == "str" and i > 0 and _word(toks[i - 1]) in _TYPED:
        return True
    if t.kind == "ref":
        return True if _word(t) in _NOW else t.parts
    return None
