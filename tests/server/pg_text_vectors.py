"""Print the expected text of ``test_text_format.py``: what PostgreSQL 15 writes for its
inputs, read from a real server (``python tests/server/pg_text_vectors.py DSN``, then
paste its output over the test's tables). Not a test: it needs a PostgreSQL."""

from __future__ import annotations

import datetime as dt
import struct
import sys
import uuid
from decimal import Decimal

import psycopg


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


FLOAT8 = [1.0, 0.1, -0.0, 0.0, 100.0, 1 / 3, -2.5, 1e14, 123456789012345.6, 1e15, 1.5e15,
          1000000000000000.5, 9999999999999998.0, 1e16, 5.2990648348713776e16,
          5.0171488407371104e16, 2.0 ** 60,
          1e17, 1e-4, 0.00012345, 1e-5, 1.5e-5, -1.25e-7, 1e22, 1e300, 5e-324,
          1.7976931348623157e308, 2.2250738585072014e-308, 2.0 ** 53, 12345678.9, 0.3,
          float("nan"), float("inf"), float("-inf")]
FLOAT4 = [f32(x) for x in (
    1.0, 0.1, -0.0, 0.3, 1 / 3, 1e5, 123456.0, 999999.0, 1e6, 1234567.0, 16777216.0,
    56795592.0, 1e-4, 1e-5, 1.5e-5, 3.4028234663852886e38, 1.401298464324817e-45,
    1.1754943508222875e-38, 2.0 ** 40, 2.0 ** -20, 2.0 ** 90, 12345.678, float("nan"),
    float("inf"), float("-inf"))]
#: reals at float4out's hard places (test_float4_text.py): the subnormals, the largest,
#: values of 9 digits, 2 ** 24, float4s whose shortest digits lie exactly halfway to a
#: neighbour (56795592, 33554430), each side of fixed notation's ends (1e-4, 1e6) and of
#: the exponents pyarrow writes in fixed notation (1e-6, 1e10), -0, NaN, the infinities
FLOAT4_HARD = [f32(x) for x in (
    1e-45, 1.4e-45, 3.4028235e38, -3.4028235e38, 123456789.0, 16777216.0, 16777217.0, 1e-5,
    1e-4, 9.9999997e-05, 0.000099999, 1e-6, 1.5e-6, 9.9999e-7, 1e-7, 1.2e-9, 1e-10,
    999999.94, 999999.0, 1e6, 1234567.5, 12345678.0, 4e9, 9.876543e9, 1e10, 56795592.0,
    33554430.0, 1.17549435e-38, 13972.1044921875, 123.80096435546875,
    1.1760161629813165e-35, 0.00011126645404146984, -0.0, 0.0, -1.5e-5, -2.5e7,
    float("nan"), float("inf"), float("-inf"))]
HARD_DIGITS = (-15, -3, 0, 1, 2, 3)
DIGITS = (1, 3, 0, -3, -15)
#: (PostgreSQL type, input): a column of each type on both engines
OTHERS = [
    ("timestamp", dt.datetime(2024, 1, 2, 3, 4, 5, 500000)),
    ("timestamp", dt.datetime(2024, 1, 2, 3, 4, 5)),
    ("timestamp", dt.datetime(2024, 1, 2, 3, 4, 5, 1)),
    ("timestamp", dt.datetime(2024, 1, 2, 3, 4, 5, 123400)),
    ("timestamp", dt.datetime(99, 1, 1)),
    ("timestamptz", dt.datetime(2024, 1, 2, 3, 4, 5, 500000, dt.UTC)),
    ("timestamptz", dt.datetime(2024, 12, 31, 23, 59, 59, 999999, dt.UTC)),
    ("time", dt.time(3, 4, 5, 500000)), ("time", dt.time(0, 0)),
    ("time", dt.time(12, 0, 0, 120)),
    ("date", dt.date(2024, 2, 29)), ("date", dt.date(99, 12, 31)),
    ("numeric(18,9)", Decimal("1E-7")), ("numeric(18,9)", Decimal("-0")),
    ("numeric(18,9)", Decimal("1.5")), ("numeric(18,9)", Decimal("-12345.123456789")),
    ("boolean", True), ("boolean", False),
    ("bytea", b"\x00\xffab\\"), ("bytea", b""),
    ("uuid", uuid.UUID("A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11")),
    ("text", "tab\there, 'quoted' \"dq\" back\\slash"), ("text", ""),
]
#: timestamptz written in these sessions' TimeZone (on the analytical engine)
ZONES = ["Asia/Kolkata", "America/New_York", "Asia/Kathmandu"]
INSTANTS = [dt.datetime(2024, 1, 2, 3, 4, 5, 500000, dt.UTC),
            dt.datetime(2024, 7, 1, 12, 0, tzinfo=dt.UTC)]

#: (PostgreSQL's expression, DuckDB's for the same value): values Python's datetime cannot
#: hold (infinities, BC, after 9999, 24:00), lists as arrays, read in text and binary
SPECIAL = [
    ("'infinity'::timestamp", "'infinity'::TIMESTAMP"),
    ("'-infinity'::timestamp", "'-infinity'::TIMESTAMP"),
    ("'infinity'::timestamptz", "'infinity'::TIMESTAMPTZ"),
    ("'-infinity'::timestamptz", "'-infinity'::TIMESTAMPTZ"),
    ("'infinity'::date", "'infinity'::DATE"), ("'-infinity'::date", "'-infinity'::DATE"),
    ("'0044-03-15 BC'::date", "'0044-03-15 (BC)'::DATE"),
    ("'0001-12-31 BC'::date", "'0000-12-31'::DATE"),
    ("'4713-01-01 BC'::date", "'4713-01-01 (BC)'::DATE"),
    ("'10000-01-01'::date", "'10000-01-01'::DATE"),
    ("'0044-03-15 12:00:00.5 BC'::timestamp", "'-0043-03-15 12:00:00.5'::TIMESTAMP"),
    ("'0001-12-31 23:59:59.999999 BC'::timestamp", "'0000-12-31 23:59:59.999999'::TIMESTAMP"),
    ("'294000-01-01 01:02:03'::timestamp", "'294000-01-01 01:02:03'::TIMESTAMP"),
    ("'24:00:00'::time", "'24:00:00'::TIME"),
    ("'2024-01-02 03:04:05.123456789'::timestamp",
     "'2024-01-02 03:04:05.123456789'::TIMESTAMP_NS"),
    ("'infinity'::timestamp", "'infinity'::TIMESTAMP_NS"),
    ("ARRAY[1, 2, NULL]::int8[]", "[1, 2, NULL]::BIGINT[]"),
    ("ARRAY[1, NULL]::int4[]", "[1, NULL]::INTEGER[]"),
    ("ARRAY[1, 2]::int2[]", "[1, 2]::SMALLINT[]"),
    ("ARRAY[1.5, 0.1, 'NaN', '-Infinity']::float8[]",
     "[1.5::DOUBLE, 0.1, 'NaN'::DOUBLE, '-Infinity'::DOUBLE]"),
    ("ARRAY[0.1]::float4[]", "[0.1]::REAL[]"),
    ("ARRAY[true, false, NULL]::bool[]", "[true, false, NULL]::BOOLEAN[]"),
    ("ARRAY['a b', 'c\"d', NULL, '', 'null', 'NULLx', 'x{', '}', 'a,b', 'back\\slash', "
     "'tab\t', 'nbsp\u00a0', 'plain']::text[]",
     "['a b', 'c\"d', NULL, '', 'null', 'NULLx', 'x{', '}', 'a,b', 'back\\slash', "
     "'tab\t', 'nbsp\u00a0', 'plain']::VARCHAR[]"),
    ("ARRAY[]::int8[]", "[]::BIGINT[]"),
    ("ARRAY[[1, 2], [3, NULL]]::int4[]", "[[1, 2], [3, NULL]]::INTEGER[][]"),
    ("ARRAY[[['a']], [['b c']]]::text[]", "[[['a']], [['b c']]]::VARCHAR[][][]"),
    ("ARRAY['2024-01-02 03:04:05.5', 'infinity', '0044-03-15 BC']::timestamp[]",
     "['2024-01-02 03:04:05.5', 'infinity', '-0043-03-15']::TIMESTAMP[]"),
    ("ARRAY['2024-02-29', '-infinity']::date[]", "['2024-02-29', '-infinity']::DATE[]"),
    ("ARRAY['12:00:00', '24:00:00']::time[]", "['12:00:00', '24:00:00']::TIME[]"),
    ("ARRAY[1.50, -2]::numeric(10,2)[]", "[1.50, -2]::DECIMAL(10,2)[]"),
    ("ARRAY['\\x00ff'::bytea]", "['\\x00\\xFF'::BLOB]"),
]


def main(dsn: str) -> None:
    con = psycopg.connect(dsn, autocommit=True)

    def text(sql: str, value: object) -> str:  # the type's output, not a cast to text's
        param = "\\x" + value.hex() if isinstance(value, bytes) else \
            repr(value) if isinstance(value, float) else str(value)
        res = con.pgconn.exec_params(f"SELECT {sql}".encode(), [param.encode()])
        assert res.status == psycopg.pq.ExecStatus.TUPLES_OK, res.error_message
        out = res.get_value(0, 0)
        assert out is not None
        return out.decode()

    def floats(cast: str, values: list[float]) -> dict[int, list[str]]:
        out = {}
        for digits in DIGITS:
            con.execute(f"SET extra_float_digits = {digits}")
            out[digits] = [text(f"$1::float8{cast}", x) for x in values]
        con.execute("RESET extra_float_digits")
        return out

    print("FLOAT8_TEXT =", floats("", FLOAT8))
    print("FLOAT4_TEXT =", floats("::real", FLOAT4))
    hard = {}
    for digits in HARD_DIGITS:
        con.execute(f"SET extra_float_digits = {digits}")
        hard[digits] = [text("$1::float8::real", x) for x in FLOAT4_HARD]
    con.execute("RESET extra_float_digits")
    print("FLOAT4_HARD_TEXT =", hard, "(test_float4_text.py)")
    print("OTHERS_TEXT =", [text(f"$1::{kind}", value) for kind, value in OTHERS])
    zoned = {}
    for zone in ZONES:
        con.execute(f"SET TimeZone = '{zone}'")
        zoned[zone] = [text("$1::timestamptz", t) for t in INSTANTS]
    print("ZONED_TEXT =", zoned)
    special = []
    for sql, _ in SPECIAL:
        row = []
        for fmt in (0, 1):
            res = con.pgconn.exec_params(f"SELECT {sql}".encode(), [], result_format=fmt)
            assert res.status == psycopg.pq.ExecStatus.TUPLES_OK, res.error_message
            out = res.get_value(0, 0)
            assert out is not None
            row.append(out.decode() if fmt == 0 else out.hex())
        special.append((res.ftype(0), *row))
    print("SPECIAL_PG =", special)


if __name__ == "__main__":
    main(sys.argv[1])
