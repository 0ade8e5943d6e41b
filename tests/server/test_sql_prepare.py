"""SQL-level PREPARE / EXECUTE / DEALLOCATE through the server, on both engines: the
statement is the session's, shares the protocol's namespace of named statements, and is
checked against the grants when it runs."""

from __future__ import annotations

import ssl

import pg8000.native
import psycopg
import pytest

from tests.server.test_grants import admin_and_bob

ENGINES = ["analytical", "sqlite_engine"]


@pytest.mark.parametrize("engine", ENGINES)
def test_prepare_execute_deallocate(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER, s VARCHAR)")
        c.execute("INSERT INTO t VALUES (1, 'x')")
        c.execute("PREPARE p AS SELECT s FROM t WHERE a = $1")
        assert c.execute("EXECUTE p(1)").fetchall() == [("x",)]
        assert c.execute("EXECUTE p (2)").fetchall() == []
        c.execute("PREPARE ins (int, text) AS INSERT INTO t VALUES ($1, $2)")
        assert c.execute("EXECUTE ins(2, 'it''s, (x)')").statusmessage == "INSERT 0 1"
        assert c.execute("SELECT s FROM t WHERE a = 2").fetchone() == ("it's, (x)",)
        c.execute("PREPARE typed (int, numeric(10, 2)) AS SELECT $1 + 1, $2")
        a, b = c.execute("EXECUTE typed('41', 1.5)").fetchone()
        assert a == 42 and float(b) == 1.5
        with pytest.raises(psycopg.errors.SyntaxError, match="wrong number of parameters"):
            c.execute("EXECUTE typed(1)")
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
            c.execute("PREPARE p AS SELECT 1")
        c.execute("DEALLOCATE p")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            c.execute("EXECUTE p(1)")
        c.execute("PREPARE nothing AS SELECT 7")
        assert c.execute("EXECUTE nothing").fetchall() == [(7,)]
        c.execute("PREPARE q AS SELECT s FROM t WHERE a = $1")
        assert c.execute("EXECUTE q(%s)", [2]).fetchall() == [("it's, (x)",)]  # extended
    p8 = pg8000.native.Connection(
        "u", host="localhost", port=srv.port, password="pw", database="db",
        ssl_context=ssl.create_default_context(cafile=str(srv.dsn["sslrootcert"])))
    try:  # pg8000 describes the statement (EXECUTE's columns) before it binds
        p8.run("PREPARE by_a AS SELECT s FROM t WHERE a = $1")
        assert p8.run("EXECUTE by_a(1)") == [["x"]]
        assert p8.run("EXECUTE by_a(:v)", v=1) == [["x"]]
    finally:
        p8.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_execute_is_checked_against_the_grants(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    setup = ["CREATE TABLE open_t (a INTEGER)", "CREATE TABLE secret (s VARCHAR)",
             "INSERT INTO open_t VALUES (1)", "INSERT INTO secret VALUES ('hidden')",
             "GRANT SELECT ON open_t TO bob"]
    with admin_and_bob(srv, setup) as bob:
        bob.execute("PREPARE mine AS SELECT a FROM open_t WHERE a = $1")
        assert bob.execute("EXECUTE mine(1)").fetchall() == [(1,)]
        bob.execute("PREPARE theirs AS SELECT s FROM secret")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            bob.execute("EXECUTE theirs")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            bob.execute("PREPARE again AS SELECT a FROM open_t; EXECUTE theirs")


@pytest.mark.parametrize("engine", ENGINES)
def test_execute_in_a_query_of_several_statements(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    setup = ["CREATE TABLE open_t (a INTEGER)", "CREATE TABLE secret (s VARCHAR)",
             "INSERT INTO open_t VALUES (1)", "GRANT SELECT ON open_t TO bob"]
    with admin_and_bob(srv, setup) as bob:
        bob.execute("PREPARE mine AS SELECT a FROM open_t WHERE a = $1")
        cur = bob.execute("PREPARE two AS SELECT a + 1 FROM open_t; EXECUTE mine(1); "
                          "EXECUTE two")
        assert cur.statusmessage == "PREPARE"
        assert cur.nextset() and cur.fetchall() == [(1,)]
        assert cur.nextset() and cur.fetchall() == [(2,)]
        # refused before anything of the query runs: "three" is not prepared after it
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            bob.execute("PREPARE three AS SELECT 3; PREPARE peek AS SELECT s FROM secret; "
                        "EXECUTE peek")
        bob.execute("PREPARE three AS SELECT 3")


def test_sqlite_execute_casts_to_an_integer_parameter_as_postgresql(start_server,
                                                                     sqlite_engine) -> None:
    """On SQLite, EXECUTE's argument for an integer parameter is cast as PostgreSQL casts it
    (SQLite's CAST gave 0 for 'abc', 3 for '3.7' and 2 for 2.5)."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("PREPARE p (int, bigint, smallint) AS SELECT $1, $2, $3")
        assert c.execute("EXECUTE p(2.5, ' 42 ', -2.5)").fetchone() == (3, 42, -3)
        assert c.execute("EXECUTE p(NULL, 9007199254740993, '7')").fetchone() == (
            None, 9007199254740993, 7)
        for args, code in [("'abc', 1, 1", "22P02"), ("'3.7', 1, 1", "22P02"),
                           ("3000000000, 1, 1", "22003"), ("1, 1e30, 1", "22003"),
                           ("1, 1, 40000", "22003")]:
            with pytest.raises(psycopg.Error) as info:
                c.execute(f"EXECUTE p({args})")
            assert info.value.sqlstate == code, args
