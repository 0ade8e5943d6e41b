"""Values written as PostgreSQL 15 writes them in text format (its ``*out`` functions):
floats, timestamps, times and numerics, byte for byte.

- ``double precision`` (``float8out``): with ``extra_float_digits`` above 0 (the default,
  1) the shortest digits that read back as the same double (Ryu's, which are Python's
  ``repr``'s), in fixed notation when the decimal exponent is in -4..14 (``1``,
  ``0.0001``, ``123456789012345.6``), else as ``1e+15``, ``1.5e-05`` (at least two
  exponent digits); ``NaN``, ``Infinity``, ``-Infinity``, ``-0``. With
  ``extra_float_digits`` at or below 0: C's ``%.*g`` with 15 + extra_float_digits
  significant digits (at least 1).
- ``real`` (``float4out``): the same with the shortest digits that read back as the same
  float4 (``0.1``, not the double's ``0.10000000149011612``) and fixed notation for
  exponents -4..5 (``100000``, ``1e+06``); 6 + extra_float_digits digits at or below 0.
- timestamps and times: no trailing zeros in the fraction, none at all for whole seconds
  (``2024-01-02 03:04:05.5``); a zone's offset as ``+00``, ``+05:30`` or ``-04:56:02``
  (minutes and seconds only when not zero).
- numeric: every digit in fixed notation (``0.000000100``, never ``1.00E-7``), no
  negative zero.

These are on the hot path of large results: :func:`float4_texts` and
:func:`float8_texts` write a whole column of floats at a time: pyarrow's cast of float4 or
double to text (double-conversion's shortest digits, in C++), rewritten to PostgreSQL's
notation by a few regular expressions; a value whose digits may lie exactly halfway to a
neighbour (double-conversion writes those, PostgreSQL's Ryu does not: the rare float4
found so, every double of 2 ** 53 or more) by :func:`float4_text` or :func:`float8_text`
(one ``repr``), as are all with ``extra_float_digits`` at or below 0.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import struct

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["datetime_text", "float4_text", "float4_texts", "float8_text", "float8_texts",
           "numeric_text", "offset_text", "time_text"]

_SPECIAL = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_TWO_53 = 2.0 ** 53
_INF = float("inf")
#: half the gap between float4 subnormals (2 ** -149)
_F4_HALF_DENORMAL = 2.0 ** -150


def _exponent_form(digits: str, exponent: int, sign: str) -> str:
    """Significant ``digits`` (no trailing zeros) with the first at 10 ** ``exponent``, as
    ``d.ddde+XX``."""
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"


def _fixed_form(digits: str, exponent: int, sign: str) -> str:
    """Significant ``digits`` with the first at 10 ** ``exponent``, in fixed notation."""
    if exponent < 0:
        return f"{sign}0.{'0' * (-exponent - 1)}{digits}"
    if len(digits) <= exponent + 1:
        return sign + digits + "0" * (exponent + 1 - len(digits))
    return f"{sign}{digits[:exponent + 1]}.{digits[exponent + 1:]}"


def float8_text(value: float, extra_float_digits: int = 1) -> str:
    """A double as PostgreSQL's ``float8out`` writes it (see the module)."""
    if extra_float_digits <= 0:
        return _rounded(value, 15 + extra_float_digits)
    r = repr(value)  # shortest round-trip digits, fixed for exponents -4..15
    if r[-2:] == ".0":  # integral: 1.0 -> 1, up to 15 digits
        r = r[:-2]
        if len(r) - (r[0] == "-") < 16:
            return r
    elif "e" in r:  # exponents below -4 or above 15: as PostgreSQL writes them
        return r if -_TWO_53 < value < _TWO_53 else _float8_inside(value, r)
    elif "n" in r:  # nan, inf, -inf
        return _SPECIAL[r]
    elif not (value >= 1e15 or value <= -1e15):
        return r
    if value >= _TWO_53 or value <= -_TWO_53:
        r = _float8_inside(value, r)
        if "e" in r:
            return r
    # 1e15 <= |value| < 1e16: Python writes it in fixed notation, PostgreSQL does not
    sign = "-" if r[0] == "-" else ""
    digits = r.lstrip("-").replace(".", "").rstrip("0")
    return _exponent_form(digits, 15, sign)


def _float8_inside(value: float, r: str) -> str:
    """``repr(value)`` of a double of 2 ** 53 or more (integral, its gaps at least 2), or
    when that lies exactly halfway to a neighbour (which reads back as ``value`` only by
    the tie going to the even one: Python accepts it, PostgreSQL's Ryu does not) the
    shortest digits strictly between the halfway points, as ``%.*e`` writes them."""
    exact = int(value)
    gap = math.ulp(value)
    below = gap / 2 if math.frexp(abs(value))[0] == 0.5 else gap  # (a power of two)
    shown = int(decimal.Decimal(r))
    if not (2 * (shown - exact) == gap or 2 * (exact - shown) == below):
        return r
    ndigits = len(r.lstrip("-").split("e")[0].replace(".", "").rstrip("0"))
    for precision in range(ndigits, 18):
        text = f"{value:.{precision}e}"
        shown = int(decimal.Decimal(text))
        if 2 * abs(shown - exact) < (gap if shown > exact else below):
            break
    mantissa, _, exponent = text.partition("e")
    return mantissa.rstrip("0").rstrip(".") + "e" + exponent


def _rounded(value: float, precision: int) -> str:
    """``%.*g`` with ``precision`` significant digits (at least 1), as PostgreSQL writes a
    float when extra_float_digits is at or below 0."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return f"{value:.{max(precision, 1)}g}"


def _inside(text: str, low: float, high: float) -> bool:
    """Whether decimal ``text`` lies strictly between ``low`` and ``high``: exactly where
    it reads as one of them as a double."""
    d = float(text)
    if low < d < high:
        return True
    if d != low and d != high:
        return False
    exact, bound = decimal.Decimal(text), decimal.Decimal(d)
    return exact > bound if d == low else exact < bound


def _next_up(text: str, precision: int) -> str:
    """The decimal of ``precision`` significant digits after ``text`` (``%.*e``)."""
    up = decimal.Decimal(text).next_plus(decimal.Context(prec=precision))
    return format(up, f".{precision - 1}e")


def float4_text(value: float, extra_float_digits: int = 1) -> str:
    """A float4 (held in a double) as PostgreSQL's ``float4out`` writes it (see the
    module): the shortest decimal strictly between the halfway points to the float4s
    below and above (one exactly halfway reads back only when the tie goes to ``x``, the
    even one: PostgreSQL's Ryu never writes those), the closest to the value of those of
    its length. The length by a binary search: a decimal of n digits that reads back is
    one of n + 1 digits too, and 9 digits always read back."""
    if extra_float_digits <= 0:
        return _rounded(value, 6 + extra_float_digits)
    if value != value or value == _INF or value == -_INF:
        return _rounded(value, 1)
    if value == 0:
        return "-0" if str(value)[0] == "-" else "0"
    try:
        packed = _F32.pack(-value if value < 0 else value)
    except OverflowError:  # (a double beyond float4's range: no float4 to write)
        return float8_text(value)
    x, bits = _F32.unpack(packed)[0], _U32.unpack(packed)[0]
    # the halfway points: half a gap either side (a quarter below a power of two)
    half = math.ldexp(1.0, (bits >> 23) - 151) if bits > 0x7FFFFF else _F4_HALF_DENORMAL
    # (the smallest normal's gap below is the subnormals', the same as above it)
    power_of_two = bits & 0x7FFFFF == 0 and bits >= 0x1000000
    low, high = x - (half / 2 if power_of_two else half), x + half
    shortest, longest, best = 1, 9, f"{x:.8e}"
    while shortest < longest:
        middle = (shortest + longest) >> 1
        text = f"{x:.{middle - 1}e}"  # the closest decimal of this many digits
        d = float(text)
        if not low < d < high and not ((d == low or d == high) and _inside(text, low, high)):
            # out; below x at a power of two the next one up may be in (the gap above
            # x is twice the gap below)
            if not (power_of_two and d < x and _inside(text := _next_up(text, middle),
                                                       low, high)):
                shortest = middle + 1
                continue
        longest, best = middle, text
    mantissa, _, exponent = best.partition("e")
    digits, power = mantissa.replace(".", "").rstrip("0") or "0", int(exponent)
    sign = "-" if value < 0 else ""
    if -4 <= power < 6:
        return _fixed_form(digits, power, sign)
    return _exponent_form(digits, power, sign)


_U32_ZERO, _U32_ONE, _U32_MAGNITUDE, _U32_LARGEST = (
    pa.scalar(n, pa.uint32()) for n in (0, 1, 0x7FFFFFFF, 0x7F7FFFFF))
#: pyarrow's text of a float4 -> PostgreSQL's, by magnitude (|x| from, to: a little wider
#: than the decimal exponent each rewrites, the rewrite itself is exact): pyarrow writes
#: exponents -6..9 in fixed notation, PostgreSQL only -4..5; exponents of one digit take
#: two; a mantissa's trailing zeros, and a point with no digits after it, are dropped
_F4_PADDED = (0.99e-10, 1.01e-6, r"e-([1-9])$", r"e-0\1")
_F4_NOTATION = (
    *((0.99 * 10.0 ** -n, 1.01 * 10.0 ** (1 - n), rf"^(-?)0\.{'0' * (n - 1)}([1-9])(\d*)$",
       rf"\1\2.\3e-{n:02d}") for n in (5, 6)),
    *((0.99 * 10.0 ** n, 1.01 * 10.0 ** (n + 1), rf"^(-?)([1-9])(\d{{{n}}})(?:\.(\d+))?$",
       rf"\1\2.\3\4e+{n:02d}") for n in range(6, 10)),
)
_F4_TRAILING = r"\.?0*e"


def float4_texts(values: pa.Array, extra_float_digits: int = 1) -> pa.StringArray:
    """A column of float4s (float32 or float64, each read as the float4 nearest it; nulls
    stay null) as :func:`float4_text` writes each: the same text, a column at a time (see
    the module)."""
    singles = pc.cast(values, pa.float32(), safe=False)
    # a double beyond float4's range, a value whose digits may lie on a halfway point, any
    # value when extra_float_digits is at or below 0: written one by one
    slow = pc.and_(pc.is_inf(singles), pc.is_finite(values))
    if extra_float_digits > 0:
        texts = singles.cast(pa.string())
        bits = pc.bit_wise_and(singles.view(pa.uint32()), _U32_MAGNITUDE)
        ordinary = pc.and_(pc.greater(bits, _U32_ZERO), pc.less(bits, _U32_LARGEST))
        # (ordinary: not 0, the largest float4, infinite or NaN; its neighbours finite;
        # the others' neighbours below are nonsense, never looked at)
        below = pc.subtract(bits, _U32_ONE).view(pa.float32())
        above = pc.add(bits, _U32_ONE).view(pa.float32())
        x = pc.abs(singles.cast(pa.float64()))
        shown = pc.abs(texts.cast(pa.float64()))  # (a float4 and its halfway points are
        # doubles exactly: a decimal at one reads as it)
        low = pc.divide(pc.add(x, below.cast(pa.float64())), 2.0)
        high = pc.divide(pc.add(x, above.cast(pa.float64())), 2.0)
        inside = pc.and_(pc.greater(shown, low), pc.less(shown, high))
        slow = pc.or_(slow, pc.and_(ordinary, pc.invert(inside)))
        for start, end, pattern, replacement in (_F4_PADDED, *_F4_NOTATION):
            these = pc.fill_null(pc.and_(pc.greater_equal(x, start), pc.less(x, end)), False)
            if pc.any(these).as_py():
                some = pc.replace_substring_regex(pc.filter(texts, these), pattern,
                                                  replacement)
                if pattern != _F4_PADDED[2]:
                    some = pc.replace_substring_regex(some, _F4_TRAILING, "e")
                texts = pc.replace_with_mask(texts, these, some)
        if pc.any(pc.invert(pc.is_finite(singles))).as_py():
            texts = pc.replace_substring(pc.replace_substring(texts, "nan", "NaN"), "inf",
                                         "Infinity")
    else:
        texts = pa.nulls(len(values), pa.string())
        slow = pc.is_valid(values)
    slow = pc.fill_null(slow, False)
    if not pc.any(slow).as_py():
        return texts
    doubles = pc.filter(values.cast(pa.float64()), slow).to_pylist()
    return pc.replace_with_mask(texts, slow, pa.array(
        [float4_text(v, extra_float_digits) for v in doubles], pa.string()))


#: pyarrow's text of a double -> PostgreSQL's, by magnitude (as for float4s): exponents -6
#: and -5 (fixed in pyarrow) and one-digit negative exponents as for float4s; exponents 10
#: to 14 (pyarrow's exponent form, PostgreSQL's fixed): the digits padded with zeros and
#: marked (p), the point put after the integer's digits, the fraction's trailing zeros
#: (and a point with none after it) dropped with the mark
_F8_FIXED = tuple(
    (0.99 * 10.0 ** n, 1.01 * 10.0 ** (n + 1), (
        (rf"^(-?)(\d)(?:\.(\d*))?e\+{n}$", r"\1\2\3" + "0" * n + "p"),
        (rf"^(-?)(\d{{{n + 1}}})(\d*)p$", r"\1\2.\3p"),
        (r"\.?0*p$", "")))
    for n in range(10, 15))


def float8_texts(values: pa.Array, extra_float_digits: int = 1) -> pa.StringArray:
    """A column of doubles (nulls stay null) as :func:`float8_text` writes each: the same
    text, a column at a time (see the module)."""
    values = values.cast(pa.float64())
    if extra_float_digits <= 0:
        texts = pa.nulls(len(values), pa.string())
        slow = pc.is_valid(values)
    else:
        texts = values.cast(pa.string())
        x = pc.abs(values)
        # from 2 ** 53 on, a double's halfway points are integers that pyarrow's digits
        # may be (PostgreSQL's Ryu never writes those): written one by one
        slow = pc.and_(pc.greater_equal(x, _TWO_53), pc.is_finite(values))
        steps = [(start, end, ((pattern, replacement),
                               *(((_F4_TRAILING, "e"),) if pattern != _F4_PADDED[2] else ())))
                 for start, end, pattern, replacement in (_F4_PADDED, *_F4_NOTATION[:2])]
        for start, end, rewrites in (*steps, *_F8_FIXED):
            these = pc.fill_null(pc.and_(pc.greater_equal(x, start), pc.less(x, end)), False)
            if pc.any(these).as_py():
                some = pc.filter(texts, these)
                for pattern, replacement in rewrites:
                    some = pc.replace_substring_regex(some, pattern, replacement)
                texts = pc.replace_with_mask(texts, these, some)
        if pc.any(pc.invert(pc.is_finite(values))).as_py():
            texts = pc.replace_substring(pc.replace_substring(texts, "nan", "NaN"), "inf",
                                         "Infinity")
    slow = pc.fill_null(slow, False)
    if not pc.any(slow).as_py():
        return texts
    doubles = pc.filter(values, slow).to_pylist()
    return pc.replace_with_mask(texts, slow, pa.array(
        [float8_text(v, extra_float_digits) for v in doubles], pa.string()))


def offset_text(offset: dt.timedelta) -> str:
    """A zone's offset from UTC as PostgreSQL writes it: ``+00``, ``+05:30``,
    ``-04:56:02``."""
    seconds = int(offset.total_seconds())
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"{sign}{hours:02d}"
    if minutes or seconds:
        text += f":{minutes:02d}"
    return text + (f":{seconds:02d}" if seconds else "")


def datetime_text(value: dt.datetime) -> str:
    """A timestamp (naive) or timestamptz (its offset from UTC written after it)."""
    offset = value.utcoffset()
    text = value.isoformat(" ") if offset is None else \
        value.replace(tzinfo=None).isoformat(" ")
    if value.microsecond:
        text = text.rstrip("0")
    return text if offset is None else text + offset_text(offset)


def time_text(value: dt.time) -> str:
    """A time of day (its offset after it if it has one: a timetz)."""
    offset = value.utcoffset()
    text = value.replace(tzinfo=None).isoformat() if offset is not None else value.isoformat()
    if value.microsecond:
        text = text.rstrip("0")
    return text if offset is None else text + offset_text(offset)


def numeric_text(value: decimal.Decimal) -> str:
    """A numeric: fixed notation with its scale's digits; ``NaN``, ``Infinity``."""
    if not value.is_finite():
        return "NaN" if value.is_nan() else str(value)
    if value.is_zero() and value.is_signed():
        value = value.copy_abs()
    return format(value, "f")
