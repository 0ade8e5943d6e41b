"""Key rotation of an encrypted SQLite database left by a crashed writer, killed at every
write and run again: ``cryptdisk keys promote`` with the database as a path, and
``cryptdisk sqlite rotate``. Real processes are killed (kill -9) throughout."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cryptdisk.sqlite
from cryptdisk.format import Header
from cryptdisk.keys import Keyring

from .test_lifecycle import _kill_at, env, run, setup

WRITER = """
import os, sys
import cryptdisk.sqlite
from cryptdisk.keys import Keyring
db = cryptdisk.sqlite.connect(sys.argv[1], keyring=Keyring.from_config(sys.argv[2]))
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA wal_autocheckpoint=0")
db.execute("CREATE TABLE t(x INTEGER, pad TEXT)")
for i in range(50):
    db.execute("INSERT INTO t VALUES (?, ?)", (i, "p" * 500))
print("committed", flush=True)
os.kill(os.getpid(), 9)  # a crash: the committed transactions stay in the WAL
"""


def _crashed_writer(db: Path, cfg: str) -> None:
    done = subprocess.run([sys.executable, "-c", WRITER, str(db), cfg], capture_output=True,
                          text=True, env=env(), timeout=120)
    assert done.stdout == "committed\n" and done.returncode == -9, done.stderr


def _rows(db: Path, cfg: str) -> list[tuple[int, int]]:
    conn = cryptdisk.sqlite.connect(db, keyring=Keyring.from_config(cfg))
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return conn.execute("SELECT count(*), sum(x) FROM t").fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("command", ["promote", "sqlite-rotate"])
def test_kill_9_at_every_write_of_a_sqlite_rotation_then_a_rerun_finishes(tmp_path, command):
    work, snapshot = tmp_path / "work", tmp_path / "snapshot"
    work.mkdir()
    cfg, _ = setup(work, files=0)
    db = work / "app.sqlite"
    _crashed_writer(db, cfg)
    wal = Path(f"{db}-wal")
    assert wal.stat().st_size > 0 and Header.parse(wal.read_bytes()[:128]).key_id == 1
    assert run("keys", "add", "2", "-c", cfg, "--generate", str(work / "k2.hex")).returncode == 0
    if command == "promote":
        argv = ["keys", "promote", "2", "-c", cfg, str(db)]
    else:  # the key is made current first; sqlite rotate rewraps to the current key
        assert run("keys", "promote", "2", "-c", cfg).returncode == 0
        argv = ["sqlite", "rotate", "-c", cfg, str(db)]
    shutil.copytree(work, snapshot)
    kills = 0
    for n in range(1, 100):
        line = _kill_at(n, argv)
        if line.startswith("finished"):
            assert line == "finished 0"
            break
        kills += 1
        # killed here: each file is under key 1 or key 2, and the config has both
        assert {Header.parse(p.read_bytes()[:128]).key_id for p in (db, wal)} <= {1, 2}
        again = run(*argv)
        assert again.returncode == 0, (n, line, again.stderr)
        assert [Header.parse(p.read_bytes()[:128]).key_id for p in (db, wal)] == [2, 2], n
        retired = run("keys", "retire", "1", "-c", cfg, str(db))
        assert retired.returncode == 0, (n, retired.stderr)
        assert _rows(db, cfg) == [(50, 49 * 50 // 2)]  # with key 1 retired: not loaded
        shutil.rmtree(work)
        shutil.copytree(snapshot, work)
    else:
        raise AssertionError("the rotation never finished")
    assert kills >= 2  # one header write per file, at least the database's and the WAL's
