"""A COMMIT with changes to users on `cryptdisk serve --sqlite` commits them with its data in
two phases (a record in the database's transaction, then the user file): kill -9 between
the two keeps both, kill -9 before the data's commit keeps neither, with one process or
with workers; the user file stays locked from the COMMIT's check to its save, so a change
from another worker waits instead of breaking the COMMIT. The kill points come from the
server's own report: started through ``tests/server/stopping_serve.py``, the child prints
the point of the COMMIT it reached and stops itself there."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cryptdisk import Keyring
from cryptdisk.server._engines import USERS_JOURNAL
from cryptdisk.sqlite import connect as sqlite_connect
from tests.server.certs import sqlite_serve_config
from tests.server.test_workers import connections_in_workers

KEY_HEX = "ab" * 32
STOPPING_SERVE = Path(__file__).with_name("stopping_serve.py")


class Serve:
    """`cryptdisk serve --sqlite` in a process of its own; ``stop_at``: it stops itself at that
    point of a COMMIT with user changes (:mod:`tests.server.stopping_serve`)."""

    def __init__(self, root: Path, *, workers: str = "1", stop_at: str | None = None,
                 fresh: bool = True) -> None:
        if fresh:
            self.ca, _cert, self.config = sqlite_serve_config(root, "c.toml", KEY_HEX)
            subprocess.run([sys.executable, "-m", "cryptdisk", "serve", str(root / "app.db"),
                            "--sqlite", "--config", str(self.config), "--add-user", "u",
                            "--admin"], env={**os.environ, "CRYPTDISK_PASSWORD": "pw"},
                           check=True, capture_output=True, timeout=120)
        else:
            self.ca, self.config = root / "tls" / "ca.pem", root / "c.toml"
        self.db = str(root / "app.db")
        launch = [sys.executable, "-m", "cryptdisk"] if stop_at is None else \
            [sys.executable, str(STOPPING_SERVE), stop_at]
        self.proc = subprocess.Popen(
            [*launch, "serve", self.db, "--sqlite", "--config", str(self.config), "--listen",
             "127.0.0.1:0", "--workers", workers],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"on 127\.0\.0\.1:(\d+)", line)
        assert m, line
        self.port = int(m[1])
        self.stops: queue.Queue[int] = queue.Queue()
        self.reader = threading.Thread(target=self._stderr, daemon=True)
        self.reader.start()

    def _stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # drained, so the server never blocks writing its log
            m = re.match(r"users-commit: \S+ pid (\d+)", line)
            if m:
                self.stops.put(int(m[1]))

    def connect(self, user: str = "u", password: str = "pw") -> psycopg.Connection:
        return psycopg.connect(host="localhost", port=self.port, user=user, password=password,
                               dbname="app", sslmode="verify-full", sslrootcert=str(self.ca),
                               autocommit=True)

    def commit_until_stopped(self, conn: psycopg.Connection, statements: list[str]) -> int:
        """Run ``statements`` in a transaction on ``conn`` and COMMIT it (in a thread) until
        the server reports it stopped at its hook; the pid of the process that stopped."""
        conn.execute("BEGIN")
        for st in statements:
            conn.execute(st)
        done: list[Any] = []

        def commit() -> None:
            try:
                conn.execute("COMMIT")
                done.append("ok")
            except Exception as exc:
                done.append(exc)

        self.committer = threading.Thread(target=commit, daemon=True)
        self.committer.start()
        self.commit_outcome = done
        return self.stops.get(timeout=120)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(60)
        self.reader.join(60)  # EOF once every process holding the pipe is gone
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None and not self.reader.is_alive():
                pipe.close()


@pytest.fixture
def servers() -> Any:
    started: list[Serve] = []
    yield started
    for s in started:
        workers = _children(s.proc.pid)
        if s.proc.poll() is None:
            s.proc.kill()
        for pid in workers:  # never leave a worker behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        s.kill()


def _setup(s: Serve) -> None:
    with s.connect() as admin:
        admin.execute("CREATE TABLE t (a INTEGER)")
        admin.execute("CREATE ROLE readers")
        admin.execute("GRANT SELECT ON t TO readers")
        admin.execute("CREATE USER bob PASSWORD 'bob pw'")


CHANGE = ["INSERT INTO t VALUES (42)", "CREATE USER carol PASSWORD 'carol pw'",
          "GRANT readers TO carol"]


def _carol_reads(s: Serve) -> list[tuple[Any, ...]] | None:
    try:
        with s.connect("carol", "carol pw") as carol:
            return carol.execute("SELECT a FROM t").fetchall()
    except psycopg.OperationalError:
        return None  # no such user (the same message as a wrong password)


@pytest.mark.parametrize(("point", "kept"), [("after-data-commit", True),
                                             ("before-data-commit", False)])
def test_kill_9_in_a_commit_keeps_both_or_neither(tmp_path: Path, servers: list[Serve],
                                                   point: str, kept: bool) -> None:
    s = Serve(tmp_path, stop_at=point)
    servers.append(s)
    _setup(s)
    admin = s.connect()
    pid = s.commit_until_stopped(admin, CHANGE)
    assert pid == s.proc.pid  # one process: the server itself stopped there
    s.kill()
    s.committer.join(60)
    assert s.commit_outcome != ["ok"]  # the COMMIT was never acknowledged
    admin.close()
    again = Serve(tmp_path, fresh=False)
    servers.append(again)
    with again.connect() as admin:
        rows = admin.execute("SELECT a FROM t").fetchall()
        users = {r[0] for r in admin.execute("SELECT * FROM system.users")}
    if kept:
        assert rows == [(42,)]
        assert "carol" in users
        assert _carol_reads(again) == [(42,)]
    else:
        assert rows == []
        assert "carol" not in users
        assert _carol_reads(again) is None
    assert "bob" in users


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "--ppid", str(pid), "-o", "pid="], capture_output=True,
                         text=True).stdout
    return {int(x) for x in out.split()}


def _wait_gone(pid: int) -> None:
    """Until the supervisor reaped ``pid``: all its threads are gone, its locks with them
    (a zombie's other threads may still hold its files)."""
    deadline = time.monotonic() + 60  # a bound on the wait, not a timing assertion
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} did not exit")


def _in_two_workers(s: Serve) -> list[psycopg.Connection]:
    """A connection in each of the two workers, connecting until both have answered."""
    return connections_in_workers(s.connect, 2)


def test_a_worker_killed_between_the_two_writes_loses_no_user_change(
        tmp_path: Path, servers: list[Serve]) -> None:
    s = Serve(tmp_path, workers="2", stop_at="after-data-commit")
    servers.append(s)
    _setup(s)
    first, other = _in_two_workers(s)
    pid = s.commit_until_stopped(first, CHANGE)
    assert pid in _children(s.proc.pid)  # a worker
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)
    # the other worker reads the change in (the record, newer than the user file) at once
    users = {r[0] for r in other.execute("SELECT * FROM system.users")}
    assert "carol" in users
    assert other.execute("SELECT a FROM t").fetchall() == [(42,)]
    deadline = time.monotonic() + 60  # a bound on the wait, not a timing assertion
    while (found := _carol_reads(s)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert found == [(42,)]
    other.close()


def test_a_change_from_another_worker_waits_for_a_commit_in_progress(
        tmp_path: Path, servers: list[Serve]) -> None:
    s = Serve(tmp_path, workers="2", stop_at="before-data-commit")
    servers.append(s)
    _setup(s)
    first, other = _in_two_workers(s)
    pid = s.commit_until_stopped(first, ["INSERT INTO t VALUES (7)", "GRANT readers TO bob"])
    dropped: list[Any] = []

    def drop() -> None:
        try:
            other.execute("DROP ROLE readers")
            dropped.append("ok")
        except Exception as exc:
            dropped.append(exc)

    dropper = threading.Thread(target=drop, daemon=True)
    dropper.start()
    dropper.join(2)
    assert dropper.is_alive() and dropped == []  # it waits for the user file
    os.kill(pid, signal.SIGCONT)
    s.committer.join(120)
    dropper.join(120)
    assert s.commit_outcome == ["ok"]  # the COMMIT checked, committed and saved as one
    assert dropped == ["ok"]
    with s.connect() as admin:
        assert admin.execute("SELECT a FROM t").fetchall() == [(7,)]
        assert "readers" not in {r[0] for r in admin.execute("SELECT * FROM system.roles")}
    first.close()
    other.close()


def test_the_record_is_hidden_from_clients_and_holds_no_password(
        tmp_path: Path, servers: list[Serve]) -> None:
    s = Serve(tmp_path)
    servers.append(s)
    _setup(s)
    with s.connect() as admin:
        admin.execute("BEGIN")
        admin.execute("CREATE USER dave PASSWORD 'dave secret pw'")
        admin.execute("COMMIT")
        for sql in [f"SELECT * FROM {USERS_JOURNAL}", f"DELETE FROM {USERS_JOURNAL}",
                    f"DROP TABLE {USERS_JOURNAL}", f"ALTER TABLE {USERS_JOURNAL} ADD x INT",
                    f"CREATE INDEX i ON {USERS_JOURNAL} (serial)",
                    f"PRAGMA table_info({USERS_JOURNAL})"]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                admin.execute(sql)
        admin.execute(f"CREATE VIEW v AS SELECT * FROM {USERS_JOURNAL}")  # checked when used
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            admin.execute("SELECT * FROM v")
        tables = {r[0] for r in admin.execute(
            "SELECT table_name FROM information_schema.tables")}
        assert "t" in tables and USERS_JOURNAL not in tables
        assert USERS_JOURNAL not in {r[0] for r in admin.execute(
            "SELECT table_name FROM information_schema.columns")}
    s.kill()
    keyring = Keyring.from_config(str(tmp_path / "c.toml"))
    db = sqlite_connect(s.db, keyring=keyring)
    try:
        ((serial, text),) = list(db.execute(f"SELECT serial, users FROM {USERS_JOURNAL}"))
    finally:
        db.close()
    assert b"dave" in text and b"dave secret pw" not in text  # verifiers, as in the file
    assert serial >= 1


def test_a_plaintext_database_never_gets_the_record(tmp_path: Path) -> None:
    """The unencrypted SQLite the benchmarks serve must not hold verifiers: the record of
    committed user changes goes only into an encrypted database."""
    from cryptdisk.keys import Key
    from cryptdisk.server import SQLiteEngine
    from cryptdisk.server._users import UserStore

    engine = SQLiteEngine(tmp_path / "p.db", None, plaintext=True)
    store = UserStore(tmp_path / "users", Keyring([Key(1, bytes(range(32)))]),
                      iterations=4096, journal=engine.read_users_record)
    session = engine.open_session()
    session.run("CREATE TABLE t (a INTEGER)", [])
    session.run("BEGIN", [])
    session.run("INSERT INTO t VALUES (1)", [])
    session.commit_users(store, [("set_user", ("erin", "erin secret pw"), {"create": True})])
    session.close()
    assert store.exists("erin") and UserStore(tmp_path / "users", store.keyring).exists("erin")
    raw = (tmp_path / "p.db").read_bytes() + b"".join(
        p.read_bytes() for p in tmp_path.glob("p.db-*"))
    assert b"erin" not in raw and USERS_JOURNAL.encode() not in raw


def test_no_test_hook_in_the_product() -> None:
    """The crash points above are the test's own patch in the child it starts
    (:mod:`tests.server.stopping_serve`): the product reads no test switch from its
    environment."""
    import cryptdisk

    src = Path(cryptdisk.__file__).parent
    hooks = [str(p.relative_to(src)) for p in src.rglob("*.py")
             if "CRYPTDISK_TEST" in p.read_text(encoding="utf-8")]
    assert hooks == []
