"""The small files a real `cryptdisk serve --sqlite` shares between its processes
(``USERS.lock``, ``PATH.write-lock``, ``PATH.sync-lock``, the workers' failed-login table)
truncated while it runs, or damaged before it starts: the server goes on serving, every
statement answers, and no process dies (a file mapped into memory and then truncated kills
the process touching it with SIGBUS: no error, no log line, every session lost)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.server.certs import sqlite_serve_config
from tests.server.test_workers import _alive, _children, connections_in_workers


class Serve:
    """``cryptdisk serve app.db --sqlite --workers N`` with user ``u`` (an admin), its stderr
    in ``root/serve.err``."""

    def __init__(self, root: Path, workers: int = 1, env: dict[str, str] | None = None,
                 prepare: Any = None) -> None:
        self.root = root
        self.ca, _cert, self.config = sqlite_serve_config(root, "c.toml", "cd" * 32)
        self.db = str(root / "app.db")
        run_env = {**os.environ, "CRYPTDISK_PASSWORD": "pw"}
        subprocess.run([sys.executable, "-m", "cryptdisk", "serve", self.db, "--sqlite",
                        "--config", str(self.config), "--add-user", "u", "--admin"],
                       env=run_env, check=True, capture_output=True, timeout=120)
        if prepare is not None:
            prepare(self)
        self.err = open(root / "serve.err", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cryptdisk", "serve", self.db, "--sqlite", "--config",
             str(self.config), "--listen", "127.0.0.1:0", "--workers", str(workers)],
            stdout=subprocess.PIPE, stderr=self.err, text=True, cwd=root,
            env={**os.environ, **(env or {})})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"on 127\.0\.0\.1:(\d+)", line)
        assert m, (line, self.errors())
        self.port = int(m[1])

    def connect(self, user: str = "u", password: str = "pw", **kw: Any) -> psycopg.Connection:
        return psycopg.connect(host="localhost", port=self.port, user=user, password=password,
                               dbname="app", sslmode="verify-full", sslrootcert=str(self.ca),
                               autocommit=True, connect_timeout=30, **kw)

    def errors(self) -> str:
        self.err.flush()
        return Path(self.err.name).read_text()

    def alive(self) -> None:
        """The server process is still running (a SIGBUS would have ended it: -7)."""
        assert self.proc.poll() is None, (self.proc.returncode, self.errors())

    def close(self) -> None:
        workers = _children(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(60)
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.err.close()


@pytest.fixture
def serve(tmp_path: Path) -> Any:
    started: list[Serve] = []

    def start(**kw: Any) -> Serve:
        s = Serve(tmp_path, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


def _truncate(path: str, size: int = 0) -> None:
    assert os.path.exists(path), path
    os.truncate(path, size)


@pytest.mark.parametrize("size", [0, 3])
def test_the_user_change_counter_truncated_while_serving(serve: Any, size: int) -> None:
    """``USERS.lock`` holds the count of user changes every process reads before each
    statement: truncated, the next statement still runs, a user change still reaches every
    process, and the counter is whole again."""
    s = serve()
    conn = s.connect()
    assert conn.execute("SELECT 1").fetchone() == (1,)
    lock = s.db + ".users.lock"
    _truncate(lock, size)
    assert conn.execute("SELECT 2").fetchone() == (2,)
    conn.execute("CREATE USER v PASSWORD 'v pw'")
    with s.connect("v", "v pw") as v:
        assert v.execute("SELECT 3").fetchone() == (3,)
    assert os.path.getsize(lock) == 8
    s.alive()
    conn.close()
    # another process's change (cryptdisk serve --add-user) is still seen by the server
    _truncate(lock, size)
    subprocess.run([sys.executable, "-m", "cryptdisk", "serve", s.db, "--sqlite", "--config",
                    str(s.config), "--add-user", "w"], env={**os.environ,
                   "CRYPTDISK_PASSWORD": "w pw"}, check=True, capture_output=True, timeout=120)
    with s.connect("w", "w pw") as w:
        assert w.execute("SELECT 4").fetchone() == (4,)
    s.alive()
    assert "users.lock" in s.errors()  # the repair is logged


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_the_write_lock_file_truncated_while_serving(serve: Any, journal: str) -> None:
    """``PATH.write-lock``: write transactions take turns on its flock, and a waiting
    process names itself in its first bytes; truncated or deleted, writes go on."""
    s = serve()
    conn = _journal(s, journal)
    conn.execute("CREATE TABLE t (a INTEGER)")
    with conn.transaction():
        conn.execute("INSERT INTO t VALUES (1)")
    _truncate(s.db + ".write-lock")
    with conn.transaction():
        conn.execute("INSERT INTO t VALUES (2)")
    conn.execute("INSERT INTO t VALUES (3)")
    os.unlink(s.db + ".write-lock")
    with conn.transaction():
        conn.execute("INSERT INTO t VALUES (4)")
    assert conn.execute("SELECT sum(a) FROM t").fetchone() == (10,)
    s.alive()
    conn.close()


def _journal(s: Serve, journal: str) -> psycopg.Connection:
    """A connection to ``s`` in the journal mode ``journal`` (a session looks at it when it
    opens: WAL mode is set, then a new session opened)."""
    conn = s.connect()
    if journal == "delete":
        return conn
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.close()
    return s.connect()


def test_the_sync_counters_file_truncated_while_serving(serve: Any) -> None:
    s = serve()
    conn = _journal(s, "wal")
    conn.execute("CREATE TABLE t (a INTEGER)")
    conn.execute("INSERT INTO t VALUES (1)")  # group commit: the counters are in use
    _truncate(s.db + ".sync-lock")
    conn.execute("INSERT INTO t VALUES (2)")
    with conn.transaction():
        conn.execute("INSERT INTO t VALUES (3)")
    assert conn.execute("SELECT sum(a) FROM t").fetchone() == (6,)
    s.alive()
    conn.close()


def test_shared_files_damaged_before_the_server_starts(serve: Any) -> None:
    """Each file shorter than its content, or holding garbage: the server starts and serves."""

    def damage(s: Serve) -> None:
        for name, data in [(".users.lock", b"\xff\x01\x02"), (".write-lock", b"\x07" * 5),
                           (".sync-lock", b"\x09" * 11)]:
            Path(s.db + name).write_bytes(data)

    s = serve(prepare=damage)
    conn = _journal(s, "wal")
    conn.execute("CREATE TABLE t (a INTEGER)")
    conn.execute("INSERT INTO t VALUES (1)")
    with conn.transaction():
        conn.execute("INSERT INTO t VALUES (2)")
    conn.execute("CREATE USER v PASSWORD 'v pw'")
    with s.connect("v", "v pw") as v:
        assert v.execute("SELECT 1").fetchone() == (1,)
    s.alive()
    conn.close()


def test_the_failed_login_table_truncated_under_the_workers(serve: Any, tmp_path: Path) -> None:
    """The workers count failed logins in one table: its backing file (unlinked, in TMPDIR)
    truncated through /proc, a failed login still fails as one, and no worker dies with
    the sessions it holds."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    s = serve(workers=2, env={"TMPDIR": str(tmp)})
    held = connections_in_workers(s.connect, 2)
    truncated = 0
    for pid in _children(s.proc.pid):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(str(tmp)):
                os.truncate(f"/proc/{pid}/fd/{fd}", 0)
                truncated += 1
    assert truncated  # (each worker has the table open)
    for _ in range(2):
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            s.connect("mallory", "guess")
    for c in held:
        assert c.execute("SELECT 1").fetchone() == (1,)
        c.close()
    s.alive()
    assert "died" not in s.errors()
