"""READ ONLY transactions and sessions: a write fails with 25006, as in PostgreSQL."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa

from tests.server.test_orm_clients import make_engine

ENGINES = ["analytical", "sqlite_engine"]
READ_ONLY = psycopg.errors.ReadOnlySqlTransaction


def _count(c) -> int:
    return c.execute("SELECT count(*) FROM t").fetchone()[0]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_read_only_block_refuses_writes(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
        c.execute("INSERT INTO t VALUES (1)")
        writes = {"INSERT INTO t VALUES (2)": "INSERT", "UPDATE t SET a = 3": "UPDATE",
                  "DELETE FROM t": "DELETE", "CREATE TABLE u (a INTEGER)": "CREATE TABLE",
                  "DROP TABLE t": "DROP TABLE", "CREATE USER carol PASSWORD 'pw'": "CREATE USER",
                  "GRANT SELECT ON t TO PUBLIC": "GRANT"}
        for begin in ("BEGIN READ ONLY", "START TRANSACTION READ ONLY",
                      "BEGIN ISOLATION LEVEL SERIALIZABLE, READ ONLY"):
            for sql, name in writes.items():
                c.execute(begin)
                assert c.execute("SHOW transaction_read_only").fetchone() == ("on",)
                assert _count(c) == 1  # reads run
                with pytest.raises(READ_ONLY,
                                   match=f"cannot execute {name} in a read-only transaction"):
                    c.execute(sql)
                with pytest.raises(psycopg.errors.InFailedSqlTransaction):
                    c.execute("SELECT 1")
                c.execute("ROLLBACK")
        # (a write the first word does not show: the engine's own check)
        hidden = "WITH x AS (SELECT 5 AS a) INSERT INTO t SELECT a FROM x" \
            if engine == "sqlite_engine" else "EXPLAIN ANALYZE INSERT INTO t VALUES (5)"
        c.execute("BEGIN READ ONLY")
        with pytest.raises(READ_ONLY):
            c.execute(hidden)
        c.execute("ROLLBACK")
        c.execute("BEGIN READ ONLY")
        with pytest.raises(READ_ONLY, match="COPY FROM"):
            with c.cursor().copy("COPY t FROM STDIN") as cp:
                cp.write_row((7,))
        c.execute("ROLLBACK")
        # the mode ends with the block
        assert c.execute("SHOW transaction_read_only").fetchone() == ("off",)
        c.execute("INSERT INTO t VALUES (2)")
        assert _count(c) == 2
        c.execute("INSERT INTO t VALUES (3)", prepare=True)  # (the extended protocol)
        assert _count(c) == 3


@pytest.mark.parametrize("engine", ENGINES)
def test_set_transaction_read_only(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
        c.execute("BEGIN")
        c.execute("SET TRANSACTION READ ONLY")
        assert _count(c) == 0
        with pytest.raises(READ_ONLY, match="cannot execute INSERT"):
            c.execute("INSERT INTO t VALUES (1)")
        c.execute("ROLLBACK")
        c.execute("BEGIN")
        c.execute("SET transaction_read_only = on")
        with pytest.raises(READ_ONLY, match="cannot execute UPDATE"):
            c.execute("UPDATE t SET a = 1")
        c.execute("ROLLBACK")
        # outside a block: a warning, and no change (as PostgreSQL)
        c.execute("SET TRANSACTION READ ONLY")
        c.execute("INSERT INTO t VALUES (1)")
        assert _count(c) == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_read_only_session(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
        for on, off in (("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
                         "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE"),
                        ("SET default_transaction_read_only = on",
                         "SET default_transaction_read_only TO off"),
                        ("SET default_transaction_read_only = true",
                         "RESET default_transaction_read_only")):
            c.execute(on)
            assert c.execute("SHOW default_transaction_read_only").fetchone() == ("on",)
            assert c.execute("SHOW transaction_read_only").fetchone() == ("on",)
            for _ in range(2):  # every statement, not the first only
                with pytest.raises(READ_ONLY, match="cannot execute INSERT"):
                    c.execute("INSERT INTO t VALUES (1)")
            with pytest.raises(READ_ONLY, match="cannot execute DROP TABLE"):
                c.execute("DROP TABLE t")
            c.execute("BEGIN")  # a block too
            assert _count(c) == 0
            with pytest.raises(READ_ONLY):
                c.execute("DELETE FROM t")
            c.execute("ROLLBACK")
            assert _count(c) == 0
            c.execute(off)
            assert c.execute("SHOW default_transaction_read_only").fetchone() == ("off",)
            c.execute("INSERT INTO t VALUES (1)")
            c.execute("DELETE FROM t")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="Boolean"):
            c.execute("SET default_transaction_read_only = maybe")


def test_begin_read_write_in_a_read_only_session(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
        c.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        c.execute("BEGIN READ WRITE")
        c.execute("INSERT INTO t VALUES (1)")
        c.execute("COMMIT")
        with pytest.raises(READ_ONLY):  # the session's mode again
            c.execute("INSERT INTO t VALUES (2)")
        assert _count(c) == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_sqlalchemy_postgresql_readonly_on_pg8000(start_server, request, engine) -> None:
    """SQLAlchemy's read-only connections (SET SESSION CHARACTERISTICS AS TRANSACTION READ
    ONLY on pg8000) are refused writes; the pool's next connection writes."""
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
        c.execute("GRANT SELECT, INSERT ON t TO u")
    eng = make_engine(srv, "pg8000", isolation_level="AUTOCOMMIT")
    try:
        with eng.connect().execution_options(postgresql_readonly=True) as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM t")).scalar() == 0
            with pytest.raises(sa.exc.DBAPIError, match="read-only transaction"):
                conn.execute(sa.text("INSERT INTO t VALUES (1)"))
        with eng.connect() as conn:
            conn.execute(sa.text("INSERT INTO t VALUES (1)"))
            assert conn.execute(sa.text("SELECT count(*) FROM t")).scalar() == 1
    finally:
        eng.dispose()
