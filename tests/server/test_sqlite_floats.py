"""Doubles on the SQLite engine (``cryptdisk serve --sqlite``) through psycopg: every
finite double goes in as a literal (PostgreSQL's own text of it, in a float context) or a
parameter (text or binary) and reads back as the same double, in text with
extra_float_digits 1 and 3 and in binary. PostgreSQL 15's answers are pinned below."""

from __future__ import annotations

import math
import struct

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cryptdisk.server._textout import float8_text

#: PostgreSQL 15 accepts each (a numeric literal rounded to the nearest double) and writes
#: the double back so; the SQLite engine refused the first ones with 22003 (inexact)
PG_FLOAT8 = [
    ("SELECT 5.2990648348713776e+16::float8", "5.2990648348713776e+16"),
    ("SELECT CAST(5.2990648348713776e+16 AS DOUBLE PRECISION)", "5.2990648348713776e+16"),
    ("SELECT 0.10000000000000001::float8", "0.1"),
    ("SELECT 1.2345678901234567890::double precision", "1.2345678901234567"),
    ("SELECT 0.1::float8", "0.1"),
]


@pytest.fixture
def conn(start_server, sqlite_engine):
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, x DOUBLE PRECISION, n NUMERIC)")
        yield c


def _text(conn, sql: str, params=None) -> list[str | None]:
    cur = conn.cursor()
    cur.adapters.register_loader("float8", psycopg.types.string.TextLoader)
    return [r[0] for r in cur.execute(sql, params).fetchall()]


@pytest.mark.parametrize("sql,text", PG_FLOAT8)
def test_a_float_literal_reads_as_postgresql_reads_it(conn, sql, text) -> None:
    assert _text(conn, sql) == [text]


def test_a_literal_a_float_column_types_is_rounded_to_the_double(conn) -> None:
    """INSERT, UPDATE and WHERE take a long literal beside a DOUBLE PRECISION column, as
    PostgreSQL does (its numeric rounded to the double); beside a NUMERIC column, or with
    no context (PostgreSQL's numeric), it is still refused: SQLite would hold another
    number than the one written."""
    conn.execute("INSERT INTO t(id, x) VALUES (1, 5.2990648348713776e+16)")
    conn.execute("INSERT INTO t VALUES (%s, 0.10000000000000001, 1)", (2,))  # (extended)
    conn.execute("UPDATE t SET x = 1.2345678901234567890 WHERE x = 0.10000000000000001")
    assert _text(conn, "SELECT x FROM t WHERE x = 5.2990648348713776e+16") == [
        "5.2990648348713776e+16"]
    assert _text(conn, "SELECT x FROM t ORDER BY id") == [
        "5.2990648348713776e+16", "1.2345678901234567"]
    for sql in ["INSERT INTO t(id, n) VALUES (3, 5.2990648348713776e+16)",
                "SELECT 5.2990648348713776e+16"]:
        with pytest.raises(psycopg.Error) as err:
            conn.execute(sql)
        assert err.value.sqlstate == "22003"


_DOUBLES = st.floats(allow_nan=False, allow_infinity=False) | st.builds(
    lambda b: struct.unpack("<d", b)[0], st.binary(min_size=8, max_size=8)).filter(
        math.isfinite)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_DOUBLES)
def test_every_finite_double_goes_in_and_comes_back_exactly(conn, value) -> None:
    conn.execute("DELETE FROM t")
    literal = float8_text(value)  # PostgreSQL's text of it, as a client would copy it
    conn.execute(f"INSERT INTO t(id, x) VALUES (1, {literal})")
    conn.execute(f"INSERT INTO t(id, x) VALUES (2, {literal}::float8)")
    conn.execute("INSERT INTO t(id, x) VALUES (3, %s)", (value,))  # text parameter
    conn.execute("INSERT INTO t(id, x) VALUES (4, %b)", (value,))  # binary parameter
    stored = value if value != 0 else 0.0  # (SQLite keeps -0.0 as 0)
    for digits in (1, 3):
        conn.execute(f"SET extra_float_digits = {digits}")
        assert _text(conn, "SELECT x FROM t ORDER BY id") == [float8_text(stored)] * 4
    rows = conn.cursor(binary=True).execute("SELECT x FROM t ORDER BY id").fetchall()
    assert [struct.pack("<d", r[0]) for r in rows] == [struct.pack("<d", stored)] * 4
