"""A real column's text is PostgreSQL 15's float4out, byte for byte, written a column at a
time (:func:`cryptdisk.server._textout.float4_texts`): the same text as the value-by-value
:func:`~cryptdisk.server._textout.float4_text` for any float4 and any extra_float_digits,
and PostgreSQL's own for the hard cases (read from a real PostgreSQL 15 by
``tests/server/pg_text_vectors.py``), in DataRows (simple and extended protocol) and COPY
TO's text and CSV. (SQLite has no float4: its REAL is a double, written as float8.)"""

from __future__ import annotations

import random
import struct

import psycopg
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cryptdisk.server._textout import float4_text, float4_texts
from cryptdisk.server._types import FLOAT4, TEXT, real_texts, real_writers
from tests.server.pg_text_vectors import FLOAT4_HARD, HARD_DIGITS
from tests.server.test_text_format import _texts

# --- written by PostgreSQL 15.x (tests/server/pg_text_vectors.py) ----------------------
FLOAT4_HARD_TEXT = {-15: ['1e-45', '1e-45', '3e+38', '-3e+38', '1e+08', '2e+07', '2e+07', '1e-05',
                          '0.0001', '0.0001', '0.0001', '1e-06', '2e-06', '1e-06', '1e-07', '1e-09',
                          '1e-10', '1e+06', '1e+06', '1e+06', '1e+06', '1e+07', '4e+09', '1e+10',
                          '1e+10', '6e+07', '3e+07', '1e-38', '1e+04', '1e+02', '1e-35', '0.0001',
                          '-0', '0', '-1e-05', '-2e+07', 'NaN', 'Infinity', '-Infinity'],
                    -3: ['1.4e-45', '1.4e-45', '3.4e+38', '-3.4e+38', '1.23e+08', '1.68e+07',
                         '1.68e+07', '1e-05', '0.0001', '0.0001', '0.0001', '1e-06', '1.5e-06',
                         '1e-06', '1e-07', '1.2e-09', '1e-10', '1e+06', '1e+06', '1e+06',
                         '1.23e+06', '1.23e+07', '4e+09', '9.88e+09', '1e+10', '5.68e+07',
                         '3.36e+07', '1.18e-38', '1.4e+04', '124', '1.18e-35', '0.000111', '-0',
                         '0', '-1.5e-05', '-2.5e+07', 'NaN', 'Infinity', '-Infinity'],
                    0: ['1.4013e-45', '1.4013e-45', '3.40282e+38', '-3.40282e+38', '1.23457e+08',
                        '1.67772e+07', '1.67772e+07', '1e-05', '0.0001', '0.0001', '9.9999e-05',
                        '1e-06', '1.5e-06', '9.9999e-07', '1e-07', '1.2e-09', '1e-10', '1e+06',
                        '999999', '1e+06', '1.23457e+06', '1.23457e+07', '4e+09', '9.87654e+09',
                        '1e+10', '5.67956e+07', '3.35544e+07', '1.17549e-38', '13972.1', '123.801',
                        '1.17602e-35', '0.000111266', '-0', '0', '-1.5e-05', '-2.5e+07', 'NaN',
                        'Infinity', '-Infinity'],
                    1: ['1e-45', '1e-45', '3.4028235e+38', '-3.4028235e+38', '1.2345679e+08',
                        '1.6777216e+07', '1.6777216e+07', '1e-05', '0.0001', '0.0001', '9.9999e-05',
                        '1e-06', '1.5e-06', '9.9999e-07', '1e-07', '1.2e-09', '1e-10', '999999.94',
                        '999999', '1e+06', '1.2345675e+06', '1.2345678e+07', '4e+09',
                        '9.876543e+09', '1e+10', '5.6795592e+07', '3.355443e+07', '1.1754944e-38',
                        '13972.1045', '123.800964', '1.17601616e-35', '0.000111266454', '-0', '0',
                        '-1.5e-05', '-2.5e+07', 'NaN', 'Infinity', '-Infinity']}
# ---------------------------------------------------------------------------------------
#: any extra_float_digits above 0 is shortest digits (PostgreSQL 15 gave 2 and 3 the same)
FLOAT4_HARD_TEXT[2] = FLOAT4_HARD_TEXT[3] = FLOAT4_HARD_TEXT[1]
ALL_DIGITS = range(-15, 4)


def _singles(bits: list[int]) -> pa.Array:
    return pa.array(bits, pa.uint32()).view(pa.float32())


@pytest.mark.parametrize("digits", HARD_DIGITS)
def test_the_hard_cases_are_postgresqls(digits) -> None:
    want = FLOAT4_HARD_TEXT[digits]
    assert [float4_text(x, digits) for x in FLOAT4_HARD] == want
    assert float4_texts(pa.array(FLOAT4_HARD, pa.float64()), digits).to_pylist() == want
    assert float4_texts(pa.array(FLOAT4_HARD, pa.float32()), digits).to_pylist() == want
    assert real_texts([*FLOAT4_HARD, None], digits) == [*want, None]


@given(st.lists(st.integers(0, 2 ** 32 - 1), max_size=60), st.sampled_from(ALL_DIGITS))
@settings(max_examples=400, deadline=None)
def test_a_column_is_written_as_each_value_is(bits, digits) -> None:
    """Any float4 bit patterns (NaNs, subnormals, the infinities among them)."""
    singles = _singles(bits)
    want = [float4_text(x, digits) for x in singles.cast(pa.float64()).to_pylist()]
    assert float4_texts(singles, digits).to_pylist() == want


@given(st.lists(st.one_of(st.none(), st.floats(), st.floats(width=32)), max_size=40),
       st.sampled_from(ALL_DIGITS))
@settings(max_examples=300, deadline=None)
def test_doubles_are_read_as_the_nearest_float4(values, digits) -> None:
    """Doubles (a real column's values as Python floats), beyond float4's range too (a
    double past the largest float4 by more than half its gap is written as a double, as
    float4_text writes it), nulls kept."""
    want = [None if v is None else float4_text(v, digits) for v in values]
    assert float4_texts(pa.array(values, pa.float64()), digits).to_pylist() == want
    assert real_texts(values, digits) == want


def test_values_that_are_not_floats_are_written_one_by_one() -> None:
    assert real_texts([1.5, 2, None, "x"]) == ["1.5", "2", None, "x"]
    assert real_texts([]) == []


def test_real_writers_give_a_columns_texts_in_turn() -> None:
    rows = [(1, 0.5), (2, None), (3, 1e10)]
    writers = real_writers([TEXT, FLOAT4], rows, encoded=True)
    assert list(writers) == [1]
    assert [writers[1](v) for _, v in rows] == [b"0.5", None, b"1e+10"]
    skipping = real_writers([TEXT, FLOAT4], rows, nulls=False)[1]
    assert [skipping(v) for _, v in rows if v is not None] == ["0.5", "1e+10"]
    assert real_writers([TEXT, TEXT], rows) == {}
    with pytest.raises(ValueError, match="a row of 1 values for 2 columns"):
        real_writers([TEXT, FLOAT4], [*rows, (4,)])


def test_exact_halfway_digits_are_not_written() -> None:
    """pyarrow (double-conversion) writes 56795592 as 56795590, the halfway point to the
    float4 below (it reads back by the tie going to the even one); PostgreSQL's Ryu
    does not."""
    assert pa.array([56795592.0], pa.float32()).cast(pa.string()).to_pylist() != \
        ["5.6795592e+07"]  # (why float4_texts checks each value's digits)
    assert float4_texts(pa.array([56795592.0, -56795592.0], pa.float32())).to_pylist() == \
        ["5.6795592e+07", "-5.6795592e+07"]


@pytest.mark.parametrize("digits", HARD_DIGITS)
def test_the_server_writes_real_columns_as_postgresql(start_server, analytical,
                                                      digits) -> None:
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE r (i INTEGER, r REAL)")
        values = [*FLOAT4_HARD, None]
        conn.cursor().executemany("INSERT INTO r VALUES (%s, %s)", list(enumerate(values)))
        conn.execute(f"SET extra_float_digits = {digits}")
        want = [(t,) for t in [*FLOAT4_HARD_TEXT[digits], None]]
        got = _texts(conn, "SELECT r FROM r ORDER BY i")
        assert got == {"simple": want, "extended": want, "copy": want, "csv": want}


@pytest.mark.parametrize("digits", [1, 0])
def test_a_large_real_column_streamed_in_batches(start_server, analytical, digits) -> None:
    """More rows than a batch (8192): random float4s of every magnitude, some NULL."""
    rng = random.Random(7)
    singles = [struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0]
               for _ in range(20000)]
    values = [None if i % 97 == 0 or v != v else v for i, v in enumerate(singles)]
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (i INTEGER, r REAL)")
        with conn.cursor().copy("COPY big FROM STDIN") as copy:
            for i, v in enumerate(values):
                copy.write_row((i, None if v is None else repr(v)))
        conn.execute(f"SET extra_float_digits = {digits}")
        want = [(None if v is None else float4_text(v, digits),) for v in values]
        got = _texts(conn, "SELECT r FROM big ORDER BY i")
        assert got == {"simple": want, "extended": want, "copy": want, "csv": want}
