"""COPY FROM STDIN / TO STDOUT with psycopg and psql, on both engines."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import os
import ssl
import struct
import subprocess

import pg8000.native
import psycopg
import pytest

from tests.server.conftest import PASSWORD, USER
from tests.server.rawclient import Raw, cstr, msg, sqlstate

#: run the SQLite tests with a rollback journal and in WAL mode
SQLITE_JOURNALS = ("delete", "wal")


@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_copy_in_and_out_with_psycopg(start_server, engine, request) -> None:
    srv = start_server(request.getfixturevalue(engine))
    rows = [(1, "plain"), (2, "tab\there, newline\nthere, back\\slash"), (3, None)]
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a BIGINT, b VARCHAR)")
        with c.cursor() as cur:
            with cur.copy("COPY t (a, b) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            assert cur.rowcount == 3
            assert c.execute("SELECT a, b FROM t ORDER BY a").fetchall() == rows
            with cur.copy("COPY (SELECT a, b FROM t ORDER BY a) TO STDOUT") as copy:
                assert list(copy.rows()) == [("1", r[1]) if r[0] == 1 else (str(r[0]), r[1])
                                             for r in rows]
            with cur.copy("COPY t TO STDOUT WITH (FORMAT csv, HEADER)") as copy:
                text = b"".join(bytes(b) for b in copy).decode()
            assert text.splitlines()[0] == "a,b" and len(text.splitlines()) == 5


def test_copy_csv_with_psql_and_a_failed_copy(start_server, sqlite_engine, certs,
                                              tmp_path) -> None:
    srv = start_server(sqlite_engine)
    data = tmp_path / "in.csv"
    data.write_text("id,name\n1,\"a, b\"\n2,\n")
    conninfo = (f"host=localhost port={srv.port} user={USER} dbname=db sslmode=verify-full "
                f"sslrootcert={certs[0]}")
    env = {**os.environ, "PGPASSWORD": PASSWORD}
    out = subprocess.run(["psql", conninfo, "-Atc", "CREATE TABLE p (id INTEGER, name TEXT)",
                          "-c", f"\\copy p FROM '{data}' WITH (FORMAT csv, HEADER)",
                          "-c", "SELECT id, coalesce(name, 'NULL') FROM p ORDER BY id"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-3:-1] == ["1|a, b", "2|NULL"]
    with psycopg.connect(**srv.dsn, autocommit=True) as c:  # a CopyFail leaves nothing
        with pytest.raises(RuntimeError):
            with c.cursor().copy("COPY p FROM STDIN") as copy:
                copy.write_row((9, "never"))
                raise RuntimeError("client gives up")  # psycopg sends CopyFail
        assert c.execute("SELECT count(*) FROM p").fetchone() == (2,)


def test_disconnect_mid_copy_inserts_nothing(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine, secure=False)
    with psycopg.connect(host="127.0.0.1", port=srv.port, user="u", dbname="d",
                         sslmode="disable", autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
    r = Raw(srv.port)
    r.startup()
    r.send(msg(b"Q", cstr("COPY t FROM STDIN")))
    assert r.read()[0] == b"G"
    r.send(msg(b"d", b"1\n2\n"))
    r.close()  # gone before CopyDone
    r = Raw(srv.port)
    r.startup()
    r.send(msg(b"Q", cstr("SELECT count(*) FROM t")))
    got = r.until(b"Z")
    assert (b"D", b"\x00\x01\x00\x00\x00\x010") in got
    r.send(msg(b"Q", cstr("COPY t FROM STDIN")))
    assert r.read()[0] == b"G"
    r.send(msg(b"Q", cstr("SELECT 1")))  # not a COPY message: a protocol violation
    rest = r.rest()
    assert [k for k, _ in rest] == [b"E"] and sqlstate(rest[0][1]) == "08P01"


BINARY_ROWS = [
    (1, "plain", 1.5, True, dt.date(2024, 2, 29), dt.datetime(2024, 1, 2, 3, 4, 5, 678901),
     decimal.Decimal("12.34"), b"\x00\xffbytes"),
    (2, "tab\tnewline\n\\", -0.25, False, dt.date(1999, 12, 31), dt.datetime(1970, 1, 1),
     decimal.Decimal("-0.01"), b""),
    (3, None, None, None, None, None, None, None),
]
BINARY_TYPES = ["int8", "text", "float8", "bool", "date", "timestamp", "numeric", "bytea"]
DDL = {"analytical": "CREATE TABLE t (a BIGINT, b VARCHAR, c DOUBLE, d BOOLEAN, e DATE, "
                     "f TIMESTAMP, g DECIMAL(10,2), h BLOB)",
       "sqlite_engine": "CREATE TABLE t (a INTEGER, b TEXT, c REAL, d BOOLEAN, e DATE, "
                        "f TIMESTAMP, g NUMERIC, h BLOB)"}


@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_binary_copy_in_and_out_with_psycopg(start_server, engine, request) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute(DDL[engine])
        with c.cursor() as cur:
            with cur.copy("COPY t FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(BINARY_TYPES)
                for row in BINARY_ROWS:
                    copy.write_row(row)
            assert cur.rowcount == 3
            if engine == "analytical":  # typed columns: the values come back as they went
                assert c.execute("SELECT * FROM t ORDER BY a").fetchall() == BINARY_ROWS
            with cur.copy("COPY (SELECT a, b, h FROM t ORDER BY a) TO STDOUT (FORMAT BINARY)"
                          ) as copy:
                copy.set_types(["int8", "text", "bytea"])
                assert list(copy.rows()) == [(r[0], r[1], r[7]) for r in BINARY_ROWS]
            with cur.copy("COPY t (b, a) FROM STDIN WITH BINARY") as copy:  # a column list
                copy.set_types(["text", "int4"])                           # a narrower int
                copy.write_row(("four", 4))
            assert c.execute("SELECT b FROM t WHERE a = 4").fetchone() == ("four",)
            with cur.copy("COPY (SELECT a FROM t WHERE a > 100) TO STDOUT (FORMAT binary)"
                          ) as copy:
                copy.set_types(["int8"])
                assert list(copy.rows()) == []  # the header and the trailer only


def _binary(*rows: bytes, header: bytes | None = None, trailer: bool = True) -> bytes:
    head = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!Ii", 0, 0) if header is None else header
    return head + b"".join(rows) + (b"\xff\xff" if trailer else b"")


def _row(*fields: bytes | None) -> bytes:
    out = struct.pack("!h", len(fields))
    for f in fields:
        out += b"\xff\xff\xff\xff" if f is None else struct.pack("!i", len(f)) + f
    return out


GOOD = _row(struct.pack("!q", 1), b"one")


@pytest.mark.parametrize("data, code", [
    (b"not binary at all", "22P04"),                                          # no signature
    (_binary(GOOD, header=b"PGCOPY\n\xff\r\n\x00" + struct.pack("!Ii", 1 << 16, 0)), "22P04"),
    (_binary(GOOD, header=b"PGCOPY\n\xff\r\n\x00" + struct.pack("!Ii", 0, 99)), "22P04"),
    (_binary(GOOD, _row(struct.pack("!q", 2))), "22P04"),                     # 1 field of 2
    (_binary(GOOD, _row(struct.pack("!q", 2), b"two")[:-1], trailer=False), "22P04"),
    (_binary(GOOD, struct.pack("!hi", 2, 1 << 30)), "22P04"),                 # length too long
    (_binary(GOOD, struct.pack("!hi", 2, -7)), "22P04"),                      # negative length
    (_binary(GOOD) + b"junk", "22P04"),                                       # after the trailer
    (_binary(GOOD, _row(b"\x01\x02\x03", b"x")), "22P03"),                    # 3-byte integer
    (_binary(GOOD, _row(struct.pack("!q", 3), b"\xff\xfe")), "22P03"),        # not UTF-8
])
@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_malformed_binary_copy_is_refused_whole(start_server, engine, request, data,
                                                code) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a BIGINT, b VARCHAR)")
        with pytest.raises(psycopg.Error) as err:
            with c.cursor().copy("COPY t FROM STDIN (FORMAT BINARY)") as copy:
                copy.write(data)
        assert err.value.sqlstate == code
        assert c.execute("SELECT count(*) FROM t").fetchone() == (0,)
        with c.cursor().copy("COPY t FROM STDIN (FORMAT BINARY)") as copy:  # the session goes on
            copy.write(_binary(GOOD, trailer=False))  # ends at a row: accepted, as PostgreSQL
        assert c.execute("SELECT a, b FROM t").fetchall() == [(1, "one")]


def test_binary_copy_options_and_unknown_table(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
        with pytest.raises(psycopg.errors.FeatureNotSupported):  # (PostgreSQL 15's code)
            c.execute("COPY t FROM STDIN (FORMAT binary, HEADER)")
        with pytest.raises(psycopg.errors.SyntaxError):
            c.execute("COPY t FROM STDIN (FORMAT binary, DELIMITER ',')")
        with pytest.raises(psycopg.errors.UndefinedTable):
            with c.cursor().copy("COPY nosuch FROM STDIN (FORMAT binary)") as copy:
                copy.write(_binary())
        with pytest.raises(psycopg.errors.UndefinedColumn):
            with c.cursor().copy("COPY t (zz) FROM STDIN (FORMAT binary)") as copy:
                copy.write(_binary())


@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_copy_through_the_extended_protocol_with_pg8000(start_server, engine, request,
                                                        certs) -> None:
    """pg8000 sends every statement, COPY too, as Parse/Bind/Describe/Execute/Sync."""
    srv = start_server(request.getfixturevalue(engine))
    ctx = ssl.create_default_context(cafile=str(certs[0]))
    con = pg8000.native.Connection(USER, host="localhost", port=srv.port, password=PASSWORD,
                                   database="db", ssl_context=ctx)
    try:
        con.run("CREATE TABLE t (a BIGINT, b VARCHAR)")
        con.run("COPY t FROM STDIN", stream=io.StringIO("1\tone\n2\t\\N\n"))
        assert con.row_count == 2
        out = io.StringIO()
        con.run("COPY (SELECT a, b FROM t ORDER BY a) TO STDOUT WITH (FORMAT csv)", stream=out)
        assert out.getvalue() == "1,one\n2,\n"
        binary = io.BytesIO()
        con.run("COPY t TO STDOUT (FORMAT binary)", stream=binary)
        assert binary.getvalue().startswith(b"PGCOPY\n\xff\r\n\x00")
        con.run("COPY t FROM STDIN (FORMAT binary)", stream=io.BytesIO(binary.getvalue()))
        assert con.run("SELECT count(*), count(b) FROM t") == [[4, 2]]
        with pytest.raises(pg8000.native.DatabaseError) as err:  # an error, then Sync
            con.run("COPY t FROM STDIN", stream=io.StringIO("3\tthree\textra\n"))
        assert err.value.args[0]["C"] == "22P04"
        assert con.run("SELECT count(*) FROM t") == [[4]]
    finally:
        con.close()


@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_binary_copy_with_psql(start_server, engine, request, certs, tmp_path) -> None:
    """psql's \\copy in binary: out to a file, back into another table, the same rows."""
    srv = start_server(request.getfixturevalue(engine))
    conninfo = (f"host=localhost port={srv.port} user={USER} dbname=db sslmode=verify-full "
                f"sslrootcert={certs[0]}")
    data = tmp_path / "t.bin"

    def psql(*commands: str) -> str:
        args = ["psql", conninfo, "-X", "-At", "-v", "ON_ERROR_STOP=1"]
        for c in commands:
            args += ["-c", c]
        out = subprocess.run(args, env={**os.environ, "PGPASSWORD": PASSWORD},
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    psql("CREATE TABLE t (a BIGINT, b VARCHAR, c DOUBLE PRECISION)",
         "CREATE TABLE t2 (a BIGINT, b VARCHAR, c DOUBLE PRECISION)",
         "INSERT INTO t VALUES (1, 'one', 0.5), (2, NULL, -2.25), (3, 'tab\there', NULL)",
         f"\\copy t TO '{data}' WITH (FORMAT binary)",
         f"\\copy t2 FROM '{data}' WITH (FORMAT binary)")
    assert data.read_bytes().startswith(b"PGCOPY\n\xff\r\n\x00")
    assert psql("SELECT a, coalesce(b, 'NULL'), c FROM t2 ORDER BY a").splitlines() == \
        ["1|one|0.5", "2|NULL|-2.25", "3|tab\there|"]


INTERVALS = [(1, dt.timedelta(days=3, seconds=5, microseconds=7)),
             (2, dt.timedelta(seconds=-5)), (3, dt.timedelta(0)), (4, None)]
#: psycopg sends -5 s as -1 day and +23:59:55 (a timedelta's own form); PostgreSQL 15
#: writes it so, with the + after the negative part
INTERVAL_TEXTS = ["3 days 00:00:05.000007", "-1 days +23:59:55", "00:00:00", None]


def test_binary_copy_of_intervals_round_trips_as_text_copy_does(start_server,
                                                                sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c, c.cursor() as cur:
        c.execute("CREATE TABLE iv (k INTEGER, d INTERVAL)")
        with cur.copy("COPY iv FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "interval"])
            for row in INTERVALS:
                copy.write_row(row)
        with cur.copy("COPY iv FROM STDIN") as copy:  # text: PostgreSQL's own form
            copy.write(b"5\t1 year 2 mons -3 days +04:05:06.5\n")
        with cur.copy("COPY iv TO STDOUT") as copy:  # text: what PostgreSQL writes
            assert [r[1] for r in copy.rows()] == [*INTERVAL_TEXTS,
                                                   "1 year 2 mons -3 days +04:05:06.5"]
        with cur.copy("COPY iv TO STDOUT (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "interval"])
            got = list(copy.rows())
        assert got[:4] == INTERVALS
        assert got[4][1] == dt.timedelta(days=365 + 60 - 3, hours=4, minutes=5, seconds=6.5)
        assert c.execute("SELECT d FROM iv WHERE k = 1", binary=True).fetchone() == \
            (INTERVALS[0][1],)


def test_intervals_of_the_analytical_engine(start_server, analytical) -> None:
    srv = start_server(analytical)
    query = ("SELECT INTERVAL '1 month 2 days 03:04:05.000006' AS a, "
             "INTERVAL '-5 seconds' AS b, INTERVAL '1 year -3 days' AS c")
    want = (dt.timedelta(days=32, seconds=11045, microseconds=6), dt.timedelta(seconds=-5),
            dt.timedelta(days=362))
    with psycopg.connect(**srv.dsn, autocommit=True) as c, c.cursor() as cur:
        assert c.execute(query).fetchone() == want
        assert c.execute(query, binary=True).fetchone() == want
        with cur.copy(f"COPY ({query}) TO STDOUT") as copy:
            assert list(copy.rows()) == [("1 mon 2 days 03:04:05.000006", "-00:00:05",
                                          "1 year -3 days")]
        with cur.copy(f"COPY ({query}) TO STDOUT (FORMAT BINARY)") as copy:
            copy.set_types(["interval"] * 3)
            assert list(copy.rows()) == [want]
        assert c.execute("SELECT %b::INTERVAL * 2", (dt.timedelta(days=-1, seconds=5),)
                         ).fetchone() == (dt.timedelta(days=-2, seconds=10),)


def test_analytical_not_null_and_default_through_copy_and_the_catalogs(start_server,
                                                                        analytical) -> None:
    """COPY FROM STDIN fills a column's DEFAULT and refuses a NULL in a NOT NULL column
    (23502, no row written), as INSERT does; information_schema and pg_attribute show
    them."""
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (k BIGINT NOT NULL, s VARCHAR DEFAULT 'none')")
        with pytest.raises(psycopg.errors.NotNullViolation):
            with c.cursor().copy("COPY t (s) FROM STDIN") as copy:
                copy.write_row(("x",))
        with pytest.raises(psycopg.errors.NotNullViolation):
            with c.cursor().copy("COPY t FROM STDIN") as copy:
                copy.write_row((1, "a"))
                copy.write_row((None, "b"))
        with pytest.raises(psycopg.errors.NotNullViolation):
            c.execute("INSERT INTO t (s) VALUES ('y')")
        assert c.execute("SELECT count(*) FROM t").fetchone() == (0,)
        with c.cursor().copy("COPY t (k) FROM STDIN") as copy:
            copy.write_row((1,))
        assert c.execute("SELECT k, s FROM t").fetchall() == [(1, "none")]
        assert c.execute("SELECT column_name, is_nullable, column_default FROM "
                         "information_schema.columns WHERE table_name = 't' "
                         "ORDER BY ordinal_position").fetchall() == [
            ("k", "NO", None), ("s", "YES", "'none'")]
        assert c.execute("SELECT a.attname, a.attnotnull, a.atthasdef FROM pg_attribute a "
                         "JOIN pg_class r ON a.attrelid = r.oid WHERE r.relname = 't' "
                         "AND a.attnum > 0 ORDER BY a.attnum"
                         ).fetchall() == [("k", True, False), ("s", False, True)]


@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_header_match_and_force_null_name_the_tables_columns(start_server, engine,
                                                             request) -> None:
    """HEADER MATCH checks the header line against the copied columns (the column list's,
    else the table's); FORCE_NOT_NULL / FORCE_NULL take the columns by name, as
    PostgreSQL 15 does, with its errors for a column the table or the COPY lacks."""
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a BIGINT, b VARCHAR, c VARCHAR)")

        def copy(sql: str, data: bytes) -> None:
            with c.cursor().copy(sql) as cp:
                cp.write(data)

        copy("COPY t FROM STDIN (FORMAT csv, HEADER MATCH)", b"a,b,c\n1,x,y\n")
        copy("COPY t (c, a) FROM STDIN (HEADER MATCH)", b"c\ta\nz\t2\n")
        copy("COPY t FROM STDIN (FORMAT csv, FORCE_NOT_NULL (b), FORCE_NULL (c))",
             b'3,,""\n')
        assert c.execute("SELECT a, b, c FROM t ORDER BY a").fetchall() == [
            (1, "x", "y"), (2, None, "z"), (3, "", None)]
        for sql, data, error, message in [
            ("COPY t FROM STDIN (FORMAT csv, HEADER MATCH)", b"a,c,b\n",
             psycopg.errors.BadCopyFileFormat, 'got "c", expected "b"'),
            ("COPY t (a) FROM STDIN (HEADER MATCH)", b"a\tb\n",
             psycopg.errors.BadCopyFileFormat, "wrong number of fields in header line"),
            ("COPY t (a) FROM STDIN (FORMAT csv, FORCE_NULL (b))", b"",
             psycopg.errors.InvalidColumnReference, 'FORCE_NULL column "b" not referenced'),
            ("COPY t FROM STDIN (FORMAT csv, FORCE_NOT_NULL (z))", b"",
             psycopg.errors.UndefinedColumn, 'column "z" of relation "t" does not exist'),
        ]:
            with pytest.raises(error, match=message):
                copy(sql, data)
        assert c.execute("SELECT count(*) FROM t").fetchone() == (3,)


@pytest.mark.parametrize("rows", [40_000, 300_000])  # within the first MiB read, and past it
@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_a_cancel_during_copy_from_stdin_fails_it_with_57014(start_server, engine, request,
                                                             rows) -> None:
    """A CancelRequest while the client sends its COPY data (the server reading it, or
    the engine inserting a batch) fails the COPY with 57014 and leaves the table as it
    was, as PostgreSQL does; the rest of the data is read and dropped. (psycopg's
    cancel_safe returns once the server has taken the request.)"""
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a BIGINT, b VARCHAR)")
        with pytest.raises(psycopg.errors.QueryCanceled, match="user request"):
            with c.cursor().copy("COPY t FROM STDIN") as copy:
                for i in range(rows):
                    copy.write(f"{i}\tx\n")
                    if i == rows * 3 // 4:
                        c.cancel_safe()
        assert c.execute("SELECT count(*) FROM t").fetchone() == (0,)
        with c.cursor().copy("COPY t FROM STDIN") as copy:  # the next COPY is not cancelled
            copy.write("1\ty\n")
        assert c.execute("SELECT a, b FROM t").fetchall() == [(1, "y")]


def _writing(session) -> bool:
    """Whether a server session's SQLite connection is in a transaction, asked from the
    test's thread: apsw refuses while the session's thread is running a statement on it
    (ThreadingViolationError), which means it is."""
    import apsw

    if session.engine is None:
        return False
    try:
        return session.engine.in_transaction
    except apsw.ThreadingViolationError:
        return True


def test_the_timeout_of_a_copy_whose_client_stalls_lets_the_write_lock_go(
        start_server, sqlite_engine) -> None:
    """A client that stops sending in the middle of its COPY FROM (past the first MiB, so
    the insert runs and holds SQLite's write lock) is stopped by the statement timeout
    while it stalls, as PostgreSQL stops it: the lock is let go then, so another session's
    write goes through before the stalled client sends again; the COPY fails with 57014
    and leaves nothing."""
    import threading
    import time

    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c, \
            psycopg.connect(**srv.dsn, autocommit=True) as other:
        c.execute("CREATE TABLE t (a BIGINT, b VARCHAR)")
        other.execute("CREATE TABLE u (a INTEGER)")
        c.execute("SET statement_timeout = '1s'")
        wrote = threading.Event()

        def write() -> None:
            other.execute("INSERT INTO u VALUES (1)")
            wrote.set()

        writer = threading.Thread(target=write)
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            with c.cursor().copy("COPY t FROM STDIN") as copy:
                copy.write("".join(f"{i}\tx\n" for i in range(300_000)))  # (3.4 MB)
                began = time.monotonic()
                for _ in range(6000):  # the insert runs (its batches hold the write lock)
                    if any(_writing(s) for s in list(srv.server.sessions)):
                        break
                    time.sleep(0.01)
                time.sleep(0.3)
                writer.start()
                stalled_through = wrote.wait(30)  # the client sends nothing meanwhile,
                time.sleep(max(0.0, began + 2 - time.monotonic()))  # past the timeout
                copy.write("1\ty\n")
        writer.join(60)
        assert stalled_through  # the other write did not wait for the stalled client
        c.execute("SET statement_timeout = 0")
        assert c.execute("SELECT count(*) FROM t").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM u").fetchone() == (1,)


@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
@pytest.mark.parametrize(("columns", "near"), [("()", ")"), ("(a,)", ")"), ("(, a)", ","),
                                               ("(a,, b)", ",")])
def test_an_empty_name_in_a_copy_column_list(start_server, engine, request, columns,
                                             near) -> None:
    """An empty column list, or an empty name in one, is PostgreSQL 15's syntax error
    (42601 at or near the ) or , after it), in and out; COPY t () was taken as every
    column, and an empty name failed as a column the table lacks (42703)."""
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a BIGINT, b VARCHAR)")
        for sql in (f"COPY t {columns} FROM STDIN", f"COPY t {columns} TO STDOUT"):
            with pytest.raises(psycopg.errors.SyntaxError) as err:
                with c.cursor().copy(sql) as copy:
                    list(copy) if "TO" in sql else copy.write(b"1\tx\n")
            assert err.value.diag.message_primary == f'syntax error at or near "{near}"'
        assert c.execute("SELECT count(*) FROM t").fetchone() == (0,)
