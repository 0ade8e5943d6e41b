"""Simple queries that differ in their integer literals share one prepared statement
(SQLite): a GRANT, REVOKE, SET ROLE or DDL still counts from the next statement on."""

from __future__ import annotations

import psycopg
import pytest

from tests.server.test_grants import admin_and_bob

DENIED = psycopg.errors.InsufficientPrivilege


def _engine_of(srv, user: str):
    (session,) = [s for s in srv.server.sessions if s.user == user]
    return session.engine


def test_one_shape_prepared_once_and_a_revoke_counts_at_once(start_server,
                                                             sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    setup = ["CREATE TABLE t (a INTEGER, b TEXT)",
             "INSERT INTO t VALUES (1, 'one'), (2, 'two'), (3, 'three')",
             "GRANT SELECT, UPDATE ON t TO bob"]
    with admin_and_bob(srv, setup) as bob, \
            psycopg.connect(**srv.dsn, autocommit=True) as admin:
        # psycopg sends a statement without parameters as a simple Query, literals in it
        assert bob.execute("SELECT b FROM t WHERE a = 1").fetchall() == [("one",)]
        engine = _engine_of(srv, "bob")
        hits = engine.conn.cache_stats()["hits"]
        assert bob.execute("SELECT b FROM t WHERE a = 2").fetchall() == [("two",)]
        assert bob.execute("UPDATE t SET b = b WHERE a = 2").rowcount == 1
        assert bob.execute("UPDATE t SET b = b WHERE a = 3").rowcount == 1
        assert engine.conn.cache_stats()["hits"] == hits + 2  # one per shape seen before

        admin.execute("REVOKE SELECT ON t FROM bob")
        with pytest.raises(DENIED):
            bob.execute("SELECT b FROM t WHERE a = 3")
        admin.execute("GRANT SELECT ON t TO bob")
        assert bob.execute("SELECT b FROM t WHERE a = 3").fetchall() == [("three",)]

        # DDL: the table replaced under the prepared statement
        admin.execute("DROP TABLE t")
        admin.execute("CREATE TABLE t (b TEXT, a INTEGER)")
        admin.execute("INSERT INTO t VALUES ('new', 3)")
        with pytest.raises(DENIED):  # the drop took the old table's grants with it
            bob.execute("SELECT b FROM t WHERE a = 3")
        admin.execute("GRANT SELECT ON t TO bob")
        assert bob.execute("SELECT b FROM t WHERE a = 3").fetchall() == [("new",)]


def test_set_role_counts_for_a_lifted_statement(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    setup = ["CREATE TABLE t (a INTEGER)", "INSERT INTO t VALUES (1)",
             "GRANT SELECT ON t TO bob", "CREATE ROLE nobody", "GRANT nobody TO bob"]
    with admin_and_bob(srv, setup) as bob:
        assert bob.execute("SELECT a FROM t WHERE a = 1").fetchall() == [(1,)]
        bob.execute("SET ROLE nobody")
        with pytest.raises(DENIED):
            bob.execute("SELECT a FROM t WHERE a = 1")
        bob.execute("RESET ROLE")
        assert bob.execute("SELECT a FROM t WHERE a = 2").fetchall() == []


def test_a_planned_statement_keeps_the_session_rules(start_server, sqlite_engine) -> None:
    """A simple query run by its text's plan (one statement, its integers lifted; BEGIN,
    END, SAVEPOINT straight to the transaction's handling) is still refused in a failed
    transaction block (25P02 until ROLLBACK or END), rolled back with it, and a text of the
    same key with several statements runs each of them."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER PRIMARY KEY, b INTEGER)")
        c.execute("INSERT INTO t VALUES (1, 10), (2, 20)")
        assert c.execute("UPDATE t SET b = b + 1 WHERE a = 1").rowcount == 1
        c.execute("BEGIN")
        assert c.execute("UPDATE t SET b = b + 5 WHERE a = 2").rowcount == 1
        with pytest.raises(psycopg.errors.UndefinedTable):
            c.execute("SELECT b FROM missing WHERE a = 1")
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            c.execute("UPDATE t SET b = b + 7 WHERE a = 1")
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            c.execute("BEGIN")
        c.execute("END")  # ends the failed block: a rollback
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert c.execute("SELECT b FROM t WHERE a = 2").fetchall() == [(20,)]
        # savepoints (their names' digits vary) run as written
        c.execute("BEGIN")
        c.execute("SAVEPOINT s1")
        c.execute("UPDATE t SET b = b + 100 WHERE a = 2")
        c.execute("SAVEPOINT s2")
        c.execute("UPDATE t SET b = b + 1000 WHERE a = 2")
        c.execute("ROLLBACK TO s2")
        c.execute("RELEASE s1")
        c.execute("COMMIT")
        assert c.execute("SELECT b FROM t WHERE a = 2").fetchall() == [(120,)]
        assert c.execute("SELECT b FROM t WHERE a = 1").fetchall() == [(11,)]
        cur = c.execute("SELECT b FROM t WHERE a = 1; SELECT b FROM t WHERE a = 2")
        assert cur.fetchall() == [(11,)] and cur.nextset() and cur.fetchall() == [(120,)]
