"""``cryptdisk serve --sqlite`` starts on a database it cannot write now: another process
holds SQLite's write lock, or the file or its directory is read-only. At start the server
removes the grants on names no table has (:meth:`_SQLiteSession.forget_table_grants`),
which takes the write lock: it waited the lock timeout, then its worker died with a
traceback and was started again, forever; on a read-only file it exited with an internal
error. Now it serves, and the grants stay until a start that can write."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.server.test_cli import cryptdisk, start

PASSWORD = "pw of alice"
ENV = {**os.environ, "CRYPTDISK_PASSWORD": PASSWORD}
#: holds the write lock of the database argv[1] (key file argv[2]) until stdin closes
HOLDER = """
import sys
import cryptdisk.sqlite
from cryptdisk.keys import Key, Keyring, read_key_file
material, _ = read_key_file(sys.argv[2])
conn = cryptdisk.sqlite.connect(sys.argv[1], keyring=Keyring([Key(1, material)]))
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A database with a user alice (admin) and a grant to bob on table t, which an
    embedded connection dropped while no server ran."""
    folder = tmp_path_factory.mktemp("template")
    key, db = folder / "k.key", str(folder / "s.db")
    assert cryptdisk("keygen", "-o", str(key)).returncode == 0
    out = cryptdisk("serve", db, "--sqlite", "--key-file", str(key), "--add-user", "alice",
                    "--admin", env=ENV)
    assert out.returncode == 0, out.stderr
    with serving(folder) as (port, _):
        with connect(port) as conn:
            conn.execute("CREATE TABLE t (a INTEGER)")
            conn.execute("CREATE TABLE kept (a INTEGER)")
            conn.execute("INSERT INTO kept VALUES (1)")
            conn.execute("CREATE USER bob PASSWORD 'pw of bob'")
            conn.execute("GRANT SELECT ON t TO bob")
    from cryptdisk.keys import Key, Keyring, read_key_file
    from cryptdisk.sqlite import connect as embedded_connect

    with embedded_connect(db, keyring=Keyring([Key(1, read_key_file(str(key))[0])])) \
            as embedded:
        embedded.execute("DROP TABLE t")
    return folder


@pytest.fixture
def folder(template, tmp_path) -> Path:
    copy = tmp_path / "db"
    shutil.copytree(template, copy)
    return copy


@contextlib.contextmanager
def serving(folder: Path, workers: str = "1") -> Iterator[tuple[int, list[str]]]:
    """A ``cryptdisk serve --sqlite`` of ``folder``'s database: (its port, the lines it
    wrote to stderr, once it stopped)."""
    proc, port, _ = start([str(folder / "s.db"), "--sqlite", "--key-file",
                           str(folder / "k.key"), "--plaintext-loopback", "--workers", workers],
                          ENV, folder.parent)
    stderr: list[str] = []
    try:
        yield port, stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        stderr += proc.stderr.read().splitlines()
        proc.stdout.close()
        proc.stderr.close()
        assert code == 0, stderr


def connect(port: int) -> psycopg.Connection:
    # a server stuck at start never answers: fail instead of waiting for ever
    return psycopg.connect(host="127.0.0.1", port=port, user="alice", password=PASSWORD,
                           sslmode="disable", autocommit=True, connect_timeout=20)


def grants(conn: psycopg.Connection) -> list[tuple[str, str]]:
    return conn.execute('SELECT "user", "table" FROM system.grants WHERE privilege <> '
                        "'MEMBER' ORDER BY 1, 2").fetchall()


def test_a_server_starts_while_another_process_holds_the_write_lock(folder) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder / "s.db"),
                               str(folder / "k.key")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with serving(folder, workers="2") as (port, stderr):
            with connect(port) as conn:  # while the other process still holds the lock
                assert conn.execute("SELECT a FROM kept").fetchall() == [(1,)]
                assert grants(conn) == [("bob", "t")]
    finally:
        holder.stdin.close()
        holder.wait(60)
        holder.stdout.close()
    text = "\n".join(stderr)
    assert "the grants on t stay, though no table has the name: database is locked" in text
    assert "Traceback" not in text and "died" not in text, text
    with serving(folder) as (port, stderr):  # the lock free: the grant goes
        with connect(port) as conn:
            assert grants(conn) == []
    assert "stay" not in "\n".join(stderr)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` (a file or directory) not writable meanwhile, by root too (the immutable
    attribute, ``chattr +i``)."""
    mode = path.stat().st_mode
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
            pytest.skip("root, and this file system has no immutable files (chattr +i)")
    else:
        path.chmod(mode & ~0o222)
    try:
        yield
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(mode)


@pytest.mark.parametrize("which", ["file", "directory"])
def test_a_server_serves_a_database_it_cannot_write(folder, which) -> None:
    """A read-only database file (or directory, where SQLite cannot make its journal) is
    served for reading; a write fails with 25006 (it was XX000 for the directory), and the
    server keeps serving."""
    with read_only(folder / "s.db" if which == "file" else folder):
        with serving(folder) as (port, stderr):
            with connect(port) as conn:
                assert conn.execute("SELECT a FROM kept").fetchall() == [(1,)]
                assert grants(conn) == [("bob", "t")]
                with pytest.raises(psycopg.Error) as err:
                    conn.execute("INSERT INTO kept VALUES (2)")
                assert err.value.sqlstate == "25006"  # read_only_sql_transaction, both
                if which == "directory":  # (SQLite cannot make its journal there)
                    assert "directory is read-only" in str(err.value)
                assert conn.execute("SELECT count(*) FROM kept").fetchone() == (1,)
    text = "\n".join(stderr)
    assert "the grants on t stay, though no table has the name" in text, text
    assert "Traceback" not in text and "internal error" not in text, text


def test_a_table_created_after_a_start_that_kept_stale_grants_gets_none(folder) -> None:
    """The grants a start could not remove (another process held the write lock) do not
    reach a table created later with the name: CREATE TABLE removes them, in its commit."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder / "s.db"),
                               str(folder / "k.key")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with serving(folder) as (port, _):
            with connect(port) as conn:
                assert grants(conn) == [("bob", "t")]  # kept: the start could not write
                holder.stdin.close()
                holder.wait(60)
                conn.execute("CREATE TABLE t (secret TEXT)")
                conn.execute("INSERT INTO t VALUES ('only for alice')")
                assert grants(conn) == []
            with psycopg.connect(host="127.0.0.1", port=port, user="bob",
                                 password="pw of bob", sslmode="disable", autocommit=True,
                                 connect_timeout=20) as bob:
                with pytest.raises(psycopg.Error) as err:
                    bob.execute("SELECT secret FROM t")
                assert err.value.sqlstate == "42501"
    finally:
        if not holder.stdin.closed:
            holder.stdin.close()
        holder.wait(60)
        holder.stdout.close()
    with serving(folder) as (port, _):  # the removal was committed, not only in memory
        with connect(port) as conn:
            assert grants(conn) == []
            assert conn.execute("SELECT secret FROM t").fetchall() == [("only for alice",)]
