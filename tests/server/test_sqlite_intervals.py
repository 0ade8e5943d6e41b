"""Intervals on the SQLite engine (``cryptdisk serve --sqlite``), which holds them as
text: any text PostgreSQL reads as an interval goes in (a string literal an INTERVAL
column types, ``'...'::interval``, a text or binary parameter) and comes out as
PostgreSQL 15 writes that interval, in text and in binary (months, days, microseconds);
text PostgreSQL refuses fails as there. The vectors were read from a real PostgreSQL 15
(``SELECT s::interval::text`` and its fields; its SQLSTATE for the refused ones)."""

from __future__ import annotations

import datetime as dt
import struct

import psycopg
import pytest
from psycopg.adapt import Loader
from psycopg.pq import Format
from psycopg.types.string import TextLoader

from cryptdisk.server._intervalin import IntervalError, parse_interval
from cryptdisk.server._types import interval_text

SQLITE_JOURNALS = ["delete", "wal"]

# --- PostgreSQL 15: input, its text (or SQLSTATE), (months, days, microseconds) ---------
PG_INTERVALS = [
    ('90 minutes', '01:30:00', (0, 0, 5400000000)),
    ('1 day 25 hours', '1 day 25:00:00', (0, 1, 90000000000)),
    ('-1 month 3 days', '-1 mons +3 days', (-1, 3, 0)),
    ('1.5 years', '1 year 6 mons', (18, 0, 0)),
    ('-1 day -02:00:00', '-1 days -02:00:00', (0, -1, -7200000000)),
    ('0', '00:00:00', (0, 0, 0)),
    ('1 day -1 hour', '1 day -01:00:00', (0, 1, -3600000000)),
    ('-1:30', '-01:30:00', (0, 0, -5400000000)),
    ('1.5 months', '1 mon 15 days', (1, 15, 0)),
    ('3 weeks', '21 days', (0, 21, 0)),
    ('-0.5 seconds', '-00:00:00.5', (0, 0, -500000)),
    ('P1Y2M3DT4H5M6S', '1 year 2 mons 3 days 04:05:06', (14, 3, 14706000000)),
    ('1 millennium', '1000 years', (12000, 0, 0)),
    ('@ 1 hour ago', '-01:00:00', (0, 0, -3600000000)),
    ('1 year 2 mons -3 days 04:05:06.7', '1 year 2 mons -3 days +04:05:06.7',
     (14, -3, 14706700000)),
    ('100000 hours', '100000:00:00', (0, 0, 360000000000000)),
    ('1.25 days', '1 day 06:00:00', (0, 1, 21600000000)),
    ('1-2', '1 year 2 mons', (14, 0, 0)),
    ('-1-2', '-1 years -2 mons', (-14, 0, 0)),
    ('1 2:03:04', '1 day 02:03:04', (0, 1, 7384000000)),
    ('5', '00:00:05', (0, 0, 5000000)),
    ('1.5', '00:00:01.5', (0, 0, 1500000)),
    ('P1.5Y', '1 year 6 mons', (18, 0, 0)),
    ('PT1.5H', '01:30:00', (0, 0, 5400000000)),
    ('P2W', '14 days', (0, 14, 0)),
    ('PT', '00:00:00', (0, 0, 0)),
    ('1.05 years', '1 year 1 mon', (13, 0, 0)),
    ('0.333 hours', '00:19:58.8', (0, 0, 1198800000)),
    ('1.1 weeks', '7 days 16:48:00', (0, 7, 60480000000)),
    ('1 mon 1.5 days', '1 mon 1 day 12:00:00', (1, 1, 43200000000)),
    ('00:00:00.0000005', '00:00:00', (0, 0, 0)),
    ('00:00:00.0000015', '00:00:00.000002', (0, 0, 2)),
    ('2.5 us', '00:00:00.000002', (0, 0, 2)),
    ('1 year 1-2', '2 years 2 mons', (26, 0, 0)),
    ('1 DAY', '1 day', (0, 1, 0)),
    ('-0.5 century 100 decade', '950 years', (11400, 0, 0)),
    ('9223372036854775807 us', '2562047788:00:54.775807', (0, 0, 9223372036854775807)),
    ('P8691948.660D', '8691948 days 15:50:24.000013', (0, 8691948, 57024000013)),
    ('P254096.4MT14M-56404.5601S', '21174 years 8 mons 11 days 08:33:55.439885',
     (254096, 11, 30835439885)),
    ('PT-6670589381.72M', '-111176489:41:43.200016', (0, 0, -400235362903200016)),
    ('P1e2D', '100 days', (0, 100, 0)),
    ('PT1e-1S', '00:00:00.1', (0, 0, 100000)),
    ('PT1HT2M', '01:02:00', (0, 0, 3720000000)),
    ('00:00:60', '00:01:00', (0, 0, 60000000)),
    ('1:59:60.5', '02:00:00.5', (0, 0, 7200500000)),
    ('P+90Y', '22007', None),
    ('PT+1H', '22007', None),
    ('P-inf D', '22015', None),
    ('P1e15D', '22015', None),
    ('P2147483648M', '22015', None),
    ('2147483648 months', '22015', None),
    ('2147483647 months 1 month', '22015', None),
    ('178956970-8', '22015', None),
    ('178956970 years 12 months', '22008', None),
    ('1 day 2 days', '22007', None),
    ('1 hour 1 hour', '22007', None),
    ('nonsense', '22007', None),
    ('10:61', '22015', None),
    ('2147483648 days', '22015', None),
    ('178956971 years', '22008', None),
    ('infinity', '22007', None),
    ('1 fortnight', '22007', None),
    ('', '22007', None),
]
# ---------------------------------------------------------------------------------------
VALID = [(s, text, fields) for s, text, fields in PG_INTERVALS if fields is not None]


class _RawBinary(Loader):
    format = Format.BINARY

    def load(self, data: bytes) -> bytes:
        return bytes(data)


@pytest.mark.parametrize("text,expected,fields", PG_INTERVALS)
def test_interval_input_reads_as_postgresql_reads_it(text, expected, fields) -> None:
    if fields is None:
        with pytest.raises(IntervalError) as err:
            parse_interval(text)
        assert err.value.args[1] == expected
        if expected == "22007":
            assert err.value.args[0] == f'invalid input syntax for type interval: "{text}"'
    else:
        assert tuple(parse_interval(text)) == fields
        assert interval_text(*fields) == expected
        assert tuple(parse_interval(expected)) == fields  # its output reads back
        assert tuple(parse_interval(interval_text(*fields, plus=False))) == fields


@pytest.fixture
def conn(start_server, sqlite_engine):
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE iv (id INTEGER PRIMARY KEY, i INTERVAL)")
        yield c


def _texts(conn, sql: str, params=None) -> list[tuple]:
    cur = conn.cursor()
    cur.adapters.register_loader("interval", TextLoader)
    return cur.execute(sql, params).fetchall()


def test_stored_intervals_come_out_as_postgresql_writes_them(conn) -> None:
    """A string literal of any spelling goes in; the text and binary results are
    PostgreSQL's, and a literal of another spelling of the same fields finds the row."""
    for n, (text, _expected, _fields) in enumerate(VALID):
        conn.execute(f"INSERT INTO iv VALUES ({n}, '{text}')")
    assert _texts(conn, "SELECT i FROM iv ORDER BY id") == [(e,) for _s, e, _f in VALID]
    cur = conn.cursor(binary=True)
    cur.adapters.register_loader("interval", _RawBinary)
    got = [struct.unpack("!qii", r[0]) for r in cur.execute("SELECT i FROM iv ORDER BY id")]
    assert got == [(us, days, months) for _s, _e, (months, days, us) in VALID]
    assert _texts(conn, "SELECT id FROM iv WHERE i = '01:30:00' ORDER BY id") == [(0,), (23,)]
    assert _texts(conn, "SELECT id FROM iv WHERE i = '1 hour 30 minutes'::interval "
                        "ORDER BY id") == [(0,), (23,)]
    conn.execute("UPDATE iv SET i = '-1 day 2 hours' WHERE i = '1 year 6 mons'")
    assert _texts(conn, "SELECT DISTINCT i FROM iv WHERE i = '-1 days +02:00:00'") == [
        ("-1 days +02:00:00",)]


@pytest.mark.parametrize("sql,code", [
    ("INSERT INTO iv VALUES (1, 'nonsense')", "22007"),
    ("INSERT INTO iv(id, i) VALUES (1, '1 hour 1 hour')", "22007"),
    ("UPDATE iv SET i = '10:61'", "22015"),
    ("SELECT 'nonsense'::interval", "22007"),
    ("SELECT CAST('nonsense' AS interval)", "22007"),
    ("INSERT INTO iv VALUES (1, CAST('1 hour 1 hour' AS INTERVAL))", "22007"),
    ("SELECT * FROM iv WHERE i = '178956971 years'", "22008"),
])
def test_text_postgresql_refuses_as_an_interval_fails_as_there(conn, sql, code) -> None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(sql)
    assert err.value.sqlstate == code
    assert _texts(conn, "SELECT count(*) FROM iv") == [(0,)]


def test_parameters_and_casts(conn) -> None:
    """A timedelta in text or binary and a string typed interval are stored as the
    literal's text: each reads back as PostgreSQL writes it and compares equal."""
    delta = dt.timedelta(days=-1, hours=2)
    conn.execute("INSERT INTO iv VALUES (1, %s)", (delta,))
    conn.execute("INSERT INTO iv VALUES (2, %b)", (delta,))
    conn.execute("INSERT INTO iv VALUES (3, %s::interval)", ("-1 day 7200 seconds",))
    conn.execute("INSERT INTO iv VALUES (4, '-1 days +02:00:00')")
    assert _texts(conn, "SELECT id, i FROM iv ORDER BY id") == [
        (n, "-1 days +02:00:00") for n in (1, 2, 3, 4)]
    assert _texts(conn, "SELECT count(*) FROM iv WHERE i = '-24:00:00 -1 day'") == [(0,)]
    assert _texts(conn, "SELECT count(*) FROM iv WHERE i = '-1 day +2 hours'") == [(4,)]
    assert _texts(conn, "SELECT '90 minutes'::interval, '1 day 25 hours'::interval") == [
        ("01:30:00", "1 day 25:00:00")]
    # SQL's CAST (as SQLAlchemy writes it) reads its string or parameter as ``::`` does
    assert _texts(conn, "SELECT CAST('P1D' AS interval), CAST(%s AS INTERVAL), "
                  "CAST(%s AS interval)", ("90 minutes", "1 day 7200 seconds")) == [
        ("1 day", "01:30:00", "1 day 02:00:00")]
    conn.execute("INSERT INTO iv VALUES (5, CAST(%s AS interval))", ("P1DT2H",))
    assert _texts(conn, "SELECT i FROM iv WHERE id = 5") == [("1 day 02:00:00",)]


def test_copy_text_reads_intervals_as_postgresql_does(conn) -> None:
    with conn.cursor() as cur:
        with cur.copy("COPY iv FROM STDIN") as copy:
            copy.write(b"1\t90 minutes\n2\t-1 day 2 hours\n3\t\\N\n")
        assert _texts(conn, "SELECT id FROM iv WHERE i = '01:30:00'") == [(1,)]
        with cur.copy("COPY iv TO STDOUT") as copy:
            assert [r[1] for r in copy.rows()] == ["01:30:00", "-1 days +02:00:00", None]
        with pytest.raises(psycopg.Error) as err:
            with cur.copy("COPY iv FROM STDIN") as copy:
                copy.write(b"4\tnonsense\n")
        assert err.value.sqlstate == "22007"


@pytest.mark.parametrize("prepare", [False, True])
def test_a_select_list_cast_to_interval_is_an_interval(conn, prepare) -> None:
    """``'...'::interval`` and ``CAST(... AS [pg_catalog.]interval)`` in a select list are
    described as interval (1186) and written as PostgreSQL 15 wrote them (the ``+`` after
    a negative part), in text and binary; a schema-qualified type is the type."""
    sql = ("SELECT '1 day 2 hours'::interval, CAST('-1 day 2 hours' AS interval), "
           "%s::interval, CAST(%s AS pg_catalog.interval), '-1 mon 3 days'::pg_catalog.interval, "
           "CAST('5' AS \"pg_catalog\".\"interval\") AS x")
    params = ("-1 day 7200 seconds", "1 day")
    cur = conn.cursor()
    cur.adapters.register_loader("interval", TextLoader)
    cur.execute(sql, params, prepare=prepare)
    assert [d.type_code for d in cur.description] == [1186] * 6
    assert [d.name for d in cur.description] == ["interval"] * 5 + ["x"]
    assert cur.fetchall() == [("1 day 02:00:00", "-1 days +02:00:00", "-1 days +02:00:00",
                               "1 day", "-1 mons +3 days", "00:00:05")]
    day = dt.timedelta(days=-1, hours=2)
    assert conn.execute(sql, params, binary=True, prepare=prepare).fetchall() == [
        (dt.timedelta(days=1, hours=2), day, day, dt.timedelta(days=1),
         dt.timedelta(days=-27), dt.timedelta(seconds=5))]
    assert conn.execute("SELECT CAST(%s AS pg_catalog.int4), '7'::pg_catalog.int8",
                        (5,)).fetchall() == [(5, 7)]


def test_an_interval_column_cast_to_text_is_the_stored_text(conn) -> None:
    """An interval is stored without the ``+`` PostgreSQL writes after a negative part:
    the column reads as PostgreSQL's text (``-1 days +02:00:00``), but its cast to text
    gives the stored ``-1 days 02:00:00`` (PostgreSQL 15: ``-1 days +02:00:00``), as
    docs/server-sqlite.md says."""
    conn.execute("INSERT INTO iv VALUES (1, '-1 day 2 hours'), (2, '1 day -2 hours')")
    cur = conn.cursor()
    cur.adapters.register_loader("interval", TextLoader)
    assert cur.execute("SELECT i, i::text, CAST(i AS text) FROM iv ORDER BY id").fetchall() \
        == [("-1 days +02:00:00", "-1 days 02:00:00", "-1 days 02:00:00"),
            ("1 day -02:00:00", "1 day -02:00:00", "1 day -02:00:00")]


def test_text_an_expression_writes_into_an_interval_column_is_read_as_one(conn) -> None:
    """An expression written into an INTERVAL column (``INSERT ... SELECT``, ``VALUES
    (x || y)``, ``UPDATE ... SET i = s``), which SQLite stored as any text, is read as
    PostgreSQL reads an interval: text that is none fails the statement with 22007 (as
    PostgreSQL 15 answered ``INSERT INTO t (i) SELECT 'garbage'``; it refuses a text
    expression with 42804 before any row), an interval's text is stored as PostgreSQL
    writes it, and a failed statement leaves the table as it was."""
    conn.execute("CREATE TABLE src (s TEXT)")
    conn.execute("INSERT INTO src VALUES ('90 minutes')")
    conn.execute("INSERT INTO iv VALUES (1, '1 day')")
    for sql, params in [
            ("INSERT INTO iv (id, i) SELECT 2, 'garbage'", None),
            ("INSERT INTO iv (id, i) SELECT 2, %s", ("garbage",)),
            ("INSERT INTO iv VALUES (2, '1 ' || 'fortnight')", None),
            ("INSERT INTO iv SELECT 2, s || 'x' FROM src", None),
            ("UPDATE iv SET i = 'x' || 'y'", None),
            ("UPDATE iv SET i = %s || %s WHERE id = 1", ("1 day", " 1 day")),
            ("UPDATE iv SET i = CASE WHEN id = 1 THEN 'nonsense' END", None),
            ("UPDATE iv SET i = (SELECT s || '!' FROM src) WHERE id = 1", None)]:
        with pytest.raises(psycopg.Error) as err:
            conn.execute(sql, params)
        assert err.value.sqlstate == "22007", sql
        assert err.value.diag.message_primary.startswith(
            "invalid input syntax for type interval"), sql
    assert _texts(conn, "SELECT id, i FROM iv ORDER BY id") == [(1, "1 day")]
    conn.execute("INSERT INTO iv (id, i) SELECT 2, s FROM src")
    conn.execute("INSERT INTO iv AS x (i, id) VALUES ('-1 ' || 'day 2 hours', 3)")
    conn.execute("INSERT INTO iv (id, i) SELECT %s, %s", (4, "P1DT2H"))
    conn.execute("UPDATE iv SET i = upper(s) FROM src WHERE id = 1")
    conn.execute("INSERT INTO iv (id, i) SELECT id + 10, i FROM iv WHERE id = 1")
    conn.execute("INSERT INTO iv (id, i) VALUES (5, NULL)")
    assert _texts(conn, "SELECT id, i FROM iv ORDER BY id") == [
        (1, "01:30:00"), (2, "01:30:00"), (3, "-1 days +02:00:00"), (4, "1 day 02:00:00"),
        (5, None), (11, "01:30:00")]
    assert _texts(conn, "SELECT count(*) FROM iv WHERE i = '90 minutes'") == [(3,)]


def test_a_set_column_list_writes_its_text_unchecked(conn) -> None:
    """``UPDATE ... SET (i) = (...)`` is not read as an interval as it is written (as
    docs/server-sqlite.md says; PostgreSQL 15 refuses it, 42804): SQLite stores the text,
    and each read of the column as interval then fails with 22007."""
    conn.execute("INSERT INTO iv VALUES (1, '1 day')")
    conn.execute("UPDATE iv SET (i) = (SELECT 'garbage') WHERE id = 1")
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT i FROM iv").fetchall()
    assert err.value.sqlstate == "22007"
    with pytest.raises(psycopg.Error) as err:
        conn.execute("UPDATE iv SET i = (SELECT 'garbage') WHERE id = 1")
    assert err.value.sqlstate == "22007"


def test_an_untyped_parameter_written_alone_is_read_as_an_interval(conn) -> None:
    """psycopg's untyped parameter (no Describe) written alone into an INTERVAL column is
    read as an interval, as PostgreSQL 15 types it: 22007 for 'garbage', '01:30:00' for
    '90 minutes'; so is one cast."""
    conn.execute("INSERT INTO iv (id, i) VALUES (1, %s)", ("90 minutes",))
    for sql in ("INSERT INTO iv (id, i) VALUES (2, %s)", "UPDATE iv SET i = %s WHERE id = 1",
                "INSERT INTO iv (id, i) VALUES (2, %s::interval)",
                "UPDATE iv SET i = %s::interval WHERE id = 1"):
        with pytest.raises(psycopg.Error) as err:
            conn.execute(sql, ("garbage",))
        assert err.value.sqlstate == "22007"
    assert _texts(conn, "SELECT id, i::text FROM iv ORDER BY id") == [(1, "01:30:00")]
    conn.execute("UPDATE iv SET i = %s::interval WHERE id = 1", ("90 minutes",))
    assert _texts(conn, "SELECT id, i::text FROM iv ORDER BY id") == [(1, "01:30:00")]
