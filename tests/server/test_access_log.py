"""The access log: a line per statement, never the statement's text, parameters or passwords."""

from __future__ import annotations

import json

import psycopg

import cryptdisk
from cryptdisk.server import AccessLog


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
