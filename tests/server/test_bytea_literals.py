"""PostgreSQL's bytea literals ('\\x0102'::bytea, the escape format) read as the bytes
PostgreSQL reads, on both engines, with psycopg and the real psql."""

from __future__ import annotations

import psycopg
import pytest

from cryptdisk.server import SQLiteEngine
from tests.server.test_psql_catalog import psql


@pytest.fixture(params=["analytical", "sqlite"])
def srv(request, start_server):
    return start_server(request.getfixturevalue(
        "analytical" if request.param == "analytical" else "sqlite_engine"))


@pytest.mark.parametrize(("sql", "value"), [
    (r"SELECT '\x0102'::bytea", b"\x01\x02"),
    (r"SELECT '\x0102' :: BYTEA", b"\x01\x02"),
    (r"SELECT CAST('\x41' AS BYTEA)", b"A"),
    (r"SELECT cast( '\x41'  as bytea )", b"A"),
    (r"SELECT bytea '\x00FF'", b"\x00\xff"),
    (r"SELECT '\x01 02'::pg_catalog.bytea", b"\x01\x02"),
    (r"SELECT '\x'::bytea", b""),
    (r"SELECT 'ab\000c\\'::bytea", b"ab\x00c\\"),
    (r"SELECT 'abc'::bytea", b"abc"),
    (r"SELECT E'\\x0102'::bytea", b"\x01\x02"),
    (r"SELECT octet_length('\x0102'::bytea)", 2),
    (r"SELECT 'it''s ::bytea'", "it's ::bytea"),
])
def test_bytea_literal_is_its_bytes(srv, sql, value) -> None:
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        assert conn.execute(sql).fetchone()[0] == value


def test_bytea_literal_inserted_into_a_blob_column(srv) -> None:
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id INTEGER, b BLOB)")
        conn.execute(r"INSERT INTO t VALUES (1, '\x0102'::bytea), (2, CAST('\xff' AS bytea))")
        conn.execute(r"INSERT INTO t VALUES (3, 'a\\b'::bytea)")
        assert conn.execute("SELECT id, b FROM t ORDER BY id").fetchall() == [
            (1, b"\x01\x02"), (2, b"\xff"), (3, b"a\\b")]
        assert conn.execute(r"SELECT id FROM t WHERE b = '\x0102'::bytea").fetchall() == [(1,)]


@pytest.mark.parametrize(("sql", "sqlstate"), [
    (r"SELECT '\x0g'::bytea", "22023"),
    (r"SELECT '\x012'::bytea", "22023"),
    (r"SELECT 'a\q'::bytea", "22P02"),
    (r"SELECT E'\x01'::bytea", "0A000"),
])
def test_bad_bytea_literal_is_refused(srv, sql, sqlstate) -> None:
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
        assert info.value.sqlstate == sqlstate


def test_psql_shows_the_bytes(srv, certs) -> None:
    out = psql(srv, certs, r"SELECT '\x0102'::bytea AS b, octet_length('\x0102'::bytea) AS n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:2] == ["b|n", r"\x0102|2"]


@pytest.mark.parametrize(("sql", "value"), [
    ("SELECT decode('0102', 'hex')", b"\x01\x02"),
    ("SELECT DECODE('00ff', 'HEX')", b"\x00\xff"),
    (r"SELECT encode('\x01ab'::bytea, 'hex')", "01ab"),
    ("SELECT encode(decode('0aff', 'hex'), 'hex')", "0aff"),
    ("SELECT octet_length(decode('010203', 'hex'))", 3),
])
def test_decode_and_encode_hex(srv, sql, value) -> None:
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        assert conn.execute(sql).fetchone()[0] == value


def test_decode_into_a_blob_column(srv) -> None:
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id INTEGER, b BLOB)")
        conn.execute("INSERT INTO t VALUES (1, decode('0102', 'hex'))")
        assert conn.execute("SELECT b FROM t").fetchall() == [(b"\x01\x02",)]


@pytest.mark.parametrize("sql", ["SELECT decode('AQI=', 'escape')",
                                 "SELECT decode('0102', 'x' || 'hex')"])
def test_unsupported_decode_is_refused(srv, sql) -> None:
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
        assert info.value.sqlstate == "0A000"


def test_a_bare_literal_is_bytea_where_its_column_is(srv) -> None:
    """A string literal without a cast takes the type of the bytea column it goes into or
    is compared with, as in PostgreSQL: '\\x0102' is two bytes there, text elsewhere."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id INTEGER, b BLOB, s TEXT)")
        conn.execute(r"INSERT INTO t VALUES (1, '\x0102', '\x0102')")
        conn.execute(r"INSERT INTO t (b, id) VALUES ('a\\b', %s)", (2,))
        conn.execute(r"UPDATE t SET b = '\x04ff' WHERE id = 2")
        assert conn.execute("SELECT id, b, octet_length(b), s FROM t ORDER BY id").fetchall() \
            == [(1, b"\x01\x02", 2, r"\x0102"), (2, b"\x04\xff", 2, None)]
        assert conn.execute(r"SELECT id FROM t WHERE b = '\x0102'").fetchall() == [(1,)]
        assert conn.execute(r"SELECT id FROM t WHERE '\x04FF' = b").fetchall() == [(2,)]
        with pytest.raises(psycopg.Error) as info:
            conn.execute(r"INSERT INTO t (b, id) VALUES ('\x0g', 3)")
        assert info.value.sqlstate == "22023"


def test_length_of_bytea(srv) -> None:
    """length(bytea) is its bytes on SQLite; the analytical engine (DuckDB has no
    length(BLOB)) refuses it naming octet_length."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (b BLOB)")
        conn.execute(r"INSERT INTO t VALUES ('\x0102')")
        if isinstance(srv.server.engine, SQLiteEngine):
            assert conn.execute("SELECT length(b) FROM t").fetchone()[0] == 2
            return
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT length(b) FROM t")
        assert info.value.sqlstate == "42883"
        assert "octet_length" in (info.value.diag.message_hint or "")


@pytest.mark.parametrize(("arg", "message"), [
    ("'zz'", 'invalid hexadecimal digit: "z"'),
    ("'abc'", "invalid hexadecimal data: odd number of digits"),
    ("%s", 'invalid hexadecimal digit: "g"'),
])
def test_decode_refuses_what_is_not_hex(srv, arg, message) -> None:
    """As PostgreSQL: 22023, not NULL (SQLite's unhex) nor a leading 0 made up (DuckDB's
    unhex of an odd number of digits)."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(f"SELECT decode({arg}, 'hex')", ("0g",) if arg == "%s" else None)
        assert info.value.sqlstate == "22023"
        if not (arg == "%s" and not isinstance(srv.server.engine, SQLiteEngine)):
            assert str(info.value) == message  # (DuckDB's own words for a parameter's)
        assert conn.execute("SELECT decode(%s, 'hex'), decode(' 01 0a', 'hex')",
                            ("ff",)).fetchone() == (b"\xff", b"\x01\x0a")


@pytest.mark.parametrize(("sql", "want"), [
    # an E'' string's \' and a dollar-quoted string's ' ended or started a literal for the
    # typing of bare literals: the next '\x0102' was not read as bytea (no row matched),
    # or ::bytea went inside the E'' string (stored a'::bytea b)
    (r"SELECT id FROM t WHERE s = E'it\'s' OR b = '\x0102'", [(1,)]),
    (r"SELECT id FROM t WHERE s = $$it's$$ OR b = '\x0102'", [(1,)]),
    (r"SELECT id FROM t WHERE s = $q$it's$q$ OR b = '\x0102'", [(1,)]),
    (r"SELECT id FROM t WHERE s = 'it''s' OR b = '\x0102'", [(1,)]),
    (r"SELECT id FROM t WHERE /* it's */ b = '\x0102'", [(1,)]),
])
def test_a_bare_literal_after_e_and_dollar_strings_is_bytea(start_server, analytical, sql,
                                                            want) -> None:
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id INTEGER, b BLOB, s TEXT)")
        conn.execute(r"INSERT INTO t VALUES (1, '\x0102'::bytea, 'x'), (2, 'ab'::bytea, 'y')")
        assert conn.execute(sql).fetchall() == want


def test_an_e_string_with_a_quote_into_a_bytea_column_is_its_text(start_server,
                                                                  analytical) -> None:
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id INTEGER, b BLOB, s TEXT)")
        conn.execute(r"INSERT INTO t (id, b, s) VALUES (1, E'a\'b', '\x0102')")
        conn.execute(r"INSERT INTO t (id, s, b) VALUES (2, E'a\'b', '\x0102')")
        assert conn.execute("SELECT id, b, s FROM t ORDER BY id").fetchall() == [
            (1, b"a'b", r"\x0102"), (2, b"\x01\x02", "a'b")]


def test_a_stored_sqlite_definition_reads_outside_the_server(start_server, sqlite_engine,
                                                             keyring) -> None:
    """A view (or trigger, CHECK) the SQLite engine stores keeps SQLite's own unhex(), not
    the server's function: the database's views read through cryptdisk.sqlite.connect and
    in a decrypted copy, where the server's function does not exist."""
    import cryptdisk.sqlite

    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE h (x TEXT)")
        conn.execute("INSERT INTO h VALUES ('ff'), (' 01 0a'), (NULL)")
        conn.execute("CREATE VIEW v AS SELECT x, decode(x, 'hex') AS b FROM h")
        assert conn.execute("SELECT b FROM v ORDER BY x").fetchall() == [
            (None,), (b"\x01\x0a",), (b"\xff",)]
    with cryptdisk.sqlite.connect(sqlite_engine.path, keyring=keyring) as db:
        assert db.execute("SELECT b FROM v ORDER BY x").fetchall() == [
            (None,), (b"\x01\x0a",), (b"\xff",)]
