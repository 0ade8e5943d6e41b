"""PostgreSQL type OIDs for the engines' result types, and values in text and binary format."""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import json
import re
import struct
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from ..errors import ProtocolError
from ._intervalin import Interval, IntervalError, parse_interval
from ._pgdatetime import PgDatetime
from ._sqltext import InputError, bool_literal
from ._textout import (
    datetime_text,
    float4_text,
    float4_texts,
    float8_text,
    float8_texts,
    numeric_text,
    time_text,
)

__all__ = ["ARRAY_TYPES", "BOOL", "BYTEA", "FLOAT8", "INT8", "OID_ARRAY", "RAGGED", "TEXT",
           "PgArray", "array_oid", "arrow_oid", "decode_param", "encode_value", "exact_result",
           "is_list", "pg_type_name", "real_texts", "real_writers", "rectangular",
           "sqlite_declared_oid", "sqlite_value", "text_encoders", "text_formatter", "value_oid"]

BOOL, BYTEA, INT8, INT2, INT4, TEXT, OID = 16, 17, 20, 21, 23, 25, 26
FLOAT4, FLOAT8, UNKNOWN, VARCHAR, BPCHAR, NAME = 700, 701, 705, 1043, 1042, 19
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, NUMERIC, UUID, JSON = (
    1082, 1083, 1114, 1184, 1186, 1700, 2950, 114)
TIMETZ, TIMETZ_ARRAY = 1266, 1270
INT2VECTOR = 22  # pg_index's indoption (its text, "0 1", here)
OID_ARRAY = 1028  # the one array type a parameter may have (pg_catalog's queries')
_TEXTLIKE = {0, TEXT, UNKNOWN, VARCHAR, BPCHAR, NAME, JSON, 3802}
_EPOCH_DATE = dt.date(2000, 1, 1)
_EPOCH = dt.datetime(2000, 1, 1)
_EPOCH_TZ = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


def arrow_oid(t: pa.DataType) -> int:
    """The PostgreSQL type OID that represents Arrow type ``t`` (text for what has none;
    a list's: :func:`array_oid`)."""
    if is_list(t):
        return array_oid(t) or TEXT
    if pa.types.is_boolean(t):
        return BOOL
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return INT2
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return INT4
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return INT8
    if pa.types.is_uint64(t) or pa.types.is_decimal(t):
        return NUMERIC
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return FLOAT4
    if pa.types.is_float64(t):
        return FLOAT8
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return BYTEA
    if pa.types.is_date(t):
        return DATE
    if pa.types.is_timestamp(t):
        return TIMESTAMPTZ if t.tz else TIMESTAMP
    if pa.types.is_time(t):
        return TIME
    if pa.types.is_duration(t) or pa.types.is_interval(t):
        return INTERVAL
    return TEXT


#: the words of a SQLite column's declared type that give its PostgreSQL type, tried in
#: this order: SQLite's affinity rules (INTERVAL before "INT": its values are text), then
#: the date, time, decimal and UUID names SQLite has no affinity for
_DECLARED = (("INTERVAL", INTERVAL), ("INT", INT8), ("CHAR", TEXT), ("CLOB", TEXT),
             ("TEXT", TEXT), ("BLOB", BYTEA), ("BYTEA", BYTEA), ("REAL", FLOAT8), ("FLOA", FLOAT8),
             ("DOUB", FLOAT8), ("BOOL", BOOL), ("TIMESTAMPTZ", TIMESTAMPTZ),
             ("TIMESTAMP", TIMESTAMP), ("DATETIME", TIMESTAMP), ("DATE", DATE),
             ("TIME", TIME), ("NUMERIC", NUMERIC), ("DECIMAL", NUMERIC), ("UUID", UUID))


@functools.lru_cache(maxsize=256)
def sqlite_declared_oid(decltype: str) -> int:
    """The PostgreSQL type of a SQLite column declared ``decltype``, whatever its values:
    the type of its results (:func:`sqlite_value` reads the values as it), of a Describe
    before the statement runs, of the catalogs, and of binary COPY's fields; text for a
    name none of the words above is in."""
    d = decltype.upper()
    if "TIMESTAMP" in d and "TIME ZONE" in d and "WITHOUT" not in d:
        return TIMESTAMPTZ
    return next((oid for word, oid in _DECLARED if word in d), TEXT)


#: PostgreSQL and DuckDB type names -> the OID the server describes them as
_CAST_NAMES = {
    **dict.fromkeys(("bool", "boolean"), BOOL),
    **dict.fromkeys(("smallint", "int2", "tinyint", "int1", "utinyint"), INT2),
    **dict.fromkeys(("int", "integer", "int4", "signed", "usmallint"), INT4),
    **dict.fromkeys(("bigint", "int8", "long", "uinteger"), INT8),
    **dict.fromkeys(("real", "float4"), FLOAT4),
    **dict.fromkeys(("float", "float8", "double"), FLOAT8),
    **dict.fromkeys(("numeric", "decimal", "ubigint", "hugeint"), NUMERIC),
    **dict.fromkeys(("text", "varchar", "char", "character", "string", "bpchar", "name"),
                    TEXT),
    **dict.fromkeys(("bytea", "blob"), BYTEA),
    "date": DATE, "time": TIME, "timestamp": TIMESTAMP, "datetime": TIMESTAMP,
    "timestamptz": TIMESTAMPTZ, "interval": INTERVAL, "uuid": UUID, "json": JSON,
}


def type_oid(name: str) -> int:
    """The OID of a type named in a cast (its first word; ``timestamp with time zone``
    gives timestamptz); 0 for a name the server does not describe."""
    words = name.lower().split()
    if not words:
        return 0
    if words[0] == "timestamp" and "with" in words and "without" not in words:
        return TIMESTAMPTZ
    return _CAST_NAMES.get(words[0].strip('"'), 0)


def value_oid(sample: Any) -> int:
    """The OID of a SQLite result column without a declared type (an expression): from
    its first non-NULL value."""
    if isinstance(sample, bool):
        return BOOL
    if isinstance(sample, int):
        return INT8
    if isinstance(sample, float):
        return FLOAT8
    if isinstance(sample, bytes):
        return BYTEA
    return TEXT


def _timestamp(value: str, tz: bool) -> dt.datetime:
    t = dt.datetime.fromisoformat(value)
    if tz:  # (the session's TimeZone is UTC: an instant stored with another offset, as
        # the client wrote it, is written in UTC, as PostgreSQL writes it)
        if t.tzinfo is None:
            return t.replace(tzinfo=dt.UTC)
        try:
            return t.astimezone(dt.UTC)
        except OverflowError:  # (year 1 or 9999 in UTC: beyond Python's, kept as stored)
            return t
    if not tz and t.tzinfo is not None:
        return t.astimezone(dt.UTC).replace(tzinfo=None)
    return t


class _FieldOutOfRange(ValueError):
    """A date whose month or day is out of range: ``args`` are (message, 22008)."""


def _date(value: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(value).date()  # a timestamp: its date
    except ValueError:
        m = PG_DATE_TEXT.fullmatch(value)  # 2024-1-2, as PostgreSQL's date input reads it
        if m is None:
            raise
    try:
        return dt.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        raise _FieldOutOfRange(f'date/time field value out of range: "{value}"',
                               "22008") from None


def _decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, float):
        return decimal.Decimal(repr(value))  # 0.1, not 0.1000000000000000055511...
    if isinstance(value, int | str):
        return decimal.Decimal(value)
    raise ValueError(value)


#: how :func:`sqlite_value` reads a stored value as its column's type, and the SQLSTATE
#: of a value it cannot read
_READERS: dict[int, tuple[Any, str, str]] = {
    NUMERIC: (_decimal, "numeric", "22P02"),
    DATE: (_date, "date", "22007"),
    TIME: (dt.time.fromisoformat, "time without time zone", "22007"),
    TIMESTAMP: (lambda v: _timestamp(v, False), "timestamp without time zone", "22007"),
    TIMESTAMPTZ: (lambda v: _timestamp(v, True), "timestamp with time zone", "22007"),
    UUID: (uuid.UUID, "uuid", "22P02"),
    INTERVAL: (lambda v: parse_interval(v if isinstance(v, str) else repr(v)), "interval",
               "22007"),  # (text; an INTERVAL column's affinity keeps '5' as 5)
}


#: the scale of a declared ``NUMERIC(p, s)`` / ``DECIMAL(p, s)`` (``NUMERIC(p)``: 0)
_DECLARED_SCALE = re.compile(r"(?:NUMERIC|DECIMAL)\s*\(\s*\d+\s*(?:,\s*(\d+)\s*)?\)", re.I)
#: enough digits for any float's exact decimal value at any scale a column declares
_WIDE = decimal.Context(prec=1200, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


@functools.lru_cache(maxsize=256)
def numeric_type(decltype: str) -> int | tuple[int, int]:
    """The type :func:`sqlite_value` reads a SQLite column declared ``decltype`` (of type
    numeric) as: ``(NUMERIC, scale)`` for a declared scale (``NUMERIC(10,2)``: its values
    are rounded to 2 places and written with them, ``1.50``, as PostgreSQL stores them);
    NUMERIC for none."""
    m = _DECLARED_SCALE.search(decltype)
    return NUMERIC if m is None else (NUMERIC, int(m[1] or 0))


def sqlite_reads(oid: int) -> bool:
    """Whether :func:`sqlite_value` changes the values of a column of type ``oid``."""
    return oid in _READERS or oid == BOOL


def sqlite_value(oid: int | tuple[int, int], value: Any) -> Any:
    """A value SQLite stored in a column of declared type ``oid`` (see
    :func:`sqlite_declared_oid`), as that type: booleans from 0 and 1, decimals from REAL,
    INTEGER or text, dates and times from the ISO text parameters are stored as. Raises
    ValueError with (message, SQLSTATE) for a value the type cannot read, as PostgreSQL
    refuses it."""
    if value is None:
        return None
    if oid == BOOL:  # SQLite stores booleans as 0 and 1: written as t and f
        if type(value) in (int, float):
            return bool(value)
        if isinstance(value, str):  # (text stored as sent: 'yes', read as PostgreSQL reads it)
            try:
                return bool_literal("'" + value.replace("'", "''") + "'") == "1"
            except InputError as exc:
                raise ValueError(*exc.args) from None
        return value
    if isinstance(oid, tuple):  # numeric with a declared scale
        number = sqlite_value(NUMERIC, value)
        if not number.is_finite():
            return number
        return number.quantize(decimal.Decimal(1).scaleb(-oid[1]), decimal.ROUND_HALF_UP,
                               _WIDE)
    reader, name, code = _READERS[oid]
    if isinstance(value, str) or (oid in (NUMERIC, INTERVAL) and
                                  isinstance(value, int | float)):
        try:
            return reader(value)
        except (IntervalError, _FieldOutOfRange):
            raise  # (its own message and SQLSTATE: 22007, or out of range)
        except (ValueError, TypeError, decimal.InvalidOperation, OverflowError):
            pass
    shown = value if isinstance(value, str) else repr(value)
    raise ValueError(f'invalid input syntax for type {name}: "{shown}"', code)


def conform(oid: int, value: Any) -> Any:
    """``value`` as type ``oid``, for a column a Describe typed before the statement ran (a
    computed column on SQLite, see :mod:`._exprtypes`), so that its rows are sent as it
    said: integers from integral floats, floats from integers, the types SQLite stores as
    text or numbers read as for a declared column (:func:`sqlite_value`); a value already
    of the type is left. Raises ValueError with (message, SQLSTATE) for a value the type
    cannot hold (an integer SQLite's arithmetic overflowed into a float: 22003)."""
    if value is None or oid == TEXT:
        return value
    kind = type(value)
    if oid in (INT2, INT4, INT8):
        if kind is int or kind is bool:
            return int(value)
        if kind is float and value.is_integer() and -2.0 ** 63 < value < 2.0 ** 63:
            return int(value)
        if kind is float and not -2.0 ** 63 < value < 2.0 ** 63:  # (-2 ** 63: -2 ** 63 - 1)
            raise ValueError("bigint out of range", "22003")
        if kind is str and value.strip().lstrip("+-").isdigit():
            return int(value)
        if kind is float or kind is str:
            raise ValueError(f'invalid input syntax for type bigint: "{value}"', "22P02")
        return value
    if oid in (FLOAT4, FLOAT8):
        if kind is float:
            return value
        try:
            return float(value)
        except (TypeError, ValueError):
            if kind is str:
                raise ValueError(f'invalid input syntax for type double precision: '
                                 f'"{value}"', "22P02") from None
            return value
    if sqlite_reads(oid) and kind in (int, float, str):
        return sqlite_value(oid, value)
    return value


_PG_NAMES = {"BIGINT": "bigint", "INT8": "bigint", "LONG": "bigint", "INTEGER": "integer",
             "INT4": "integer", "INT": "integer", "SMALLINT": "smallint", "INT2": "smallint",
             "TINYINT": "smallint", "HUGEINT": "numeric(38,0)", "UBIGINT": "numeric(20,0)",
             "UINTEGER": "bigint", "USMALLINT": "integer", "UTINYINT": "smallint",
             "DOUBLE": "double precision", "FLOAT8": "double precision",
             "REAL": "real", "FLOAT": "real", "FLOAT4": "real", "VARCHAR": "text",
             "TEXT": "text", "STRING": "text", "BOOLEAN": "boolean", "BOOL": "boolean",
             "BLOB": "bytea", "BYTEA": "bytea", "DATE": "date", "TIME": "time without time zone",
             "TIMESTAMP": "timestamp without time zone",
             "TIMESTAMPTZ": "timestamp with time zone",
             "TIMESTAMP WITH TIME ZONE": "timestamp with time zone",
             "INTERVAL": "interval", "UUID": "uuid", "JSON": "json"}


def pg_type_name(duckdb_type: str) -> str:
    """The name PostgreSQL's ``format_type`` would give a DuckDB column type."""
    t = duckdb_type.strip().upper()
    if t.startswith(("DECIMAL", "NUMERIC")):
        return "numeric" + t[t.index("("):].replace(" ", "") if "(" in t else "numeric"
    return _PG_NAMES.get(t, duckdb_type.lower())


# --- intervals ------------------------------------------------------------------------

_US_PER_HOUR = 3_600_000_000


def interval_parts(value: Any) -> tuple[int, int, int]:
    """(months, days, microseconds) of an interval: DuckDB's through Arrow (a
    ``MonthDayNano``), a ``timedelta``, an :class:`._intervalin.Interval`, or text
    PostgreSQL reads as one (``90 minutes``; :func:`._intervalin.parse_interval`)."""
    if isinstance(value, Interval):
        return value.months, value.days, value.micros
    if isinstance(value, pa.MonthDayNano):
        ns = value.nanoseconds
        return value.months, value.days, ns // 1000 if ns >= 0 else -(-ns // 1000)
    if isinstance(value, dt.timedelta):
        return 0, value.days, value.seconds * 1_000_000 + value.microseconds
    if isinstance(value, str):
        return tuple(parse_interval(value))  # type: ignore[return-value]
    raise TypeError(f"{type(value).__name__} is not an interval")


def interval_text(months: int, days: int, micros: int, *, plus: bool = True) -> str:
    """An interval as PostgreSQL writes it (IntervalStyle postgres): ``1 year 2 mons
    -3 days +04:05:06.000007``; ``plus=False`` leaves out the ``+`` PostgreSQL puts on a
    part after a negative one (DuckDB does not read it; PostgreSQL reads both)."""
    parts: list[str] = []
    before = False  # the last part written was negative
    years, mons = abs(months) // 12, abs(months) % 12
    if months < 0:
        years, mons = -years, -mons
    for n, unit in ((years, "year"), (mons, "mon"), (days, "day")):
        if n:
            sign = "+" if plus and before and n > 0 else ""
            parts.append(f"{sign}{n} {unit}{'' if n == 1 else 's'}")
            before = n < 0
    if micros or not parts:
        hours, rest = divmod(abs(micros), _US_PER_HOUR)
        minutes, rest = divmod(rest, 60_000_000)
        seconds, us = divmod(rest, 1_000_000)
        sign = "-" if micros < 0 else "+" if plus and before else ""
        frac = f".{us:06d}".rstrip("0") if us else ""
        parts.append(f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}{frac}")
    return " ".join(parts)


# --- results --------------------------------------------------------------------------


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_map(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_map(t.value_type)
    return False


def has_wide(t: pa.DataType) -> bool:
    """:func:`cryptdisk.db.has_wide` (a ``DECIMAL(38,0)``, alone or nested, which may be a
    wrapped ``UHUGEINT``), looking in a ``MAP``'s keys and values too."""
    from ..db import has_wide as wide

    if pa.types.is_map(t):
        return has_wide(t.key_type) or has_wide(t.item_type)
    if pa.types.is_struct(t):
        return any(has_wide(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return has_wide(t.value_type)
    return wide(t)


def _exact_as_text(array: pa.Array) -> pa.Array:
    """``array`` with each exact ``UHUGEINT`` in it (a ``DECIMAL(39,0)``, see
    :func:`cryptdisk.db.exact_uhugeint`), alone or in lists, structs and maps' keys and
    values, as its text: DuckDB, which makes a ``MAP``'s text, reads no Arrow
    ``DECIMAL(39,0)``."""
    import pyarrow.compute as pc

    t = array.type
    if pa.types.is_decimal(t) and t.precision > 38:
        return pc.cast(array, pa.string())
    if pa.types.is_map(t):
        if not len(array):
            keys, items = array.keys.slice(0, 0), array.items.slice(0, 0)
        else:  # (of the array's own maps: a slice's keys and items are the whole's)
            start = array.offsets[0].as_py()
            size = array.offsets[-1].as_py() - start
            keys, items = array.keys.slice(start, size), array.items.slice(start, size)
        keys, items = _exact_as_text(keys), _exact_as_text(items)
        if keys.type == t.key_type and items.type == t.item_type:
            return array
        if not len(array):
            return pa.array([], pa.map_(keys.type, items.type))
        return pa.MapArray.from_arrays(pc.subtract(array.offsets, array.offsets[0]), keys,
                                       items, mask=array.is_null())
    if pa.types.is_struct(t):
        children = [_exact_as_text(c) for c in array.flatten()]
        if all(c.type == t.field(i).type for i, c in enumerate(children)):
            return array
        return pa.StructArray.from_arrays(
            children, fields=[t.field(i).with_type(c.type) for i, c in enumerate(children)],
            mask=array.is_null())
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        values = _exact_as_text(array.flatten())
        if values.type == t.value_type:
            return array
        cls = pa.ListArray if pa.types.is_list(t) else pa.LargeListArray
        return cls.from_arrays(pc.subtract(array.offsets, array.offsets[0]), values,
                               mask=array.is_null())
    if pa.types.is_fixed_size_list(t):
        values = _exact_as_text(array.flatten())
        if values.type == t.value_type:
            return array
        return pa.FixedSizeListArray.from_arrays(values, t.list_size, mask=array.is_null())
    return array


def _zone(t: pa.DataType) -> str | None:
    """The time zone of the first ``TIMESTAMPTZ`` in Arrow type ``t`` (DuckDB exports its
    session's ``TimeZone`` there), None for none."""
    if pa.types.is_timestamp(t):
        return t.tz or None
    if pa.types.is_map(t):
        return _zone(t.key_type) or _zone(t.item_type)
    if pa.types.is_struct(t):
        return next((z for i in range(t.num_fields) if (z := _zone(t.field(i).type))), None)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _zone(t.value_type)
    return None


def exact_result(table: pa.Table, kinds: list[str] | None = None) -> pa.Table:
    """DuckDB's Arrow result ``table`` with what Arrow does not hold as DuckDB means it
    made exact, for the server to send as text: a ``UHUGEINT`` column (``kinds``: the
    DuckDB types of the columns, if known) whose values above 2^127 - 1 DuckDB's Arrow
    export wraps to negative numbers, as those values (``DECIMAL(39,0)``); a column with a
    ``MAP`` (which Arrow holds as a list of pairs) as DuckDB's text form of it,
    ``{a=1, b=2}``, its timestamps with time zone in the zone DuckDB exported them in
    (the session's ``TimeZone``), as the server sends them anywhere else. A ``UHUGEINT``
    in a list or struct is made exact too (its column a list or struct of
    ``DECIMAL(39,0)``); in a column with a ``MAP`` (the map in a list or struct, or
    holding one), each is its value in the text."""
    for i, field in enumerate(table.schema):
        column = table.column(i)
        if kinds is not None and len(kinds) == table.num_columns and \
                "UHUGEINT" in kinds[i].upper() and not _has_map(field.type):
            from ..db import exact_uhugeint

            table = table.set_column(i, field.name, exact_uhugeint(column, kinds[i]))
        elif _has_map(field.type):
            import duckdb

            if kinds is not None and len(kinds) == table.num_columns and \
                    "UHUGEINT" in kinds[i].upper():
                from ..db import exact_uhugeint

                column = exact_uhugeint(column, kinds[i])  # (in its maps too)
            column = pa.chunked_array([_exact_as_text(c) for c in column.chunks]
                                      or [_exact_as_text(pa.array([], column.type))])
            con = duckdb.connect()
            try:
                zone = (_zone(field.type) or "UTC").replace("'", "''")
                con.execute(f"SET TimeZone = '{zone}'")  # (none: the database's, UTC)
                text = con.from_arrow(pa.table({"v": column})).project(
                    'CAST("v" AS VARCHAR)').to_arrow_table().column(0)
            finally:
                con.close()
            table = table.set_column(i, field.name, text)
    return table


def _text(value: Any) -> str:
    """A value (never None) in text format, as PostgreSQL writes its type (floats as
    double precision: :func:`text_formatter` writes a column's by its type)."""
    kind = type(value)
    if kind is int or kind is str:  # the common cases first (bool is an int subclass)
        return str(value)
    if kind is float:
        return float8_text(value)
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        return float8_text(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return "\\x" + bytes(value).hex()
    if isinstance(value, dt.datetime):
        return datetime_text(value)
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.time):
        return time_text(value)
    if isinstance(value, decimal.Decimal):
        return numeric_text(value)
    if isinstance(value, dt.timedelta | pa.MonthDayNano | Interval):
        return interval_text(*interval_parts(value))
    if isinstance(value, PgArray):
        return value.text()
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


def text_formatter(oid: int, extra_float_digits: int = 1) -> Callable[[Any], str]:
    """How a column of type ``oid`` writes its values (never None) in text format: a
    real's as float4 (the shortest digits of the float4, not of the double it is held
    in), floats with the session's ``extra_float_digits`` (see :mod:`._textout`), any
    other as :func:`_text` writes it."""
    if oid in _ELEMENTS:
        write_element = text_formatter(_ELEMENTS[oid], extra_float_digits)

        def array(value: Any) -> str:
            return _array_text(value, write_element) if isinstance(value, list) \
                else _text(value)

        return array
    if oid == FLOAT4 or (oid == FLOAT8 and extra_float_digits != 1):
        write = float4_text if oid == FLOAT4 else float8_text

        def floats(value: Any) -> str:
            return write(value, extra_float_digits) if type(value) is float else _text(value)

        return floats
    return _text


def real_texts(values: Sequence[Any], extra_float_digits: int = 1, *,
               encoded: bool = False, oid: int = FLOAT4) -> list[Any]:
    """A real (``oid`` FLOAT4) or double precision (FLOAT8) column's values (None: NULL)
    in text, as :func:`text_formatter` writes each (``encoded``: as UTF-8 bytes): a column
    of floats at a time (:func:`._textout.float4_texts`, :func:`._textout.float8_texts`:
    the hot path of a large result of floats), any other value by value."""
    if extra_float_digits > 0 and set(map(type, values)) <= _FLOAT_OR_NONE:
        column = pa.array(values, pa.float64())
        texts = float4_texts(column, extra_float_digits) if oid == FLOAT4 else \
            float8_texts(column, extra_float_digits)
        out: list[Any] = (texts.cast(pa.binary()) if encoded else texts).to_pylist()
        return out
    write = text_formatter(oid, extra_float_digits)
    return [None if v is None else write(v).encode() if encoded else write(v)
            for v in values]


_FLOAT_OR_NONE = frozenset({float, type(None)})


def real_writers(oids: Sequence[int], rows: Sequence[Sequence[Any]],
                 extra_float_digits: int = 1, *, nulls: bool = True,
                 encoded: bool = False) -> dict[int, Callable[[Any], Any]]:
    """For each real or double precision column of ``rows`` (columns of type ``oids``), by
    its index, a writer that gives the next of the column's texts (:func:`real_texts`,
    written a column at a time) at each call, whatever it is passed: to be called once for
    each row's value in turn (``nulls`` False: for each value but the NULLs, whose texts it
    skips). A row of another length than ``oids`` raises ValueError."""
    reals = [i for i, oid in enumerate(oids)
             if oid == FLOAT4 or (oid == FLOAT8 and extra_float_digits > 0)]
    if not reals or not rows:
        return {}
    for row in rows:
        if len(row) != len(oids):
            raise ValueError(f"a row of {len(row)} values for {len(oids)} columns")
    writers: dict[int, Callable[[Any], Any]] = {}
    for i in reals:
        texts = real_texts([row[i] for row in rows], extra_float_digits, encoded=encoded,
                           oid=oids[i])
        if not nulls:
            texts = [t for t in texts if t is not None]
        writers[i] = functools.partial(next, iter(texts))  # (next(texts, value))
    return writers


def _float8_bytes(value: Any) -> bytes | None:
    """A double precision column's value (see :func:`float8_text`; this is the hot path
    of a large result of floats)."""
    if type(value) is float and -1e15 < value < 1e15:  # repr's digits, 1.0 as 1
        text = repr(value)
        return (text[:-2] if text[-2:] == ".0" else text).encode()
    if type(value) is float:
        return float8_text(value).encode()
    return None if value is None else _text(value).encode("utf-8")


def text_encoders(oids: Sequence[int], extra_float_digits: int = 1,
                  ) -> list[Callable[[Any], bytes | None]]:
    """For each column of type ``oids``, its values (None: NULL) as DataRow fields in
    text format (see :func:`text_formatter`)."""
    def encoder(oid: int) -> Callable[[Any], bytes | None]:
        if oid == FLOAT8 and extra_float_digits == 1:
            return _float8_bytes
        if oid != FLOAT4 and oid != FLOAT8 and oid not in _ELEMENTS:
            return encode_text
        write = text_formatter(oid, extra_float_digits)
        return lambda value: None if value is None else write(value).encode()

    return [encoder(oid) for oid in oids]


#: the array type of each element type (a list's, a catalog's arrays)
_ARRAY_OIDS = {BOOL: 1000, BYTEA: 1001, INT2: 1005, INT4: 1007, TEXT: 1009, INT8: 1016,
               FLOAT4: 1021, FLOAT8: 1022, OID: 1028, VARCHAR: 1015, DATE: 1182, TIME: 1183,
               TIMESTAMP: 1115, TIMESTAMPTZ: 1185, INTERVAL: 1187, NUMERIC: 1231, UUID: 2951,
               JSON: 199, TIMETZ: 1270}
_ELEMENTS = {array: element for element, array in _ARRAY_OIDS.items()}
#: PostgreSQL's array types of the base types (a parameter of one is refused)
ARRAY_TYPES = frozenset({*_ARRAY_OIDS.values(), 1014, 3807})
#: an element array_out quotes: empty, NULL in any case, or with a brace, quote, comma,
#: backslash or ASCII white space (array_isspace's; not Unicode's)
_ARRAY_QUOTED = re.compile(r'[{}",\\ \t\n\r\v\f]|^$|^null$', re.I)


def is_list(t: pa.DataType) -> bool:
    """Whether Arrow type ``t`` is a list (variable or fixed size)."""
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t)
                or pa.types.is_fixed_size_list(t))


def _shape(value: list[Any]) -> list[int]:
    """The dimensions of a (nested) list as a PostgreSQL array: its lengths down the first
    elements, every list at a level of the same length and none NULL (PostgreSQL's arrays
    are rectangular), else :class:`ProtocolError`; ``[0]`` for one without elements."""
    dims, level = [len(value)], value
    while level and isinstance(level[0], list):
        dims.append(len(level[0]))
        level = level[0]

    def check(items: list[Any], depth: int) -> None:
        if len(items) != dims[depth]:
            raise ProtocolError(RAGGED)
        for item in items:
            if depth + 1 < len(dims):
                if not isinstance(item, list):
                    raise ProtocolError(RAGGED)
                check(item, depth + 1)
            elif isinstance(item, list):
                raise ProtocolError(RAGGED)

    check(value, 0)
    return [0] if 0 in dims else dims


#: why a list of lists is refused
RAGGED = ("a list of lists of different lengths (or with a NULL list) has no PostgreSQL "
           "array: PostgreSQL's multidimensional arrays are rectangular (cast the column "
           "to VARCHAR for DuckDB's text of it)")


def _array_text(value: list[Any], write: Callable[[Any], str]) -> str:
    """A (nested) list as PostgreSQL's ``array_out`` writes it: ``{1,2,NULL}``,
    ``{{1,2},{3,4}}``, ``{"a b","c\\"d",NULL}``; its elements by ``write``."""
    if _shape(value) == [0]:
        return "{}"

    def items(level: list[Any]) -> str:
        out = []
        for v in level:
            if v is None:
                out.append("NULL")
            elif isinstance(v, list):
                out.append(items(v))
            else:
                item = write(v)
                if _ARRAY_QUOTED.search(item):
                    item = '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'
                out.append(item)
        return "{" + ",".join(out) + "}"

    return items(value)


def _array_binary(element: int, value: list[Any]) -> bytes:
    """A (nested) list in PostgreSQL's binary array format: its dimensions (each from 1),
    then its elements in row-major order, -1 for a NULL."""
    dims = _shape(value)
    if dims == [0]:  # an empty array has no dimensions
        return struct.pack("!iiI", 0, 0, element)
    flat: list[Any] = value
    for _ in dims[1:]:
        flat = [v for inner in flat for v in inner]
    items = [None if v is None else _binary(element, v) for v in flat]
    head = struct.pack("!iiI", len(dims), any(i is None for i in items), element)
    return head + b"".join(struct.pack("!ii", d, 1) for d in dims) + b"".join(
        struct.pack("!i", -1) if i is None else struct.pack("!i", len(i)) + i for i in items)


def rectangular(value: list[Any]) -> bool:
    """Whether a (nested) list is a PostgreSQL array (see :func:`_shape`)."""
    try:
        _shape(value)
    except ProtocolError:
        return False
    return True


class PgArray(list[Any]):
    """A one-dimensional PostgreSQL array of elements of type OID ``element`` (what
    ``pg_catalog``'s queries give: ``indkey``, ``array_agg(attname)``), sent as
    PostgreSQL writes arrays: ``{a,"b c",NULL}`` in text, its array format in binary."""

    __slots__ = ("element",)

    def __init__(self, values: Any, element: int) -> None:
        super().__init__(values)
        self.element = element

    def text(self) -> str:
        return _array_text(self, text_formatter(self.element))

    def binary(self) -> bytes:
        return _array_binary(self.element, self)


def array_oid(t: pa.DataType) -> int | None:
    """The PostgreSQL array type OID for Arrow list type ``t`` (None: not one): of its
    innermost elements' type (a list of lists is a multidimensional array), text's for
    a type the server sends as text."""
    if not is_list(t) or _has_map(t):  # (a MAP's column is sent as DuckDB's text)
        return None
    while is_list(t):
        t = t.value_type
    return _ARRAY_OIDS.get(arrow_oid(t), 1009)


def _numeric_binary(value: decimal.Decimal) -> bytes:
    if not value.is_finite():
        return struct.pack("!hhHh", 0, 0, 0xC000, 0)  # NaN (infinities have no int16 sign)
    sign, digits, exp = value.as_tuple()
    assert isinstance(exp, int)
    dscale = max(-exp, 0)
    text = "".join(map(str, digits))
    # pad so the decimal point falls on a base-10000 group boundary
    int_len = len(text) + exp
    int_part = text[:int_len] if int_len > 0 else ""
    frac_part = text[int_len:] if int_len >= 0 else "0" * -int_len + text
    if int_len > len(text):
        int_part = text + "0" * (int_len - len(text))
        frac_part = ""
    int_part = int_part.zfill((len(int_part) + 3) // 4 * 4)
    frac_part = frac_part.ljust((len(frac_part) + 3) // 4 * 4, "0")
    groups = [int(int_part[i:i + 4]) for i in range(0, len(int_part), 4)]
    weight = len(groups) - 1
    groups += [int(frac_part[i:i + 4]) for i in range(0, len(frac_part), 4)]
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    return struct.pack(f"!hhHH{len(groups)}H", len(groups), weight,
                       0x4000 if sign else 0, dscale, *groups)


#: a timetz's text, as DuckDB and PostgreSQL write it: ``12:34:56.5+05:30``, ``24:00:00-08``
_TIMETZ_TEXT = re.compile(r"(\d+):(\d+):(\d+)(?:\.(\d{1,6}))?([+-])(\d+)(?::(\d+))?(?::(\d+))?")


def _timetz_binary(value: Any) -> bytes:
    """A timetz as PostgreSQL's timetz_send writes it: the time's microseconds (int64),
    then the zone's offset in seconds west of UTC (int32)."""
    if isinstance(value, dt.time):
        offset = value.utcoffset()
        if offset is None:
            raise TypeError("a time without an offset")
        us = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 \
            + value.microsecond
        return struct.pack("!qi", us, -int(offset.total_seconds()))
    m = _TIMETZ_TEXT.fullmatch(str(value))
    if m is None:
        raise ValueError(f"{value!r} is not a timetz")
    us = ((int(m[1]) * 60 + int(m[2])) * 60 + int(m[3])) * 1_000_000 + \
        int((m[4] or "").ljust(6, "0"))
    east = (int(m[6]) * 60 + int(m[7] or 0)) * 60 + int(m[8] or 0)
    return struct.pack("!qi", us, east if m[5] == "-" else -east)


def _binary(oid: int, value: Any) -> bytes:
    try:
        if oid == BOOL:
            return b"\x01" if value else b"\x00"
        if oid == INT2:
            return struct.pack("!h", value)
        if oid == INT4:
            return struct.pack("!i", value)
        if oid == INT8:
            return struct.pack("!q", value)
        if oid == OID:
            return struct.pack("!I", value)
        if oid == FLOAT4:
            return struct.pack("!f", value)
        if oid == FLOAT8:
            return struct.pack("!d", value)
        if oid == BYTEA:
            return bytes(value) if not isinstance(value, str) else value.encode()
        if oid == DATE:
            return struct.pack("!i", (value - _EPOCH_DATE).days)
        if oid in (TIMESTAMP, TIMESTAMPTZ):
            base = _EPOCH_TZ if value.tzinfo else _EPOCH
            delta = value - base
            return struct.pack("!q", (delta.days * 86400 + delta.seconds) * 1_000_000
                               + delta.microseconds)
        if oid == TIME:
            us = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
            return struct.pack("!q", us + value.microsecond)
        if oid == TIMETZ:
            return _timetz_binary(value)
        if oid == INTERVAL:
            months, days, us = interval_parts(value)
            return struct.pack("!qii", us, days, months)
        if oid == NUMERIC:
            return _numeric_binary(decimal.Decimal(value))
        if oid == UUID:
            return value.bytes if isinstance(value, uuid.UUID) else uuid.UUID(str(value)).bytes
        if oid in _ELEMENTS and isinstance(value, list):
            return _array_binary(_ELEMENTS[oid], value)
        if oid == INT2VECTOR:  # int2vectorsend's: one dimension from 0, even when empty
            items = [int(v) for v in str(value).split()]
            return struct.pack("!iiIii", 1, 0, INT2, len(items), 0) + b"".join(
                struct.pack("!ih", 2, v) for v in items)
    except (struct.error, TypeError, AttributeError, ValueError,
            decimal.InvalidOperation) as exc:
        if isinstance(value, PgDatetime):  # (infinity, BC, beyond 9999, 24:00:00)
            if value.binary:
                return value.binary
            raise ProtocolError(f"date {value} is out of PostgreSQL's range in binary "
                                "format") from None
        raise ProtocolError(f"cannot send {type(value).__name__} as binary type {oid}: "
                            f"{exc}") from None
    return _text(value).encode("utf-8")


def encode_text(value: Any) -> bytes | None:
    """One result value in text format as its Python type says (a float as double
    precision; :func:`text_encoders` writes a column's by its type)."""
    if value is None:
        return None
    kind = type(value)
    if kind is int or kind is str:
        return str(value).encode("utf-8")
    return _text(value).encode("utf-8")


def encode_value(oid: int, value: Any, fmt: int, extra_float_digits: int = 1,
                 ) -> bytes | None:
    """One result value in text (0, see :func:`text_formatter`) or binary (1) format;
    None is SQL NULL."""
    if value is None:
        return None
    if fmt == 1:
        return _binary(oid, value)
    return text_formatter(oid, extra_float_digits)(value).encode("utf-8")


# --- parameters ----------------------------------------------------------------------


def _decode_numeric(data: bytes) -> decimal.Decimal:
    ndigits, weight, sign, dscale = struct.unpack("!hhHH", data[:8])
    if len(data) != 8 + 2 * ndigits or ndigits < 0:
        raise ProtocolError("binary numeric parameter has the wrong length")
    if sign == 0xC000:
        return decimal.Decimal("NaN")
    if sign not in (0, 0x4000):
        raise ProtocolError("binary numeric parameter has an unknown sign")
    digits = struct.unpack(f"!{ndigits}H", data[8:])
    if any(d > 9999 for d in digits):
        raise ProtocolError("binary numeric parameter has a digit above 9999")
    if dscale > 16383:  # (PostgreSQL's NUMERIC_MAX_DISPLAY_SCALE... and its dscale mask)
        raise ProtocolError("binary numeric parameter has a scale above 16383")
    # exact, whatever its length (decimal's arithmetic would round it to 28 digits): its
    # base-10000 digits, the last of which stands at 10000 ** (weight - ndigits + 1)
    text = "".join(f"{d:04d}" for d in digits) or "0"
    exponent = 4 * (weight - ndigits + 1)
    value = decimal.Decimal((1 if sign else 0, tuple(map(int, text)), exponent))
    # its display scale: trailing zeros to drop or add (dscale digits after the point)
    if -exponent > dscale:
        value = decimal.Decimal((1 if sign else 0, tuple(map(int, text[:len(text) - (
            -exponent - dscale)] or "0")), -dscale))
    elif -exponent < dscale:
        value = decimal.Decimal((1 if sign else 0, tuple(map(int, text + "0" * (
            dscale + exponent))), -dscale))
    return value


_OID_NAMES = {BOOL: "boolean", INT2: "smallint", INT4: "integer", INT8: "bigint", OID: "oid",
              FLOAT4: "real", FLOAT8: "double precision", NUMERIC: "numeric", DATE: "date",
              TIMESTAMP: "timestamp", TIMESTAMPTZ: "timestamp with time zone", UUID: "uuid",
              OID_ARRAY: "oid[]"}


#: a date and a zone, as PostgreSQL's JDBC driver sends a java.sql.Date (setDate:
#: ``2024-02-29 +02``, the JVM's offset, as a parameter of no type)
_DATE_WITH_ZONE = re.compile(r"(\d{4}-\d\d-\d\d) ([+-]\d\d(?::?\d\d){0,2})")
#: a date or a timestamp with a zone, as the JDBC driver sends a java.sql.Date or
#: Timestamp (setTimestamp: ``2024-01-02 03:04:05.123456+09``) as a parameter of no type
_ZONED = re.compile(r"\d{4}-\d\d-\d\d(?: \d\d:\d\d:\d\d(?:\.\d+)?| )"
                    r"[+-]\d\d(?::?\d\d){0,2}")


def zoned(text: str) -> bool:
    """Whether ``text`` is a date or timestamp with a zone (see :data:`_ZONED`): the type
    its place gives it decides what it is, as PostgreSQL reads it (a date: the date; a
    timestamp: the time of day, the zone ignored; a timestamptz: that instant)."""
    return _ZONED.fullmatch(text) is not None


def _midnight(text: str) -> str:
    """A date with a zone as midnight at that offset; other text as it is."""
    m = _DATE_WITH_ZONE.fullmatch(text.strip())
    return f"{m[1]} 00:00:00{m[2]}" if m else text


#: the dates a date parameter's text may be beside Python's ISO forms: ISO 8601's
#: year-month-day (``2024-1-2``), then a time and a zone that are dropped
PG_DATE_TEXT = re.compile(r"\s*([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})"
                          r"(?:[ T][0-9]{1,2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?"
                          r"(?:\s*(?:Z|[+-][0-9]{1,2}(?::?[0-9]{2})?))?)?\s*")


class ParameterInputError(ProtocolError):
    """A parameter's text that its type's input refuses, with PostgreSQL's SQLSTATE for it
    (``sqlstate``: 22007 for a date that is none, 22008 for a field out of range)."""

    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def _date_param(text: str) -> dt.date:
    """A date parameter's text: a date, or a timestamp or a date with a zone (JDBC's
    setDate) of which the date, as PostgreSQL's date input takes them (its ISO forms:
    :data:`PG_DATE_TEXT`); :class:`ParameterInputError` for other text."""
    given, text = text, text.strip()
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(_midnight(text)).date()
    except ValueError:
        pass
    m = PG_DATE_TEXT.fullmatch(text)
    if m is None:
        raise ParameterInputError(f'invalid input syntax for type date: "{given}"', "22007")
    try:
        return dt.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        raise ParameterInputError(f'date/time field value out of range: "{given}"',
                                  "22008") from None


def decode_param(oid: int, data: bytes | None, fmt: int) -> Any:
    """A Bind parameter as a Python value (None for NULL), by its type OID and format."""
    if data is None:
        return None
    try:
        if fmt == 1:
            return _oid_array(data) if oid == OID_ARRAY else _decode_binary(oid, data)
        text = data.decode("utf-8")
        if oid == OID_ARRAY:
            return _oid_array_text(text)
        if oid in (INT2, INT4, INT8, OID):
            return int(text)
        if oid in (FLOAT4, FLOAT8):
            return float(text)
        if oid == BOOL:
            low = text.strip().lower()
            if low in ("t", "true", "yes", "on", "1", "y"):
                return True
            if low in ("f", "false", "no", "off", "0", "n"):
                return False
            raise ValueError(f"invalid boolean {text!r}")
        if oid == NUMERIC:
            return decimal.Decimal(text)
        if oid == BYTEA:
            return bytes.fromhex(text[2:]) if text.startswith("\\x") else data
        if oid == DATE:
            return _date_param(text)
        if oid == TIMESTAMPTZ:
            return dt.datetime.fromisoformat(_midnight(text))
        if oid == TIMESTAMP:  # a zone is ignored, as PostgreSQL's timestamp input does
            return dt.datetime.fromisoformat(_midnight(text)).replace(tzinfo=None)
        if oid == UUID:
            return uuid.UUID(text)
        if oid == INTERVAL:  # as a binary one: the text PostgreSQL writes (as both read it)
            return interval_text(*parse_interval(text), plus=False)
        return text
    except IntervalError as exc:  # (22007; 22015 or 22008 out of range)
        raise ParameterInputError(*exc.args) from None
    except (ValueError, UnicodeDecodeError, struct.error, decimal.InvalidOperation) as exc:
        if fmt == 0 and not isinstance(exc, UnicodeDecodeError):
            raise ProtocolError(f"invalid input syntax for type {_OID_NAMES.get(oid, oid)}: "
                                f'"{text}"') from None
        raise ProtocolError(f"invalid value for parameter of type {oid}: {exc}") from None


def _oid_array_text(text: str) -> list[int | None]:
    """An oid[] parameter (one dimension) in text, ``{1,2,NULL}``, as a list."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"malformed array literal {text!r}")
    items = [i.strip() for i in text[1:-1].split(",")] if text[1:-1].strip() else []
    return [None if i.upper() == "NULL" else int(i) for i in items]


def _oid_array(data: bytes) -> list[int | None]:
    """An oid[] parameter (one dimension) in PostgreSQL's binary array format as a list."""
    ndims, _, element = struct.unpack_from("!iiI", data)
    if ndims == 0:
        return []
    if ndims != 1 or element != OID:
        raise ValueError(f"an oid[] of {ndims} dimensions of type {element}")
    (count, _) = struct.unpack_from("!ii", data, 12)
    out: list[int | None] = []
    at = 20
    for _ in range(count):
        (length,) = struct.unpack_from("!i", data, at)
        at += 4
        if length == -1:
            out.append(None)
            continue
        if length != 4:
            raise ValueError(f"an oid of {length} bytes")
        out.append(struct.unpack_from("!I", data, at)[0])
        at += 4
    if at != len(data):
        raise ValueError(f"{len(data) - at} bytes after the array")
    return out


def _decode_binary(oid: int, data: bytes) -> Any:
    fixed = {BOOL: "!?", INT2: "!h", INT4: "!i", INT8: "!q", OID: "!I", FLOAT4: "!f",
             FLOAT8: "!d"}
    if oid in fixed:
        fmt = fixed[oid]
        if len(data) != struct.calcsize(fmt):
            raise ProtocolError(f"binary parameter of type {oid} has {len(data)} bytes")
        return struct.unpack(fmt, data)[0]
    if oid == BYTEA:
        return bytes(data)
    if oid in _TEXTLIKE:
        return data.decode("utf-8")
    if oid == DATE:
        (days,) = struct.unpack("!i", data)
        return _EPOCH_DATE + dt.timedelta(days=days)
    if oid in (TIMESTAMP, TIMESTAMPTZ):
        (us,) = struct.unpack("!q", data)
        return (_EPOCH_TZ if oid == TIMESTAMPTZ else _EPOCH) + dt.timedelta(microseconds=us)
    if oid == NUMERIC:
        return _decode_numeric(data)
    if oid == UUID:
        return uuid.UUID(bytes=data)
    if oid in (TIME, TIMETZ):  # as text, as a text parameter gives it (psycopg's time)
        if len(data) != (8 if oid == TIME else 12):
            raise ProtocolError(f"{len(data)} bytes is not a binary time")
        (us,) = struct.unpack("!q", data[:8])
        if not 0 <= us <= 86_400_000_000:
            raise ProtocolError("binary time parameter out of range")
        seconds, us = divmod(us, 1_000_000)
        text = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" + (
            f".{us:06d}".rstrip("0") if us else "")
        if oid == TIMETZ:  # the zone's offset in seconds west of UTC
            (west,) = struct.unpack("!i", data[8:])
            east = abs(west)
            text += ("-" if west > 0 else "+") + f"{east // 3600:02d}:{east // 60 % 60:02d}" + (
                f":{east % 60:02d}" if east % 60 else "")
        return text
    if oid == INTERVAL:  # as text, which both engines read: what a text parameter gives
        if len(data) != 16:
            raise ProtocolError(f"{len(data)} bytes is not a binary interval")
        us, days, months = struct.unpack("!qii", data)
        return interval_text(months, days, us, plus=False)
    raise ProtocolError(f"binary parameters of type {oid} are not supported; send it as text")


#: a result column's Arrow field metadata that marks a ``TIME WITH TIME ZONE`` made text
#: by :func:`lossy_result` (sent as timetz, 1266)
TIMETZ_FIELD = {b"cryptdisk.type": b"timetz"}

_TIMETZ_OFFSET_BITS = 24  # DuckDB's dtime_tz_t: microseconds << 24 | 57599 - offset
_TIMETZ_MAX_OFFSET = 16 * 60 * 60 - 1
_UHUGEINT_TYPE = pa.decimal256(39, 0)  # (as _rows.exact_uhugeint makes one)


def _opaque(t: pa.DataType) -> str | None:
    """The DuckDB type name of an ``arrow.opaque`` type of DuckDB's lossless Arrow export,
    ``arrow.uuid`` and ``arrow.json`` as ``uuid`` and ``json``; None for any other type."""
    if not isinstance(t, pa.BaseExtensionType):
        return None
    name = t.extension_name
    if name == "arrow.opaque" and getattr(t, "vendor_name", "") == "DuckDB":
        return str(t.type_name)
    return {"arrow.uuid": "uuid", "arrow.json": "json", "arrow.bool8": "bool8"}.get(name)


def _lossless(t: pa.DataType) -> bool:
    """Whether Arrow type ``t`` has (alone or nested) a type :func:`_lossy_array` turns
    back into DuckDB's default export's."""
    if _opaque(t) not in (None, "bignum"):
        return True
    if pa.types.is_map(t):
        return _lossless(t.key_type) or _lossless(t.item_type)
    if pa.types.is_struct(t) or pa.types.is_union(t):
        return any(_lossless(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _lossless(t.value_type)
    return False


def _timetz_parts(values: pa.Array) -> list[tuple[int, int] | None]:
    """Each ``time_tz`` value of ``values`` (its 8 bytes, DuckDB's ``dtime_tz_t``) as
    (microseconds of the day, offset in seconds east of UTC), None for a NULL."""
    out: list[tuple[int, int] | None] = []
    for raw in values.to_pylist():
        if raw is None:
            out.append(None)
            continue
        bits = int.from_bytes(raw, "little")
        out.append((bits >> _TIMETZ_OFFSET_BITS,
                    _TIMETZ_MAX_OFFSET - (bits & ((1 << _TIMETZ_OFFSET_BITS) - 1))))
    return out


def timetz_text(us: int, east: int) -> str:
    """A timetz as PostgreSQL 15 (and DuckDB) write it: ``12:34:56.5+05:30``,
    ``24:00:00-15:59``, ``12:34:56+05:30:15``."""
    seconds, micro = divmod(us, 1_000_000)
    text = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    if micro:
        text += f".{micro:06d}".rstrip("0")
    hours, rest = divmod(abs(east), 3600)
    text += f"{'-' if east < 0 else '+'}{hours:02d}"
    if rest:
        text += f":{rest // 60:02d}" + (f":{rest % 60:02d}" if rest % 60 else "")
    return text


def _storage(array: pa.Array) -> pa.Array:
    return array.storage if isinstance(array, pa.ExtensionArray) else array


def _lossy_array(array: pa.Array) -> pa.Array:
    """``array`` of DuckDB's lossless Arrow export as DuckDB's default export gives it: a
    ``UUID`` as its text, ``HUGEINT`` ``DECIMAL(38,0)``, ``BIT`` binary, ``JSON`` text, a
    ``TIME WITH TIME ZONE`` (in a list or struct) its text with the offset (PostgreSQL's,
    :func:`timetz_text`), ``BOOLEAN`` bool; a ``UHUGEINT``
    its exact value, a
    ``DECIMAL(39,0)`` (as ``exact_result`` makes one)."""
    t = array.type
    if not _lossless(t):
        return array
    kind = _opaque(t)
    if kind is not None:
        storage = _storage(array)
        if kind == "uuid":
            return pa.array([None if b is None else str(uuid.UUID(bytes=b))
                             for b in storage.to_pylist()], pa.string())
        if kind == "time_tz":  # (in a list or struct: its text, as at the top level)
            return pa.array([None if p is None else timetz_text(*p)
                             for p in _timetz_parts(storage)], pa.string())
        if kind == "hugeint":  # (the same 16 bytes, as the default export reads them)
            return pa.Array.from_buffers(pa.decimal128(38, 0), len(storage),
                                         storage.buffers(), storage.null_count,
                                         storage.offset)
        if kind == "uhugeint":
            return pa.array([None if b is None else
                             decimal.Decimal(int.from_bytes(b, "little"))
                             for b in storage.to_pylist()], _UHUGEINT_TYPE)
        if kind == "bool8":
            return storage.cast(pa.bool_())
        return storage  # (BIT's bytes, JSON's text)
    mask = array.is_null() if array.null_count else None
    # a list of TIME WITH TIME ZONE: its values' field marked (sent as timetz[], 1270)
    zoned = TIMETZ_FIELD if _opaque(getattr(t, "value_type", None)) == "time_tz" else None
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        values = _lossy_array(array.values)
        item = pa.field(t.value_field.name, values.type, t.value_field.nullable, zoned)
        if pa.types.is_list(t):
            return pa.ListArray.from_arrays(array.offsets, values, pa.list_(item), mask=mask)
        return pa.LargeListArray.from_arrays(array.offsets, values, pa.large_list(item),
                                             mask=mask)
    if pa.types.is_fixed_size_list(t):
        values = _lossy_array(array.flatten())
        item = pa.field(t.value_field.name, values.type, t.value_field.nullable, zoned)
        return pa.FixedSizeListArray.from_arrays(values, type=pa.list_(item, t.list_size),
                                                 mask=mask)
    if pa.types.is_map(t):
        keys, items = _lossy_array(array.keys), _lossy_array(array.items)
        return pa.MapArray.from_arrays(array.offsets, keys, items, mask=mask)
    if pa.types.is_struct(t):
        fields = [_lossy_array(f) for f in array.flatten()]
        return pa.StructArray.from_arrays(
            fields, fields=[pa.field(t.field(i).name, f.type, t.field(i).nullable)
                            for i, f in enumerate(fields)], mask=mask)
    children = [_lossy_array(array.field(i)) for i in range(t.num_fields)]  # (a union)
    names = [t.field(i).name for i in range(t.num_fields)]
    if t.mode == "sparse":
        return pa.UnionArray.from_sparse(array.type_codes, children, names, t.type_codes)
    return pa.UnionArray.from_dense(array.type_codes, array.offsets, children, names,
                                    t.type_codes)


def lossy_result(data: Any) -> Any:
    """A result table or batch of DuckDB's lossless Arrow export (see
    ``cryptdisk.db.Reader.arrow_lossless``) as the server reads DuckDB's default one,
    with each ``TIME WITH TIME ZONE`` column as its text (PostgreSQL's,
    :func:`timetz_text`) in a field marked :data:`TIMETZ_FIELD`, and one in a list or
    struct as its text too (a list's values' field marked so: :func:`zoned_list`)."""
    if data is None or not any(_lossless(f.type) for f in data.schema):
        return data
    columns, fields = [], []
    for i, field in enumerate(data.schema):
        column = data.column(i)
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        if not chunks:  # (an empty table's)
            chunks = [pa.nulls(0, field.type)]
        if _opaque(field.type) == "time_tz":
            done = [pa.array([None if p is None else timetz_text(*p)
                              for p in _timetz_parts(_storage(c))], pa.string())
                    for c in chunks]
            fields.append(pa.field(field.name, pa.string(), field.nullable, TIMETZ_FIELD))
        else:
            done = [_lossy_array(c) for c in chunks]
            fields.append(pa.field(field.name, done[0].type, field.nullable))
        columns.append(done)
    schema = pa.schema(fields)
    if isinstance(data, pa.RecordBatch):
        return pa.RecordBatch.from_arrays([c[0] for c in columns], schema=schema)
    return pa.Table.from_arrays([pa.chunked_array(c, f.type) for c, f in
                                 zip(columns, fields, strict=True)], schema=schema)


def lossy_schema(schema: pa.Schema) -> pa.Schema:
    """The schema :func:`lossy_result` gives a result of ``schema``."""
    return lossy_result(pa.Table.from_arrays([pa.nulls(0, f.type) for f in schema],
                                             schema=schema)).schema


def zoned_field(field: pa.Field) -> bool:
    """Whether a column of :func:`lossy_result` is a ``TIME WITH TIME ZONE``'s text."""
    return bool(field.metadata) and field.metadata.get(b"cryptdisk.type") == b"timetz"


def zoned_list(t: pa.DataType) -> bool:
    """Whether a column type of :func:`lossy_result` is a (nested) list of ``TIME WITH
    TIME ZONE`` texts: an array of timetz (1270)."""
    if not is_list(t) or _has_map(t):
        return False
    while is_list(t.value_type):
        t = t.value_type
    return zoned_field(t.value_field)
