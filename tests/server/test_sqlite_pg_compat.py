"""Statements the SQLite engine (``cryptdisk serve --sqlite``) answers as PostgreSQL 15
does: the SQLSTATE, the command tag, the RowDescription's type OIDs and the values, as a
real PostgreSQL 15 answered the same statements through psycopg."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import psycopg
import pytest

SQLITE_JOURNALS = ["delete", "wal"]


@pytest.fixture
def conn(start_server, sqlite_engine):
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        yield c


def types(cur: psycopg.Cursor) -> list[int]:
    assert cur.description is not None
    return [d.type_code for d in cur.description]


@pytest.mark.parametrize("prepare", [False, True])
@pytest.mark.parametrize("sql,name", [
    ("SELECT 5::bogus", "bogus"), ("SELECT CAST(5 AS bogus)", "bogus"),
    ("SELECT 'x'::bogus", "bogus"), ("SELECT %s::bogus", "bogus"),
    ("SELECT 1::int::serial", "serial")])
def test_a_cast_to_a_type_that_does_not_exist_is_42704(conn, sql, name, prepare) -> None:
    with pytest.raises(psycopg.errors.UndefinedObject) as err:
        conn.execute(sql, ("5",) if "%s" in sql else None, prepare=prepare)
    assert err.value.diag.message_primary == f'type "{name}" does not exist'


@pytest.mark.parametrize("prepare", [False, True])
def test_a_null_cast_to_interval_is_a_null_interval(conn, prepare) -> None:
    for sql in ("SELECT CAST(NULL AS interval)", "SELECT NULL::interval AS i"):
        cur = conn.execute(sql, prepare=prepare)
        assert types(cur) == [1186]
        assert cur.fetchall() == [(None,)]
    conn.execute("CREATE TABLE t (id INTEGER, i INTERVAL)")
    conn.execute("INSERT INTO t VALUES (1, CAST(NULL AS interval)), (2, NULL::interval)")
    assert conn.execute("SELECT count(*) FROM t WHERE i IS NULL").fetchone() == (2,)


@pytest.mark.parametrize("prepare", [False, True])
def test_a_string_cast_in_the_select_list_is_described_as_its_type(conn, prepare) -> None:
    """'...'::date, ::uuid, ::numeric, ::time, ::timestamp, ::timestamptz (and a
    parameter's cast, CAST(... AS date)) are described as PostgreSQL describes them, and
    psycopg reads them into its types."""
    cur = conn.execute(
        "SELECT '2024-01-02'::date, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, "
        "'1.50'::numeric, '10:00'::time, '2024-01-02 10:00'::timestamp, "
        "'2024-01-02 10:00+02'::timestamptz", prepare=prepare)
    assert types(cur) == [1082, 2950, 1700, 1083, 1114, 1184]
    assert cur.fetchall() == [(
        dt.date(2024, 1, 2), uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        decimal.Decimal("1.50"), dt.time(10, 0), dt.datetime(2024, 1, 2, 10, 0),
        dt.datetime(2024, 1, 2, 8, 0, tzinfo=dt.UTC))]
    cur = conn.execute("SELECT %s::date, %s::numeric, CAST('2024-01-04' AS date)",
                       ("2024-01-03", "2.5"), prepare=prepare)
    assert types(cur) == [1082, 1700, 1082]
    assert cur.fetchall() == [(dt.date(2024, 1, 3), decimal.Decimal("2.5"),
                               dt.date(2024, 1, 4))]
    for sql in ("SELECT 'abc'::uuid", "SELECT 'x'::numeric"):
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):  # 22P02
            conn.execute(sql, prepare=prepare)


@pytest.mark.parametrize("prepare", [False, True])
def test_a_write_after_with_is_tagged_as_the_write(conn, prepare) -> None:
    conn.execute("CREATE TABLE w (a INTEGER)")
    for sql, tag in [
            ("WITH x AS (SELECT 1) INSERT INTO w SELECT * FROM x", "INSERT 0 1"),
            ("WITH RECURSIVE x(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM x WHERE n < 3) "
             "INSERT INTO w SELECT n FROM x", "INSERT 0 3"),
            ("WITH x AS (SELECT 1) UPDATE w SET a = a + 1", "UPDATE 4"),
            ("WITH x AS MATERIALIZED (SELECT 1), y AS (SELECT 2) "
             "DELETE FROM w WHERE a > 3 RETURNING a", "DELETE 1"),
            ("WITH x AS (SELECT 1) SELECT * FROM x", "SELECT 1")]:
        cur = conn.execute(sql, prepare=prepare)
        assert cur.statusmessage == tag, sql
        assert cur.rowcount == int(tag.split()[-1]), sql



def test_show_timezone_gives_the_name_set(conn) -> None:
    """SQLite's sessions are in UTC only; SHOW and the ParameterStatus give the name SET
    gave, as PostgreSQL shows it (its canonical name), and RESET or a rollback undoes it."""
    def shown() -> str:
        return conn.execute("SHOW timezone").fetchone()[0]

    for sql, name in [("SET TimeZone = 'GMT'", "GMT"), ("SET TimeZone = 'gmt'", "GMT"),
                      ("SET TIME ZONE 'zulu'", "Zulu"), ("SET TimeZone = 'z'", "Etc/UTC"),
                      ("SET TIME ZONE 0", "<+00>-00"), ("SET TimeZone = '00:00'", "00:00"),
                      ("SET TimeZone TO 'etc/utc'", "Etc/UTC"), ("SET TimeZone = 'UTC'", "UTC")]:
        conn.execute(sql)
        assert shown() == name, sql
        assert conn.info.parameter_status("TimeZone") == name, sql
        assert conn.execute("SELECT current_setting('TimeZone')").fetchone() == (name,)
    conn.execute("SET TimeZone = 'GMT'")
    conn.execute("RESET TimeZone")
    assert shown() == "UTC" and conn.info.parameter_status("TimeZone") == "UTC"
    with conn.transaction(force_rollback=True):
        conn.execute("SET TimeZone = 'GMT'")
        assert shown() == "GMT"
    assert shown() == "UTC"


@pytest.mark.parametrize("prepare", [False, True])
def test_a_name_cast_to_regclass_names_a_relation(conn, prepare) -> None:
    """'x'::regclass fails with 42P01 where no relation has that name, as in PostgreSQL
    (SQLite answered the string); a relation's name is read as PostgreSQL's regclass
    input reads it (unquoted: lower case; schema public)."""
    conn.execute("CREATE TABLE t (a INTEGER)")
    conn.execute("CREATE VIEW v AS SELECT a FROM t")
    for sql in ("SELECT 'x'::pg_catalog.regclass", "SELECT 'x'::regclass",
                "SELECT 'public.x'::regclass", "SELECT 1 WHERE 'x'::regclass IS NOT NULL"):
        with pytest.raises(psycopg.errors.UndefinedTable) as err:
            conn.execute(sql, prepare=prepare)
        assert err.value.diag.message_primary.startswith('relation "')
    cur = conn.execute("SELECT 't'::pg_catalog.regclass, 'T'::regclass, 'public.t'::regclass, "
                       "'v'::regclass, '::regclass'", prepare=prepare)
    assert cur.fetchall() == [("t", "t", "t", "v", "::regclass")]


@pytest.mark.parametrize("prepare", [False, True])
def test_a_string_cast_to_date_is_read_by_the_date_input(conn, prepare) -> None:
    """'2024-1-2'::date is 2024-01-02; a month or day out of range fails with 22008, other
    text with 22007, as in PostgreSQL."""
    assert conn.execute("SELECT '2024-1-2'::date", prepare=prepare).fetchone() == (
        dt.date(2024, 1, 2),)
    with pytest.raises(psycopg.errors.DatetimeFieldOverflow):  # 22008
        conn.execute("SELECT '2024-13-45'::date", prepare=prepare)
    with pytest.raises(psycopg.errors.InvalidDatetimeFormat):  # 22007
        conn.execute("SELECT 'x'::date", prepare=prepare)
