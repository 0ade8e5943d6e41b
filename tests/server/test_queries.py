"""Real clients (psycopg 3, pg8000) over TLS with SCRAM logins run queries on both engines."""

from __future__ import annotations

import datetime as dt
import decimal
import ssl

import pg8000.dbapi
import pg8000.native
import psycopg
import pytest

from tests.server.conftest import PASSWORD, USER, cancel_running

#: run the SQLite tests with a rollback journal and in WAL mode
SQLITE_JOURNALS = ("delete", "wal")


def pg(srv, **kw):
    return psycopg.connect(**{**srv.dsn, **kw})


def test_psycopg_uses_the_system_libpq() -> None:
    assert psycopg.pq.__impl__ == "python"  # see conftest.py: one OpenSSL in the process


def test_analytical_types_and_parameters(start_server, analytical) -> None:
    srv = start_server(analytical)
    with pg(srv, autocommit=True) as c:
        c.execute("CREATE TABLE t (i BIGINT, s VARCHAR, f DOUBLE, d DATE, b BLOB, n DECIMAL(10,2))")
        c.execute("INSERT INTO t VALUES (%s, %s, %s, %s, %s, %s)",
                        (1, "o'k; $1 --", 2.5, dt.date(2024, 2, 29), b"\x00\xff", "1.25"))
        c.execute("INSERT INTO t VALUES (2, NULL, NULL, NULL, NULL, NULL)")
        rows = c.execute("SELECT * FROM t ORDER BY i").fetchall()
        assert rows == [(1, "o'k; $1 --", 2.5, dt.date(2024, 2, 29), b"\x00\xff",
                         decimal.Decimal("1.25")), (2, None, None, None, None, None)]
        for binary in (False, True):  # text and binary parameters and results
            got = c.execute("SELECT i, s FROM t WHERE i = %s AND f > %s", (1, 2.0),
                            binary=binary).fetchall()
            assert got == [(1, "o'k; $1 --")]
            got = c.execute("SELECT d, b, n, f FROM t WHERE i = 1", binary=binary).fetchall()
            assert got == [(dt.date(2024, 2, 29), b"\x00\xff", decimal.Decimal("1.25"), 2.5)]
        desc = c.execute("SELECT 1::SMALLINT, 1::INTEGER, 1::BIGINT, 1::REAL, true, "
                         "TIMESTAMP '2020-01-01'").description
        assert [d.type_code for d in desc] == [21, 23, 20, 700, 16, 1114]


def test_analytical_refuses_writes_in_transactions_clearly(start_server, analytical) -> None:
    srv = start_server(analytical)
    with pg(srv) as c:  # psycopg opens a transaction before the first statement
        assert c.execute("SELECT 1").fetchone() == (1,)  # a block of queries
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="cannot roll it back"):
            c.execute("CREATE TABLE t (a INTEGER)")


def test_errors_carry_sqlstate_and_the_session_goes_on(start_server, analytical) -> None:
    srv = start_server(analytical)
    with pg(srv, autocommit=True) as c:
        with pytest.raises(psycopg.errors.SyntaxError):
            c.execute("SELEC 1")
        with pytest.raises(psycopg.errors.UndefinedTable):
            c.execute("SELECT * FROM nosuch")
        # a statement cryptdisk's own parser cannot read (OPTIMIZE, SYSTEM, ALTER ...):
        # a syntax error too, with its explanation, not an internal error (XX000)
        for sql, said in [("OPTIMIZE a", "OPTIMIZE TABLE t"), ("SYSTEM NOTHING", "SYSTEM")]:
            with pytest.raises(psycopg.errors.SyntaxError, match=said):
                c.execute(sql)
        assert c.execute("SELECT 41 + %s", (1,)).fetchone() == (42,)
        # several statements in one simple query; the last result is returned
        c.execute("CREATE TABLE a (x INTEGER); INSERT INTO a VALUES (1), (2)")
        assert c.execute("SELECT sum(x) FROM a").fetchone() == (3,)


def test_sqlite_transactions(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with pg(srv) as c, pg(srv) as other:
        c.execute("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT)")
        c.commit()
        c.execute("INSERT INTO t VALUES (%s, %s)", (1, "kept"))
        c.commit()
        c.execute("INSERT INTO t VALUES (%s, %s)", (2, "rolled back"))
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        c.rollback()
        assert other.execute("SELECT a, b FROM t").fetchall() == [(1, "kept")]
        other.rollback()
        with pytest.raises(psycopg.errors.UniqueViolation):
            c.execute("INSERT INTO t VALUES (1, 'dup')")
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            c.execute("SELECT 1")
        c.rollback()
        cur = c.execute("UPDATE t SET b = %s WHERE a = %s", ("new", 1))
        assert cur.rowcount == 1
        c.commit()
        assert c.execute("SELECT b FROM t WHERE a = %s", (1,), prepare=True).fetchone() == \
            ("new",)
        assert c.execute("SELECT b FROM t WHERE a = %s", (1,), prepare=True).fetchone() == \
            ("new",)


def test_pg8000_prepared_statements(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    tls = ssl.create_default_context(cafile=srv.dsn["sslrootcert"])
    conn = pg8000.dbapi.connect(user=USER, password=PASSWORD, host="localhost", port=srv.port,
                                ssl_context=tls)
    try:
        cur = conn.cursor()
        cur.execute("CREATE TABLE t (a INTEGER, b TEXT, c REAL, d BLOB)")
        cur.executemany("INSERT INTO t VALUES (%s, %s, %s, %s)",
                        [(i, f"row {i}", i / 2, bytes([i])) for i in range(5)])
        conn.commit()
        cur.execute("SELECT a, b, c, d FROM t WHERE a >= %s ORDER BY a", (3,))
        assert [tuple(r) for r in cur.fetchall()] == [(3, "row 3", 1.5, b"\x03"),
                                                     (4, "row 4", 2.0, b"\x04")]
        conn.rollback()
    finally:
        conn.close()
    native = pg8000.native.Connection(user=USER, password=PASSWORD, host="localhost",
                                      port=srv.port, ssl_context=tls)
    try:  # a named statement, described once, bound and executed twice
        ps = native.prepare("SELECT b, c FROM t WHERE a = :a")
        assert [tuple(r) for r in ps.run(a=2)] == [("row 2", 1.0)]
        assert [tuple(r) for r in ps.run(a=4)] == [("row 4", 2.0)]
        ps.close()
    finally:
        native.close()


@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_cancel_request_interrupts_a_running_statement(start_server, engine, request) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with pg(srv, autocommit=True) as c:
        errors = cancel_running(srv, c)
        assert len(errors) == 1 and isinstance(errors[0], psycopg.errors.QueryCanceled)
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_sqlite_savepoints(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with pg(srv) as c:
        c.execute("CREATE TABLE t (a INTEGER PRIMARY KEY)")
        c.execute("INSERT INTO t VALUES (1)")
        c.execute("SAVEPOINT s1")
        c.execute("INSERT INTO t VALUES (2)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            c.execute("INSERT INTO t VALUES (1)")
        c.execute("ROLLBACK TO SAVEPOINT s1")  # leaves the failed state, keeps row 1
        c.execute("INSERT INTO t VALUES (3)")
        c.commit()
        assert c.execute("SELECT a FROM t ORDER BY a").fetchall() == [(1,), (3,)]


def test_32_concurrent_clients_without_errors(start_server, sqlite_engine) -> None:
    import threading

    srv = start_server(sqlite_engine)
    with pg(srv, autocommit=True) as c:
        c.execute("CREATE TABLE t (client INTEGER, i INTEGER)")
    errors: list[BaseException] = []

    def client(n: int) -> None:
        try:
            with pg(srv) as c:
                for i in range(10):
                    c.execute("INSERT INTO t VALUES (%s, %s)", (n, i))
                    c.commit()
                    assert c.execute("SELECT count(*) FROM t WHERE client = %s",
                                     (n,)).fetchone() == (i + 1,)
                    c.rollback()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert errors == []
    with pg(srv, autocommit=True) as c:
        assert c.execute("SELECT count(*), count(DISTINCT client) FROM t").fetchone() == (320, 32)


def test_sqlite_constraint_failures_have_postgresql_sqlstates(start_server,
                                                              sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("PRAGMA foreign_keys = ON")
        c.execute("CREATE TABLE p (id INTEGER PRIMARY KEY, n TEXT NOT NULL, v INTEGER "
                  "CHECK (v > 0))")
        c.execute("CREATE TABLE r (pid INTEGER REFERENCES p(id))")
        c.execute("INSERT INTO p VALUES (1, 'a', 1)")
        for sql, error in [("INSERT INTO p VALUES (1, 'b', 1)", psycopg.errors.UniqueViolation),
                           ("INSERT INTO p VALUES (2, NULL, 1)",
                            psycopg.errors.NotNullViolation),
                           ("INSERT INTO p VALUES (3, 'c', 0)", psycopg.errors.CheckViolation),
                           ("INSERT INTO r VALUES (9)", psycopg.errors.ForeignKeyViolation)]:
            with pytest.raises(error):
                c.execute(sql)


@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_a_parameter_without_a_value_is_42p02(start_server, engine, request) -> None:
    """``$1`` in a query sent without parameters: PostgreSQL's 42P02 on both engines (on
    SQLite it was an internal error, XX000, quoting apsw's binding count message)."""
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        with pytest.raises(psycopg.errors.UndefinedParameter,
                           match=r"there is no parameter \$1"):
            c.execute("SELECT $1")
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_analytical_refuses_an_interval_column_with_0a000(start_server, analytical) -> None:
    srv = start_server(analytical)
    with pg(srv, autocommit=True) as c:
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="INTERVAL"):
            c.execute("CREATE TABLE iv (a INTEGER, d INTERVAL)")
        with pytest.raises(psycopg.errors.UndefinedTable):
            c.execute("INSERT INTO iv VALUES (1, INTERVAL 3 DAY)")
        assert c.execute("SELECT INTERVAL 3 DAY").fetchone() == (dt.timedelta(days=3),)


def test_analytical_columns_sharing_a_name_each_keep_their_values(start_server,
                                                                   analytical) -> None:
    srv = start_server(analytical)
    with pg(srv, autocommit=True) as c:
        assert c.execute("SELECT 1 AS a, 2 AS a").fetchall() == [(1, 2)]
        c.execute("CREATE TABLE t (k BIGINT, s VARCHAR)")
        c.execute("INSERT INTO t VALUES (1, 'x'), (2, 'y')")
        got = c.execute("SELECT * FROM t, t AS u WHERE t.k < u.k").fetchall()
        assert got == [(1, "x", 2, "y")]


@pytest.mark.parametrize(("sql", "form", "hint"), [
    ("ALTER TABLE t ADD CONSTRAINT c CHECK (a > 0)", "ADD CONSTRAINT", "NOT NULL and DEFAULT"),
    ("ALTER TABLE IF EXISTS t DROP COLUMN b", "DROP COLUMN", "the table named alone"),
    ("ALTER TABLE t ALTER COLUMN a SET DATA TYPE BIGINT USING a + 1", "ALTER COLUMN a TYPE",
     "CAST"),
    ("ALTER TABLE IF EXISTS t ALTER a TYPE BIGINT", "ALTER COLUMN a TYPE", "CAST"),
    ("ALTER TABLE t ALTER COLUMN a SET STATISTICS 100", "ALTER COLUMN a SET STATISTICS",
     "CREATE TABLE"),
])
def test_alter_table_forms_the_analytical_engine_lacks_are_0a000(start_server, analytical,
                                                                  sql, form, hint) -> None:
    """Each ALTER TABLE form but RENAME TO, ADD, DROP and RENAME COLUMN and MODIFY SETTING
    is refused as not supported (0A000), naming the form and the ones supported, with the
    way round it; never an internal error."""
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
        conn.execute("INSERT INTO t VALUES (1, 'x')")
        with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
            conn.execute(sql)
        assert e.value.sqlstate == "0A000"
        message = e.value.diag.message_primary or ""
        assert f"ALTER TABLE t {form} is not supported" in message
        assert "ALTER TABLE t MODIFY SETTING storage_policy" in message
        assert hint in (e.value.diag.message_hint or "")
        assert conn.execute("SELECT * FROM t").fetchall() == [(1, "x")]


def test_analytical_wide_integers_maps_uuids_intervals_are_sent_as_duckdb_computes_them(
        start_server, analytical) -> None:
    """A UHUGEINT above 2^127 - 1 (which DuckDB's Arrow export wraps to a negative number)
    is sent as its value, a MAP as DuckDB's text of it (not Arrow's list of pairs), in text
    and binary results, from a query and from one of the server's catalogs."""
    import uuid

    import duckdb

    top = 2**128 - 1
    srv = start_server(analytical)
    with pg(srv, autocommit=True) as c:
        c.execute("CREATE TABLE w (k BIGINT)")
        c.execute("INSERT INTO w VALUES (1), (2)")
        for binary in (False, True):
            got = c.execute(f"SELECT (2::UHUGEINT**127)::UHUGEINT AS a, {top}::UHUGEINT AS b, "
                            "5::UHUGEINT AS c, NULL::UHUGEINT AS d, "
                            "(-170141183460469231731687303715884105727::HUGEINT - 1) AS h",
                            binary=binary).fetchall()
            assert got == [(decimal.Decimal(2**127), decimal.Decimal(top), decimal.Decimal(5),
                            None, decimal.Decimal(-2**127))]
            got = c.execute(f"SELECT k, {top}::UHUGEINT - k::UHUGEINT FROM w ORDER BY k",
                            binary=binary).fetchall()
            assert got == [(1, decimal.Decimal(top - 1)), (2, decimal.Decimal(top - 2))]
            got = c.execute("SELECT MAP {'a': 1, 'b': 2} AS m, [MAP {'k': [1, 2]}] AS l, "
                            "NULL::MAP(VARCHAR, INTEGER) AS n", binary=binary).fetchall()
            assert got == [("{a=1, b=2}", "[{k=[1, 2]}]", None)]
            assert got[0][:2] == duckdb.sql("SELECT MAP {'a': 1, 'b': 2}::VARCHAR, "
                                            "[MAP {'k': [1, 2]}]::VARCHAR").fetchall()[0]
            u = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
            got = c.execute(f"SELECT '{u}'::UUID, INTERVAL '14 months 3 days 04:05:06.789'",
                            binary=binary).fetchall()
            assert got == [(uuid.UUID(u), dt.timedelta(days=365 + 2 * 30 + 3, seconds=14706,
                                                        microseconds=789000))]
        cur = c.execute(f"SELECT {top}::UHUGEINT, MAP {{'a': 1}} FROM pg_catalog.pg_type "
                        "LIMIT 1")
        assert cur.fetchall() == [(decimal.Decimal(top), "{a=1}")]
        raw = c.pgconn.exec_(b"SELECT (2::UHUGEINT**127)::UHUGEINT, "
                             b"INTERVAL '14 months 3 days 04:05:06.789'")
        assert raw.get_value(0, 0) == str(2**127).encode()
        assert raw.get_value(0, 1) == b"1 year 2 mons 3 days 04:05:06.789"
