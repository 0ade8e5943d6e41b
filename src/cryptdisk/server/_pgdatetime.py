"""Dates, timestamps and times that DuckDB and PostgreSQL hold and Python's ``datetime``
does not, as PostgreSQL 15 sends them.

- ``infinity`` and ``-infinity`` (dates and timestamps): that text, and in binary the
  largest and smallest integer of the type's width (int32 days, int64 microseconds).
- years before 1 (astronomical year 0 is 1 BC: PostgreSQL has no year 0) and after 9999:
  ``0044-03-15 BC``, ``0001-01-01 00:00:00 BC``, ``10000-01-01``; in binary the days or
  microseconds from 2000-01-01 as for any other. A timestamptz takes its session zone's
  offset then (a year before 1: the zone's local mean time, as PostgreSQL's; after 9999:
  its rules, which repeat every 400 years as the Gregorian calendar does).
- the time ``24:00:00``.

DuckDB's dates reach beyond PostgreSQL's (4713 BC to 5874897 AD): those are written in
the same form, and a binary date whose days from 2000 do not fit in 32 bits is refused.

:func:`values` gives an Arrow array's values with such values as :class:`PgDatetime`
(its text and binary encoding), the others as :func:`cryptdisk.db.python_rows` gives
them; :func:`has_special` says whether an array needs it (one ``min_max``).
"""

from __future__ import annotations

import datetime as dt
import struct
import zoneinfo
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ._textout import offset_text

__all__ = ["PgDatetime", "has_special", "temporal", "values"]

_DAY_US = 86_400_000_000
#: days of 400 Gregorian years (a whole number of weeks: the calendar repeats)
_CYCLE = 146_097
_UNIX = dt.date(1970, 1, 1)
#: 2000-01-01, PostgreSQL's epoch, in days and microseconds from 1970-01-01
_PG_DAYS = 10_957
_PG_US = _PG_DAYS * _DAY_US
#: the days from 1970 of the years Python formats here: 0002-01-01 .. 9998-12-31 (a day
#: of margin either side for a zone's offset)
_LOW = (dt.date(2, 1, 1) - _UNIX).days
_HIGH = (dt.date(9998, 12, 31) - _UNIX).days
#: DuckDB's infinite dates (int32) and timestamps (int64, any unit)
_DATE_INF, _TS_INF = 2**31 - 1, 2**63 - 1
_UNIT_US = {"s": 1_000_000, "ms": 1_000, "us": 1}


class PgDatetime:
    """One such value: ``str()`` is its text, :attr:`binary` its binary encoding."""

    __slots__ = ("binary", "text")

    def __init__(self, text: str, binary: bytes) -> None:
        self.text, self.binary = text, binary

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"PgDatetime({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PgDatetime) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


_INFINITE_DATES = {_DATE_INF: PgDatetime("infinity", struct.pack("!i", 2**31 - 1)),
                   -_DATE_INF: PgDatetime("-infinity", struct.pack("!i", -2**31))}
_INFINITE_TIMES = {_TS_INF: PgDatetime("infinity", struct.pack("!q", _TS_INF)),
                   -_TS_INF: PgDatetime("-infinity", struct.pack("!q", -2**63))}
_MIDNIGHT = PgDatetime("24:00:00", struct.pack("!q", _DAY_US))


def _in_range(days: int) -> tuple[dt.date, int]:
    """The date ``days`` from 1970 moved by whole 400-year cycles into years 2..9998, and
    the years it was moved by (to take off its year)."""
    if days < _LOW:
        cycles = (_LOW - days + _CYCLE - 1) // _CYCLE
    elif days > _HIGH:
        cycles = -((days - _HIGH + _CYCLE - 1) // _CYCLE)
    else:
        cycles = 0
    return _UNIX + dt.timedelta(days=days + cycles * _CYCLE), 400 * cycles


def _year(year: int) -> tuple[str, str]:
    """An astronomical year as PostgreSQL writes it, and its ``BC`` suffix."""
    return (f"{1 - year:04d}", " BC") if year < 1 else (f"{year:04d}", "")


def _date(days: int) -> PgDatetime:
    if days in _INFINITE_DATES:
        return _INFINITE_DATES[days]
    day, moved = _in_range(days)
    year, bc = _year(day.year - moved)
    text = f"{year}-{day.month:02d}-{day.day:02d}{bc}"
    if not -2**31 <= days - _PG_DAYS < 2**31:
        return PgDatetime(text, b"")  # (refused in binary: see _binary)
    return PgDatetime(text, struct.pack("!i", days - _PG_DAYS))


def _timestamp(us: int, zone: zoneinfo.ZoneInfo | None) -> PgDatetime:
    days, rest = divmod(us, _DAY_US)
    day, moved = _in_range(days)
    at = dt.datetime.combine(day, dt.time()) + dt.timedelta(microseconds=rest)
    offset = ""
    if zone is not None:
        at = at.replace(tzinfo=dt.UTC).astimezone(zone)
        offset = offset_text(at.utcoffset() or dt.timedelta())
    year, bc = _year(at.year - moved)
    text = f"{year}-{at:%m-%d %H:%M:%S}"
    if at.microsecond:
        text += f".{at.microsecond:06d}".rstrip("0")
    return PgDatetime(text + offset + bc, struct.pack("!q", us - _PG_US))


def _special(t: pa.DataType, array: pa.Array) -> bool:
    """Whether Arrow ``array`` of temporal type ``t`` has a value Python cannot hold."""
    if pa.types.is_date32(t):
        ints = array.view(pa.int32())
        low, high = _LOW, _HIGH
    elif pa.types.is_timestamp(t):
        ints = array.view(pa.int64())
        scale = _DAY_US // _UNIT_US[t.unit] if t.unit in _UNIT_US else _DAY_US * 1000
        # (nanoseconds reach years 1677 to 2262 only: their infinities are the special ones)
        low, high = max(_LOW * scale, 1 - _TS_INF), min((_HIGH + 1) * scale - 1, _TS_INF - 1)
    elif pa.types.is_time64(t):
        ints = array.view(pa.int64())
        low, high = 0, (_DAY_US if t.unit == "us" else _DAY_US * 1000) - 1
    else:
        return False
    bounds = pc.min_max(ints).as_py()
    return bounds["min"] is not None and not (low <= bounds["min"] and bounds["max"] <= high)


def values(array: pa.Array) -> list[Any]:
    """``array``'s values as Python's, each that Python cannot hold as a
    :class:`PgDatetime`."""
    t = array.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        items = values(array.flatten())
        out: list[Any] = []
        offsets = array.offsets.to_pylist() if not pa.types.is_fixed_size_list(t) else None
        start = offsets[0] if offsets else 0
        for i, valid in enumerate(array.is_valid().to_pylist()):
            if offsets is not None:
                lo, hi = offsets[i] - start, offsets[i + 1] - start
            else:
                lo, hi = i * t.list_size, (i + 1) * t.list_size
            out.append(items[lo:hi] if valid else None)
        return out
    if not _special(t, array):
        from ..db import python_rows

        return [r[0] for r in python_rows(pa.table({"v": array}))]
    raw = array.view(pa.int32() if pa.types.is_date32(t) else pa.int64()).to_pylist()
    if pa.types.is_date32(t):
        return [None if v is None else _date(v) for v in raw]
    if pa.types.is_time64(t):
        ns = t.unit == "ns"
        return [None if v is None else _MIDNIGHT if v == (_DAY_US * (1000 if ns else 1))
                else (dt.datetime.min + dt.timedelta(microseconds=v // 1000 if ns else v)
                      ).time() for v in raw]
    zone = zoneinfo.ZoneInfo(t.tz) if t.tz else None
    scale = _UNIT_US.get(t.unit, 1)
    return [None if v is None else _INFINITE_TIMES.get(v) or
            _timestamp(v * scale if t.unit != "ns" else (v + 500) // 1000, zone) for v in raw]


def temporal(t: pa.DataType) -> bool:
    """Whether Arrow type ``t`` is a date, timestamp or time, or a list of them."""
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return temporal(t.value_type)
    return bool(pa.types.is_date32(t) or pa.types.is_timestamp(t) or pa.types.is_time64(t))


def has_special(array: pa.Array) -> bool:
    """Whether ``array`` (of a :func:`temporal` type) has a value Python cannot hold."""
    t = array.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return has_special(array.flatten())
    return _special(t, array)
