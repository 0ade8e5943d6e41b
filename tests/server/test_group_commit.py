"""Group commit (WAL mode): sessions run with synchronous=NORMAL and sync the WAL after each
commit, one fdatasync shared by the commits that wait for it; checkpoints still run."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cryptdisk.keys import Key, Keyring
from cryptdisk.server import SQLiteEngine
from cryptdisk.server._groupsync import GroupSync


def _engine(tmp_path: Any, journal: str, encrypted: bool = False) -> SQLiteEngine:
    path = str(tmp_path / "g.db")
    keyring = Keyring([Key(1, b"\x07" * 32)]) if encrypted else None
    engine = SQLiteEngine(path, keyring, plaintext=not encrypted)
    session = engine.open_session()
    session.run(f"PRAGMA journal_mode={journal}", [])
    session.run("CREATE TABLE t (a INTEGER PRIMARY KEY, b BLOB)", [])
    session.close()
    return engine


def _counts(engine: SQLiteEngine) -> tuple[int, int]:
    """(started, completed) in the memory the server's processes share."""
    shared = engine.group_sync._shared
    return int(shared[0]), int(shared[1])


@pytest.mark.parametrize("encrypted", [False, True])
def test_wal_sessions_sync_every_commit_themselves(tmp_path: Any, encrypted: bool) -> None:
    engine = _engine(tmp_path, "wal", encrypted)
    session = engine.open_session()
    assert session.run("PRAGMA synchronous", []).rows == [(1,)]  # NORMAL: not in the lock
    before = engine.group_sync.counts()
    for i in range(5):  # one writer, one after the other: each commit waits for a sync of its own
        session.run("BEGIN IMMEDIATE", [])
        session.run("INSERT INTO t VALUES ($1, $2)", [i, b"x"])
        session.run("COMMIT", [])
    session.run("INSERT INTO t VALUES (99, x'00')", [])  # autocommit
    session.run("SELECT * FROM t", [])  # a read commits nothing: no sync
    started, completed = _counts(engine)
    assert (started - before[0], completed - before[1]) == (6, 6)
    session.close()
    engine.close()


def test_a_rollback_journal_database_keeps_sqlite_syncing(tmp_path: Any) -> None:
    engine = _engine(tmp_path, "delete")
    session = engine.open_session()
    assert session.run("PRAGMA synchronous", []).rows == [(2,)]  # FULL, SQLite's default
    session.run("INSERT INTO t VALUES (1, x'00')", [])
    assert not os.path.exists(engine.path + ".sync-lock")
    session.close()
    engine.close()


def test_checkpoints_still_run_and_the_wal_restarts(tmp_path: Any) -> None:
    engine = _engine(tmp_path, "wal")
    session = engine.open_session()
    blob = os.urandom(100_000)  # 25 pages a commit: 100 commits, 2,500 pages of WAL
    for i in range(100):
        session.run("INSERT INTO t VALUES ($1, $2)", [i, blob])
    # checkpointed at 1,000 pages (SQLite's wal_autocheckpoint), then written from the start
    assert os.path.getsize(engine.path) > 5_000_000
    assert os.path.getsize(engine.path + "-wal") < 5_000_000
    session.close()
    engine.close()


def _group_sync(tmp_path: Any) -> tuple[GroupSync, str]:
    """A GroupSync with its counters file made, and a WAL with frames to sync."""
    wal = str(tmp_path / "w")
    with open(wal, "wb") as f:
        f.write(b"frames")
    gs = GroupSync(str(tmp_path / "d"))
    gs.counts()
    return gs, wal


@contextlib.contextmanager
def _holding(gs: GroupSync) -> Iterator[Any]:
    """Play another process forked from the server: hold the sync lock, with the counters
    (started, completed) it shares; released at the end."""
    fd = os.open(gs.path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield gs._shared[:2]
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _waiting(gs: GroupSync, wal: str) -> threading.Thread:
    thread = threading.Thread(target=gs.sync, args=(wal,))
    thread.start()
    deadline = time.monotonic() + 10
    while not gs._thread.locked():  # it has read its ticket and waits for the file's lock
        assert time.monotonic() < deadline
        time.sleep(0.001)
    return thread


def test_a_sync_begun_after_the_commit_serves_it(tmp_path: Any) -> None:
    gs, wal = _group_sync(tmp_path)
    with _holding(gs) as counts:
        thread = _waiting(gs, wal)
        counts[0] += 1  # another process syncs, begun after the waiter's frames were written
        counts[1] = counts[0]
    thread.join(10)
    assert gs.counts() == (1, 1)  # the waiter returned without a sync of its own


def test_a_sync_begun_before_the_commit_does_not_serve_it(tmp_path: Any) -> None:
    gs, wal = _group_sync(tmp_path)
    with _holding(gs) as counts:
        counts[0] += 1  # another process's sync is under way before the frames were written
        thread = _waiting(gs, wal)
        counts[1] = counts[0]
    thread.join(10)
    assert gs.counts() == (2, 2)  # so the waiter synced itself


def test_the_counters_file_holds_nothing_and_a_replaced_one_is_not_shared(
        tmp_path: Any, caplog: Any) -> None:
    """The counters live in memory the server's processes share; ``.sync-lock`` is only
    locked, so truncating it changes nothing. A process that finds another file at the
    path than the one the others lock (deleted, replaced) counts alone, and says so:
    counters shared under two locks could lose a count."""
    gs, wal = _group_sync(tmp_path)
    gs.sync(wal)
    assert os.path.getsize(gs.path) == 0 and gs.counts() == (1, 1)
    with open(gs.path, "wb") as f:
        f.write(b"\xff" * 3)  # damaged: not read
    gs.sync(wal)
    assert gs.counts() == (2, 2)
    gs.close()  # (this process opens the file again at its next sync)
    other = os.open(gs.path, os.O_RDONLY)  # another process still has the first file
    os.unlink(gs.path)
    with caplog.at_level("ERROR", logger="cryptdisk.server"):
        gs.sync(wal)
    os.close(other)
    assert "not the file the server's other processes lock" in caplog.text
    assert gs.counts() == (1, 1)  # its own
    assert (int(gs._shared[0]), int(gs._shared[1])) == (2, 2)  # the others' untouched
    gs.close()


def test_a_failed_sync_fails_the_statement(tmp_path: Any, monkeypatch: Any) -> None:
    engine = _engine(tmp_path, "wal")
    session = engine.open_session()

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(Exception, match="committed but could not be made durable") as info:
        session.run("INSERT INTO t VALUES (1, x'00')", [])
    assert getattr(info.value, "sqlstate", None) == "58030"
    monkeypatch.undo()
    # the queue was released and the session goes on
    session.run("BEGIN IMMEDIATE", [])
    session.run("INSERT INTO t VALUES (2, x'00')", [])
    session.run("COMMIT", [])
    assert session.run("SELECT count(*) FROM t", []).rows == [(2,)]
    session.close()
    engine.close()


def test_close_lets_go_of_the_counters_file(tmp_path: Any) -> None:
    """GroupSync.close closed the kept WALs' descriptors but not the counters file's
    (``.sync-lock``): every engine opened and closed in a process left one descriptor of
    it open. Now close lets go of it, and a later sync opens it again."""
    def open_files() -> set[str]:
        return {os.readlink(f"/proc/self/fd/{n}") for n in os.listdir("/proc/self/fd")
                if os.path.exists(f"/proc/self/fd/{n}")}

    gs, wal = _group_sync(tmp_path)
    gs.sync(wal)
    assert gs.path in open_files()
    gs.close()
    assert gs.path not in open_files() and wal not in open_files()
    gs.sync(wal)  # opened again
    assert gs.counts() == (2, 2)
    gs.close()
    engine = _engine(tmp_path, "wal")
    session = engine.open_session()
    session.run("INSERT INTO t VALUES (1, x'00')", [])
    session.close()
    engine.close()
    assert engine.path + ".sync-lock" not in open_files()


_DIES_DURING_A_SYNC = """
from cryptdisk.server._groupsync import GroupSync
sync = GroupSync(sys.argv[1])
sync._wal_fd = lambda wal: fork_and_die()  # inside the sync, the counters' flock held
sync.sync(sys.argv[1] + "-wal")
"""


def test_a_forked_child_does_not_keep_the_sync_lock_of_a_dead_server(tmp_path: Any) -> None:
    """A WAL sync holds an flock of PATH.sync-lock. A process forked during a sync shared
    that open file: after the server died the child kept the flock, and every commit of
    the next server on the database waited for the child to exit. The child now closes
    its copy as it starts."""
    from tests.forked import child_of_a_dead_holder

    engine = _engine(tmp_path, "wal")
    engine.close()
    with child_of_a_dead_holder(_DIES_DURING_A_SYNC, engine.path):
        fd = os.open(engine.path + ".sync-lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError before
        finally:
            os.close(fd)
