"""SQL-level ``PREPARE name [(type, ...)] AS statement`` and ``EXECUTE name [(value, ...)]``.

The session keeps a prepared statement with the protocol's named statements (one
namespace, as in PostgreSQL: ``EXECUTE``, ``DEALLOCATE`` and a Close message reach
both). ``EXECUTE`` runs the statement's text with each ``$n`` replaced by the n-th value
expression, in parentheses and cast to its declared type: the statement that runs is one
the user could have typed, checked against the grants as any other.
"""

from __future__ import annotations

import re

from . import _sqltext
from ._engines import StatementError

__all__ = ["execute_text", "parse_execute", "parse_prepare"]

_NAME = r'("(?:[^"]|"")+"|[A-Za-z_]\w*)'
_PREPARE = re.compile(r"\s*PREPARE\s+" + _NAME + r"\s*", re.I)
_EXECUTE = re.compile(r"\s*EXECUTE\s+" + _NAME + r"\s*", re.I)
_PREPARE_SYNTAX = "syntax: PREPARE name [(type, ...)] AS statement"
_EXECUTE_SYNTAX = "syntax: EXECUTE name [(value, ...)]"


def _unquote(name: str) -> str:
    """An identifier's name: a quoted one as written, a bare one in lower case."""
    return name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()


def _parenthesized(text: str) -> tuple[str, str]:
    """(inside, after) of the parenthesis ``text`` starts with (strings and quoted names
    may hold parentheses); 42601 when it is not closed."""
    depth = 0
    for kind, start, end in _sqltext.scan_parens(text):
        if kind == "(":
            depth += 1
        elif kind == ")":
            depth -= 1
            if depth == 0:
                return text[1:start], text[end:].strip()
    raise StatementError("unbalanced parentheses", "42601")


def _split_top_level(text: str) -> list[str]:
    """``text`` split at its commas outside parentheses, strings and quoted names."""
    if not text.strip():
        return []
    parts, depth, pos = [], 0, 0
    for kind, start, end in _sqltext.scan_parens(text):
        depth += (kind == "(") - (kind == ")")
        if kind == "," and depth == 0:
            parts.append(text[pos:start].strip())
            pos = end
    parts.append(text[pos:].strip())
    if not all(parts):
        raise StatementError("an empty item in a parenthesized list", "42601")
    return parts


def parse_prepare(sql: str) -> tuple[str, list[str], str]:
    """(name, declared types, statement) of a ``PREPARE``; 42601 for bad syntax."""
    m = _PREPARE.match(sql)
    if m is None:
        raise StatementError(_PREPARE_SYNTAX, "42601")
    rest, types = sql[m.end():], []
    if rest.startswith("("):
        inner, rest = _parenthesized(rest)
        types = _split_top_level(inner)
    a = re.match(r"AS\s+", rest, re.I)
    body = rest[a.end():].strip().rstrip(";").strip() if a else ""
    if not body:
        raise StatementError(_PREPARE_SYNTAX, "42601")
    head = (_sqltext.first_words(body, 1) or [""])[0]
    if head in ("PREPARE", "EXECUTE", "DEALLOCATE"):
        raise StatementError(f"cannot PREPARE a {head}", "42601")
    return _unquote(m[1]), types, body


def parse_execute(sql: str) -> tuple[str, list[str]]:
    """(name, value expressions) of an ``EXECUTE``; 42601 for bad syntax."""
    m = _EXECUTE.match(sql)
    if m is None:
        raise StatementError(_EXECUTE_SYNTAX, "42601")
    rest, args = sql[m.end():].strip().rstrip(";").strip(), []
    if rest.startswith("("):
        inner, rest = _parenthesized(rest)
        args = _split_top_level(inner)
    if rest.strip().rstrip(";").strip():
        raise StatementError(_EXECUTE_SYNTAX, "42601")
    return _unquote(m[1]), args


#: a numeric literal (PostgreSQL's numeric: an integer cast rounds its halves away from 0)
_NUMERIC_LITERAL = re.compile(
    r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][+-]?[0-9]+)?")


def execute_text(name: str, body: str, nparams: int, type_names: tuple[str, ...],
                 args: list[str], sqlite: bool) -> str:
    """The statement an ``EXECUTE name(args)`` of ``body`` runs."""
    if len(args) != nparams:
        raise StatementError(f'wrong number of parameters for prepared statement "{name}": '
                             f"expected {nparams}, got {len(args)}", "42601")

    def value(n: int) -> str:
        arg = f"({args[n - 1]})"
        declared = type_names[n - 1] if n - 1 < len(type_names) else ""
        if not declared:
            return arg
        if sqlite:  # SQLite's CAST to a date or a boolean would make a number of it
            target = _sqltext.sqlite_cast(declared)
            return _sqltext.cast_sql(arg, target, _NUMERIC_LITERAL.fullmatch(
                args[n - 1].strip()) is not None) if target else arg
        return f"CAST({arg} AS {declared})"

    return _sqltext.substitute(body, value)
