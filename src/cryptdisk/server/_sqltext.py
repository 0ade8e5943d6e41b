"""Just enough SQL lexing for the server: split statements, find ``$n`` parameters, keywords.

The lexer knows single-quoted strings (with ``''`` and ``E'...'`` backslash
escapes), double-quoted identifiers, ``--`` and ``/* */`` comments and
dollar-quoted strings, so a ``;`` or ``$1`` inside any of them is left alone.
"""

from __future__ import annotations

import functools
import math
import re
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from ..errors import ServerError

__all__ = ["QueryPlan", "bytea_literals", "digit_key", "dollar_strings", "drop_casts",
           "drop_pg_catalog", "first_words", "lift_literals", "placeholders", "query_plan",
           "quote_index_names", "replace_calls", "replace_words", "scan_parens",
           "split_arguments",
           "split_statements", "sqlite_cast", "strip_strings", "substitute",
           "unqualified_parts", "unqualify"]

_DOLLAR_TAG = re.compile(r"\$([A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$")
_PARAM = re.compile(r"\$([0-9]+)")


_WORD = re.compile(r"[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_$\x80-\U0010ffff]*")
#: a number as DuckDB's tokenizer reads one: what follows it starts a token of its own
#: (``1$$...$$``: a number and a dollar-quoted string; ``1E'...'``: a number and an E-string)
_NUMBER = re.compile(r"[0-9](?:_?[0-9]|\.|[eE][+-]?[0-9])*")


def _ident(c: str) -> bool:
    return c.isalnum() or c == "_"


def _scan(sql: str, words: bool = False) -> Iterator[tuple[str, int, int]]:
    """Yield (kind, start, end) for ';', parameters, quoted parts ("quoted": strings,
    quoted identifiers, comments) and, with ``words``, bare words."""
    i, n = 0, len(sql)
    after = -1  # where the last number or parameter ended: a token starts there
    while i < n:
        c = sql[i]
        start = i
        if c == "'":
            escaped = i > 0 and sql[i - 1] in "eE" and (i < 2 or not _ident(sql[i - 2])
                                                         or i - 1 == after)
            j = i + 1
            while True:
                if j >= n:
                    raise ServerError("unterminated quoted string")
                if escaped and sql[j] == "\\":
                    j += 2
                    continue
                if sql[j] == "'":
                    if j + 1 < n and sql[j + 1] == "'":
                        j += 2
                        continue
                    break
                j += 1
            i = j + 1
            after = i  # (what follows a string, name or comment starts a token)
            yield "quoted", start, i
        elif c == '"':
            j = sql.find('"', i + 1)
            while j >= 0 and j + 1 < n and sql[j + 1] == '"':
                j = sql.find('"', j + 2)
            if j < 0:
                raise ServerError("unterminated quoted identifier")
            i = j + 1
            after = i  # (what follows a string, name or comment starts a token)
            yield "quoted", start, i
        elif c == "-" and sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
            after = i  # (what follows a string, name or comment starts a token)
            yield "quoted", start, i
        elif c == "/" and sql.startswith("/*", i):
            depth, j = 1, i + 2
            while depth:
                if j >= n:
                    raise ServerError("unterminated /* comment")
                if sql.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif sql.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            i = j
            after = i  # (what follows a string, name or comment starts a token)
            yield "quoted", start, i
        elif c == "$":
            prev_ident = i > 0 and _ident(sql[i - 1]) and i != after
            m = _PARAM.match(sql, i)
            if m and not prev_ident:
                yield "param", i, m.end()
                # (DuckDB reads $ and then a number: $1e5 is $ and 1e5)
                i = after = _NUMBER.match(sql, i + 1).end()  # type: ignore[union-attr]
                continue
            t = _DOLLAR_TAG.match(sql, i)
            if t and not prev_ident:
                end = sql.find(t.group(0), t.end())
                if end < 0:
                    raise ServerError("unterminated dollar-quoted string")
                i = after = end + len(t.group(0))
                yield "quoted", start, i
            else:
                i += 1
        elif c == ";":
            yield "semicolon", i, i + 1
            i += 1
        elif c.isdigit() and c.isascii() and (i == 0 or i == after or not (
                _ident(sql[i - 1]) or sql[i - 1] == "$")):
            i = after = _NUMBER.match(sql, i).end()  # type: ignore[union-attr]
        elif (c.isalpha() or c == "_") and (i == 0 or i == after or not (
                sql[i - 1].isalnum() or sql[i - 1] in "_$")):
            m = _WORD.match(sql, i)
            end = m.end() if m else i + 1
            if words and m and (i == 0 or sql[i - 1] != "."):
                yield "word", i, end
            i = end
        else:
            i += 1


def split_statements(sql: str) -> list[str]:
    """The statements of a simple Query, without empty ones."""
    single = _single_statement(sql)
    if single is not None:
        return single
    out, start = [], 0
    for kind, s, e in _scan(sql):
        if kind == "semicolon":
            # a trigger's body (CREATE TRIGGER ... BEGIN ...; ...; END) holds semicolons
            words = first_words(sql[start:s], 4)
            if "TRIGGER" in words and words[0] == "CREATE" and not re.search(
                    r"\bEND\s*$", _strip_comments(sql[start:s]), re.I):
                continue
            out.append(sql[start:s])
            start = e
    out.append(sql[start:])
    return [st.strip() for st in out if _strip_comments(st).strip()]


_PLAIN = re.compile(r"(?:[^'\"$;/-]++|-(?!-)|/(?!\*))*+;?\s*")


def _single_statement(sql: str) -> list[str] | None:
    """The common case without a scan: no quotes, comments or ``$``, at most a final ``;``
    (and not a CREATE, which may be a trigger); None for anything else."""
    if _PLAIN.fullmatch(sql) is None:
        return None
    text = sql.strip()
    if text.endswith(";"):
        text = text[:-1].rstrip()
    if text[:6].upper() == "CREATE":
        return None
    return [text] if text else []


_COMMENT_MARK = re.compile(r"--|/\*|\*/")


def _strip_comments(sql: str) -> str:
    """``sql`` with each comment a space: ``/* ... */`` nested, as DuckDB reads them."""
    if "--" not in sql and "/*" not in sql:
        return sql
    out, pos, depth, at = [], 0, 0, 0
    while (m := _COMMENT_MARK.search(sql, at)) is not None:
        mark, at = m.group(), m.end()
        if depth == 0 and mark == "--":
            out.append(sql[pos:m.start()] + " ")
            end = sql.find("\n", at)
            pos = at = len(sql) if end < 0 else end
        elif mark == "/*":
            if depth == 0:
                out.append(sql[pos:m.start()] + " ")
            depth += 1
        elif mark == "*/" and depth:
            depth -= 1
            if depth == 0:
                pos = at
    out.append(sql[pos:] if depth == 0 else "")
    return "".join(out)


def placeholders(sql: str) -> int:
    """The highest ``$n`` the statement uses (0 for none)."""
    return max((int(sql[s + 1:e]) for k, s, e in _scan(sql) if k == "param"), default=0)


def substitute(sql: str, replace: Callable[[int], str]) -> str:
    """``sql`` with every ``$n`` replaced by ``replace(n)``."""
    out, pos = [], 0
    for kind, s, e in _scan(sql):
        if kind == "param":
            out.append(sql[pos:s])
            out.append(replace(int(sql[s + 1:e])))
            pos = e
    out.append(sql[pos:])
    return "".join(out)


def strip_strings(sql: str) -> str:
    """``sql`` with its strings, quoted identifiers and comments blanked out."""
    out, pos = [], 0
    for kind, s, e in _scan(sql):
        if kind == "quoted":
            out.append(sql[pos:s])
            out.append(" " * (e - s))
            pos = e
    out.append(sql[pos:])
    return "".join(out)


#: a cast to regclass after a string literal (``::regclass``, ``::pg_catalog.regclass``)
_REGCLASS_CAST = re.compile(r"\s*::\s*(?:\"?pg_catalog\"?\s*\.\s*)?\"?regclass\"?(?![\w$])",
                            re.I)


def regclass_literals(sql: str) -> list[tuple[int, int]]:
    """(start, end) of each string literal of ``sql`` cast to regclass (``'t'::regclass``),
    outside strings, quoted names and comments."""
    return [(s, e) for kind, s, e in _scan(sql)
            if kind == "quoted" and sql[s] == "'" and _REGCLASS_CAST.match(sql, e)]


_EMPTY_CALL = re.compile(r"\s*\(\s*\)")


def replace_words(sql: str, replace: Callable[[str], str | None],
                  empty_call: bool = False) -> str:
    """``sql`` with each bare word (not in a string, quoted identifier or comment, not
    after a ``.``) replaced by ``replace(word)`` unless that returns None. ``empty_call``:
    an empty argument list right after a replaced word (``current_role()``) goes with it."""
    out, pos = [], 0
    for kind, s, e in _scan(sql, words=True):
        if kind == "word" and s >= pos:
            new = replace(sql[s:e])
            if new is not None:
                out.append(sql[pos:s])
                out.append(new)
                pos = e
                if empty_call and (m := _EMPTY_CALL.match(sql, e)) is not None:
                    pos = m.end()
    out.append(sql[pos:])
    return "".join(out)


_CAST = re.compile(
    r"\s*::\s*(\"[^\"]+\"|[A-Za-z_][A-Za-z0-9_]*(?:\s+(?:PRECISION|VARYING|WITH(?:OUT)?\s+TIME"
    r"\s+ZONE)\b)*)(\s*\(\s*\d+\s*(?:,\s*\d+\s*)?\))?(?:\s*\[\s*\])*", re.I)
#: the SQLite function, registered on the server's SQLite connections, of PostgreSQL's
#: cast to an integer type: ``cryptdisk_int(x, bytes, numeric)`` (SQLite's CAST truncates
#: a float, reads '3.7' and 'abc' as 3 and 0 and clamps what does not fit)
INT_CAST_FUNCTION = "cryptdisk_int"
#: the SQLite function, registered on the server's SQLite connections, of PostgreSQL's
#: cast of text to an interval: the text PostgreSQL writes for it (see interval_literal)
INTERVAL_CAST_FUNCTION = "cryptdisk_interval"
#: the SQLite function, registered on the server's SQLite connections, of PostgreSQL's
#: date input of a parameter written into a DATE column: its ISO text (YYYY-MM-DD)
DATE_INPUT_FUNCTION = "cryptdisk_date"
#: the SQLite function, registered on the server's SQLite connections, of PostgreSQL's
#: substr(s, start [, count]) (SQLite's counts a start below 1 from the end)
SUBSTR_FUNCTION = "cryptdisk_substr"
#: the integer types' widths in bytes, as :func:`cast_sql`'s targets name them
INT_CAST_BYTES = {"INT2": 2, "INT4": 4, "INT8": 8}
#: :func:`cast_sql`'s target for each number type's name
NUMBER_CASTS = {**dict.fromkeys(("int", "int4", "integer"), "INT4"),
                **dict.fromkeys(("int2", "smallint"), "INT2"),
                **dict.fromkeys(("int8", "bigint"), "INT8"),
                **dict.fromkeys(("real", "float", "float4", "float8", "double precision"),
                                "REAL")}


def cast_sql(operand: str, target: str, numeric: bool = False, stored: bool = False) -> str:
    """SQLite's text of ``operand`` cast to ``target``: SQLite's ``CAST(... AS target)``,
    or for ``INT2``, ``INT4`` and ``INT8`` the call of :data:`INT_CAST_FUNCTION`, which
    answers as PostgreSQL's cast to ``smallint``, ``integer`` and ``bigint`` does
    (``numeric``: the operand is a numeric literal, whose halves round away from zero).
    ``stored``: in a definition SQLite keeps (a view, trigger, CHECK, generated column),
    SQLite's CAST for those too, so that it reads where the server's function does not
    exist (``cryptdisk.sqlite.connect``, a decrypted copy)."""
    size = INT_CAST_BYTES.get(target)
    if size is None or stored:
        return f"CAST({operand} AS {target})"
    return f"{INT_CAST_FUNCTION}({operand}, {size}, {int(numeric)})"


def sqlite_cast(type_name: str) -> str | None:
    """:func:`cast_sql`'s target for a number type's name (``INT2``, ``INT4``, ``INT8``,
    ``REAL``); None for the others, which SQLite's CAST would make a number of."""
    return NUMBER_CASTS.get(" ".join(type_name.lower().split()))


def scan_parens(sql: str) -> Iterator[tuple[str, int, int]]:
    """(``(``, ``)`` or ``,``, start, end) for each outside strings, quoted names and
    comments."""
    pos = 0
    for kind, s, e in _scan(sql):
        if kind == "quoted":
            for m in re.finditer(r"[(),]", sql[pos:s]):
                yield m.group(), pos + m.start(), pos + m.end()
            pos = e
    for m in re.finditer(r"[(),]", sql[pos:]):
        yield m.group(), pos + m.start(), pos + m.end()


def _word_char(c: str) -> bool:  # (a character of a name or a number)
    return c.isalnum() or c in "_$"


def drop_casts(sql: str, stored: bool = False) -> str:
    """``sql`` for SQLite, which has no ``::`` casts: a cast of a parameter (``$1::BIGINT``,
    as SQLAlchemy writes them) is dropped, the parameter's value being of its type already;
    a cast of a string literal becomes SQLite's ``CAST(... AS REAL)`` for the float types,
    :data:`INT_CAST_FUNCTION`'s call for the integer ones (:func:`cast_sql`: as PostgreSQL,
    ``'abc'::int`` fails with 22P02 where SQLite's CAST gives 0), and is dropped for the
    others (``'r'::VARCHAR``; SQLite's CAST to DATE or BOOLEAN would make a number of it).
    Other casts are left for SQLite to refuse. ``stored``: see :func:`cast_sql`."""
    if "::" not in sql:
        return sql
    out, pos = [], 0
    for kind, s, e in _scan(sql):
        if kind not in ("param", "quoted") or (kind == "quoted" and sql[s] != "'"):
            continue  # (a quoted name or a comment)
        m = _CAST.match(sql, e)
        if m is None:
            continue
        first = m
        while (more := _CAST.match(sql, m.end())) is not None:  # $1::int8::text
            m = more
        if first is not m and kind == "quoted" and sql[s] == "'" and not stored and \
                first[2] is None and sqlite_cast(first[1]) == "REAL":
            out.append(sql[pos:s])  # '2.5'::float8::int: the float, cast on from there
            out.append(f"CAST({float_literal(sql[s:e], first[1])} AS REAL)")
            pos = first.end()
            continue
        target = sqlite_cast(m[1]) \
            if kind == "quoted" and m[2] is None and "[" not in m.group() else None
        if s > pos and sql[s - 1] in "xX" and (s < 2 or not _word_char(sql[s - 2])):
            s -= 1  # (a blob's literal, X'01', as the server writes '\x01'::bytea)
        out.append(sql[pos:s])
        if target == "REAL" and kind == "quoted" and sql[s] == "'" and not stored:
            out.append(float_literal(sql[s:e], m[1]))  # 'NaN'::float8, 'abc'::float8
        elif target:
            out.append(cast_sql(sql[s:e], target, stored=stored))
        elif kind == "quoted" and m[1].lower() in ("bool", "boolean") and not stored \
                and sql[s] == "'":  # 'yes'::boolean: 1, as PostgreSQL's boolean input
            out.append(bool_literal(sql[s:e]))
        elif m[1].lower() == "interval" and not stored:  # '90 minutes'::interval, $1::interval
            out.append(interval_literal(sql[s:e]) if kind == "quoted"
                       else f"{INTERVAL_CAST_FUNCTION}({sql[s:e]})")
        else:
            out.append(sql[s:e])
        pos = m.end()
    if not out:
        return sql
    out.append(sql[pos:])
    return "".join(out)


class InputError(ValueError):
    """A literal its type's input refuses: ``args`` are (message, SQLSTATE)."""


def bool_literal(literal: str) -> str:
    """A string literal cast to boolean (``'yes'``) as SQLite's ``1`` or ``0``, read as
    PostgreSQL's boolean input reads it (``t``, ``true``, ``yes``, ``on``, ``1`` and
    their false ones, any case, a prefix that tells them apart, spaces around); raises
    :class:`InputError` (22P02) for other text."""
    return bool_input(literal[1:-1].replace("''", "'"))


def bool_input(body: str) -> str:
    """Text read by PostgreSQL's boolean input (see :func:`bool_literal`): ``1`` or ``0``."""
    word = body.strip(" \t\n\r\v\f").lower()
    if word and ("true".startswith(word) or "yes".startswith(word) or word == "1"
                 or (len(word) >= 2 and "on".startswith(word))):
        return "1"
    if word and ("false".startswith(word) or "no".startswith(word) or word == "0"
                 or (len(word) >= 2 and "off".startswith(word))):
        return "0"
    raise InputError(f'invalid input syntax for type boolean: "{body}"', "22P02")


_PG_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?0[xX][0-9a-fA-F]+",
                       re.ASCII)  # (strtod's digits are ASCII: not '\u0663')
_PG_FLOAT_WORDS = {"nan": "NULL", "infinity": "9e999", "+infinity": "9e999", "inf": "9e999",
                   "+inf": "9e999", "-infinity": "-9e999", "-inf": "-9e999"}


def float_literal(literal: str, type_name: str) -> str:
    """A string literal cast to a float type (``'1.5'::float8``) as SQLite's number,
    read as PostgreSQL's float input reads it (spaces around, ``Infinity``, ``-inf``,
    ``NaN``: SQLite keeps NaN as NULL); raises :class:`InputError` for other text (22P02,
    where SQLite's CAST would give 0) and for a number out of the type's range (22003)."""
    return float_input(literal[1:-1].replace("''", "'"), type_name)


def float_input(body: str, type_name: str) -> str:
    """Text read by PostgreSQL's float input (see :func:`float_literal`): SQLite's number."""
    word = body.strip(" \t\n\r\v\f")
    four = type_name.lower() in ("real", "float4")
    name = "real" if four else "double precision"
    if word.lower() in _PG_FLOAT_WORDS:
        return _PG_FLOAT_WORDS[word.lower()]
    if _PG_FLOAT.fullmatch(word) is None:
        raise InputError(f'invalid input syntax for type {name}: "{body}"', "22P02")
    try:
        value = float.fromhex(word) if "x" in word.lower() else float(word)
    except OverflowError:  # (a hexadecimal one past float8's range)
        value = math.inf
    try:  # float4: what strtof makes of it (FLT_MAX's 3.4028235e38, 8e-46 as 1e-45)
        single = struct.unpack("f", struct.pack("f", value))[0] if four else value
    except OverflowError:
        single = math.inf
    if math.isinf(single) or (single == 0 and any(c in "123456789" for c in
                                                   word.lower().split("e")[0])):
        raise InputError(f'"{body}" is out of range for type {name}', "22003")
    return repr(value)


def interval_literal(literal: str) -> str:
    """A string literal (``'90 minutes'``) of an interval as the literal of PostgreSQL's
    text of it (``'01:30:00'``), without the ``+`` after a negative part, as a parameter's
    is stored (:func:`._types.decode_param`): one interval, one text; raises
    :class:`._intervalin.IntervalError` for text PostgreSQL does not read as one."""
    from ._intervalin import parse_interval
    from ._types import interval_text

    body = literal[1:-1].replace("''", "'")
    if literal[:1] in "eE":
        return literal  # (an escape string: left as it is)
    return "'" + interval_text(*parse_interval(body), plus=False) + "'"


_INDEX_WORD = re.compile(r"(?<![\w$])index(?![\w$])", re.I)
_INDEX_KEYWORD_AFTER = re.compile(r"\b(?:CREATE|UNIQUE|DROP)\s+$", re.I)


def quote_index_names(sql: str) -> str:
    """``sql`` for SQLite with a bare ``index`` that names a column or table quoted
    (``"index"``): PostgreSQL does not reserve the word, so its clients leave it bare
    (pandas' ``to_sql`` names its index column so), and SQLite's parser reads it as its
    keyword. The keyword (after ``CREATE``, ``UNIQUE`` or ``DROP``) stays as it is."""
    if "ndex" not in sql and "NDEX" not in sql:
        return sql
    out, pos = [], 0
    spans = [(s, e) for kind, s, e in _scan(sql) if kind == "quoted"]
    for start, end in [*zip([0, *(e for _, e in spans)], [*(s for s, _ in spans), len(sql)],
                            strict=True)]:
        for m in _INDEX_WORD.finditer(sql, start, end):
            if _INDEX_KEYWORD_AFTER.search(sql, 0, m.start()) is None:
                out.append(sql[pos:m.start()])
                out.append('"index"')
                pos = m.end()
    if not out:
        return sql
    out.append(sql[pos:])
    return "".join(out)


_QUALIFIED = re.compile(r'\s*\.\s*(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)(\s*\()?')
_BEFORE_TYPE = re.compile(r"(?:::|\bAS)\s*$", re.I)
_PG_CATALOG = re.compile("pg_catalog", re.I)


def drop_pg_catalog(sql: str) -> str:
    """``sql`` without ``pg_catalog.`` before a function's or a type's name:
    ``pg_catalog.lower(b)``, ``$1::pg_catalog.int8``, ``CAST(x AS "pg_catalog"."text")``
    (as drivers write them) become ``lower(b)``, ``$1::int8``, ``CAST(x AS "text")``; the
    engines have PostgreSQL's functions and types, if any, under their bare names. A
    table's qualified name (``pg_catalog.pg_class``) is left alone."""
    if _PG_CATALOG.search(sql) is None:
        return sql
    out, pos = [], 0
    for kind, s, e in _scan(sql, words=True):
        if kind == "word":
            if sql[s:e].lower() != "pg_catalog":
                continue
        elif kind != "quoted" or sql[s:e] != '"pg_catalog"':
            continue
        if sql[:s].rstrip().endswith("."):
            continue
        m = _QUALIFIED.match(sql, e)
        if m is None or not (m[1] or _BEFORE_TYPE.search(sql, 0, s)):
            continue
        out.append(sql[pos:s])
        pos = sql.index(".", e) + 1
    if not out:
        return sql
    out.append(sql[pos:])
    return "".join(out)


_BYTEA_NAME = r'(?:(?:pg_catalog|"pg_catalog")\s*\.\s*)?(?:bytea|"bytea")'
_BYTEA_AFTER = re.compile(rf"\s*::\s*{_BYTEA_NAME}(?![\w$])(?!\s*\[)", re.I)
_BYTEA_AS = re.compile(rf"\s*AS\s+{_BYTEA_NAME}\s*\)", re.I)
_CAST_OPEN = re.compile(r"(?<![\w$])CAST\s*\(\s*$", re.I)
_BYTEA_BEFORE = re.compile(rf'(?<![\w$."]){_BYTEA_NAME}\s*$', re.I)
_E_ESCAPES = {"\\": "\\", "'": "'", "n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


def bytea_literals(sql: str, spell: Callable[[str], str]) -> str:
    """``sql`` with each string literal PostgreSQL reads as a ``bytea`` (``'\\x0102'::bytea``,
    ``CAST('...' AS bytea)``, ``bytea '...'``; also ``E'...'`` and ``$$...$$``) written
    as ``spell`` of the literal's text (its value as PostgreSQL reads the string, before
    ``bytea``'s input function reads it): the engines read a string cast to a blob their
    own way (DuckDB takes ``\\x01`` as one escaped byte and the rest as text, SQLite's CAST
    makes a number of it), so the literal is replaced by the engine's own spelling of the bytes."""
    if "bytea" not in sql.lower():
        return sql
    out, pos = [], 0
    for kind, s, e in _scan(sql):
        if kind != "quoted" or sql[s] not in "'$":
            continue
        dollar = sql[s] == "$"  # $$...$$, $tag$...$tag$: the text between the tags
        escaped = not dollar and s > 0 and sql[s - 1] in "eE" and (
            s < 2 or not _ident(sql[s - 2]))
        start = s - 1 if escaped else s
        if (m := _BYTEA_AFTER.match(sql, e)) is not None:
            end = m.end()
        elif (m := _BYTEA_AS.match(sql, e)) is not None and \
                (c := _CAST_OPEN.search(sql, pos, start)) is not None:
            start, end = c.start(), m.end()
        elif not escaped and (b := _BYTEA_BEFORE.search(sql, pos, s)) is not None:
            start, end = b.start(), e
        else:
            continue
        body = sql[s + 1:e - 1].replace("''", "'")
        if dollar:
            tag = sql.index("$", s + 1) + 1 - s
            body = sql[s + tag:e - tag]
        elif escaped:
            body = _unescape(sql[s + 1:e - 1])
        out.append(sql[pos:start])
        out.append(spell(body))
        pos = end
    if not out:
        return sql
    out.append(sql[pos:])
    return "".join(out)


def _unescape(body: str) -> str:
    """The value of an ``E'...'`` string's ``body``: ``\\\\``, ``\\'``, ``''`` and the
    control escapes (``\\n``, ``\\t``, ...); other escapes are refused."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            nxt = body[i + 1:i + 2]
            if nxt not in _E_ESCAPES:
                raise ServerError(f"the escape \\{nxt} in an E'' string cast to bytea is not "
                                  "supported: write the bytes as '\\x...'::bytea")
            out.append(_E_ESCAPES[nxt])
            i += 2
        elif c == "'":  # ''
            out.append("'")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def standard_strings(sql: str) -> str:
    """``sql`` with each escape string (``E'a\\tb'``) written as the standard string of its
    value (``'a<tab>b'``), as PostgreSQL reads it: ``\\b \\f \\n \\r \\t``, an octal
    (``\\101``), hex (``\\x41``) or Unicode (``\\u00e9``, ``\\U0001F600``) code, any other
    character after a backslash itself (``\\\\``, ``\\'``), ``''`` a quote; for an engine
    that has no escape strings (SQLite). A NUL (``\\0``) fails: PostgreSQL's text holds
    none."""
    if "'" not in sql or ("e'" not in sql and "E'" not in sql):
        return sql
    out, pos = [], 0
    for kind, s, e in _scan(sql):
        if kind != "quoted" or sql[s] != "'" or s == 0 or sql[s - 1] not in "eE" or (
                s >= 2 and _ident(sql[s - 2]) and not _number_before(sql, s - 1)):
            continue
        value = _escape_string_value(sql[s + 1:e - 1])
        out.append(sql[pos:s - 1])
        out.append((" '" if s >= 2 and _ident(sql[s - 2]) else "'")
                   + value.replace("'", "''") + "'")
        pos = e
    if not out:
        return sql
    out.append(sql[pos:])
    return "".join(out)


#: where a dollar quote may open (a $ then no digit); $1 is a parameter
_DOLLAR_OPEN = re.compile(r"\$[^0-9]")


def dollar_strings(sql: str) -> str:
    """``sql`` with each dollar-quoted string (``$$it's$$``, ``$x$...$x$``) written as the
    standard string of its text (``'it''s'``), for an engine that has none (SQLite reads
    ``$x`` as a named parameter)."""
    if "$" not in sql or _DOLLAR_OPEN.search(sql) is None:  # ($1 alone: nothing to do)
        return sql
    out, pos = [], 0
    for kind, s, e in _scan(sql):
        if kind != "quoted" or sql[s] != "$":
            continue
        tag = sql.index("$", s + 1) + 1 - s
        out.append(sql[pos:s])
        out.append((" '" if s > 0 and _ident(sql[s - 1]) else "'")
                   + sql[s + tag:e - tag].replace("'", "''") + "'")
        pos = e
    if not out:
        return sql
    out.append(sql[pos:])
    return "".join(out)


def _number_before(sql: str, i: int) -> bool:
    """Whether the text before ``i`` ends in a number (``1E'...'``: a number, then an
    escape string), not a name (``nameE'...'``)."""
    m = re.search(r"[\w$]+$", sql[:i])
    return m is not None and m.group()[0].isdigit()


_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|u([0-9A-Fa-f]{4})|"
                     r"U([0-9A-Fa-f]{8})|(.))|''", re.S)


def _escape_string_value(body: str) -> str:
    """The value of the escape string ``E'body'`` (see :func:`standard_strings`): octal
    and hex escapes are bytes, the rest UTF-8; bytes that are not UTF-8, or a NUL, fail
    (ServerError), as in PostgreSQL."""
    out, pos = bytearray(), 0
    for m in _ESCAPE.finditer(body):
        out += body[pos:m.start()].encode()
        pos = m.end()
        octal, hexa, u4, u8, other = m.groups()
        if m.group() == "''":
            out += b"'"
        elif other is not None:
            out += _E_ESCAPES.get(other, other).encode()
        elif octal or hexa:
            out.append(int(octal, 8) & 0xFF if octal else int(hexa, 16))
        else:
            code = int(u4 or u8, 16)
            if code == 0 or code > 0x10FFFF or 0xD800 <= code < 0xE000:
                raise ServerError(f"invalid Unicode escape value in an E'' string: "
                                  f"{m.group()}")
            out += chr(code).encode()
    out += body[pos:].encode()
    if 0 in out:
        raise ServerError('invalid byte sequence for encoding "UTF8": 0x00')
    try:
        return out.decode()
    except UnicodeDecodeError as exc:
        raise ServerError('invalid byte sequence for encoding "UTF8": 0x'
                          + out[exc.start:exc.start + 1].hex()) from None


def replace_calls(sql: str, name: str, template: str | Callable[[str], str]) -> str:
    """``sql`` with each call of the function ``name`` (any case, unqualified) written as
    ``template`` with ``{}`` for its argument text: for a PostgreSQL function an engine
    lacks (``quote_literal(x)``). Strings, quoted names and comments are left alone."""
    if name not in sql.lower():
        return sql
    out, pos, depth_from = [], 0, -1
    spans = list(_scan(sql, words=True))
    for i, (kind, s, e) in enumerate(spans):
        if kind != "word" or sql[s:e].lower() != name or s < depth_from:
            continue
        m = re.compile(r"\s*\(").match(sql, e)
        if m is None:
            continue
        depth, j = 1, m.end()
        quoted = [(qs, qe) for k, qs, qe in spans[i + 1:] if k == "quoted"]
        while j < len(sql) and depth:
            q = next(((qs, qe) for qs, qe in quoted if qs == j), None)
            if q is not None:
                j = q[1]
                continue
            depth += (sql[j] == "(") - (sql[j] == ")")
            j += 1
        if depth:
            return sql
        out.append(sql[pos:s])
        args = sql[m.end():j - 1]
        out.append(template.format(args) if isinstance(template, str) else template(args))
        pos = depth_from = j
    if not out:
        return sql
    out.append(sql[pos:])
    return "".join(out)


def split_arguments(args: str) -> list[str]:
    """A call's argument text split at its top-level commas (outside parentheses, strings,
    quoted names and comments), each stripped."""
    parts, depth, pos = [], 0, 0
    for c, s, _e in scan_parens(args):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif depth == 0:
            parts.append(args[pos:s].strip())
            pos = s + 1
    parts.append(args[pos:].strip())
    return parts


#: the schemas clients put before a table's name: PostgreSQL's default, DuckDB's and SQLite's
DEFAULT_SCHEMAS = frozenset({"public", "main"})
_DOTTED = re.compile(r'\s*\.\s*("(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)')


def unqualify(sql: str, tables: Callable[[], Iterable[str]] | None = None,
              schemas: frozenset[str] = DEFAULT_SCHEMAS) -> str:
    """``sql`` with the default schema dropped from the names of tables: ``public.t``,
    ``main.t``, ``"public"."T"``, ``PUBLIC.t`` become ``t``, ``"T"``, ``t`` (and the column
    ``public.t.c`` becomes ``t.c``). A schema counts written bare (any case) or quoted in
    lower case; not after a dot (``db.public.t`` stays). With ``tables`` (called once, and
    only when the text has such a name: the database's tables, any case), only a name in
    it loses its schema; without, every such name does."""
    lower = sql.lower()
    if not any(s in lower for s in schemas):
        return sql
    known: set[str] | None = None
    out, pos = [], 0
    for kind, s, e in _scan(sql, words=True):
        if kind == "word":
            schema = sql[s:e].lower()
        elif kind == "quoted" and sql[s] == '"':
            schema = sql[s + 1:e - 1]
        else:
            continue
        if schema not in schemas or sql[:s].rstrip().endswith("."):
            continue
        m = _DOTTED.match(sql, e)
        if m is None:
            continue
        name = m[1]
        name = name[1:-1].replace('""', '"') if name.startswith('"') else name
        if tables is not None:
            if known is None:
                known = {t.lower() for t in tables()}
            if name.lower() not in known:
                continue
        out.append(sql[pos:s])
        pos = m.start(1)
    if not out:
        return sql
    out.append(sql[pos:])
    return "".join(out)


def unqualified_parts(parts: list[str], schemas: frozenset[str] = DEFAULT_SCHEMAS) -> list[str]:
    """A name's parts (unquoted) without a leading default schema (see :func:`unqualify`)."""
    return parts[1:] if len(parts) == 2 and parts[0] in schemas else parts


def first_words(sql: str, count: int = 2) -> list[str]:
    """The statement's first ``count`` words, upper-cased, comments skipped."""
    if count <= 0:
        return []
    # one cache entry serves the 1- and 2-word questions asked of each statement
    return list(_first_words(sql, max(count, 2))[:count])


@functools.lru_cache(maxsize=64)  # a statement is asked about several times on its way
def _first_words(sql: str, count: int) -> tuple[str, ...]:
    if count == 2 and "-" not in sql and "/" not in sql:
        m = _TWO_WORDS.match(sql)  # the common case, in one match: "SELECT abalance ..."
        if m is not None:
            return m[1].upper(), m[2].upper()
    out = []
    if count > 0:
        for m in _ALPHA.finditer(_strip_comments(sql)):
            out.append(m.group().upper())
            if len(out) == count:
                break
    return tuple(out)


_ALPHA = re.compile(r"[A-Za-z_]+")
#: two words with only white space before and between them: the first two _ALPHA runs
_TWO_WORDS = re.compile(r"\s*([A-Za-z_]+)\s+([A-Za-z_]+)")


# --- integer literals as parameters ---------------------------------------------------------

#: texts never lifted: quotes, comments, parameters of any SQLite spelling, bracketed or
#: backquoted identifiers, several statements, exponents (``1e-5``)
_NO_LIFT = re.compile(r"['\"$;?:@#\[`]|--|/\*|\d[eE]")
_LIFT_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*|[()]")
#: an integer literal: not part of a name, a decimal or a hex literal
_INTEGER = re.compile(r"(?<![\w.])(\d{1,18})(?![\w.])")
#: words after which a literal's position may name a result column (ORDER BY 1), a
#: column's name may come from the text (RETURNING, a subquery's select list), or the
#: plan may need the literal: a region holding one is not lifted
_LIFT_STOP = frozenset({"SELECT", "ORDER", "GROUP", "HAVING", "WINDOW", "UNION", "INTERSECT",
                        "EXCEPT", "LIMIT", "OFFSET", "RETURNING", "VALUES", "ON", "FROM",
                        "WITH", "MATCH", "LIKE", "GLOB", "REGEXP"})
_OPERATORS = frozenset("=<>+-*/%")
_COMPARISONS = frozenset("=<>")
_MAX_LIFTED = 64


def lift_literals(sql: str) -> tuple[str, tuple[int, ...]] | None:
    """One SQLite statement with its integer literals as parameters, where that cannot
    change what it does: ``(text with ?1, ?2, ..., values)``, or None.

    Lifted are the integers compared with ``=``, ``<``, ``>`` (and ``<=``, ``<>``, ...)
    in the ``WHERE`` clause of a ``SELECT``, ``DELETE`` or ``UPDATE``, those after any
    operator (also ``+``, ``-``, ``*``, ``/``, ``%``) in an ``UPDATE``'s ``SET``, and
    the elements of an ``INSERT``'s one ``VALUES`` row that are integers. A bound integer
    compares, converts and computes as the literal does, and SQLite prepares again where
    a value can change the plan (partial indexes, ``LIKE``); an index on an expression
    is matched against the text, whose ``WHERE`` keeps the literals inside expressions
    (``a + 5 = ?1``). Nothing is lifted from a text with strings, quoted names, comments or
    parameters, or with a subquery, a join, ``RETURNING``, ``ORDER BY``, ``LIMIT`` and the
    like (where a literal can name a column, or its text be a column's name). Statements
    of one shape then share one prepared statement.

    Which integers are lifted depends on the text around them only: it is worked out once
    per such text (the statement with its digits blanked out) and remembered."""
    text = sql.encode("utf-8")
    key = text.translate(_DIGIT_MARKS)  # digits blanked out (0xFF: never in UTF-8), in C
    if key == text:
        return None
    plan = _LIFT_PLANS.get(key, _UNKNOWN)
    if plan is _UNKNOWN:
        plan = _lift_plan(sql)
        if len(_LIFT_PLANS) >= _MAX_PLANS:
            _LIFT_PLANS.clear()
        _LIFT_PLANS[key] = plan
    if plan is None:
        return None
    shape, spans, exact = plan
    if not exact:  # digits outside the lifted integers (a name's, a literal kept) are this
        shape = _shape(sql, spans)  # text's own, not those of the text the plan came from
    if len(spans) == 1:
        ((start, end),) = spans
        return shape, (int(sql[start:end]),)
    return shape, tuple([int(sql[start:end]) for start, end in spans])


_DIGIT_MARKS = bytes.maketrans(b"0123456789", b"\xff" * 10)
_UNKNOWN: Any = object()
_MAX_PLANS = 4096
#: a text with its digits blanked out -> (its shape, where the integers lifted are, whether
#: they are all its digits) or None (nothing lifted): texts alike but for their digits'
#: values lift the same integers, and share the shape when every digit is lifted
_LIFT_PLANS: dict[bytes, tuple[str, tuple[tuple[int, int], ...], bool] | None] = {}


def _lift_plan(sql: str) -> tuple[str, tuple[tuple[int, int], ...], bool] | None:
    """:func:`lift_literals`' work: the shape of ``sql``, where the integers it lifts are,
    and whether they hold all its digits (another text of the same key then has the same
    shape: its digits are where these are); None when none."""
    spans = tuple(_lift_spans(sql))
    if not spans:
        return None
    digits = len(sql) - len(sql.encode("utf-8").translate(None, b"0123456789"))
    return _shape(sql, spans), spans, digits == sum(end - start for start, end in spans)


def _shape(sql: str, spans: tuple[tuple[int, int], ...]) -> str:
    """``sql`` with its integers at ``spans`` as parameters ``?1``, ``?2``, ..."""
    out, pos = [], 0
    for n, (start, end) in enumerate(spans, 1):
        out.append(sql[pos:start])
        out.append(f"?{n}")
        pos = end
    out.append(sql[pos:])
    return "".join(out)


def _lift_spans(sql: str) -> list[tuple[int, int]]:
    """Where the integers :func:`lift_literals` lifts from ``sql`` are."""
    # SQLite reads any character above 0x7F as part of a name, and regular expressions'
    # \d and \w take non-ASCII digits and letters: such texts run as written
    if not sql.isascii() or _NO_LIFT.search(sql) is not None:
        return []
    tokens = list(_LIFT_TOKEN.finditer(sql))
    if not tokens:
        return []
    head = tokens[0][0].upper()
    if head not in ("SELECT", "UPDATE", "DELETE", "INSERT"):
        return []
    depth, start, where = 0, -1, len(sql)
    for m in tokens[1:]:
        t = m[0]
        if t == "(":
            depth += 1
            continue
        if t == ")":
            depth -= 1
            if depth < 0:
                return []
            continue
        word = t.upper()
        if head == "INSERT":
            if depth == 0 and word == "VALUES":
                return _values_spans(sql, m.end())
            if word in _LIFT_STOP:
                return []
            continue
        if depth == 0 and word == "WHERE" and where == len(sql):
            where = m.end()
        if start < 0 and depth == 0 and (word == "WHERE" or (word == "SET" and head == "UPDATE")):
            start = m.end()
        elif word in _LIFT_STOP and not (start < 0 and depth == 0 and word == "FROM"
                                         and head in ("SELECT", "DELETE")):
            return []
    if start < 0 or depth != 0:
        return []
    spans = []
    for m in _INTEGER.finditer(sql, start):
        j = m.start() - 1
        while sql[j].isspace():
            j -= 1
        # in WHERE, only a comparison's operand: an index on an expression (a + 5) is
        # matched against the query's text, with its literals
        if m.start() < where:
            if sql[j] in _OPERATORS:
                spans.append(m.span())
            continue
        if sql[j] == "-":  # a negative operand: - after the comparison
            j -= 1
            while sql[j].isspace():
                j -= 1
        if sql[j] in _COMPARISONS:
            spans.append(m.span())
    return spans[:_MAX_LIFTED] if len(spans) <= _MAX_LIFTED else []


_VALUES_ROW = re.compile(r"\s*\(([^()]*)\)\s*")
_INTEGER_ELEMENT = re.compile(r"\s*(-\s*)?(\d{1,18})\s*")


def _values_spans(sql: str, at: int) -> list[tuple[int, int]]:
    """An INSERT whose text ends with one ``VALUES (...)`` row without parentheses inside:
    where its elements that are integers are."""
    row = _VALUES_ROW.fullmatch(sql, at)
    if row is None:
        return []
    spans, pos = [], row.start(1)
    for element in row[1].split(","):
        m = _INTEGER_ELEMENT.fullmatch(element)
        if m is not None:
            spans.append((pos + m.start(2), pos + m.end(2)))
        pos += len(element) + 1
    return spans if len(spans) <= _MAX_LIFTED else []


# --- a simple query's plan ------------------------------------------------------------------


class QueryPlan(NamedTuple):
    """What :func:`split_statements` and :func:`lift_literals` make of a simple query that
    holds one statement, in terms that hold for every text of its :func:`digit_key`: the
    statement is ``sql[start:end]``, its first word ``head``; ``shape`` (None: not lifted)
    is its text with the integers at ``spans`` (of ``sql``) as parameters ?1, ?2, ...,
    those being all its digits. ``transaction``: set by the server for a transaction
    statement (BEGIN, COMMIT, ...) it hands to the engine as it is."""

    start: int
    end: int
    head: str
    shape: str | None
    spans: tuple[tuple[int, int], ...]
    transaction: bool = False


def digit_key(sql: str) -> bytes:
    """``sql`` with its digits blanked out (in C): texts alike but for their digits' values
    share it, and with it how they split into statements and lift their literals."""
    return sql.encode("utf-8").translate(_DIGIT_MARKS)


def query_plan(sql: str) -> QueryPlan | None:
    """The plan of a simple query of one statement without quotes, comments or ``$`` (None
    for any other: digits could then change where a string or a statement ends), not a
    COPY (the server runs those itself). ``shape`` only when every digit of the text is a
    lifted integer, so that the shape is that of every text of the same key."""
    single = _single_statement(sql)
    if not single:
        return None
    st = single[0]
    start = len(sql) - len(sql.lstrip())
    if sql[start:start + len(st)] != st:
        return None
    head = (first_words(st, 1) or [""])[0]
    if head == "COPY":
        return None
    text = st.encode("utf-8")
    plan = _lift_plan(st) if text.translate(_DIGIT_MARKS) != text else None
    if plan is None or not plan[2]:
        return QueryPlan(start, start + len(st), head, None, ())
    return QueryPlan(start, start + len(st), head, plan[0],
                     tuple((a + start, b + start) for a, b in plan[1]))


#: a run of 16 or more digits and dots: a number literal a float may not hold exactly
_LONG_NUMBER = re.compile(r"\d[\d.]{15,}")
_NUMBER_LITERAL = re.compile(r"(?<![\w$.?:@])(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![\w.])")


def long_number(sql: str) -> bool:
    """Whether ``sql`` has a run of 16 digits and dots (anywhere: in strings too), which
    :func:`inexact_number` may find a number SQLite cannot hold in."""
    return _LONG_NUMBER.search(sql) is not None


def inexact_number(sql: str) -> str | None:
    """The first number literal of ``sql`` (outside strings, quoted names and comments)
    that SQLite, whose numbers are 64-bit integers and floats, would hold as another
    value (``123456789012345.12345``, an integer past 2^63 - 1); None for none."""
    if _LONG_NUMBER.search(sql) is None:
        return None
    import decimal

    try:
        quoted = [(s, e) for kind, s, e in _scan(sql) if kind == "quoted"]
    except ServerError:
        return None  # (SQLite says what is wrong with the text)
    pos = 0
    for s, e in [*quoted, (len(sql), len(sql))]:
        for m in _NUMBER_LITERAL.finditer(sql, pos, s):
            text = m.group()
            if len(text) < 16:
                continue
            value = decimal.Decimal(text)
            if "." not in text and "e" not in text.lower() and (int(value) < (1 << 63) or (
                    int(value) == 1 << 63 and sql[:m.start()].rstrip().endswith("-"))):
                continue  # an INTEGER (-9223372036854775808 too)
            if decimal.Decimal(repr(float(value))) != value:
                return text
        pos = e
    return None
