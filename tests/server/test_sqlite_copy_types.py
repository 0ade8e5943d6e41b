"""COPY FROM text into the SQLite engine's typed columns (``cryptdisk serve --sqlite``)
reads each field by its column type's PostgreSQL input, as PostgreSQL 15 does: ``inf``,
``-Infinity`` and `` 1.5 `` into a DOUBLE PRECISION column are doubles, ``yes`` into a
BOOLEAN is true; text the type's input refuses fails the COPY with PostgreSQL's SQLSTATE
(22P02, 22003) and stores nothing (SQLite would store it as TEXT)."""

from __future__ import annotations

import math

import psycopg
import pytest


@pytest.fixture
def conn(start_server, sqlite_engine):
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id INTEGER, x DOUBLE PRECISION, b BOOLEAN)")
        yield c


def _copy(conn, data: str) -> None:
    with conn.cursor().copy("COPY t FROM STDIN") as cp:
        cp.write(data)


def test_float_and_boolean_words_are_read_as_postgresql_reads_them(conn) -> None:
    _copy(conn, "1\tinf\tyes\n2\t-Infinity\toff\n3\t 1.5 \tT\n4\t+inf\t0\n5\t\\N\t\\N\n")
    rows = conn.execute("SELECT id, x, b, typeof(x) FROM t ORDER BY id").fetchall()
    assert [r[:3] for r in rows] == [(1, math.inf, True), (2, -math.inf, False),
                                     (3, 1.5, True), (4, math.inf, False),
                                     (5, None, None)]


@pytest.mark.parametrize("line,code", [
    ("1\tabc\tt\n", "22P02"),     # invalid input syntax for type double precision: "abc"
    ("1\t1e400\tt\n", "22003"),   # "1e400" is out of range for type double precision
    ("1\t1.5\tmaybe\n", "22P02"),  # invalid input syntax for type boolean: "maybe"
    ("1\t\u0663\tt\n", "22P02"),  # an Arabic-Indic digit: no digit to strtod
    ("1\t1_0\tt\n", "22P02"),      # (Python's float reads it)
    ("1\t1e-400\tt\n", "22003"),   # "1e-400" is out of range for type double precision
    ("x1\t1.5\tt\n", "22P02"),    # invalid input syntax for type bigint: "x1"
    ("1.5\t1.5\tt\n", "22P02"),   # invalid input syntax for type bigint: "1.5"
    ("99999999999999999999\t1\tt\n", "22003"),  # value ... out of range for type bigint
])
def test_text_a_column_type_refuses_fails_the_copy(conn, line, code) -> None:
    with pytest.raises(psycopg.Error) as info:
        _copy(conn, "7\t2\tf\n" + line)
    assert info.value.sqlstate == code
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
