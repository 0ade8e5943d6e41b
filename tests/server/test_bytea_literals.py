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


def test_dollar_quoted_string_is_read_by_bytea_input(srv) -> None:
    """A dollar-quoted string a bytea column gives its type, or cast to bytea, is read by
    bytea's input as PostgreSQL reads it, the same as its '' string: ``$x$\\x0102$x$`` is
    two bytes (the analytical engine stored the three of DuckDB's cast, SQLite refused
    the $ quotes)."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id INTEGER, b BYTEA)")
        conn.execute(r"INSERT INTO t VALUES (1, $x$\x0102$x$), (2, '\x0102')")
        conn.execute(r"INSERT INTO t (b, id) VALUES ($$it's\\$$, 3)")
        assert conn.execute("SELECT id, b FROM t ORDER BY id").fetchall() == [
            (1, b"\x01\x02"), (2, b"\x01\x02"), (3, b"it's\\")]
        assert conn.execute(r"SELECT id FROM t WHERE b = $$\x0102$$ ORDER BY id").fetchall(
            ) == [(1,), (2,)]
        assert conn.execute(r"SELECT $a$\x41ff$a$::bytea, CAST($$\x00$$ AS bytea)"
                            ).fetchone() == (b"A\xff", b"\x00")


def test_strings_of_an_array_compared_with_a_bytea_column(start_server, analytical) -> None:
    """``b = ANY(ARRAY['\\x0102', ...])`` reads the strings as bytea, as PostgreSQL
    coerces the unknown literals to the column's type (the analytical engine failed with
    42804: DuckDB compares no BLOB with a VARCHAR list); so does a parameter there."""
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id INTEGER, b BYTEA)")
        conn.execute(r"INSERT INTO t VALUES (1, '\x0102'), (2, 'abc'), (3, '\x00')")
        assert conn.execute(r"SELECT id FROM t WHERE b = any(ARRAY['\x0102']) ORDER BY id"
                            ).fetchall() == [(1,)]
        assert conn.execute(r"SELECT id FROM t WHERE b = ANY (ARRAY['\x0102', 'abc']) "
                            "ORDER BY id").fetchall() == [(1,), (2,)]
        assert conn.execute(r"SELECT id FROM t WHERE b <> ALL(ARRAY['\x0102', '\x00'])"
                            ).fetchall() == [(2,)]
        cur = conn.cursor()
        cur.execute("SELECT id FROM t WHERE b = ANY(ARRAY[%s, %s]) ORDER BY id",
                    [b"abc", b"\x00"], prepare=True)
        assert cur.fetchall() == [(2,), (3,)]


def test_length_of_bytea(srv) -> None:
    """length(bytea) is its bytes on both engines, as in PostgreSQL (DuckDB's length() has
    no BLOB form: the analytical engine failed with 42883), beside length() of text (its
    characters) in the same statement."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (b BYTEA, s TEXT)")
        conn.execute(r"INSERT INTO t VALUES ('\x0102', 'héllo'), ('\x', ''), (NULL, NULL)")
        assert conn.execute("SELECT length(b), length(s), LENGTH(b) + 1 FROM t "
                            "ORDER BY 1 NULLS LAST").fetchall() == [
            (0, 0, 1), (2, 5, 3), (None, None, None)]
        assert conn.execute(r"SELECT length('\x010203'::bytea)").fetchone()[0] == 3
        assert conn.execute("SELECT length(%s::bytea)", [b"\0\1"]).fetchone()[0] == 2
        cur = conn.cursor()
        cur.execute("SELECT length(b) FROM t WHERE length(b) = %s", [2], prepare=True)
        assert cur.fetchall() == [(2,)]
        assert [d.name for d in cur.description] == ["length"]


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
            (b"\x01\x0a",), (b"\xff",), (None,)]  # (the server: NULL last, as PostgreSQL)
    with cryptdisk.sqlite.connect(sqlite_engine.path, keyring=keyring) as db:
        assert db.execute("SELECT b FROM v ORDER BY x").fetchall() == [
            (None,), (b"\x01\x0a",), (b"\xff",)]


@pytest.mark.parametrize(("sql", "value"), [
    (r"SELECT E'a\tb'", "a\tb"),
    (r"SELECT e'it\'s', E'a''b', E'\\x01'", ("it's", "a'b", r"\x01")),
    (r"SELECT E'\x41\102\u00e9\U0001F600\n\r\b\f\q'", "AB\u00e9\U0001f600\n\r\b\fq"),
    (r"SELECT E'\xc3\xa9' || 'x'", "\u00e9x"),
    (r"SELECT length(E'\t')", 1),
])
def test_escape_string(srv, sql, value) -> None:
    """E'' strings (PostgreSQL's escape string syntax) read as PostgreSQL reads them on
    both engines (SQLite has none: it failed with 42703, no such column: E)."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        assert (row if len(row) > 1 else row[0]) == value


@pytest.mark.parametrize("sql", [r"SELECT E'\0'", r"SELECT E'\xff'"])
def test_escape_string_of_no_text_is_refused(srv, sql) -> None:
    """A NUL or bytes that are not UTF-8: PostgreSQL's text holds neither."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
        assert info.value.sqlstate == "22021"


def test_escape_string_into_a_sqlite_table(start_server, sqlite_engine, certs) -> None:
    srv = start_server(sqlite_engine)
    out = psql(srv, certs, "CREATE TABLE s (v TEXT)", r"INSERT INTO s VALUES (E'x\ty')",
               r"SELECT v = E'x\011y', length(v) FROM s WHERE v LIKE E'x\\ty' OR v = 'x	y'")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-2:] == ["1|3", "(1 row)"] or \
        out.stdout.splitlines()[-2:] == ["t|3", "(1 row)"]


def test_length_of_a_list_beside_length_of_bytea(start_server, analytical) -> None:
    """A statement with length(bytea) runs again with each length() as PostgreSQL's; a
    length() of a list there still counts its elements, as DuckDB's does (it counted the
    characters of the list's text: length([1, 2, 3]) was 9)."""
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (b BYTEA, l VARCHAR[])")
        conn.execute(r"INSERT INTO t VALUES ('\x0102', ['a,]', '[x']), (NULL, [])")
        assert conn.execute("SELECT length(b), length(l), length([1, 2, 3]) FROM t "
                            "ORDER BY 2").fetchall() == [(None, 0, 3), (2, 2, 3)]


@pytest.mark.parametrize("prepare", [False, True])
def test_concatenation_with_a_bytea_is_a_bytea(srv, prepare) -> None:
    """``bytea || bytea`` is a bytea, and so is a string or parameter joined to one
    (PostgreSQL reads it by bytea's input, ``b || '\\x03'``, ``'x' || b``, along a chain):
    the analytical engine returned text for a string beside a BLOB (``\\x01\\x03``), SQLite
    text for every ``||``, also of two blobs (and an internal error for bytes that are no
    UTF-8)."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, b BYTEA, s TEXT)")
        conn.execute(r"INSERT INTO t VALUES (1, '\x01ff', 'x')")
        cur = conn.cursor()
        cur.execute(r"SELECT b || '\x03', 'x' || '\x0102'::bytea, b || b, "
                    r"'\x01'::bytea || '\x02'::bytea, b || 'abc', b || '\x03' || '\x04', "
                    r"'\x03' || b, b || %s, b || (SELECT b FROM t) FROM t", (b"\x09",),
                    prepare=prepare)
        assert cur.fetchall() == [(
            b"\x01\xff\x03", b"x\x01\x02", b"\x01\xff\x01\xff", b"\x01\x02", b"\x01\xffabc",
            b"\x01\xff\x03\x04", b"\x03\x01\xff", b"\x01\xff\x09", b"\x01\xff\x01\xff")]
        assert [d.type_code for d in cur.description] == [17] * 9
        conn.execute(r"UPDATE t SET b = b || '\x0a' || 'b' WHERE a = 1")
        conn.execute(r"INSERT INTO t (a, b) VALUES (2, '\x61'::bytea || 'b')")
        assert conn.execute("SELECT b FROM t ORDER BY a").fetchall() == [
            (b"\x01\xff\x0ab",), (b"ab",)]


@pytest.mark.parametrize("prepare", [False, True])
def test_text_joined_to_a_bytea_is_text_of_its_hex_output(srv, prepare) -> None:
    """``text || bytea`` is text, the bytea in its output (hex: ``\\x61``), as
    PostgreSQL's; the engines joined the bytes themselves (DuckDB escapes only bytes
    that print not: ``xa``; SQLite the raw bytes); strings alone stay text."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (b BYTEA, s TEXT)")
        conn.execute(r"INSERT INTO t VALUES ('\x61ff', 'x')")
        cur = conn.cursor()
        cur.execute(r"SELECT s || b, b || s, 'y'::text || b, s || '\x01'::bytea, "
                    "'a || b' || s, 'x' || 'y' FROM t", prepare=prepare)
        assert cur.fetchall() == [
            ("x\\x61ff", "\\x61ffx", "y\\x61ff", "x\\x01", "a || bx", "xy")]
        assert [d.type_code for d in cur.description] == [25] * 6


def test_text_joined_to_a_null_bytea_is_null(srv) -> None:
    """``text || NULL::bytea`` is NULL, as PostgreSQL's, along a chain too, and an empty
    bytea is ``\\x``: SQLite's hex(NULL) is '' and gave ``y\\x`` for a NULL column."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, b BYTEA, s TEXT)")
        conn.execute(r"INSERT INTO t VALUES (1, NULL, 'y'), (2, '\x'::bytea, 'z'), "
                     r"(3, '\x00ff'::bytea, 'w')")
        assert conn.execute("SELECT s || b, b || s, s || b || b FROM t ORDER BY a").fetchall() \
            == [(None, None, None), ("z\\x", "\\xz", "z\\x\\x"),
                ("w\\x00ff", "\\x00ffw", "w\\x00ff\\x00ff")]


def test_text_of_bytes_that_are_no_utf8_is_a_clear_error_on_sqlite(start_server,
                                                                    sqlite_engine) -> None:
    """SQLite's ``||`` of an operand the server cannot type (a call) and a bytea makes
    text of the bytes; bytes that are no UTF-8 failed as "internal error:
    UnicodeDecodeError" (XX000, logged as a bug): now 22021 as PostgreSQL says it, with a
    hint, and the connection goes on."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (b BYTEA, s TEXT)")
        conn.execute(r"INSERT INTO t VALUES ('\xff01', 'x')")
        with pytest.raises(psycopg.errors.CharacterNotInRepertoire) as raised:
            conn.execute("SELECT upper(s) || b FROM t")
        assert str(raised.value).startswith('invalid byte sequence for encoding "UTF8": 0xff')
        assert "::bytea" in (raised.value.diag.message_hint or "")
        assert conn.execute("SELECT b FROM t").fetchall() == [(b"\xff\x01",)]


@pytest.mark.parametrize("prepare", [False, True])
def test_a_string_compared_with_a_bytea_concatenation_is_a_bytea(srv, prepare) -> None:
    """``b || 'c' = '\\x616263'``: the string is compared with a bytea, so it is read by
    bytea's input, as beside a bytea column (the engines compared the BLOB with their own
    cast of the text, ``\\x61`` and the text ``6263``: no row)."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, b BYTEA)")
        conn.execute(r"INSERT INTO t VALUES (1, '\x6162'), (2, '\x01')")
        cur = conn.cursor()
        cur.execute(r"SELECT a FROM t WHERE b || '' = '\x6162' OR '\x0163' = b || 'c' "
                    "ORDER BY a", prepare=prepare)
        assert cur.fetchall() == [(1,), (2,)]
