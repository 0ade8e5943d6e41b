"""Reads that finish at once run on the event loop (run_quick); anything else is left for
the session's thread, having done nothing."""

from __future__ import annotations

import threading
from typing import Any

import apsw
import pytest

from cryptdisk.errors import ServerError
from cryptdisk.server import SQLiteEngine

ENDLESS = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) "
           "SELECT count(*) FROM n")


@pytest.fixture
def engine(tmp_path: Any) -> SQLiteEngine:
    engine = SQLiteEngine(tmp_path / "p.db", None, plaintext=True, busy_timeout_ms=30000)
    session = engine.open_session()
    session.run("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT)", [])
    session.run("INSERT INTO t VALUES (1, 'one'), (2, 'two')", [])
    session.close()
    return engine


def test_a_point_read_runs_at_once(engine: SQLiteEngine) -> None:
    session = engine.open_session()
    result = session.run_quick("SELECT b FROM t WHERE a = $1", [2])
    assert result is not None and result.rows == [("two",)] and result.tag == "SELECT 1"
    assert result.columns == [("b", 25)]
    with pytest.raises(ServerError, match="no such table"):  # errors are errors
        session.run_quick("SELECT * FROM nope", [])


def test_a_long_read_is_left_for_the_thread(engine: SQLiteEngine) -> None:
    session = engine.open_session()
    assert session.run_quick("SELECT count(*) FROM (WITH RECURSIVE n(i) AS (SELECT 1 UNION "
                             "ALL SELECT i + 1 FROM n LIMIT 1000000) SELECT i FROM n)",
                             []) is None
    # the progress handler only stops quick runs: the same statement runs in full
    assert session.run("SELECT count(*) FROM (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL "
                       "SELECT i + 1 FROM n LIMIT 1000000) SELECT i FROM n)",
                       []).rows == [(1000000,)]
    # and a cancel still stops what runs on the thread
    worker_errors: list[BaseException] = []

    def endless() -> None:
        try:
            session.run(ENDLESS, [])
        except BaseException as exc:
            worker_errors.append(exc)

    worker = threading.Thread(target=endless)
    worker.start()
    while worker.is_alive():
        session.interrupt()
        worker.join(0.05)
    assert len(worker_errors) == 1 and getattr(worker_errors[0], "sqlstate", "") == "57014"


def test_a_read_that_would_wait_for_a_lock_is_left_for_the_thread(
        engine: SQLiteEngine) -> None:
    session = engine.open_session()
    other = apsw.Connection(engine.path)
    other.execute("BEGIN EXCLUSIVE")  # rollback journal: readers wait for this lock
    other.execute("UPDATE t SET b = 'deux' WHERE a = 2")
    assert session.run_quick("SELECT b FROM t WHERE a = 2", []) is None
    found: list[Any] = []
    # on the thread it waits (the busy timeout is back) and sees the committed change
    worker = threading.Thread(target=lambda: found.append(
        session.run("SELECT b FROM t WHERE a = 2", []).rows))
    worker.start()
    worker.join(0.3)
    other.execute("COMMIT")
    worker.join()
    assert found == [[("deux",)]]
    other.close()
    session.close()
