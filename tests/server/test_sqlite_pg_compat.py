"""Statements the SQLite engine (``cryptdisk serve --sqlite``) answers as PostgreSQL 15
does: the SQLSTATE, the command tag, the RowDescription's type OIDs and the values, as a
real PostgreSQL 15 answered the same statements through psycopg."""

from __future__ import annotations

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
