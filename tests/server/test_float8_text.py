"""A double precision column's text is PostgreSQL 15's float8out, byte for byte, written a
column at a time (:func:`cryptdisk.server._textout.float8_texts`): the same text as the
value-by-value :func:`~cryptdisk.server._textout.float8_text` (itself checked against
PostgreSQL 15 in test_text_format.py) for any double and any extra_float_digits, in
DataRows (simple and extended protocol) and COPY TO's text and CSV, on both engines."""

from __future__ import annotations

import random
import struct

import psycopg
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cryptdisk.server._textout import float8_text, float8_texts
from cryptdisk.server._types import FLOAT8, TEXT, real_texts, real_writers
from tests.server.test_text_format import _texts

ALL_DIGITS = range(-15, 4)
#: each side of the exponents pyarrow and PostgreSQL write differently (pyarrow: fixed
#: for -6..9; PostgreSQL: -4..14), the extremes, integers past 2 ** 53 (whose shortest
#: digits may lie exactly halfway to a neighbour: 5.2990648348713776e16), -0, NaN, the
#: infinities
HARD = [5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -1.7976931348623157e308,
        1e15, 1e16, 123456789012345678.0, 1e-4, 1e-5, 1.5e-5, 1e-6, 2.5e-6, 1e-7, 1.25e-9,
        1e-10, 9.999999999999999e-5, 0.1, -0.0, 0.0, 1.0, 1e9, 9999999999.0, 1e10, 1.5e10,
        12345678901.25, 1e14, 123456789012345.6, 999999999999999.9, -1e10, -1e-5,
        1000000000000000.5, 9999999999999998.0, 5.2990648348713776e16,
        5.0171488407371104e16, 2.0 ** 53, 2.0 ** 60, 1e22, 1e300, float("nan"),
        float("inf"), float("-inf")]


def _doubles(bits: list[int]) -> pa.Array:
    return pa.array(bits, pa.uint64()).view(pa.float64())


@pytest.mark.parametrize("digits", ALL_DIGITS)
def test_the_hard_cases_are_float8_text(digits) -> None:
    got = float8_texts(pa.array([*HARD, None], pa.float64()), digits).to_pylist()
    assert got == [*(float8_text(x, digits) for x in HARD), None]


def test_the_notation_is_postgresqls() -> None:
    """(A few as PostgreSQL 15 writes them, for a reader: test_text_format.py has more.)"""
    assert float8_texts(pa.array([1e15, 1e-5, 1e-4, 1e10, 123456789012345.6, 1e-7, 5e-324,
                                  -0.0, float("nan"), float("-inf")])).to_pylist() == [
        "1e+15", "1e-05", "0.0001", "10000000000", "123456789012345.6", "1e-07", "5e-324",
        "-0", "NaN", "-Infinity"]


@given(st.lists(st.integers(0, 2 ** 64 - 1), max_size=60), st.sampled_from(ALL_DIGITS))
@settings(max_examples=300, deadline=None)
def test_a_column_is_written_as_each_value_is(bits, digits) -> None:
    values = _doubles(bits)
    assert float8_texts(values, digits).to_pylist() == \
        [float8_text(v, digits) for v in values.to_pylist()]


@given(st.lists(st.one_of(st.none(), st.floats(), st.floats(-1e16, 1e16),
                          st.floats(-1e-3, 1e-3)), max_size=40),
       st.sampled_from(ALL_DIGITS))
@settings(max_examples=300, deadline=None)
def test_doubles_with_nulls(values, digits) -> None:
    assert float8_texts(pa.array(values, pa.float64()), digits).to_pylist() == \
        [None if v is None else float8_text(v, digits) for v in values]


def test_real_writers_take_double_columns() -> None:
    rows = [(1, 0.5), (2, None), (3, 1e15)]
    write = real_writers([TEXT, FLOAT8], rows)[1]
    assert [write(v) for _, v in rows] == ["0.5", None, "1e+15"]
    assert real_texts([1e10, None, 7], oid=FLOAT8) == ["10000000000", None, "7"]
    assert real_texts([1e-5], encoded=True, oid=FLOAT8) == [b"1e-05"]
    # (at extra_float_digits 0 and below a double is written value by value)
    assert real_writers([FLOAT8], [(0.5,)], 0) == {}


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
@pytest.mark.parametrize("digits", [1, 0])
def test_a_large_double_column_streamed_in_batches(start_server, request, engine,
                                                   digits) -> None:
    """More rows than a batch (8192): random doubles of every magnitude and the hard
    cases, some NULL."""
    rng = random.Random(8)
    doubles = [*HARD, *(struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
                        for _ in range(10000)),
               *(rng.uniform(-1, 1) * 10.0 ** rng.randint(-8, 17) for _ in range(10000))]
    sqlite = engine == "sqlite_engine"
    # (SQLite stores a NaN as NULL and -0.0 as 0)
    values = [None if i % 97 == 0 or v != v or (sqlite and v == 0) else v
              for i, v in enumerate(doubles)]
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (i INTEGER, d DOUBLE PRECISION)")
        with conn.cursor().copy("COPY big FROM STDIN") as copy:
            for i, v in enumerate(values):
                copy.write_row((i, None if v is None else float8_text(v)))
        conn.execute(f"SET extra_float_digits = {digits}")
        want = [(None if v is None else float8_text(v, digits),) for v in values]
        got = _texts(conn, "SELECT d FROM big ORDER BY i")
        assert got == {"simple": want, "extended": want, "copy": want, "csv": want}
