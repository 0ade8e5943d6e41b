"""PostgreSQL's bytea literals ('\\x0102'::bytea, the escape format) read as the bytes
PostgreSQL reads, on both engines, with psycopg and the real psql."""

from __future__ import annotations

import psycopg
import pytest

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
