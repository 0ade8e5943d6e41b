"""Writes in a transaction that holds the write lock (WAL mode) run on the event loop
(run_write_quick) when every earlier run of their text was short; anything else is left
for the session's thread, having done nothing."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from cryptdisk.server import SQLiteEngine

BUMP = "UPDATE t SET b = b + $1 WHERE a >= $2"
SQLITE_JOURNALS = ["wal"]  # the sqlite_engine fixture's (the server test below)


def _engine(tmp_path: Any, journal: str = "wal") -> SQLiteEngine:
    engine = SQLiteEngine(tmp_path / "w.db", None, plaintext=True)
    session = engine.open_session()
    session.run(f"PRAGMA journal_mode={journal}", [])
    session.run("CREATE TABLE t (a INTEGER PRIMARY KEY, b INTEGER)", [])
    session.run("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000)"
                " INSERT INTO t SELECT i, 0 FROM n", [])
    session.close()
    return engine


@contextlib.contextmanager
def _writing(tmp_path: Any, journal: str = "wal") -> Iterator[tuple[SQLiteEngine, Any]]:
    """(engine, session): the session holds the write lock (BEGIN IMMEDIATE) and has run
    BUMP once, short (row 5000's b is 1); both are closed at the end."""
    engine = _engine(tmp_path, journal)
    session = engine.open_session()
    session.run("BEGIN IMMEDIATE", [])
    session.run(BUMP, [1, 5000])
    try:
        yield engine, session
    finally:
        session.close()
        engine.close()


#: A write whose run time depends on its parameters: (2, 2, 2) is short, (2001, ...) long.
HEAVY = ("UPDATE t SET b = (SELECT count(*) FROM t AS x, t AS y, t AS z "
         "WHERE x.a < %s AND y.a < %s AND z.a < %s) WHERE a = 1")


def _two_thousand_rows(c: Any) -> None:
    """Table t of the server tests: rows 1..2000, b = 0."""
    c.execute("CREATE TABLE t (a INTEGER PRIMARY KEY, b INTEGER)")
    c.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
              "WHERE i < 2000) INSERT INTO t SELECT i, 0 FROM n")


def test_a_short_write_in_a_write_transaction_runs_at_once(tmp_path: Any) -> None:
    engine = _engine(tmp_path)
    session = engine.open_session()
    assert session.run_write_quick(BUMP, [1, 5000]) is None  # never run: unknown
    session.run("BEGIN IMMEDIATE", [])
    assert session.run_write_quick(BUMP, [1, 5000]) is None  # still unknown
    assert session.run(BUMP, [1, 5000]).tag == "UPDATE 1"  # on the thread: short
    result = session.run_write_quick(BUMP, [1, 4999])
    assert result is not None and result.tag == "UPDATE 2"
    session.run("COMMIT", [])
    assert session.run_write_quick(BUMP, [1, 5000]) is None  # no transaction, no lock held
    assert session.run("SELECT a, b FROM t WHERE a >= 4999", []).rows == [(4999, 1), (5000, 2)]
    session.close()
    engine.close()


def test_a_write_that_ran_long_stays_on_the_thread(tmp_path: Any) -> None:
    engine = _engine(tmp_path)
    session = engine.open_session()
    session.run("BEGIN IMMEDIATE", [])
    assert session.run(BUMP, [1, 1]).tag == "UPDATE 5000"  # over 20,000 VM steps
    assert session.run_write_quick(BUMP, [1, 5000]) is None
    session.run("ROLLBACK", [])
    session.close()
    engine.close()


def test_a_short_write_that_runs_long_finishes_and_goes_back_to_the_thread(
        tmp_path: Any) -> None:
    with _writing(tmp_path) as (_, session):
        result = session.run_write_quick(BUMP, [1, 1])  # long this time: never stopped midway
        assert result is not None and result.tag == "UPDATE 5000"
        assert session.in_transaction  # the transaction is whole
        assert session.run_write_quick(BUMP, [1, 5000]) is None  # from now on on the thread
        session.run("COMMIT", [])
        assert session.run("SELECT sum(b) FROM t", []).rows == [(5001,)]


@pytest.mark.parametrize("journal", ["delete", "truncate"])
def test_only_in_wal_mode(tmp_path: Any, journal: str) -> None:
    # with a rollback journal a writer may wait for readers (to spill its cache): never
    # on the event loop
    with _writing(tmp_path, journal) as (_, session):
        assert session.run_write_quick(BUMP, [1, 5000]) is None
        session.run("ROLLBACK", [])


def test_a_commit_releases_the_lock_at_once_and_syncs_later(tmp_path: Any) -> None:
    engine = _engine(tmp_path)
    session, other = engine.open_session(), engine.open_session()
    assert not session.commit_quick()  # no transaction
    session.run("BEGIN IMMEDIATE", [])
    session.run(BUMP, [1, 5000])
    synced = engine.group_sync.counts()
    assert session.commit_quick()
    assert not session.in_transaction
    other.run("BEGIN IMMEDIATE", [])  # the write lock is free before the sync
    assert engine.group_sync.counts() == synced  # no sync yet: the client is not told yet
    session.finish_commit()
    assert engine.group_sync.counts()[1] == synced[1] + 1
    other.run("ROLLBACK", [])
    assert session.run("SELECT b FROM t WHERE a = 5000", []).rows == [(1,)]
    session.close()
    other.close()
    engine.close()


def test_a_commit_that_makes_a_checkpoint_due_keeps_the_lock_until_it_ran(
        tmp_path: Any) -> None:
    engine = _engine(tmp_path)
    session = engine.open_session()
    session.run("BEGIN IMMEDIATE", [])
    session.run("CREATE TABLE big (x BLOB)", [])
    session.run("INSERT INTO big VALUES (randomblob(5000000))", [])  # 1,200 pages of WAL
    assert session.commit_quick()
    assert session.writing  # the checkpoint runs before the next writer starts
    session.finish_commit()
    assert not session.writing
    assert os.path.getsize(engine.path) > 5_000_000  # checkpointed
    session.close()
    engine.close()


def test_no_quick_commit_with_a_rollback_journal(tmp_path: Any) -> None:
    with _writing(tmp_path, "delete") as (_, session):
        assert not session.commit_quick()  # SQLite syncs inside COMMIT: on the thread
        session.run("COMMIT", [])


def test_a_short_write_that_runs_past_its_deadline_is_stopped(tmp_path: Any) -> None:
    import time

    from cryptdisk.server._engines import StatementError

    with _writing(tmp_path) as (engine, session):
        with pytest.raises(StatementError) as e:  # long this time, past the statement timeout
            session.run_write_quick(BUMP, [1, 1], time.monotonic() - 1)
        assert e.value.sqlstate == "57014"
        # SQLite rolls back the whole transaction when a write is interrupted, and the write
        # lock goes with it (the server's session answers 25P02 until ROLLBACK)
        assert not session.in_transaction and not session.writing
        other = engine.open_session()
        other.run("BEGIN IMMEDIATE", [])  # the lock is free
        other.run("ROLLBACK", [])
        other.close()
        assert session.run("SELECT sum(b) FROM t", []).rows == [(0,)]
        session.run("BEGIN IMMEDIATE", [])
        assert session.run_write_quick(BUMP, [1, 5000], time.monotonic() + 60) is None
        session.run("ROLLBACK", [])


def test_the_statement_timeout_stops_a_write_on_the_event_loop(start_server,
                                                               sqlite_engine) -> None:
    """A write whose earlier runs were short runs on the event loop, where no timer can
    fire: it stops itself at the statement timeout, and the transaction fails as it would
    in PostgreSQL."""
    import time

    import psycopg

    srv = start_server(sqlite_engine, statement_timeout=0.5)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        _two_thousand_rows(c)
        c.execute("BEGIN")
        c.execute("UPDATE t SET b = 1 WHERE a = 2")  # holds the write lock
        c.execute(HEAVY, (2, 2, 2))  # short: learnt as such
        assert c.execute("SELECT b FROM t WHERE a = 1").fetchone() == (1,)
        began = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            c.execute(HEAVY, (2001, 2001, 2001))  # 8e9 rows: long this time
        assert time.monotonic() - began < 30
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            c.execute("SELECT 1")
        c.execute("ROLLBACK")
        assert c.execute("SELECT sum(b) FROM t").fetchone() == (0,)


def test_a_transaction_sqlite_rolled_back_is_a_failed_block(start_server,
                                                            sqlite_engine) -> None:
    """A write stopped by the statement timeout on the session's thread: SQLite rolls
    back the whole transaction; later statements fail with 25P02 until ROLLBACK rather than
    running on their own in autocommit."""
    import psycopg

    srv = start_server(sqlite_engine, statement_timeout=0.5)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        _two_thousand_rows(c)
        c.execute("BEGIN")
        c.execute("UPDATE t SET b = 1 WHERE a = 2")
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            c.execute(HEAVY, (2001, 2001, 2001))  # never run before: on the thread
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            c.execute("UPDATE t SET b = 5 WHERE a = 3")
        assert c.execute("COMMIT").statusmessage == "ROLLBACK"
        assert c.execute("SELECT sum(b) FROM t").fetchone() == (0,)
        c.execute("UPDATE t SET b = 7 WHERE a = 4")  # out of the block: runs again
        assert c.execute("SELECT sum(b) FROM t").fetchone() == (7,)
