"""PostgreSQL 15's interval input (``interval_in``, IntervalStyle postgres), for the
intervals the SQLite engine holds as text: ``90 minutes``, ``1 day 25 hours``, ``1.5
years``, ``-1:30``, ``@ 1 hour ago``, ``1-2`` (year-month), ``1 2:03:04`` (day-time) and
ISO 8601's designators (``P1Y2M3DT4H5M6S``) read as PostgreSQL reads them, into its three
fields (months, days, microseconds), which it keeps apart: ``1 day 25 hours`` stays 1 day
and 25 hours. A fraction spills as PostgreSQL's does: a year's into whole months
(rounded), a month's into days of 30 and the rest into time, a week's into days, a day's
into time, rounded to the microsecond."""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Interval", "IntervalError", "parse_interval"]

_US_SECOND = 1_000_000
_US_DAY = 86_400 * _US_SECOND
_INT32 = 1 << 31
_INT64 = 1 << 63


class Interval(NamedTuple):
    """An interval's three fields, as PostgreSQL keeps them."""

    months: int
    days: int
    micros: int


class IntervalError(ValueError):
    """Text ``interval_in`` refuses: ``args`` are (message, SQLSTATE)."""


#: unit words (PostgreSQL compares their first 10 characters) -> (field, scale, the
#: field a unit may be given once: PostgreSQL's mask)
_UNITS: dict[str, tuple[str, int, str]] = {
    **dict.fromkeys(("us", "usec", "usecs", "useconds", "microsecon"), ("us", 1, "us")),
    **dict.fromkeys(("ms", "msec", "msecs", "mseconds", "millisecon"), ("us", 1000, "ms")),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), ("us", _US_SECOND, "s")),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"),
                    ("us", 60 * _US_SECOND, "min")),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), ("us", 3600 * _US_SECOND, "h")),
    **dict.fromkeys(("d", "day", "days"), ("day", 1, "day")),
    **dict.fromkeys(("w", "week", "weeks"), ("day", 7, "week")),
    **dict.fromkeys(("mon", "mons", "month", "months"), ("mon", 1, "mon")),
    **dict.fromkeys(("y", "yr", "yrs", "year", "years"), ("year", 1, "year")),
    **dict.fromkeys(("dec", "decs", "decade", "decades"), ("year", 10, "decade")),
    **dict.fromkeys(("c", "cent", "century", "centuries"), ("year", 100, "century")),
    **dict.fromkeys(("mil", "mils", "millennia", "millennium"), ("year", 1000, "mil")),
}
_SECONDS = frozenset({"s", "ms", "us"})
_TIME = frozenset({"h", "min", *_SECONDS})
_TOKEN = re.compile(r"""\s*(?:
    (?P<time>[+-]?\d+:\d+(?::\d+(?:\.\d*)?)?)
  | (?P<ym>[+-]?\d+-\d+)
  | (?P<num>[+-]?(?:\d+\.?\d*|\.\d+))
  | (?P<word>[a-z]+)
  | (?P<at>@))""", re.X)
#: what C's strtod reads of a number starting with a digit, '-' or '.' (PostgreSQL's
#: ParseISO8601Number); hexadecimal is not read here
_ISO_NUMBER = re.compile(r"-?(?:(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?|inf(?:inity)?|nan)")
_ISO_DATE = {"y": ("year", 1), "m": ("mon", 1), "w": ("day", 7), "d": ("day", 1)}
_ISO_TIME = {"h": 3600 * _US_SECOND, "m": 60 * _US_SECOND, "s": _US_SECOND}


def parse_interval(text: str) -> Interval:
    """``text`` as PostgreSQL 15 reads an interval; raises :class:`IntervalError` (22007
    for text it does not read, 22015 for a field out of range)."""
    s = text.strip().lower()
    try:
        if s.startswith("p"):
            fields = _iso(s, text)
        else:
            fields = _postgres(s, text)
    except OverflowError:
        raise IntervalError(f'interval field value out of range: "{text}"', "22015") from None
    return Interval(*fields)


def _bad(text: str) -> IntervalError:
    return IntervalError(f'invalid input syntax for type interval: "{text}"', "22007")


class _Fields:
    """PostgreSQL's ``pg_itm_in``: years and months apart (int32 each), days (int32),
    microseconds (int64); a step past its field's range is PostgreSQL's field overflow
    (22015), years and months together past int32 its "interval out of range" (22008)."""

    def __init__(self) -> None:
        self.years = self.months = self.days = self.micros = 0

    def add(self, number: str, field: str, scale: int) -> None:
        """``number`` (its sign on its fraction too) of ``field`` times ``scale``."""
        whole_text, _, frac_text = number.partition(".")
        whole = int(whole_text) if whole_text.lstrip("+-") else 0
        frac = float("0." + frac_text) if frac_text else 0.0
        self.adjust(whole, -frac if whole_text.startswith("-") else frac, field, scale)

    def adjust(self, whole: int, frac: float, field: str, scale: int) -> None:
        """``whole`` and ``frac`` (of the same sign) of ``field`` times ``scale``."""
        if field == "us":
            self.micros = _fit(self.micros + _fit(whole * scale, _INT64), _INT64)
            self._fract_micros(frac, scale)
            return
        whole = _fit(_fit(whole, _INT32) * scale, _INT32)
        if field == "year":
            self.years = _fit(self.years + whole, _INT32)
            self.months = _fit(self.months + _rint(frac * scale * 12), _INT32)
        elif field == "mon":
            self.months = _fit(self.months + whole, _INT32)
            self._fract_days(frac, 30)
        else:
            self.days = _fit(self.days + whole, _INT32)
            if scale == 1:
                self._fract_micros(frac, _US_DAY)
            else:
                self._fract_days(frac, scale)

    def _fract_days(self, frac: float, scale: int) -> None:
        if frac:
            frac *= scale
            extra = int(frac)
            self.days = _fit(self.days + extra, _INT32)
            self._fract_micros(frac - extra, _US_DAY)

    def _fract_micros(self, frac: float, scale: int) -> None:
        if frac:
            frac *= scale
            usec = int(frac)
            self.micros = _fit(self.micros + usec + _rint(frac - usec), _INT64)

    def time(self, token: str) -> None:
        """``[+-]h:mm[:ss[.frac]]`` into microseconds, its sign on all of it (a second
        of 60, as PostgreSQL takes)."""
        negative = token.startswith("-")
        parts = token.lstrip("+-").split(":")
        hours, minutes = int(parts[0]), int(parts[1])
        if minutes > 59:
            raise OverflowError
        us = (hours * 60 + minutes) * 60 * _US_SECOND
        if len(parts) == 3:
            sec, _, frac = parts[2].partition(".")
            if int(sec) > 60:
                raise OverflowError
            us += int(sec) * _US_SECOND + _rint(float("0." + frac) * _US_SECOND) if frac \
                else int(sec) * _US_SECOND
        self.micros = _fit(self.micros + (-us if negative else us), _INT64)

    def ago(self) -> None:
        """PostgreSQL's ``ago``: each field negated (its minimum has no negation)."""
        if self.micros == -_INT64 or -_INT32 in (self.years, self.months, self.days):
            raise OverflowError
        self.years, self.months = -self.years, -self.months
        self.days, self.micros = -self.days, -self.micros

    def result(self) -> tuple[int, int, int]:
        months = self.years * 12 + self.months
        if not -_INT32 <= months < _INT32:
            raise IntervalError("interval out of range", "22008")
        return months, self.days, self.micros


def _fit(n: int, limit: int) -> int:
    """``n``, or OverflowError when it is outside [-limit, limit)."""
    if not -limit <= n < limit:
        raise OverflowError
    return n


def _rint(x: float) -> int:
    """C's rint(): to the nearest, ties to even (Python's round)."""
    return round(x)


def _postgres(s: str, text: str) -> tuple[int, int, int]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if m is None or m.end() == pos:
            if s[pos:].strip():
                raise _bad(text)
            break
        kind = m.lastgroup or ""
        tokens.append((kind, m[kind]))
        pos = m.end()
    ago = False
    if tokens and tokens[-1] == ("word", "ago"):
        ago = True
        tokens.pop()
    if tokens and tokens[0][0] == "at":
        tokens.pop(0)
    if not tokens:
        raise _bad(text)
    f = _Fields()
    seen: set[str] = set()
    i = 0
    try:
        while i < len(tokens):
            kind, value = tokens[i]
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            if kind == "num" and following is not None and following[0] == "word":
                unit = _UNITS.get(following[1][:10])
                if unit is None:
                    raise _bad(text)
                field, scale, mask = unit
                f.add(value, field, scale)  # PostgreSQL: its overflow before the mask
                masks = _SECONDS if mask == "s" and "." in value else {mask}
                if seen & masks:
                    raise _bad(text)
                seen |= masks
                i += 2
            elif kind == "num" and following is not None and following[0] == "time":
                if "day" in seen:  # SQL's day-time: 1 2:03:04
                    raise _bad(text)
                seen.add("day")
                f.add(value, "day", 1)
                i += 1
            elif kind == "num" and following is None:
                masks = _SECONDS if "." in value else {"s"}
                if seen & masks:  # a number alone: seconds
                    raise _bad(text)
                seen |= masks
                f.add(value, "us", _US_SECOND)
                i += 1
            elif kind == "time" and not seen & _TIME:
                seen |= _TIME
                f.time(value)
                i += 1
            elif kind == "ym":  # SQL's year-month: 1-2
                sign = -1 if value.startswith("-") else 1
                years, months = value.lstrip("+-").split("-")
                if int(months) > 11:
                    raise OverflowError
                f.adjust(sign * _fit(int(years) * 12 + int(months), _INT32), 0.0, "mon", 1)
                i += 1
            else:
                raise _bad(text)
    except ValueError as exc:
        if isinstance(exc, IntervalError):
            raise
        raise _bad(text) from None
    if ago:
        f.ago()
    return f.result()


def _iso(s: str, text: str) -> tuple[int, int, int]:
    """ISO 8601's designators, each number read as PostgreSQL reads it: C's strtod
    (``1e2``; no ``+``), refused past 1e15, its fraction what the double holds past its
    whole part (``P8691948.66D`` is 8691948 days 15:50:24.000013 there)."""
    if s == "p":
        raise _bad(text)
    f = _Fields()
    pos, in_time = 1, False
    while pos < len(s):
        if s[pos] == "t":
            in_time, pos = True, pos + 1
            continue
        m = _ISO_NUMBER.match(s, pos)
        if m is None:
            raise _bad(text)
        value = float(m[0])
        if not -1e15 <= value <= 1e15:  # and NaN
            raise OverflowError
        whole = int(value)
        unit, pos = s[m.end():m.end() + 1], m.end() + 1
        if in_time and unit in _ISO_TIME:
            f.adjust(whole, value - whole, "us", _ISO_TIME[unit])
        elif not in_time and unit in _ISO_DATE:
            f.adjust(whole, value - whole, *_ISO_DATE[unit])
        else:
            raise _bad(text)
    return f.result()
