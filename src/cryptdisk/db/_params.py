"""Query parameters: Python values bound to ``?``, ``$1`` and ``$name`` as SQL literals.

Every statement kind cryptdisk runs (its own ``INSERT``, ``DELETE``, ``UPDATE``,
``CREATE TABLE ... AS``, a role's policy rewrite, the scan's filter pushdown and key
index) works on SQL text, so a statement's parameters become literals in that text
before it is read (:func:`bind`): each is written as a literal DuckDB parses back to
the value and type DuckDB's own binding of the Python value gives (:func:`sql_literal`:
``5`` an ``INTEGER``, ``Decimal('1.5')`` a ``DECIMAL(2,1)``, a tz-aware ``datetime`` a
``TIMESTAMPTZ`` ...), in parentheses. No value can become SQL: a string is quoted with
its quotes doubled (DuckDB's strings take no backslash escapes), bytes are hex escapes,
numbers, dates and UUIDs are written by Python from their values, a NUL is ``chr(0)``,
and the parentheses keep a literal from joining the text around it (``'a'`` followed by
a string, a ``-`` before a negative number, ``E`` before a quote).

Placeholders are found by DuckDB's own tokenizer, so never inside a string
(``'...'``, ``E'...'``, ``$$...$$``), quoted name or comment as DuckDB reads them:
``?`` (the next parameter), ``?N`` or ``$N`` (the N-th, from 1) with a sequence of
values, ``$name`` (any case) with a mapping. Every parameter given must be used, and
every one used given, as DuckDB requires; a mismatch, or a value of a type not bound,
is a :class:`~cryptdisk.errors.DatabaseError`.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from ..errors import DatabaseError

__all__ = ["Template", "bind", "check_parameters", "sql_literal"]

_INT32 = 2 ** 31
_INT64 = 2 ** 63
_INT128 = 2 ** 127
#: a ``$name`` placeholder's name, a ``$N`` or ``?N`` one's number (in UTF-8)
_NAME_B = re.compile(rb"[A-Za-z_\x80-\xff][A-Za-z0-9_\x80-\xff]*")
_DIGITS_B = re.compile(rb"[0-9]+")


def _integer(value: int) -> str:
    """An integer as DuckDB binds a Python int: INTEGER, BIGINT, UBIGINT, HUGEINT or
    UHUGEINT, the smallest that holds it."""
    if -_INT64 <= value < _INT64:
        return str(value)  # (DuckDB reads it as INTEGER or BIGINT, as it binds it)
    if 0 <= value < 2 * _INT64:
        return f"'{value}'::UBIGINT"
    if -_INT128 <= value < _INT128:  # (quoted: -170...728::HUGEINT would negate an overflow)
        return f"'{value}'::HUGEINT"
    if 0 <= value < 2 * _INT128:
        return f"'{value}'::UHUGEINT"
    raise DatabaseError(f"the integer parameter {value} does not fit in 128 bits",
                        hint="pass it as a Decimal or a str and CAST it in the statement")


def _decimal(value: decimal.Decimal) -> str:
    """A Decimal as DuckDB binds it: DECIMAL(width, scale) of its digits, DOUBLE beyond
    38 digits; FLOAT for NaN and infinities."""
    if not value.is_finite():
        if value.is_snan():
            raise DatabaseError("a signalling NaN Decimal cannot be a parameter")
        return f"'{'nan' if value.is_nan() else float(value)}'::FLOAT"
    _sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    scale = -exponent if exponent < 0 else 0
    width = max(len(digits) + max(exponent, 0), scale + 1)
    if width > 38:
        return f"{float(value)!r}::DOUBLE"
    return f"'{value:f}'::DECIMAL({width},{scale})"


def _string(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise DatabaseError("a string parameter is not valid Unicode (it holds a lone "
                            "surrogate)", hint="pass bytes for data that is not text"
                            ) from None
    quoted = "'" + text.replace("'", "''") + "'"
    if "\0" in text:  # (DuckDB's parser ends the text at a NUL)
        return quoted.replace("\0", "' || chr(0) || '")
    return quoted


def _offset(delta: dt.timedelta | None) -> str:
    seconds = int(delta.total_seconds()) if delta is not None else 0
    sign = "-" if seconds < 0 else "+"
    h, rest = divmod(abs(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{sign}{h:02}:{m:02}" + (f":{s:02}" if s else "")


def sql_literal(value: Any) -> str:
    """``value`` as a SQL literal DuckDB parses back to the value, of the type DuckDB's
    own binding of it as a parameter gives (see the module); a string literal is
    untyped, so that it compares with any column as DuckDB's string constants do.
    A value of no type below raises :class:`~cryptdisk.errors.DatabaseError`."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return _integer(int(value))
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return f"'{value}'::DOUBLE"
        return repr(float(value)) + "::DOUBLE"
    if isinstance(value, str):
        return _string(str(value))
    if isinstance(value, decimal.Decimal):
        return _decimal(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return "'" + "".join(f"\\x{b:02X}" for b in bytes(value)) + "'::BLOB"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None and value.utcoffset() is not None:
            try:
                utc = value.astimezone(dt.UTC).replace(tzinfo=None)
            except (OverflowError, ValueError):
                raise DatabaseError(f"the datetime parameter {value} is out of range in "
                                    "UTC") from None
            return f"TIMESTAMPTZ '{utc.isoformat(sep=' ')}+00'"
        return f"TIMESTAMP '{value.replace(tzinfo=None).isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, dt.time):
        plain = value.replace(tzinfo=None).isoformat()
        if value.tzinfo is not None and value.utcoffset() is not None:
            return f"TIMETZ '{plain}{_offset(value.utcoffset())}'"
        return f"TIME '{plain}'"
    if isinstance(value, dt.timedelta):
        micros = value.seconds * 1_000_000 + value.microseconds
        return f"INTERVAL '{value.days} days {micros} microseconds'"
    if isinstance(value, uuid.UUID):
        return f"'{value}'::UUID"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(sql_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "MAP {}"
        return "{" + ", ".join(f"{_string(str(k))}: {sql_literal(v)}"
                               for k, v in value.items()) + "}"
    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and callable(item):  # a numpy scalar
        return sql_literal(item())
    raise DatabaseError(f"a parameter of type {type(value).__name__} cannot be bound",
                        hint="pass None, bool, int, float, Decimal, str, bytes, date, "
                        "datetime, time, timedelta, UUID, a list or a dict")


#: The Python types whose values :meth:`Template.arrow` puts in an Arrow array: one DuckDB
#: reads as the values it binds (a UUID, a list, a dict, a time with a zone take literals)
_ARROW_KINDS = frozenset({bool, int, float, str, bytes, decimal.Decimal, dt.date,
                          dt.datetime, dt.time, dt.timedelta})


@dataclass(frozen=True)
class _Placeholder:
    start: int
    end: int
    #: None for ``?``; an int for ``?N`` / ``$N``; a lower-case name for ``$name``
    key: int | str | None


class Template:
    """A statement's text with its placeholders found once, to be filled with parameters
    (:meth:`fill`) any number of times (``executemany``)."""

    def __init__(self, sql: str) -> None:
        self.sql = sql
        self.placeholders = _placeholders(sql)
        keys = [p.key for p in self.placeholders]
        auto = sum(1 for k in keys if k is None)
        numbered = sorted({k for k in keys if isinstance(k, int)})
        named = sorted({k for k in keys if isinstance(k, str)})
        if sum(1 for kinds in (auto, numbered, named) if kinds) > 1:
            raise DatabaseError(
                "a statement's parameters are either ?, or numbered ($1, ?1), or named "
                "($name): this one mixes them", hint="write all of them the same way")
        self.auto = auto
        self.numbered = numbered
        self.named = named

    def fill(self, parameters: Any) -> str:
        """The text with each placeholder replaced by its parameter's literal."""
        values = self.values(parameters)
        return self.substitute({k: f"({sql_literal(v)})" for k, v in values.items()})

    def substitute(self, texts: dict[Any, str]) -> str:
        """The text with each placeholder replaced by the text ``texts`` holds for its key
        (see :meth:`values`)."""
        if not self.placeholders:
            return self.sql
        out, pos = [], 0
        for i, p in enumerate(self.placeholders):
            out.append(self.sql[pos:p.start])
            out.append(texts[i if p.key is None else p.key])
            pos = p.end
        out.append(self.sql[pos:])
        return "".join(out)

    def arrow(self, sets: list[Any]) -> pa.Table | None:
        """The values of parameter sets ``sets`` (each checked as :meth:`values` does) as
        an Arrow table of a column per key, ``p0``, ``p1`` ... in the order of
        :attr:`keys`; None when a key's values do not make one Arrow array of a type
        DuckDB reads as it binds the values (mixed types, an int past 64 bits, a UUID, a
        time with a time zone, a decimal past 38 digits)."""
        columns: list[list[Any]] = [[] for _ in self.keys]
        for parameters in sets:
            values = self.values(parameters)
            for column, key in zip(columns, self.keys, strict=True):
                column.append(values[key])
        arrays = []
        for column in columns:
            kinds = {(type(v), getattr(v, "tzinfo", None) is not None)
                     for v in column if v is not None}
            if len(kinds) > 1:  # (an int beside a float would become a float)
                return None
            for kind, zoned in kinds:  # (a time with a zone: Arrow's would drop it)
                if kind not in _ARROW_KINDS or (kind is dt.time and zoned):
                    return None
            if any(kind is dt.datetime and zoned for kind, zoned in kinds):
                # as the literal is written (the UTC instant): Arrow takes one zone for the
                # array and drops an offset finer than a second (2000-01-01 00:00+00:00:00.000001)
                column = [v if v is None or v.utcoffset() is None else v.astimezone(dt.UTC)
                          for v in column]
            try:
                array = pa.array(column)
            except (pa.ArrowException, TypeError, ValueError, OverflowError, UnicodeError):
                return None
            if pa.types.is_decimal256(array.type):
                return None
            arrays.append(array)
        return pa.Table.from_arrays(arrays, names=[f"p{i}" for i in range(len(arrays))])

    @property
    def keys(self) -> list[Any]:
        """The parameters' keys (what :meth:`values` maps): ``0, 1 ...`` for ``?``, the
        numbers of ``$N``, the names of ``$name``."""
        return list(range(self.auto)) if self.auto else [*self.numbered, *self.named]

    def values(self, parameters: Any) -> dict[Any, Any]:
        """The value of each key (see :attr:`keys`) in ``parameters``; a count, form or
        name that does not match the placeholders raises
        :class:`~cryptdisk.errors.DatabaseError`."""
        if isinstance(parameters, Mapping):
            given: dict[str, Any] = {}
            for k, v in parameters.items():
                if not isinstance(k, str):
                    raise DatabaseError(f"a mapping of parameters is keyed by name (str), "
                                        f"not {type(k).__name__}")
                if k.lower() in given:
                    raise DatabaseError(f"the parameter ${k} is given twice (names ignore "
                                        "case)")
                given[k.lower()] = v
            if self.auto or self.numbered:
                raise DatabaseError("parameters given by name (a mapping) need $name "
                                    "placeholders; this statement has "
                                    + ("?" if self.auto else "numbered") + " ones",
                                    hint="pass a list or tuple of values")
            missing = [n for n in self.named if n not in given]
            if missing:
                raise DatabaseError("no value given for parameter "
                                    + ", ".join(f"${n}" for n in missing))
            extra = sorted(set(given) - set(self.named))
            if extra:
                raise DatabaseError("the statement has no parameter "
                                    + ", ".join(f"${n}" for n in extra))
            return {n: given[n] for n in self.named}
        values = check_parameters(parameters)
        if self.named:
            raise DatabaseError("the statement's parameters are named ($name): pass a "
                                "mapping (a dict) of their values")
        if self.numbered:
            wanted = self.numbered[-1]
            if len(values) != wanted or len(self.numbered) != wanted:
                absent = sorted(set(range(1, len(values) + 1)) - set(self.numbered))
                raise DatabaseError(
                    f"the statement uses parameters {_listed(self.numbered)}, and "
                    f"{len(values)} {'was' if len(values) == 1 else 'were'} given"
                    + (f" (none uses {_listed(absent)})" if absent else ""),
                    hint="number the parameters $1 to $N and pass N values")
            return {n: values[n - 1] for n in self.numbered}
        if len(values) != self.auto:
            raise DatabaseError(f"the statement has {self.auto} parameter"
                                f"{'' if self.auto == 1 else 's'} and {len(values)} "
                                f"{'was' if len(values) == 1 else 'were'} given")
        return dict(enumerate(values))


def _listed(numbers: list[int]) -> str:
    return ", ".join(f"${n}" for n in numbers)


def check_parameters(parameters: Any) -> Sequence[Any]:
    """``parameters`` as a sequence of values; refuse anything else but a mapping (a
    string, bytes, a number)."""
    if isinstance(parameters, str | bytes | bytearray | memoryview) \
            or not isinstance(parameters, Sequence):
        raise DatabaseError(f"parameters are a list or tuple of values, or a dict of named "
                            f"values, not {type(parameters).__name__}",
                            hint="execute(sql, [value]) for one value")
    return parameters


def bind(sql: str, parameters: Any) -> str:
    """``sql`` with its placeholders replaced by the literals of ``parameters`` (a
    sequence for ``?``, ``?N`` and ``$N``; a mapping for ``$name``)."""
    return Template(sql).fill(parameters)


def _placeholders(sql: str) -> list[_Placeholder]:
    """The placeholders of ``sql`` (character offsets), found by DuckDB's own tokenizer:
    what it reads as a string, quoted name or comment holds none, so a literal never
    lands inside one (where its quotes would end it)."""
    if "?" not in sql and "$" not in sql:
        return []
    try:
        raw = sql.encode("utf-8")
    except UnicodeEncodeError:
        raise DatabaseError("the statement is not valid Unicode (it holds a lone "
                            "surrogate)") from None
    try:
        tokens = duckdb.tokenize(sql)
    except duckdb.Error as exc:
        raise DatabaseError(f"cannot read the statement's parameters: {exc}") from None
    found: list[tuple[int, int, int | str | None]] = []  # (byte offsets, key)
    for at, kind in tokens:
        mark = raw[at:at + 1]
        if kind != duckdb.token_type.operator or mark not in (b"?", b"$"):
            continue
        d = _DIGITS_B.match(raw, at + 1)
        if d is not None:
            found.append((at, d.end(), _number(d.group().decode())))
        elif mark == b"?":
            found.append((at, at + 1, None))
        elif (name := _NAME_B.match(raw, at + 1)) is not None:
            found.append((at, name.end(), name.group().decode().lower()))
    if not found:
        return []
    # byte offsets to character offsets (one pass over the text)
    out, chars, pos = [], 0, 0
    for start, end, key in found:
        chars += len(raw[pos:start].decode())
        begin = chars
        chars += len(raw[start:end].decode())
        pos = end
        out.append(_Placeholder(begin, chars, key))
    return out


def _number(digits: str) -> int:
    number = int(digits)
    if number < 1:
        raise DatabaseError(f"parameters are numbered from $1: there is no ${digits}")
    return number
