"""The access log: a line per statement, never the statement's text, parameters or passwords."""

from __future__ import annotations

import io
import json
import ssl

import pg8000.native
import psycopg
import pytest

import cryptdisk
from cryptdisk.server import AccessLog
from tests.server.conftest import ENDLESS, PASSWORD, USER, cancel_running
from tests.server.rawclient import Raw, cstr, msg


def lines(raw: bytes) -> list[dict]:
    return [json.loads(line) for line in raw.decode().splitlines()]


def test_encrypted_access_log_of_sqlite(start_server, sqlite_engine, keyring, tmp_path) -> None:
    path = tmp_path / "access.log"
    srv = start_server(sqlite_engine, access_log=AccessLog(path, keyring))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER, secret TEXT)")
        c.execute("INSERT INTO t VALUES (%s, %s)", (1, "param-value-xyz"))
        c.execute("CREATE VIEW v AS SELECT a FROM t")
        assert c.execute("SELECT a FROM v WHERE a = %s", (1,)).fetchall() == [(1,)]
        c.execute("CREATE USER carol PASSWORD 'carol-password-123'")
        try:
            c.execute("SELECT * FROM missing")
        except psycopg.errors.UndefinedTable:
            pass
    srv.stop()
    raw = path.read_bytes()
    assert b"param-value-xyz" not in raw and b"INSERT" not in raw  # encrypted at rest
    with cryptdisk.open(path, "rb", keyring=keyring) as f:
        text = f.read()
    assert b"param-value-xyz" not in text and b"carol-password-123" not in text
    log = lines(text)
    assert [e["kind"] for e in log] == ["CREATE", "INSERT", "CREATE", "SELECT", "CREATE",
                                        "SELECT"]
    assert log[1]["tables"] == ["t"] and log[1]["rows"] == 1 and log[1]["user"] == "u"
    assert log[3]["tables"] == ["t", "v"] and log[3]["rows"] == 1  # the view and its table
    assert log[5]["sqlstate"] == "42P01"
    assert all(e["source"] == "127.0.0.1" and e["duration_ms"] >= 0 for e in log)


def test_plain_access_log_of_the_analytical_engine(start_server, analytical, tmp_path) -> None:
    path = tmp_path / "access.log"
    srv = start_server(analytical, access_log=AccessLog(path))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a BIGINT)")
        c.execute("INSERT INTO t VALUES (%s)", (42,))
        c.execute("WITH x AS (SELECT a FROM t) SELECT * FROM x").fetchall()
    srv.stop()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    log = lines(path.read_bytes())
    assert [(e["kind"], e["tables"]) for e in log] == [
        ("CREATE", ["t"]), ("INSERT", ["t"]), ("WITH", ["t"])]
    assert b"VALUES" not in path.read_bytes() and b"SELECT a" not in path.read_bytes()


def test_access_log_names_the_role_after_set_role(start_server, sqlite_engine, tmp_path) -> None:
    path = tmp_path / "access.log"
    srv = start_server(sqlite_engine, access_log=AccessLog(path))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
        c.execute("CREATE ROLE auditors")
        c.execute("GRANT SELECT ON t TO auditors")
        c.execute("SET ROLE auditors")
        c.execute("SELECT a FROM t").fetchall()
        c.execute("RESET ROLE")
        c.execute("SELECT 1").fetchall()
    srv.stop()
    log = lines(path.read_bytes())
    assert [(e["kind"], e["user"], e.get("role")) for e in log] == [
        ("CREATE", "u", None), ("CREATE", "u", None), ("GRANT", "u", None), ("SET", "u", None),
        ("SELECT", "u", "auditors"), ("RESET", "u", "auditors"), ("SELECT", "u", None)]


def test_a_query_refused_before_it_runs_is_logged(start_server, analytical, tmp_path) -> None:
    """A query with several statements is checked whole first: the refused statement gets a
    line (42501), the ones before it none, since they never ran."""
    path = tmp_path / "access.log"
    srv = start_server(analytical, access_log=AccessLog(path))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        for st in ["CREATE TABLE sink (a BIGINT)", "CREATE TABLE secret (s VARCHAR)",
                   "CREATE USER bob PASSWORD 'bob pw'", "GRANT INSERT ON sink TO bob"]:
            c.execute(st)
    with psycopg.connect(**{**srv.dsn, "user": "bob", "password": "bob pw"},
                         autocommit=True) as bob:
        try:
            bob.execute("INSERT INTO sink VALUES (1); SELECT * FROM secret")
        except psycopg.errors.InsufficientPrivilege:
            pass
        else:
            raise AssertionError("the query ran")
    srv.stop()
    log = [e for e in lines(path.read_bytes()) if e["user"] == "bob"]
    assert [(e["kind"], e.get("sqlstate"), e["tables"]) for e in log] == \
        [("SELECT", "42501", [])]


def _plain(srv) -> dict:
    return {"host": "127.0.0.1", "port": srv.port, "user": "u", "dbname": "d",
            "sslmode": "disable"}


def test_every_copy_gets_one_line_and_a_failed_one_says_so(start_server, sqlite_engine,
                                                           tmp_path) -> None:
    """COPY FROM STDIN in text, csv and binary, COPY TO STDOUT, and COPYs that end with a
    CopyFail or with the client gone mid-COPY: one line each, kind COPY; a failed one has
    its SQLSTATE and 0 rows, and its rows are not in the table."""
    path = tmp_path / "access.log"
    srv = start_server(sqlite_engine, secure=False, access_log=AccessLog(path))
    with psycopg.connect(**_plain(srv), autocommit=True) as c:
        c.execute("CREATE TABLE t (a BIGINT, b TEXT)")
        with c.cursor() as cur:
            with cur.copy("COPY t (a, b) FROM STDIN") as copy:
                for row in [(1, "one"), (2, "two")]:
                    copy.write_row(row)
            with cur.copy("COPY t FROM STDIN WITH (FORMAT csv)") as copy:
                copy.write(b"3,three\n4,four\n5,five\n")
            with cur.copy("COPY t (a, b) FROM STDIN (FORMAT binary)") as copy:
                copy.set_types(["int8", "text"])
                copy.write_row((6, "six"))
            with cur.copy("COPY t TO STDOUT") as copy:
                assert len(list(copy.rows())) == 6
            with pytest.raises(RuntimeError):
                with cur.copy("COPY t FROM STDIN") as copy:
                    copy.write_row((7, "never"))
                    raise RuntimeError("client gives up")  # psycopg sends CopyFail
    r = Raw(srv.port)
    r.startup()
    r.send(msg(b"Q", cstr("COPY t FROM STDIN")))
    assert r.read()[0] == b"G"
    r.send(msg(b"d", b"8\teight\n"))
    r.close()  # gone before CopyDone
    with psycopg.connect(**_plain(srv), autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM t").fetchone() == (6,)
    srv.stop()
    log = [e for e in lines(path.read_bytes()) if e["kind"] == "COPY"]
    assert [(e["rows"], e["tables"], e.get("sqlstate")) for e in log] == [
        (2, ["t"], None), (3, ["t"], None), (1, ["t"], None), (6, ["t"], None),
        (0, [], "57014"), (0, [], "08006")]
    assert all(e["user"] == "u" and e["source"] == "127.0.0.1" for e in log)
    assert b"eight" not in path.read_bytes() and b"never" not in path.read_bytes()


def test_copy_through_the_extended_protocol_is_logged(start_server, analytical, certs,
                                                      tmp_path) -> None:
    """pg8000 sends COPY as Parse/Bind/Describe/Execute: one line per COPY there too."""
    path = tmp_path / "access.log"
    srv = start_server(analytical, access_log=AccessLog(path))
    ctx = ssl.create_default_context(cafile=str(certs[0]))
    con = pg8000.native.Connection(USER, host="localhost", port=srv.port, password=PASSWORD,
                                   database="db", ssl_context=ctx)
    try:
        con.run("CREATE TABLE t (a BIGINT, b VARCHAR)")
        con.run("COPY t FROM STDIN", stream=io.StringIO("1\tone\n2\t\\N\n"))
        con.run("COPY (SELECT a FROM t) TO STDOUT", stream=io.StringIO())
        with pytest.raises(pg8000.native.DatabaseError):
            con.run("COPY t FROM STDIN", stream=io.StringIO("3\tthree\textra\n"))
    finally:
        con.close()
    srv.stop()
    log = lines(path.read_bytes())
    assert [(e["kind"], e["rows"], e["tables"], e.get("sqlstate")) for e in log] == [
        ("CREATE", None, ["t"], None), ("COPY", 2, ["t"], None), ("COPY", 2, ["t"], None),
        ("COPY", 0, ["t"], "22P04")]


def test_one_line_per_statement_of_a_query_and_per_execution(start_server, sqlite_engine,
                                                            tmp_path) -> None:
    """Each statement of a multi-statement query gets its line (those after a failed one
    never run: none); a prepared statement gets one per execution; a portal read in chunks
    (Execute with a row limit, PortalSuspended) one line, for all its rows."""
    path = tmp_path / "access.log"
    srv = start_server(sqlite_engine, secure=False, access_log=AccessLog(path))
    with psycopg.connect(**_plain(srv), autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER); INSERT INTO t VALUES (1), (2), (3)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            c.execute("CREATE UNIQUE INDEX i ON t (a); INSERT INTO t VALUES (1); "
                      "DELETE FROM t")
        for _ in range(3):
            c.execute("SELECT a FROM t WHERE a > %s", (0,), prepare=True).fetchall()
    r = Raw(srv.port)
    r.startup()
    r.send(msg(b"P", cstr("s") + cstr("SELECT a FROM t ORDER BY a") + b"\0\0")
           + msg(b"B", cstr("p") + cstr("s") + b"\0\0" + b"\0\0" + b"\0\0")
           + msg(b"E", cstr("p") + b"\0\0\0\x01") + msg(b"E", cstr("p") + b"\0\0\0\x01")
           + msg(b"E", cstr("p") + b"\0\0\0\0") + msg(b"S"))
    kinds = [k for k, _ in r.until(b"Z")]
    assert kinds.count(b"s") == 2 and kinds.count(b"D") == 3 and kinds.count(b"C") == 1
    r.close()
    srv.stop()
    log = lines(path.read_bytes())
    assert [(e["kind"], e["rows"], e.get("sqlstate")) for e in log] == [
        ("CREATE", None, None), ("INSERT", 3, None), ("CREATE", None, None),
        ("INSERT", 0, "23505"), ("SELECT", 3, None), ("SELECT", 3, None),
        ("SELECT", 3, None), ("SELECT", 3, None)]
    assert [e["tables"] for e in log[4:]] == [["t"]] * 4


def test_server_side_cursors_are_logged(start_server, sqlite_engine, tmp_path) -> None:
    """DECLARE, each FETCH and CLOSE get a line; DECLARE and FETCH name the query's tables."""
    path = tmp_path / "access.log"
    srv = start_server(sqlite_engine, access_log=AccessLog(path))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
        c.execute("INSERT INTO t VALUES (1), (2), (3), (4), (5)")
        with c.cursor("cur", withhold=True) as cur:
            cur.execute("SELECT a FROM t ORDER BY a")
            assert cur.fetchmany(2) == [(1,), (2,)]
            assert cur.fetchall() == [(3,), (4,), (5,)]
    srv.stop()
    log = lines(path.read_bytes())[2:]
    assert [e["kind"] for e in log if e["kind"] != "FETCH"] == ["DECLARE", "CLOSE"]
    assert log[0]["tables"] == ["t"]
    fetches = [e for e in log if e["kind"] == "FETCH"]
    assert sum(e["rows"] for e in fetches) == 5
    assert all(e["tables"] == ["t"] for e in fetches)


SECRETS = ["carol-secret-1", "carol-secret-2", "nobody-secret-3", "again-secret-4",
           "broken-secret-5"]


@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_passwords_never_reach_the_log(start_server, engine, request, tmp_path,
                                       caplog) -> None:
    """CREATE USER / ALTER USER ... PASSWORD, succeeding and failing (no such user, the user
    exists, an unterminated literal): a line each, never the password; nor in the server's
    own log."""
    path = tmp_path / "access.log"
    srv = start_server(request.getfixturevalue(engine), access_log=AccessLog(path))
    caplog.set_level("DEBUG", logger="cryptdisk")
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute(f"CREATE USER carol PASSWORD '{SECRETS[0]}'")
        c.execute(f"ALTER USER carol PASSWORD '{SECRETS[1]}'")
        with pytest.raises(psycopg.Error):
            c.execute(f"ALTER USER nobody PASSWORD '{SECRETS[2]}'")
        with pytest.raises(psycopg.Error):
            c.execute(f"CREATE USER carol PASSWORD '{SECRETS[3]}'")
        with pytest.raises(psycopg.errors.SyntaxError):
            c.execute(f"CREATE USER dave PASSWORD '{SECRETS[4]}")
    srv.stop()
    raw = path.read_bytes()
    for secret in SECRETS:
        assert secret.encode() not in raw and secret not in caplog.text
    log = lines(raw)
    assert [(e["kind"], e["rows"] == 0, "sqlstate" in e) for e in log] == [
        ("CREATE", False, False), ("ALTER", False, False), ("ALTER", True, True),
        ("CREATE", True, True), ("CREATE", True, True)]
    assert log[-1]["sqlstate"] == "42601"


def test_refusals_catalog_grants_and_policies_are_logged(start_server, analytical,
                                                         tmp_path) -> None:
    """A statement refused (42501), an information_schema query, grants and policy
    statements: a line each with the right kind and outcome."""
    from cryptdisk.server import PolicyStore

    analytical.policies = PolicyStore(tmp_path / "a.policies", analytical.keyring, analytical)
    path = tmp_path / "access.log"
    srv = start_server(analytical, access_log=AccessLog(path))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        for st in ["CREATE TABLE t (a BIGINT, s VARCHAR)", "CREATE USER bob PASSWORD 'bob pw'",
                   "CREATE ROLE readers", "GRANT SELECT ON t TO readers",
                   "GRANT readers TO bob", "GRANT APPLY POLICY TO u",
                   "CREATE MASKING POLICY m AS (v VARCHAR) RETURNS VARCHAR -> '***'",
                   "ALTER TABLE t ALTER s SET MASKING POLICY m", "REVOKE readers FROM bob"]:
            c.execute(st)
    with psycopg.connect(**{**srv.dsn, "user": "bob", "password": "bob pw"},
                         autocommit=True) as bob:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            bob.execute("SELECT * FROM t")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            bob.execute("INSERT INTO t VALUES (1, 'x')")
        bob.execute("SELECT table_name FROM information_schema.tables").fetchall()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # extended protocol
            bob.execute("SELECT * FROM t WHERE a = %s", (1,))
        bob.execute("SELECT table_name FROM information_schema.tables WHERE table_name = %s",
                    ("t",), prepare=True).fetchall()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with bob.cursor().copy("COPY t TO STDOUT") as copy:
                list(copy)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with bob.cursor().copy("COPY t (a) FROM STDIN") as copy:
                copy.write_row((1,))
    srv.stop()
    log = lines(path.read_bytes())
    admin = [(e["kind"], e.get("sqlstate")) for e in log if e["user"] == "u"]
    assert admin == [("CREATE", None), ("CREATE", None), ("CREATE", None), ("GRANT", None),
                     ("GRANT", None), ("GRANT", None), ("CREATE", None), ("ALTER", None),
                     ("REVOKE", None)]
    bobs = [(e["kind"], e.get("sqlstate"), e["rows"]) for e in log if e["user"] == "bob"]
    assert bobs == [("SELECT", "42501", 0), ("INSERT", "42501", 0), ("SELECT", None, 0),
                    ("SELECT", "42501", 0), ("SELECT", None, 0), ("COPY", "42501", 0),
                    ("COPY", "42501", 0)]


def test_timed_out_and_cancelled_statements_are_logged(start_server, sqlite_engine,
                                                       keyring, tmp_path) -> None:
    from cryptdisk.server import SQLiteEngine

    path = tmp_path / "access.log"
    srv = start_server(sqlite_engine, access_log=AccessLog(path), statement_timeout=0.5)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        with pytest.raises(psycopg.errors.QueryCanceled):
            c.execute(ENDLESS)
        assert c.execute("SELECT 1").fetchone() == (1,)
    srv.stop()
    log = lines(path.read_bytes())
    assert [(e["kind"], e.get("sqlstate"), e["rows"]) for e in log] == [
        ("WITH", "57014", 0), ("SELECT", None, 1)]

    path = tmp_path / "cancel.log"
    srv = start_server(SQLiteEngine(tmp_path / "s2.db", keyring), access_log=AccessLog(path))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        errors = cancel_running(srv, c)
        assert len(errors) == 1 and isinstance(errors[0], psycopg.errors.QueryCanceled)
    srv.stop()
    assert [(e["kind"], e.get("sqlstate"), e["rows"]) for e in lines(path.read_bytes())] == \
        [("WITH", "57014", 0)]


def test_a_copy_in_flight_at_shutdown_is_logged(start_server, sqlite_engine, keyring,
                                                tmp_path) -> None:
    """The server ends a session still inside a COPY once draining times out: the COPY's
    line says 57P01 with 0 rows, in the encrypted log too, and nothing of it is applied."""
    import asyncio

    path = tmp_path / "access.log"
    srv = start_server(sqlite_engine, secure=False, access_log=AccessLog(path, keyring))
    with psycopg.connect(**_plain(srv), autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
    r = Raw(srv.port)
    r.startup()
    r.send(msg(b"Q", cstr("COPY t FROM STDIN")))
    assert r.read()[0] == b"G"
    r.send(msg(b"d", b"1\n"))
    asyncio.run_coroutine_threadsafe(srv.server.drain(timeout=0.2), srv.loop).result(60)
    rest = r.rest()
    assert rest and rest[-1][0] == b"E"
    srv.stop()
    with cryptdisk.open(path, "rb", keyring=keyring) as f:
        log = lines(f.read())
    assert [(e["kind"], e.get("sqlstate"), e["rows"]) for e in log] == [
        ("CREATE", None, None), ("COPY", "57P01", 0)]
    assert sqlite_engine.open_session().run("SELECT count(*) FROM t", []).rows == [(0,)]


def test_binary_results_that_fail_to_encode_are_logged_as_failed(start_server, sqlite_engine,
                                                                 tmp_path) -> None:
    """SQLite keeps a text value in an INTEGER column: sent in binary it cannot be, the
    client gets 22000 and the statement's line says so (0 rows). Binary results that are
    sent, whole or in part (a portal dropped at Sync after one chunk), get one line each."""
    path = tmp_path / "access.log"
    srv = start_server(sqlite_engine, secure=False, access_log=AccessLog(path))
    with psycopg.connect(**_plain(srv), autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
        c.execute("INSERT INTO t VALUES (1), (2)")
        assert c.execute("SELECT a FROM t WHERE a > %s ORDER BY a", (0,),
                         binary=True).fetchall() == [(1,), (2,)]
        c.execute("INSERT INTO t VALUES ('abc')")
        with pytest.raises(psycopg.errors.DataException):
            c.execute("SELECT a FROM t WHERE a <> %s", (0,), binary=True).fetchall()
        assert c.execute("SELECT count(*) FROM t").fetchone() == (3,)
    r = Raw(srv.port)
    r.startup()
    r.send(msg(b"P", cstr("") + cstr("SELECT a FROM t ORDER BY a") + b"\0\0")
           + msg(b"B", cstr("") + cstr("") + b"\0\0" + b"\0\0" + b"\0\x01\0\x01")
           + msg(b"E", cstr("") + b"\0\0\0\x01") + msg(b"S"))
    assert [k for k, _ in r.until(b"Z")] == [b"1", b"2", b"D", b"s", b"Z"]
    r.close()
    srv.stop()
    log = lines(path.read_bytes())
    assert [(e["kind"], e["rows"], e.get("sqlstate")) for e in log] == [
        ("CREATE", None, None), ("INSERT", 2, None), ("SELECT", 2, None), ("INSERT", 1, None),
        ("SELECT", 0, "22000"), ("SELECT", 1, None), ("SELECT", 3, None)]
