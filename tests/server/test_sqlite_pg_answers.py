"""Common statements on the SQLite engine (``cryptdisk serve --sqlite``) answer as
PostgreSQL 15 does where SQLite's own answer differs: the rows (as text) or the SQLSTATE
below were read from a real PostgreSQL 15 running the same statements on the same
table."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.string import TextLoader

SQLITE_JOURNALS = ["delete", "wal"]

_TABLE = ("CREATE TABLE p (id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, ok BOOLEAN, "
          "big BIGINT)")
_ROWS = ("INSERT INTO p VALUES (1, 'Apple', 3, true, 9223372036854775807), "
         "(2, 'banana', NULL, false, -9223372036854775808), (3, NULL, 7, NULL, 0)")

# --- PostgreSQL 15: statement -> rows (text; None is NULL) or SQLSTATE ------------------
PG_ANSWERS = [
    # NULL sorts above every value: last ascending, first descending
    ("SELECT name FROM p ORDER BY name", [("Apple",), ("banana",), (None,)]),
    ("SELECT name FROM p ORDER BY name DESC", [(None,), ("banana",), ("Apple",)]),
    ("SELECT qty FROM p ORDER BY qty", [("3",), ("7",), (None,)]),
    ("SELECT qty FROM p ORDER BY qty DESC, id", [(None,), ("7",), ("3",)]),
    ("SELECT qty FROM p ORDER BY qty NULLS FIRST", [(None,), ("3",), ("7",)]),
    ("SELECT qty FROM p ORDER BY qty DESC NULLS LAST", [("7",), ("3",), (None,)]),
    ("SELECT ok, count(*) FROM p GROUP BY ok ORDER BY ok",
     [("f", "1"), ("t", "1"), (None, "1")]),
    ("SELECT id, row_number() OVER (ORDER BY qty) FROM p ORDER BY id",
     [("1", "1"), ("2", "3"), ("3", "2")]),
    ("SELECT string_agg(name, ',' ORDER BY name DESC) FROM p", [("banana,Apple",)]),
    ("SELECT id FROM (SELECT id, qty FROM p ORDER BY qty LIMIT 2) s ORDER BY id",
     [("1",), ("3",)]),
    # int8 arithmetic past its range: 22003 (SQLite went on in floats)
    ("SELECT big + 1 FROM p WHERE id = 1", "22003"),
    ("SELECT big - 1 FROM p WHERE id = 2", "22003"),
    ("SELECT big * 2 FROM p WHERE id = 1", "22003"),
    ("SELECT -big FROM p WHERE id = 2", "22003"),
    ("SELECT abs(big) FROM p WHERE id = 2", "22003"),
    ("SELECT big + qty FROM p WHERE id = 1", "22003"),
    ("SELECT big + 0, big - 0 FROM p ORDER BY id",
     [("9223372036854775807", "9223372036854775807"),
      ("-9223372036854775808", "-9223372036854775808"), ("0", "0")]),
    ("SELECT qty * 2 FROM p ORDER BY id", [("6",), (None,), ("14",)]),
    # booleans: NOT and IS [NOT] DISTINCT FROM are booleans; a string cast to boolean is
    # read by PostgreSQL's boolean input
    ("SELECT NOT ok FROM p ORDER BY id", [("f",), ("t",), (None,)]),
    ("SELECT ok IS DISTINCT FROM true, ok IS NOT DISTINCT FROM NULL FROM p ORDER BY id",
     [("f", "f"), ("t", "f"), ("t", "t")]),
    ("SELECT 1 IS DISTINCT FROM NULL, 2 IS NOT DISTINCT FROM 2", [("t", "t")]),
    ("SELECT 'true'::boolean, 'yes'::bool, 'f'::boolean, ' ON '::boolean, 'of'::boolean, "
     "'0'::boolean, CAST('t' AS BOOLEAN)", [("t", "t", "f", "t", "f", "f", "t")]),
    ("SELECT id FROM p WHERE ok = 'yes'::boolean", [("1",)]),
    ("SELECT 'maybe'::boolean", "22P02"),
    ("SELECT 'o'::boolean", "22P02"),
    # a string cast to a float is read by PostgreSQL's float input (SQLite's CAST: 0)
    ("SELECT 'Infinity'::float8, '-inf'::float8, ' 1.5e3 '::float8, '.5'::float8, "
     "'0x10'::float8, CAST('2.5' AS DOUBLE PRECISION)",
     [("Infinity", "-Infinity", "1500", "0.5", "16", "2.5")]),
    ("SELECT 'abc'::float8", "22P02"),
    ("SELECT '1_000'::float8", "22P02"),
    ("SELECT '1e400'::float8", "22003"),
    ("SELECT '1e-400'::float8", "22003"),
    # float4's range is strtof's: its largest value as PostgreSQL writes it reads back
    ("SELECT '3.4028235e38'::float4", [("3.4028235e+38",)]),
    ("SELECT '3.4028236e38'::float4", "22003"),
    ("SELECT '4e-46'::float4", "22003"),
    ("SELECT '0x1" + "0" * 300 + "'::float8", "22003"),  # (strtod: ERANGE)
    ("SELECT '2.5'::float8::int, '3.5'::float8::int8, '1.5'::float8::text",
     [("2", "4", "1.5")]),
    # substr counts positions from 1, a start below it taking fewer characters
    ("SELECT substr('hello', -1, 3), substr('hello', 0, 2), substr('hello', 10), "
     "substr('hello', 2, 3), substr('hello', 2), substr('hello', -5), substring('héllo', 2, 2)",
     [("h", "h", "", "ell", "ello", "hello", "él")]),
    ("SELECT substr('hello', 2, -1)", "22011"),
    ("SELECT substr(name, -1, 3) FROM p ORDER BY id", [("A",), ("b",), (None,)]),
]
# ---------------------------------------------------------------------------------------


@pytest.fixture
def conn(start_server, sqlite_engine):
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute(_TABLE)
        c.execute(_ROWS)
        for name in ("int4", "int8", "bool", "float8", "numeric"):
            c.adapters.register_loader(name, TextLoader)
        yield c


@pytest.mark.parametrize("sql,expected", PG_ANSWERS)
def test_answers_as_postgresql(conn, sql, expected) -> None:
    if isinstance(expected, str):
        with pytest.raises(psycopg.Error) as err:
            conn.execute(sql)
        assert err.value.sqlstate == expected, err.value
    else:
        assert conn.execute(sql).fetchall() == expected


def test_a_float4_below_its_smallest_rounds_as_strtof_does(conn) -> None:
    """'8e-46'::float4 is PostgreSQL's 1e-45 (strtof rounds it to the smallest subnormal);
    only a value that rounds to 0 is out of range. SQLite holds the double."""
    assert conn.execute("SELECT '8e-46'::float4 > 0, '-3.40282356e38'::real < 0").fetchall() \
        == [("t", "t")]


def test_a_boolean_column_takes_postgresql_boolean_text(conn) -> None:
    """Strings a BOOLEAN column gives its type are read by PostgreSQL's boolean input as
    they are stored (SQLite kept 'false' as text, sent back as 'false', true to WHERE)."""
    conn.execute("INSERT INTO p (id, ok) VALUES (4, 'false'), (5, 'yes'), (6, ' off ')")
    conn.execute("UPDATE p SET ok = 'no' WHERE id = 1")
    assert conn.execute("SELECT id, ok FROM p WHERE id <> 3 ORDER BY id").fetchall() == [
        ("1", "f"), ("2", "f"), ("4", "f"), ("5", "t"), ("6", "f")]
    assert conn.execute("SELECT id FROM p WHERE ok ORDER BY id").fetchall() == [("5",)]
    assert conn.execute("SELECT id FROM p WHERE ok = 'y'").fetchall() == [("5",)]
    with pytest.raises(psycopg.Error) as err:
        conn.execute("INSERT INTO p (id, ok) VALUES (7, 'maybe')")
    assert err.value.sqlstate == "22P02"


def test_typed_strings_follow_schema_changes(conn) -> None:
    """The same statement text is typed anew after the schema changes: a column that
    becomes BOOLEAN reads 'yes' as true, one that becomes TEXT keeps it."""
    insert = "INSERT INTO b VALUES ('yes')"
    conn.execute("CREATE TABLE b (v TEXT)")
    conn.execute(insert)
    assert conn.execute("SELECT v FROM b").fetchall() == [("yes",)]
    conn.execute("DROP TABLE b")
    conn.execute("CREATE TABLE b (v BOOLEAN)")
    conn.execute(insert)
    conn.execute(insert)
    assert conn.execute("SELECT v FROM b").fetchall() == [("t",), ("t",)]
    conn.execute("DROP TABLE b")
    conn.execute("CREATE TABLE b (v TEXT)")
    conn.execute(insert)
    assert conn.execute("SELECT v FROM b").fetchall() == [("yes",)]
