"""Extended query, several Executes before one Sync (pipelining): on SQLite they run as one
implicit transaction, as in PostgreSQL; an error discards the messages until Sync."""

from __future__ import annotations

import struct

import psycopg
import pytest

from tests.server.rawclient import Raw, cstr, msg, sqlstate

#: run the SQLite tests with a rollback journal and in WAL mode
SQLITE_JOURNALS = ("delete", "wal")

SYNC = msg(b"S")
FLUSH = msg(b"H")


def execute(sql: str, portal: str = "") -> bytes:
    """Parse, Bind (no parameters) and Execute ``sql`` in the unnamed statement."""
    return (msg(b"P", cstr("") + cstr(sql) + struct.pack("!h", 0))
            + msg(b"B", cstr(portal) + cstr("") + struct.pack("!hhh", 0, 0, 0))
            + msg(b"E", cstr(portal) + struct.pack("!i", 0)))


def kinds(got: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [k for k, _ in got]


def count(r: Raw, table: str) -> int:
    r.send(msg(b"Q", cstr(f"SELECT count(*) FROM {table}")))
    rows = [body for kind, body in r.until(b"Z") if kind == b"D"]
    assert len(rows) == 1
    return int(rows[0][6:])


@pytest.fixture
def raw():
    """raw(srv): a started raw client, closed after the test whatever its outcome."""
    opened: list[Raw] = []

    def open_(srv) -> Raw:
        r = Raw(srv.port)
        opened.append(r)
        r.startup()
        return r

    yield open_
    for r in opened:
        r.close()

def prepared(srv, raw) -> tuple[Raw, Raw]:
    """A session with tables sink and k (k holds 1), and a second one to look from."""
    r = raw(srv)
    r.send(msg(b"Q", cstr("CREATE TABLE sink (a BIGINT); CREATE TABLE k (a INTEGER PRIMARY KEY);"
                          " INSERT INTO k VALUES (1)")))
    assert r.until(b"Z")[-1] == (b"Z", b"I")
    return r, raw(srv)


def test_sqlite_a_failing_execute_rolls_back_the_pipeline(start_server, sqlite_engine,
                                                           raw) -> None:
    srv = start_server(sqlite_engine, secure=False)
    r, other = prepared(srv, raw)
    r.send(execute("INSERT INTO sink VALUES (1)") + execute("INSERT INTO k VALUES (1)")
           + execute("INSERT INTO sink VALUES (2)") + SYNC)
    got = r.until(b"Z")
    # the third is discarded: no ParseComplete, BindComplete or CommandComplete for it
    assert kinds(got) == [b"1", b"2", b"C", b"1", b"2", b"E", b"Z"]
    assert sqlstate(got[5][1]) == "23505"
    assert got[-1] == (b"Z", b"I")  # rolled back: no transaction left open
    assert count(r, "sink") == 0 and count(other, "sink") == 0
    assert count(r, "k") == 1
    # the session goes on: the next pipeline is a new implicit transaction
    r.send(execute("INSERT INTO sink VALUES (3)") + execute("INSERT INTO k VALUES (3)") + SYNC)
    assert r.until(b"Z")[-1] == (b"Z", b"I")
    assert count(other, "sink") == 1 and count(other, "k") == 2


def test_sqlite_sync_commits_the_pipeline(start_server, sqlite_engine, raw) -> None:
    srv = start_server(sqlite_engine, secure=False)
    r, other = prepared(srv, raw)
    r.send(execute("INSERT INTO sink VALUES (1)") + execute("INSERT INTO sink VALUES (2)")
           + FLUSH)
    got = r.until(b"C")
    got += r.until(b"C")
    assert kinds(got) == [b"1", b"2", b"C", b"1", b"2", b"C"]
    assert count(other, "sink") == 0  # both ran, neither committed before the Sync
    r.send(SYNC)
    assert r.until(b"Z") == [(b"Z", b"I")]
    assert count(other, "sink") == 2


def test_sqlite_a_lone_execute_commits_at_its_sync(start_server, sqlite_engine, raw) -> None:
    srv = start_server(sqlite_engine, secure=False)
    r, other = prepared(srv, raw)
    r.send(execute("INSERT INTO sink VALUES (1)") + SYNC)
    assert kinds(r.until(b"Z")) == [b"1", b"2", b"C", b"Z"]
    assert count(other, "sink") == 1
    # an Execute whose Sync comes in a later packet: committed when the Sync arrives
    r.send(execute("INSERT INTO sink VALUES (2)") + FLUSH)
    assert kinds(r.until(b"C")) == [b"1", b"2", b"C"]
    r.send(SYNC)
    assert r.until(b"Z") == [(b"Z", b"I")]
    assert count(other, "sink") == 2


def test_sqlite_begin_in_a_pipeline_keeps_its_transaction_open(start_server, sqlite_engine,
                                                                raw) -> None:
    srv = start_server(sqlite_engine, secure=False)
    r, other = prepared(srv, raw)
    r.send(execute("INSERT INTO sink VALUES (1)") + execute("BEGIN")
           + execute("INSERT INTO sink VALUES (2)") + SYNC)
    got = r.until(b"Z")
    assert b"E" not in kinds(got)
    assert got[-1] == (b"Z", b"T")  # the explicit transaction stays open after Sync
    assert count(other, "sink") == 0
    # the statement before BEGIN joined it: ROLLBACK undoes both, as in PostgreSQL
    r.send(msg(b"Q", cstr("ROLLBACK")))
    assert r.until(b"Z")[-1] == (b"Z", b"I")
    assert count(other, "sink") == 0
    # an error inside the explicit transaction leaves it open and failed after Sync
    r.send(execute("BEGIN") + execute("INSERT INTO sink VALUES (3)")
           + execute("INSERT INTO k VALUES (1)") + SYNC)
    assert r.until(b"Z")[-1] == (b"Z", b"E")
    r.send(msg(b"Q", cstr("COMMIT")))
    got = r.until(b"Z")
    assert (b"C", cstr("ROLLBACK")) in got and got[-1] == (b"Z", b"I")
    # COMMIT in a pipeline ends its implicit transaction there
    r.send(execute("INSERT INTO sink VALUES (4)") + execute("COMMIT")
           + execute("INSERT INTO k VALUES (1)") + SYNC)
    got = r.until(b"Z")
    assert sqlstate(next(b for k, b in got if k == b"E")) == "23505"
    assert got[-1] == (b"Z", b"I")
    assert count(other, "sink") == 1


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_an_error_discards_the_messages_until_sync(start_server, request, engine,
                                                   raw) -> None:
    srv = start_server(request.getfixturevalue(engine), secure=False)
    r = raw(srv)
    r.send(msg(b"Q", cstr("CREATE TABLE sink (a BIGINT)")))
    r.until(b"Z")
    r.send(execute("INSERT INTO sink VALUES (1)") + execute("INSERT INTO nosuch VALUES (1)")
           + execute("INSERT INTO sink VALUES (2)") + SYNC)
    got = r.until(b"Z")
    assert kinds(got) == [b"1", b"2", b"C", b"1", b"2", b"E", b"Z"]  # nothing for the 3rd
    assert got[-1] == (b"Z", b"I")
    # the analytical engine has no transactions: the first INSERT stays; SQLite undoes it
    assert count(r, "sink") == (1 if engine == "analytical" else 0)


def _psycopg_setup(srv) -> None:
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        for st in ["CREATE TABLE sink (a BIGINT)", "CREATE TABLE secret (s VARCHAR)",
                   "CREATE TABLE pos (a BIGINT CHECK (a > 0))",
                   "CREATE USER bob PASSWORD 'bob pw'", "GRANT INSERT ON sink TO bob",
                   "GRANT INSERT ON pos TO bob"]:
            admin.execute(st)


def _sink(srv) -> list[tuple[int]]:
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        return admin.execute("SELECT a FROM sink ORDER BY a").fetchall()


def test_sqlite_psycopg_pipeline_is_one_transaction(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    _psycopg_setup(srv)
    bob_dsn = {**srv.dsn, "user": "bob", "password": "bob pw"}
    with psycopg.connect(**bob_dsn, autocommit=True) as bob:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with bob.pipeline():
                bob.execute("INSERT INTO sink VALUES (%s)", [1])
                bob.execute("INSERT INTO secret VALUES (%s)", ["x"])  # denied
        assert bob.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert _sink(srv) == []
        with bob.pipeline():
            bob.execute("INSERT INTO sink VALUES (%s)", [1])
            bob.execute("INSERT INTO sink VALUES (%s)", [2])
        assert _sink(srv) == [(1,), (2,)]
        # executemany sends its statements in one pipeline: all of them or none
        with pytest.raises(psycopg.errors.IntegrityError):
            bob.cursor().executemany("INSERT INTO pos VALUES (%s)", [(3,), (4,), (-1,)])
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM pos").fetchone() == (0,)
