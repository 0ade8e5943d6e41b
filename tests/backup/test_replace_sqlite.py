"""Restoring a SQLite backup over an encrypted SQLite file (``--force``): a database that
a connection has open (SQLite's locks say so) is refused; files beside it that nobody
holds (an empty WAL a read-only connection left, a killed writer's WAL and WAL index)
are leftovers of the database being replaced and go with it (real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import cryptdisk.sqlite
from cryptdisk.backup import Repository, create, restore
from cryptdisk.errors import BackupError
from cryptdisk.keys import Key, Keyring, key_from_file, write_key_file

from .helpers import FAST_KDF

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("hold_child.py")


@pytest.fixture
def shm_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "shm"
    d.mkdir()
    monkeypatch.setenv("CRYPTDISK_SHM_DIR", str(d))
    return d


def _db(path: Path, keyfile: Path, rows: int, wal: bool) -> Keyring:
    kr = Keyring.single(Key(1, key_from_file(keyfile)))
    c = cryptdisk.sqlite.connect(path, keyring=kr)
    c.execute("PRAGMA journal_mode=" + ("WAL" if wal else "DELETE")).fetchall()
    c.execute("CREATE TABLE IF NOT EXISTS w (i INTEGER)")
    c.executemany("INSERT INTO w VALUES (?)", [(i,) for i in range(rows)])
    c.close()
    return kr


def _count(path: Path, kr: Keyring) -> int:
    c = cryptdisk.sqlite.connect(path, keyring=kr)
    try:
        return int(c.execute("SELECT count(*) FROM w").fetchall()[0][0])
    finally:
        c.close()


def _setup(tmp_path: Path, wal: bool) -> tuple[Path, Path, Keyring, Repository, str]:
    """r.db (WAL or rollback mode) holding 10 rows, and a backup of it."""
    keyfile = tmp_path / "k"
    write_key_file(keyfile, os.urandom(32))
    db = tmp_path / "r.db"
    kr = _db(db, keyfile, 10, wal)
    repo = Repository.init(str(tmp_path / "repo"), passphrase="pw", kdf_params=FAST_KDF)
    return db, keyfile, kr, repo, create(repo, db, keyring=kr).id


def _companions(db: Path) -> list[str]:
    return sorted(p.name for p in db.parent.iterdir()
                  if p.name.startswith(db.name + "-"))


def test_a_user_who_backs_up_a_wal_database_then_rolls_back_with_force(tmp_path: Path,
                                                                         shm_dir: Path) -> None:
    """The backup's read-only connection cannot delete the WAL it opened: the empty
    ``-wal`` it leaves is a leftover, not an open database (CLI end to end)."""
    keyfile = tmp_path / "k"
    write_key_file(keyfile, os.urandom(32))
    db = tmp_path / "app.db"
    kr = _db(db, keyfile, 10, wal=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PW="pw")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cryptdisk", "backup", *args,
                               "--passphrase-env", "PW"], capture_output=True, text=True,
                              env=env, cwd=tmp_path)

    repo = str(tmp_path / "repo")
    assert run("init", repo).returncode == 0
    r = run("create", repo, str(db), "--key-file", str(keyfile))
    assert r.returncode == 0, r.stderr
    assert _companions(db) == ["app.db-wal"]  # SQLite's read-only connection left it
    assert (tmp_path / "app.db-wal").stat().st_size == 0
    c = cryptdisk.sqlite.connect(db, keyring=kr)
    c.executemany("INSERT INTO w VALUES (?)", [(i,) for i in range(5)])  # a change to undo
    c.close()
    assert _count(db, kr) == 15
    r = run("create", repo, str(db), "--key-file", str(keyfile))  # leaves the WAL again
    assert r.returncode == 0 and _companions(db) == ["app.db-wal"], r.stderr
    r = run("restore", repo, "latest", str(db), "--key-file", str(keyfile), "--force")
    assert r.returncode == 0, r.stderr
    assert _count(db, kr) == 15
    assert _companions(db) == []
    assert not list(shm_dir.iterdir())


def _hold(db: Path, keyfile: Path, mode: str, state: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen([sys.executable, str(CHILD), str(db), str(keyfile), mode, state],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    return proc


def _next(proc: subprocess.Popen[str]) -> str:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


@pytest.mark.parametrize("mode,state", [("wal", "idle"), ("wal", "read"), ("wal", "write"),
                                        ("rollback", "read"), ("rollback", "write")])
def test_force_refuses_a_database_another_process_has_open(tmp_path: Path, shm_dir: Path,
                                                           mode: str, state: str) -> None:
    db, keyfile, kr, repo, bid = _setup(tmp_path, wal=mode == "wal")
    proc = _hold(db, keyfile, mode, state)
    try:
        with pytest.raises(BackupError, match=r"r.db is open: a connection holds SQLite's "
                                              r"lock on it"):
            restore(repo, bid, db, keyring=kr, replace=True)
        # the database and its user go on as before: nothing of theirs was removed
        assert _next(proc) == str(11 + (state == "write"))
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait() == 0
        assert proc.stdout is not None
        proc.stdout.close()
    assert _count(db, kr) == 11 + (state == "write")
    assert not [p for p in tmp_path.iterdir() if ".restoring" in p.name]
    restore(repo, bid, db, keyring=kr, replace=True)  # closed: replaced
    assert _count(db, kr) == 10


def test_force_replaces_a_database_whose_wal_writer_was_killed(tmp_path: Path,
                                                                shm_dir: Path) -> None:
    """A killed writer leaves its WAL (committed frames), ``-shm`` and the WAL index in
    the memory directory; nobody holds them: they go with the replaced database, and
    none of the old WAL's frames reaches the new one."""
    db, keyfile, kr, repo, bid = _setup(tmp_path, wal=True)
    proc = _hold(db, keyfile, "wal", "idle")
    c = cryptdisk.sqlite.connect(db, keyring=kr)
    c.execute("PRAGMA wal_autocheckpoint=0")
    c.executemany("INSERT INTO w VALUES (?)", [(i,) for i in range(100)])
    c.close()  # not the last connection: the WAL keeps the frames
    assert _next(proc) == "111"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    proc.stdout.close()
    assert (tmp_path / "r.db-wal").stat().st_size > 0
    assert sorted(p.name for p in shm_dir.iterdir())  # the WAL index the child held
    restore(repo, bid, db, keyring=kr, replace=True)
    assert _companions(db) == []
    assert not list(shm_dir.iterdir())
    assert _count(db, kr) == 10
