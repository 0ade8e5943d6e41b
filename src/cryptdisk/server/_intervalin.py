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
_ISO = re.compile(r"p(?:(?P<date>(?:[+-]?(?:\d+\.?\d*|\.\d+)[ymwd])*)"
                  r"(?:t(?P<time>(?:[+-]?(?:\d+\.?\d*|\.\d+)[hms])*))?)")
_ISO_PART = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))([ymwdhs])")


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
    months, days, micros = fields
    if not -_INT32 <= months < _INT32:
        raise IntervalError("interval out of range", "22008")
    if not (-_INT32 <= days < _INT32 and -_INT64 <= micros < _INT64):
        raise IntervalError(f'interval field value out of range: "{text}"', "22015")
    return Interval(months, days, micros)


def _bad(text: str) -> IntervalError:
    return IntervalError(f'invalid input syntax for type interval: "{text}"', "22007")


class _Fields:
    def __init__(self) -> None:
        self.months = self.days = self.micros = 0

    def add(self, number: str, field: str, scale: int) -> None:
        """``number`` (its sign on its fraction too) of ``field`` times ``scale``."""
        whole_text, _, frac_text = number.partition(".")
        negative = whole_text.startswith("-")
        whole = int(whole_text) if whole_text.lstrip("+-") else 0
        if not -_INT64 <= whole < _INT64:
            raise OverflowError
        frac = float("0." + frac_text) if frac_text else 0.0
        if negative:
            frac = -frac
        if field == "year":
            self.months += whole * scale * 12 + _rint(frac * scale * 12)
        elif field == "mon":
            self.months += whole * scale
            self._fract_days(frac, 30)
        elif field == "day":
            self.days += whole * scale
            if scale == 1:
                self._fract_micros(frac, _US_DAY)
            else:
                self._fract_days(frac, scale)
        else:
            self.micros += whole * scale
            self._fract_micros(frac, scale)

    def _fract_days(self, frac: float, scale: int) -> None:
        if frac:
            frac *= scale
            extra = int(frac)
            self.days += extra
            self._fract_micros(frac - extra, _US_DAY)

    def _fract_micros(self, frac: float, scale: int) -> None:
        if frac:
            frac *= scale
            usec = int(frac)
            self.micros += usec + _rint(frac - usec)

    def time(self, token: str) -> None:
        """``[+-]h:mm[:ss[.frac]]`` into microseconds, its sign on all of it."""
        negative = token.startswith("-")
        parts = token.lstrip("+-").split(":")
        hours, minutes = int(parts[0]), int(parts[1])
        if minutes > 59:
            raise OverflowError
        us = (hours * 60 + minutes) * 60 * _US_SECOND
        if len(parts) == 3:
            sec, _, frac = parts[2].partition(".")
            if int(sec) > 59:
                raise OverflowError
            us += int(sec) * _US_SECOND + _rint(float("0." + frac) * _US_SECOND) if frac \
                else int(sec) * _US_SECOND
        self.micros += -us if negative else us


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
                masks = _SECONDS if mask == "s" and "." in value else {mask}
                if seen & masks:
                    raise _bad(text)
                seen |= masks
                f.add(value, field, scale)
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
                f.months += sign * (int(years) * 12 + int(months))
                i += 1
            else:
                raise _bad(text)
    except ValueError as exc:
        if isinstance(exc, IntervalError):
            raise
        raise _bad(text) from None
    if ago:
        return -f.months, -f.days, -f.micros
    return f.months, f.days, f.micros


def _iso(s: str, text: str) -> tuple[int, int, int]:
    m = _ISO.fullmatch(s)
    if m is None or not (m["date"] or m["time"] is not None):
        raise _bad(text)
    f = _Fields()
    for part, in_time in ((m["date"] or "", False), (m["time"] or "", True)):
        for number, unit in _ISO_PART.findall(part):
            if in_time:
                f.add(number, "us", {"h": 3600, "m": 60, "s": 1}[unit] * _US_SECOND)
            else:
                field, scale = {"y": ("year", 1), "m": ("mon", 1), "w": ("day", 7),
                                "d": ("day", 1)}[unit]
                f.add(number, field, scale)
    return f.months, f.days, f.micros
