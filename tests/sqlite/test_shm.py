"""The WAL index lives in a memory file system shared by every process, not beside the database."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

import cryptdisk
import cryptdisk.sqlite as csql

CHILD = Path(__file__).with_name("shm_child.py")
LINE = re.compile(rb"cryptdisk wal-index ([0-9a-f]{32})\n")


@pytest.fixture
def shm_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "shm"
    d.mkdir()
    monkeypatch.setenv("CRYPTDISK_SHM_DIR", str(d))
    return d


@pytest.fixture
def key() -> bytes:
    return os.urandom(32)


def wal_db(path: Path, key: bytes) -> apsw.Connection:
    conn = csql.connect(path, keyring=cryptdisk.Keyring([cryptdisk.Key(1, key)]))
    assert conn.execute("PRAGMA journal_mode=WAL").fetchall() == [("wal",)]
    conn.execute("CREATE TABLE IF NOT EXISTS t(x)")
    return conn


def token_of(db: Path) -> str:
    m = LINE.fullmatch((db.parent / (db.name + "-shm")).read_bytes())
    assert m, "the -shm beside the database holds only the token line"
    return m.group(1).decode()


def child(db: Path, key: bytes, mode: str = "cryptdisk", **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD), str(db), mode],
                            env={**os.environ, "CD_TEST_KEY": key.hex(), **env},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_the_index_is_in_the_shm_dir_and_only_a_token_beside_the_database(tmp_path, shm_dir, key):
    db = tmp_path / "a.db"
    conn = wal_db(db, key)
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(2000)])
    token = token_of(db)
    index = shm_dir / f"cryptdisk-{token}-shm"
    assert (shm_dir / f"cryptdisk-{token}").stat().st_size == 0  # the anchor
    assert index.stat().st_size >= 32768 and index.read_bytes().strip(b"\0")
    conn.close()
    # a clean close removes all three, as SQLite removes its -shm
    assert not (tmp_path / "a.db-shm").exists()
    assert list(shm_dir.iterdir()) == []


def test_connections_in_two_processes_share_the_index(tmp_path, shm_dir, key):
    db = tmp_path / "a.db"
    conn = wal_db(db, key)
    with child(db, key) as proc:
        assert proc.stdout.readline().strip() == "ready"
        conn.execute("INSERT INTO t VALUES (2)")
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "3"  # the child saw this commit
        assert conn.execute("SELECT count(*) FROM t").fetchall() == [(3,)]  # and we its
        assert len(list(shm_dir.iterdir())) == 2
        proc.stdin.close()
    conn.close()


def test_the_index_keeps_the_permissions_of_the_database(tmp_path, shm_dir, key):
    db = tmp_path / "a.db"
    wal_db(db, key).close()
    os.chmod(db, 0o600)
    conn = wal_db(db, key)
    conn.execute("INSERT INTO t VALUES (1)")
    modes = {p.name: p.stat().st_mode & 0o777 for p in shm_dir.iterdir()}
    assert set(modes.values()) == {0o600}, modes
    conn.close()


def test_a_killed_process_leaves_an_index_the_next_open_replaces(tmp_path, shm_dir, key):
    db = tmp_path / "a.db"
    with child(db, key) as proc:
        assert proc.stdout.readline().strip() == "ready"
        for n in (2, 3):
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == str(n)
        stale = token_of(db)
        proc.send_signal(signal.SIGKILL)
    assert (shm_dir / f"cryptdisk-{stale}-shm").exists()
    conn = wal_db(db, key)
    assert conn.execute("SELECT count(*) FROM t").fetchall() == [(3,)]
    assert token_of(db) != stale
    assert sorted(p.name for p in shm_dir.iterdir()) == sorted(
        [f"cryptdisk-{token_of(db)}", f"cryptdisk-{token_of(db)}-shm"])
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()


def test_the_suite_keeps_the_index_a_killed_child_leaves_in_a_directory_of_its_own(tmp_path,
                                                                                   key):
    """tests/conftest.py points CRYPTDISK_SHM_DIR at a directory of the test session: an
    index left by a child killed as the last user does not pile up in /dev/shm."""
    session = Path(os.environ["CRYPTDISK_SHM_DIR"])
    assert session.is_dir() and session.resolve() != Path("/dev/shm").resolve()
    db = tmp_path / "a.db"
    wal_db(db, key).close()
    with child(db, key) as proc:
        assert proc.stdout.readline().strip() == "ready"
        token = token_of(db)
        proc.send_signal(signal.SIGKILL)
    assert sorted(p.name for p in session.iterdir() if token in p.name) == [
        f"cryptdisk-{token}", f"cryptdisk-{token}-shm"]


def test_a_process_that_sees_another_memory_file_system_gets_a_clear_error(tmp_path, shm_dir, key,
                                                                           monkeypatch):
    db = tmp_path / "a.db"
    conn = wal_db(db, key)
    conn.execute("INSERT INTO t VALUES (1)")
    elsewhere = tmp_path / "other-container-shm"
    elsewhere.mkdir()
    with child(db, key, CRYPTDISK_SHM_DIR=str(elsewhere)) as proc:
        out, _ = proc.communicate(timeout=60)
    assert out.strip() == "WalIndexError"
    # and in this process too, with a message that says what to do
    monkeypatch.setenv("CRYPTDISK_SHM_DIR", str(elsewhere))
    with pytest.raises(csql.WalIndexError, match="memory file system this process does not see"):
        csql.connect(db, keyring=cryptdisk.Keyring([cryptdisk.Key(1, key)]))
    monkeypatch.setenv("CRYPTDISK_SHM_DIR", str(shm_dir))
    assert conn.execute("SELECT count(*) FROM t").fetchall() == [(1,)]  # unharmed
    conn.close()


def test_an_index_beside_the_database_and_one_off_the_disk_exclude_each_other(tmp_path, shm_dir,
                                                                              key):
    db = tmp_path / "a.db"
    wal_db(db, key).close()
    # cryptdisk without its C extension keeps the index beside the database: while it has
    # the database open, this cryptdisk refuses to start a second index ...
    with child(db, key, "beside") as beside:
        assert beside.stdout.readline().strip() == "ready"
        with pytest.raises(csql.WalIndexError, match="WAL index on disk beside it"):
            csql.connect(db, keyring=cryptdisk.Keyring([cryptdisk.Key(1, key)]))
        beside.stdin.close()
    # ... and while this cryptdisk has it open, the other cannot write or recover its index
    conn = wal_db(db, key)
    conn.execute("INSERT INTO t VALUES (2)")
    with child(db, key, "beside") as beside:
        out, _ = beside.communicate(timeout=60)
    # SQLite retries its recovery for a while (about 10 s), then gives up
    assert out.strip() in ("BusyError", "ProtocolError")
    assert token_of(db)  # the line is still the token: the other wrote no index here
    assert conn.execute("SELECT count(*) FROM t").fetchall() == [(2,)]
    conn.close()


def test_the_last_connection_removes_the_index_even_when_the_wal_stays(tmp_path, shm_dir, key):
    db = tmp_path / "a.db"
    writer = wal_db(db, key)
    writer.execute("INSERT INTO t VALUES (1)")
    reader = csql.connect(db, keyring=cryptdisk.Keyring([cryptdisk.Key(1, key)]),
                          flags=apsw.SQLITE_OPEN_READONLY)
    assert reader.execute("SELECT count(*) FROM t").fetchall() == [(1,)]
    writer.close()  # the reader still has the database: nothing is removed
    assert len(list(shm_dir.iterdir())) == 2
    reader.close()  # read-only, it cannot checkpoint: the WAL stays, the index goes
    assert (tmp_path / "a.db-wal").exists()
    assert not (tmp_path / "a.db-shm").exists()
    assert list(shm_dir.iterdir()) == []
    conn = wal_db(db, key)  # rebuilt from the WAL
    assert conn.execute("SELECT count(*) FROM t").fetchall() == [(1,)]
    conn.close()


_FAILING_FCHMOD = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <dlfcn.h>
#include <sys/types.h>
/* fchmod fails (EPERM) on the WAL index's anchor in $CRYPTDISK_SHM_DIR, works elsewhere. */
int fchmod(int fd, mode_t mode) {
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n > 0) {
        target[n] = 0;
        if (strstr(target, "/cryptdisk-") != NULL) {
            errno = EPERM;
            return -1;
        }
    }
    int (*real)(int, mode_t) = (int (*)(int, mode_t))dlsym(RTLD_NEXT, "fchmod");
    return real(fd, mode);
}
"""


def test_an_index_whose_permissions_cannot_be_set_is_a_clear_error(tmp_path, shm_dir, key):
    """The anchor of the WAL index takes the database's permissions with fchmod: when that
    fails, opening the index fails with the OSError, naming the anchor, and leaves no
    anchor behind (it could carry the umask's mode instead of the database's)."""
    shim = tmp_path / "fchmod.so"
    (tmp_path / "fchmod.c").write_text(_FAILING_FCHMOD)
    try:
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "fchmod.c"),
                        "-ldl"], check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no C compiler to build the fchmod shim")
    db = tmp_path / "a.db"
    wal_db(db, key).close()
    code = ("import sys, cryptdisk, cryptdisk.sqlite as c\n"
            "k = cryptdisk.Keyring([cryptdisk.Key(1, bytes.fromhex(sys.argv[2]))])\n"
            "try:\n"
            "    conn = c.connect(sys.argv[1], keyring=k, implementation='c')\n"
            "    conn.execute('SELECT count(*) FROM t').fetchall()\n"
            "except Exception as exc:\n"
            "    print(type(exc).__name__, exc)\n"
            "else:\n"
            "    print('opened')\n")
    out = subprocess.run([sys.executable, "-c", code, str(db), key.hex()], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "LD_PRELOAD": str(shim)})
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stdout.startswith("PermissionError"), out.stdout
    assert str(shm_dir) in out.stdout and "cryptdisk-" in out.stdout, out.stdout
    assert [p.name for p in shm_dir.iterdir()] == []
