"""Parameters a client sends untyped (OID 0) and runs with no Describe to type them
(psycopg's ``execute``), written alone into a DATE or INTERVAL column on the SQLite
engine: read by PostgreSQL's input of the column's type, as PostgreSQL types them, not
stored as the text sent. The SQLSTATEs and stored text were read from a real PostgreSQL
15 running the same statements."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

SQLITE_JOURNALS = ["delete", "wal"]


@pytest.fixture
def conn(start_server, sqlite_engine):
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id INTEGER, d DATE, i INTERVAL)")
        yield c


def stored(conn) -> list[tuple[object, ...]]:
    return conn.execute("SELECT id, d::text, i::text FROM t ORDER BY id").fetchall()


@pytest.mark.parametrize("value,sqlstate", [
    ("2024-13-45", "22008"), ("2024-02-30", "22008"), ("not a date", "22007")])
def test_a_bad_untyped_date_is_refused(conn, value, sqlstate) -> None:
    for sql, params in [("INSERT INTO t (id, d) VALUES (%s, %s)", (1, value)),
                        ("INSERT INTO t (id, d) VALUES (%s, %s::date)", (1, value)),
                        ("INSERT INTO t (id, d) VALUES (%s, CAST(%s AS date))", (1, value)),
                        ("INSERT INTO t VALUES (1, %s, NULL), (2, '2024-01-01', NULL)",
                         (value,))]:
        with pytest.raises(psycopg.Error) as err:
            conn.execute(sql, params)
        assert err.value.sqlstate == sqlstate, err.value
        assert value in err.value.diag.message_primary
    assert stored(conn) == []
    conn.execute("INSERT INTO t (id, d) VALUES (1, '2024-01-01')")
    with pytest.raises(psycopg.Error) as err:
        conn.execute("UPDATE t SET d = %s WHERE id = 1", (value,))
    assert err.value.sqlstate == sqlstate, err.value
    assert stored(conn) == [(1, "2024-01-01", None)]


def test_a_good_untyped_date_is_stored_as_postgresql_stores_it(conn) -> None:
    conn.execute("INSERT INTO t (id, d) VALUES (1, %s), (2, %s), (3, %s), (4, %s)",
                 ("2024-1-2", " 2024-03-04 ", "2024-05-06 10:00", "2024-07-08T23:59:59+02"))
    conn.execute("INSERT INTO t (id, d) VALUES (5, %s)", (None,))
    conn.execute("INSERT INTO t (id, d) VALUES (6, %s::date)", ("2024-1-3",))
    conn.execute("INSERT INTO t (id, d) VALUES (7, CAST(%s AS date))", ("2024-1-4",))
    conn.execute("UPDATE t SET d = %s WHERE id = 5", ("2024-2-29",))
    assert stored(conn) == [(1, "2024-01-02", None), (2, "2024-03-04", None),
                            (3, "2024-05-06", None), (4, "2024-07-08", None),
                            (5, "2024-02-29", None), (6, "2024-01-03", None),
                            (7, "2024-01-04", None)]
    assert conn.execute("SELECT count(*) FROM t WHERE d = '2024-01-02'").fetchone() == (1,)


def test_a_bad_untyped_interval_is_refused(conn) -> None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute("INSERT INTO t (id, i) VALUES (1, %s)", ("not an interval",))
    assert err.value.sqlstate == "22007", err.value
    assert err.value.diag.message_primary == \
        'invalid input syntax for type interval: "not an interval"'
    with pytest.raises(psycopg.Error) as err:
        conn.execute("INSERT INTO t (id, i) VALUES (1, %s)", ("2147483648 years",))
    assert err.value.sqlstate == "22015", err.value
    conn.execute("INSERT INTO t (id, i) VALUES (1, '1 day')")
    with pytest.raises(psycopg.Error) as err:
        conn.execute("UPDATE t SET i = %s WHERE id = 1", ("garbage",))
    assert err.value.sqlstate == "22007", err.value
    assert stored(conn) == [(1, None, "1 day")]


def test_a_good_untyped_interval_is_stored_as_postgresql_writes_it(conn) -> None:
    conn.execute("INSERT INTO t (id, i) VALUES (1, %s), (2, %s)", ("90 minutes", "1-2"))
    conn.execute("INSERT INTO t (id) VALUES (3)")
    conn.execute("UPDATE t SET i = %s WHERE id = 3", ("@ 1 hour ago",))
    assert stored(conn) == [(1, None, "01:30:00"), (2, None, "1 year 2 mons"),
                            (3, None, "-01:00:00")]
    assert conn.execute("SELECT id FROM t WHERE i = '01:30:00'").fetchall() == [(1,)]


def test_typed_parameters_are_read_as_before(conn) -> None:
    """A date or interval a client types (psycopg's date, timedelta, a cast) reads as it
    is."""
    conn.execute("INSERT INTO t VALUES (1, %s, %s)",
                 (dt.date(2024, 1, 2), dt.timedelta(days=1, hours=2)))
    conn.execute("INSERT INTO t VALUES (2, %s::date, %s::interval)", ("2024-01-03", "2 days"))
    assert stored(conn) == [(1, "2024-01-02", "1 day 02:00:00"),
                            (2, "2024-01-03", "2 days")]


def test_parameters_typed_by_a_describe_are_read_as_postgresql_reads_them(
        start_server, sqlite_engine) -> None:
    """pg8000 sends its strings untyped and Describes the statement first: the server
    types them by the column (DATE, INTERVAL) and reads them at Bind, with PostgreSQL's
    SQLSTATE for text it refuses (not 22P02) and its ISO forms (2024-1-2) read."""
    import ssl

    import pg8000.native

    srv = start_server(sqlite_engine)
    c = pg8000.native.Connection(
        "u", host="localhost", port=srv.port, password="pw", database="db",
        ssl_context=ssl.create_default_context(cafile=str(srv.dsn["sslrootcert"])))
    try:
        c.run("CREATE TABLE t (id INTEGER, d DATE, i INTERVAL)")
        for column, value, sqlstate, message in [
                ("d", "2024-13-45", "22008", 'date/time field value out of range: "2024-13-45"'),
                ("d", "not a date", "22007", 'invalid input syntax for type date: "not a date"'),
                ("i", "garbage", "22007", 'invalid input syntax for type interval: "garbage"'),
                ("i", "2147483648 years", "22015",
                 'interval field value out of range: "2147483648 years"')]:
            with pytest.raises(pg8000.native.DatabaseError) as err:
                c.run(f"INSERT INTO t (id, {column}) VALUES (1, :v)", v=value)
            assert (err.value.args[0]["C"], err.value.args[0]["M"]) == (sqlstate, message)
        c.run("INSERT INTO t (id, d, i) VALUES (1, :d, :i)", d="2024-1-2", i="90 minutes")
        assert c.run("SELECT id, d::text, i::text FROM t") == [[1, "2024-01-02", "01:30:00"]]
    finally:
        c.close()
