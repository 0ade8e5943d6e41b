"""Lock markers on object stores: stale ones (a killed holder's) are ignored and deleted,
live ones refuse, holders refresh theirs (fsspec's in-memory filesystem stands in for S3:
any non-local target uses markers)."""

from __future__ import annotations

import datetime as dt
import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from cryptdisk.backup import Repository, create, prune
from cryptdisk.errors import BackupError
from tests.forked import child_of_a_dead_holder

from .helpers import FAST_KDF, make_db


@pytest.fixture
def repo() -> Repository:
    r = Repository.init(f"memory://backups-{uuid.uuid4().hex}", passphrase="pw",
                        kdf_params=FAST_KDF)
    return r


def _marker(repo: Repository, name: str, *, minutes_ago: float = 0, host: str = "elsewhere",
            pid: int = 1) -> str:
    when = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=minutes_ago)
    path = f"{repo.root}/locks/{name}"
    repo._put(path, json.dumps({"kind": name.split("-")[0], "host": host, "pid": pid,
                                "time": when.isoformat()}).encode())
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _backed_up(repo: Repository, tmp_path: Path) -> None:
    make_db(tmp_path / "a.db", rows=10)
    create(repo, tmp_path / "a.db")
    create(repo, tmp_path / "a.db")


def test_markers_older_than_the_stale_age_are_ignored_and_deleted(repo, tmp_path) -> None:
    _backed_up(repo, tmp_path)
    old = _marker(repo, "create-old", minutes_ago=31)
    assert len(prune(repo, keep_last=1)[0]) == 1  # not busy
    assert not repo.fs.exists(old)
    _marker(repo, "prune-old", minutes_ago=31)
    create(repo, tmp_path / "a.db")  # a stale prune marker does not stop a backup
    assert repo._list(f"{repo.root}/locks") == []


def test_a_dead_process_on_this_host_leaves_a_stale_marker(repo, tmp_path) -> None:
    _backed_up(repo, tmp_path)
    dead = _marker(repo, "create-dead", host=socket.gethostname(), pid=_dead_pid())
    prune(repo, keep_last=1)
    assert not repo.fs.exists(dead)


@pytest.mark.parametrize("where", ["other host", "live process here", "unreadable"])
def test_live_or_unknown_markers_refuse(repo, tmp_path, where: str) -> None:
    _backed_up(repo, tmp_path)
    if where == "other host":
        path = _marker(repo, "create-x", minutes_ago=29, host="elsewhere", pid=_dead_pid())
    elif where == "live process here":
        path = _marker(repo, "create-x", host=socket.gethostname(), pid=1)  # init
    else:
        path = f"{repo.root}/locks/create-x"
        repo._put(path, b"not json")
    with pytest.raises(BackupError, match=r"busy.*create-x") as err:
        prune(repo, keep_last=1)
    assert "30 minutes" in (err.value.hint or "")
    assert repo.fs.exists(path) and len(repo.manifest_ids()) == 2  # nothing pruned
    prune(repo, keep_last=1, break_lock=True)
    assert len(repo.manifest_ids()) == 1


def test_a_holder_refreshes_its_marker(repo) -> None:
    repo.LOCK_REFRESH_S = 0.05  # type: ignore[misc]
    with repo.lock(exclusive=False):
        (path,) = repo._list(f"{repo.root}/locks")
        first = json.loads(repo.fs.cat_file(path))
        assert first["host"] == socket.gethostname() and first["kind"] == "create"
        for _ in range(400):  # until the refresher has rewritten it
            if json.loads(repo.fs.cat_file(path))["time"] != first["time"]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the marker was never refreshed")
    assert repo._list(f"{repo.root}/locks") == []  # released


_DIES_DURING_A_RESTORE = """
from cryptdisk.backup._restoring import restore_lock
with restore_lock(sys.argv[1]):
    fork_and_die()
"""


def test_a_forked_child_does_not_keep_a_dead_restores_lock(tmp_path: Path) -> None:
    """A restore holds an flock on TARGET.restoring.lock while it runs. A process forked
    during the restore shared that open file: after the restore died the child kept the
    flock, and every restore to TARGET failed with 'another restore is running' until the
    child exited. The child now closes its copy as it starts."""

    from cryptdisk.backup._restoring import restore_lock

    dest = str(tmp_path / "target")
    with child_of_a_dead_holder(_DIES_DURING_A_RESTORE, dest):
        with restore_lock(dest):  # BackupError (another restore is running) before
            pass


_DIES_DURING_A_PRUNE = """
from cryptdisk.backup import Repository
repo = Repository.open(sys.argv[1], passphrase="pw")
with repo._flock(True):  # as a prune holds it
    fork_and_die()
"""


def test_a_forked_child_does_not_keep_a_dead_prunes_repository_lock(tmp_path: Path) -> None:
    """A backup (shared) or a prune (exclusive) holds an flock on a local repository's
    lock file while it runs. A process forked meanwhile shared that open file: after the
    prune died the child kept the flock, and every backup to the repository failed with
    'is busy: a prune is running' until the child exited. The child now closes its copy
    as it starts."""

    url = str(tmp_path / "repo")
    Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    with child_of_a_dead_holder(_DIES_DURING_A_PRUNE, url):
        make_db(tmp_path / "a.db", rows=10)
        create(Repository.open(url, passphrase="pw"), tmp_path / "a.db")  # busy before


_DIES_ADDING_A_WRAPPING = """
from cryptdisk.backup import Repository
repo = Repository.open(sys.argv[1], passphrase="pw")
repo._write_config = fork_and_die  # in the config's update, the directory locked
repo.add_wrapping(passphrase="another pw",
                 kdf_params={"memory_cost": 1024, "iterations": 1, "lanes": 1})
"""


def test_a_forked_child_does_not_keep_the_config_lock_of_a_dead_process(
        tmp_path: Path) -> None:
    """Adding a wrapping to a local repository rewrites its config under an flock of the
    repository directory. A process forked meanwhile shared that open file: after the
    process died the child kept the flock, and every later config change (`cryptdisk
    backup key add`) waited for the child to exit. The child now closes its copy as it
    starts."""
    import fcntl
    import os

    url = str(tmp_path / "repo")
    Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    with child_of_a_dead_holder(_DIES_ADDING_A_WRAPPING, url):
        fd = os.open(url, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError before
        finally:
            os.close(fd)
        Repository.open(url, passphrase="pw").add_wrapping(passphrase="pw 3",
                                                           kdf_params=FAST_KDF)
    Repository.open(url, passphrase="pw 3")


_DIES_REPLACING_A_SQLITE_FILE = """
from cryptdisk.backup._replace import _journals, holding_sqlite
with holding_sqlite(sys.argv[1], _journals(sys.argv[1])):  # SQLite's lock held
    fork_and_die()
"""


def test_a_forked_child_does_not_keep_sqlites_lock_of_a_dead_restore(tmp_path: Path) -> None:
    """A restore over a SQLite file holds SQLite's exclusive lock on it (an open file
    description lock) while it replaces it. A process forked meanwhile shared that open
    file: after the restore died the child kept the lock, and every connection to the
    database failed with 'database is locked' until the child exited. The child now
    closes its copy as it starts."""
    import sqlite3

    db = str(tmp_path / "app.db")
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE t (a)")
    con.close()
    with child_of_a_dead_holder(_DIES_REPLACING_A_SQLITE_FILE, db):
        con = sqlite3.connect(db, timeout=0)
        try:
            con.execute("INSERT INTO t VALUES (1)")  # database is locked before
            con.commit()
        finally:
            con.close()
