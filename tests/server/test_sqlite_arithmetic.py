"""Arithmetic on the SQLite engine (``cryptdisk serve --sqlite``) through real clients: a
zero divisor fails with 22012 as in PostgreSQL, where SQLite answers NULL; arithmetic on
dates, times, timestamps and intervals (which SQLite holds as text, and its ``+`` reads
as the year's number) fails with 0A000 naming SQLite's date functions, and arithmetic on
numbers is left alone."""

from __future__ import annotations

import os
import subprocess

import psycopg
import pytest

from tests.server.conftest import PASSWORD, USER

SQLITE_JOURNALS = ["delete", "wal"]  # (WAL: writes and commits on the event loop)

_TABLE = ("CREATE TABLE t (id INTEGER PRIMARY KEY, d DATE, ts TIMESTAMP, n INTEGER, "
          "x REAL, z INTEGER, s TEXT)")
_ROW = "INSERT INTO t VALUES (1, '2024-01-31', '2024-01-31 10:00:00', 7, 2.5, 0, '0')"


@pytest.fixture
def conn(start_server, sqlite_engine):
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute(_TABLE)
        c.execute(_ROW)
        yield c


def _fails(conn, sql: str, code: str, params=None) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(sql, params)
    assert err.value.sqlstate == code, (sql, err.value)
    return err.value


@pytest.mark.parametrize("sql", [
    "SELECT 1 / 0", "SELECT 5 % 0", "SELECT 1.5 / 0", "SELECT 1 / 0.0", "SELECT n / z FROM t",
    "SELECT n % z FROM t", "SELECT x / (n - 7) FROM t", "SELECT n / -z FROM t",
    "SELECT 10 / s FROM t", "SELECT n / (z / 1) FROM t", "SELECT id FROM t WHERE n / z > 1",
    "SELECT sum(n) / sum(z) FROM t WHERE id = 1", "SELECT mod(n, z) FROM t",
    "SELECT mod(7, 0)", "SELECT 1 / 0x0", "SELECT n % 0X00 FROM t"])
def test_a_zero_divisor_is_22012(conn, sql) -> None:
    """SQLite's ``/``, ``%`` and ``mod()`` answered NULL for a zero divisor (an integer, a
    float, text, an expression), in the select list and in a WHERE alike."""
    err = _fails(conn, sql, "22012")
    assert str(err) == "division by zero"


def test_a_zero_parameter_or_lifted_literal_divisor_is_22012(conn) -> None:
    """A divisor sent as a parameter (extended protocol) or lifted from the text into one
    (the server's prepared shape of an UPDATE) fails as a literal does, and the failed
    UPDATE changes nothing."""
    _fails(conn, "SELECT n / %s FROM t", "22012", (0,))
    _fails(conn, "SELECT %s::int %% %s::int", "22012", (5, 0))
    _fails(conn, "UPDATE t SET n = n / 0 WHERE id = 1", "22012")
    _fails(conn, "UPDATE t SET n = n % 0 WHERE id = 1", "22012")
    assert conn.execute("SELECT n FROM t").fetchone() == (7,)
    conn.execute("UPDATE t SET n = n / 2 WHERE id = 1")  # (the same shape: ?1 divides)
    assert conn.execute("SELECT n FROM t").fetchone() == (3,)


def test_nonzero_and_null_divisors_divide_as_before(conn) -> None:
    assert conn.execute("SELECT 7 / 2, 7 %% 3, n / 2, n %% 4, x / 2, n / %s, 7 / NULL, "
                        "n / (z + 2), -7 / 2 FROM t", (7,)).fetchone() == \
        (3, 1, 3, 3, 1.25, 1, None, 3, -3)
    assert conn.execute("SELECT mod(n, 4), mod(n, NULL), modulo FROM t, "
                        "(SELECT 5 AS modulo)").fetchone() == (3, None, 5)
    assert conn.execute("SELECT count(*) FROM t WHERE n / NULLIF(z, 0) > 1").fetchone() == (0,)
    # a hexadecimal divisor (SQLite's 0x literal) was split into 0 and a name x...
    assert conn.execute("SELECT n / 0x2, 0x10 / 4, 0xA % 3, n / 0x0a + 1 FROM t"
                        ).fetchone() == (3, 4, 1, 1)


def test_a_null_dividend_over_zero_is_null(conn) -> None:
    """PostgreSQL's operators are strict: a NULL dividend gives NULL whatever the divisor
    (``sum(n) / count(*)`` of no rows), not 22012; a dividend that is not NULL still
    fails."""
    conn.execute("INSERT INTO t (id, n, z) VALUES (2, NULL, 0)")
    assert conn.execute("SELECT sum(n) / count(s), sum(n) % count(s) FROM t WHERE id = 3"
                        ).fetchone() == (None, None)
    assert conn.execute("SELECT n / z, n % z, mod(n, z), (n + 1) / z, -n / z FROM t "
                        "WHERE id = 2").fetchone() == (None,) * 5
    assert conn.execute("SELECT %s / z FROM t WHERE id = 2", (None,)).fetchone() == (None,)
    _fails(conn, "SELECT n / z FROM t WHERE id = 1", "22012")
    _fails(conn, "SELECT n * 1 / z FROM t WHERE id = 1", "22012")


def test_a_view_divides_as_sqlite_and_reads_outside_the_server(
        start_server, sqlite_engine, keyring) -> None:
    """A stored definition keeps SQLite's ``/`` (a zero divisor is NULL there): the server's
    divisor function would fail outside the server."""
    import cryptdisk.sqlite

    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE h (a INTEGER, b INTEGER CHECK (a / b < 10))")
        c.execute("INSERT INTO h VALUES (6, 3)")
        c.execute("CREATE VIEW v AS SELECT a / b AS q, a % 0 AS r FROM h")
        assert c.execute("SELECT q, r FROM v").fetchone() == (2, None)
    with cryptdisk.sqlite.connect(sqlite_engine.path, keyring=keyring) as db:
        db.execute("INSERT INTO h VALUES (8, 4)")
        assert db.execute("SELECT q FROM v ORDER BY q").fetchall() == [(2,), (2,)]


@pytest.mark.parametrize("sql", [
    "SELECT d + 1 FROM t", "SELECT d - 1 FROM t", "SELECT 30 + d FROM t",
    "SELECT ts - ts FROM t", "SELECT d - d FROM t", "SELECT t.d + 1 FROM t",
    "SELECT a.ts - b.ts FROM t a, t b", "SELECT z.d + 1 FROM t AS z",
    "SELECT id FROM t WHERE d + 30 > 20240301",
    "SELECT '2024-01-01'::date + 30", "SELECT CAST('2024-01-01' AS DATE) + 1",
    "SELECT '2024-01-01'::timestamp - '2023-01-01'::timestamp", "SELECT current_date + 1",
    "SELECT current_timestamp - 1", "SELECT date(d) - 1 FROM t", "SELECT d * 2 FROM t",
    "UPDATE t SET d = d + 1", "SELECT (SELECT max(d) FROM t) - 1", "SELECT (d) + 1 FROM t",
    "SELECT max(d) + 1 FROM t", "SELECT 1 + coalesce(d, ts) FROM t",
    "WITH w AS (SELECT d FROM t) SELECT d + 1 FROM w"])
def test_date_arithmetic_is_refused(conn, sql) -> None:
    """SQLite's ``'2024-01-31' + 1`` is 2025: refused (0A000), with SQLite's date functions
    named, for a DATE or TIMESTAMP column, a cast to one, current_date or date()."""
    err = _fails(conn, sql, "0A000")
    assert "date, time, timestamp or interval" in str(err)
    assert "date(d, '+1 day')" in (err.diag.message_hint or "")
    assert conn.execute("SELECT d FROM t").fetchone()[0].isoformat() == "2024-01-31"


@pytest.mark.parametrize("sql", [
    "SELECT date '2024-01-01' + 30", "SELECT d - interval '1 day' FROM t",
    "SELECT ts + interval '1 hour' FROM t", "SELECT id FROM t WHERE d > date '2024-01-01'",
    "SELECT timestamp '2024-01-01 00:00:00'"])
def test_a_typed_literal_is_refused(conn, sql) -> None:
    """``DATE '...'`` and ``INTERVAL '...'`` failed with a syntax error or "no such
    column: interval": now 0A000 saying what to write instead."""
    err = _fails(conn, sql, "0A000")
    assert "typed literals" in str(err)
    assert "date(d, '+1 day')" in (err.diag.message_hint or "")


def test_numeric_arithmetic_and_sqlites_date_functions_run(conn) -> None:
    """Arithmetic on numbers, on a column named ``date`` that holds integers, on a
    qualified integer column beside a DATE column of the same name, and SQLite's own
    date functions are not refused."""
    conn.execute("CREATE TABLE u (id INTEGER, d INTEGER, date INTEGER)")
    conn.execute("INSERT INTO u VALUES (1, 40, 2024)")
    assert conn.execute("SELECT n + 1, n - x, n * 2, -n, x / 2 FROM t").fetchone() == \
        (8, 4.5, 14, -7, 1.25)
    assert conn.execute("SELECT date + 1, d - 1, u.d * 2 FROM u").fetchone() == (2025, 39, 80)
    assert conn.execute("SELECT u.d + 1, t.n + u.d FROM t JOIN u ON u.id = t.id").fetchone() \
        == (41, 47)
    assert conn.execute("SELECT x.d - 1, v.d * 2 FROM (SELECT 5 AS d) x, t, u AS v"
                        ).fetchone() == (4, 80)  # (aliases of a subquery and of u)
    assert conn.execute("SELECT date(d, '+1 day'), datetime(ts, '-2 hours'), "
                        "julianday(ts) - julianday(d), strftime('%Y', d) + 0, "
                        "strftime('%s', ts) - strftime('%s', d) FROM t").fetchone() == \
        ("2024-02-01", "2024-01-31 08:00:00", pytest.approx(10 / 24), 2024, 36000)
    assert conn.execute("SELECT count(*) FROM t WHERE d > '2024-01-01' AND "
                        "n - 1 > 0 AND s = '0'").fetchone() == (1,)
    assert conn.execute("SELECT '2024-01-31 + 1', 'x' || '-' || n FROM t").fetchone() == \
        ("2024-01-31 + 1", "x-7")


def test_a_cte_column_named_as_a_date_column_is_refused_unless_qualified(conn) -> None:
    """A column's type is told by its name in the tables the statement names (t.d is a
    DATE), not through a CTE or subquery: one of their columns named d (an integer here)
    is refused as the DATE would be, with the error's way out, never computed on a date's
    text; qualified by the CTE's or subquery's name it is known not to be t's, and runs."""
    for sql in ("WITH w AS (SELECT n AS d FROM t) SELECT d + 1 FROM w",
                "WITH w(d) AS (SELECT n FROM t) SELECT d + 1 FROM w",
                "SELECT d + 1 FROM (SELECT n AS d FROM t)",
                "WITH w AS (SELECT n AS d FROM t) SELECT d + 1 FROM t"):  # (t.d: a DATE)
        _fails(conn, sql, "0A000")
    for sql in ("WITH w AS (SELECT n AS d FROM t) SELECT w.d + 1 FROM w",
                "SELECT w.d + 1 FROM (SELECT n AS d FROM t) w",
                "WITH w AS (SELECT n AS e FROM t) SELECT e + 1 FROM w"):
        assert conn.execute(sql).fetchone() == (8,), sql


def test_a_column_that_becomes_a_date_is_refused_after_the_change(start_server,
                                                                    sqlite_engine) -> None:
    """The declared types are read again after any change to the schema, by this session,
    another one, or a connection outside the server."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as a, \
            psycopg.connect(**srv.dsn, autocommit=True) as b:
        a.execute("CREATE TABLE w (v INTEGER)")
        a.execute("INSERT INTO w VALUES (5)")
        assert a.execute("SELECT v + 1 FROM w").fetchone() == (6,)
        assert b.execute("SELECT v + 1 FROM w").fetchone() == (6,)
        b.execute("DROP TABLE w")
        b.execute("CREATE TABLE w (v DATE)")
        b.execute("INSERT INTO w VALUES ('2024-01-31')")
        _fails(a, "SELECT v + 1 FROM w", "0A000")
        a.execute("ALTER TABLE w ADD COLUMN k INTEGER")
        assert a.execute("SELECT k + 1 FROM w").fetchone() == (None,)
        _fails(b, "SELECT v + 1 FROM w", "0A000")


def test_a_user_without_grants_on_the_catalog_gets_the_refusal(start_server,
                                                               sqlite_engine) -> None:
    """The declared types are looked up without the session's privileges (the catalog):
    a user with SELECT on the table is refused for the arithmetic, not for the lookup."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute(_TABLE)
        admin.execute(_ROW)
        admin.execute("CREATE USER bob PASSWORD 'bob pw'")
        admin.execute("GRANT SELECT ON t TO bob")
    with psycopg.connect(**{**srv.dsn, "user": "bob", "password": "bob pw"},
                         autocommit=True) as bob:
        _fails(bob, "SELECT d + 1 FROM t", "0A000")
        _fails(bob, "SELECT n / z FROM t", "22012")
        assert bob.execute("SELECT n + 1 FROM t").fetchone() == (8,)


def test_psql_shows_the_errors(start_server, sqlite_engine, certs) -> None:
    srv = start_server(sqlite_engine)
    conninfo = (f"host=localhost port={srv.port} user={USER} dbname=db sslmode=verify-full "
                f"sslrootcert={certs[0]}")

    def psql(sql: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["psql", conninfo, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                               "-v", "VERBOSITY=verbose", "-c", sql],
                              env={**os.environ, "PGPASSWORD": PASSWORD},
                              capture_output=True, text=True, timeout=60)

    assert psql(f"{_TABLE}; {_ROW}").returncode == 0
    out = psql("SELECT n / z FROM t")
    assert out.returncode == 1 and "ERROR:  22012: division by zero" in out.stderr
    out = psql("SELECT d + 1 FROM t")
    assert out.returncode == 1 and "ERROR:  0A000: operator + on a date" in out.stderr
    assert "HINT:  use SQLite's date functions: date(d, '+1 day')" in out.stderr
    out = psql("SELECT n + 1, n / 2 FROM t")
    assert out.returncode == 0 and out.stdout.strip() == "8|3"


def test_integer_columns_are_int8_and_a_check_gives_int4s_range(conn) -> None:
    """An INTEGER (or SMALLINT) column is SQLite's 64-bit integer, described as int8: it
    takes 3000000000 and 2147483647 + 1, where PostgreSQL's int4 fails with 22003 (as
    docs/server-protocol.md says); a cast to int4 keeps int4's range, and a CHECK gives a
    column that range (23514, not 22003)."""
    conn.execute("INSERT INTO t (id, n) VALUES (2, 3000000000)")
    conn.execute("UPDATE t SET z = n + 2147483647 WHERE id = 1")
    cur = conn.execute("SELECT n, z FROM t ORDER BY id")
    assert [d.type_code for d in cur.description] == [20, 20]
    assert cur.fetchall() == [(7, 2147483654), (3000000000, None)]
    _fails(conn, "SELECT n::int4 FROM t", "22003")
    conn.execute("CREATE TABLE c (x INTEGER CHECK (x BETWEEN -2147483648 AND 2147483647))")
    _fails(conn, "INSERT INTO c VALUES (3000000000)", "23514")
    conn.execute("INSERT INTO c VALUES (2147483647)")
    _fails(conn, "UPDATE c SET x = x + 1", "23514")
