"""kill -9 during write transactions never loses a committed transaction or corrupts the db."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk.format import HEADER_SIZE

CHILD = Path(__file__).with_name("crash_child.py")


@pytest.mark.slow
@pytest.mark.parametrize(("journal", "sync", "trials"), [
    ("delete", "full", 30), ("wal", "normal", 30), ("delete", "off", 12), ("wal", "full", 12),
    ("truncate", "full", 12),
])
def test_sigkill_keeps_every_committed_transaction(tmp_path, journal, sync, trials):
    material = os.urandom(32)
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, material)])
    db = tmp_path / "crash.db"
    env = {**os.environ, "CD_TEST_KEY": material.hex(),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    rnd = random.Random(1234)
    committed: set[int] = set()
    for trial in range(trials):
        child = subprocess.Popen([sys.executable, str(CHILD), str(db), journal, sync,
                                  str(trial)], stdout=subprocess.PIPE, env=env)
        assert child.stdout is not None
        reported = [child.stdout.readline()]
        assert reported == [b"open\n"], "the child died before it opened the database"
        # Kill points come from the child's own reports: right after "open" (while it
        # opens and recovers the database), or after its n-th commit (mid-transaction).
        for _ in range(0 if trial % 5 == 0 else rnd.randrange(1, 40)):
            reported.append(child.stdout.readline())
            assert reported[-1], "the child died before it was killed"
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate()
        assert child.returncode == -signal.SIGKILL, "the child died before it was killed"
        committed.update(int(x) for x in (b"".join(reported[1:]) + out).split())
        conn = csql.connect(str(db), keyring=keyring)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            tables = {t for (t,) in conn.execute("SELECT name FROM sqlite_schema")}
            if not committed and "log" not in tables:
                continue  # killed before its schema was committed: nothing to find
            present = {n for (n,) in conn.execute("SELECT n FROM log")}
            missing = committed - present
            assert not missing, f"trial {trial}: committed transactions lost: {sorted(missing)}"
            (updates,) = conn.execute("SELECT coalesce(sum(k), 0) FROM log").fetchall()[0]
            (balance,) = conn.execute("SELECT sum(bal) FROM acc").fetchall()[0]
            assert updates == balance, "a transaction was applied in part"
        finally:
            conn.close()
    assert len(committed) > trials  # the children did commit work between kills


TORN_CHILD = Path(__file__).with_name("torn_child.py")


@pytest.mark.parametrize("what", ["page1", "append"])
@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_sigkill_mid_write_of_a_page_still_opens(tmp_path, journal, what):
    """A kill in the middle of a page's record (page 1, or a page appended to the
    file) leaves a hot journal (or the WAL) that restores the database; it must
    open, not fail on the torn record."""
    material = os.urandom(32)
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, material)])
    db = tmp_path / "torn.db"
    env = {**os.environ, "CD_TEST_KEY": material.hex(),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.run([sys.executable, str(TORN_CHILD), str(db), journal, what],
                           capture_output=True, env=env, timeout=60, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    if what == "append":  # the cut record really is there
        assert (db.stat().st_size - HEADER_SIZE) % (4096 + 32) == 20
    conn = csql.connect(str(db), keyring=keyring)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        rows = [x for (x,) in conn.execute("SELECT length(x) FROM t ORDER BY rowid")]
        assert rows == ([1, 20000] if journal == "wal" else [1])
        conn.execute("INSERT INTO t VALUES(3)")  # writes over whatever the crash left
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()
    bad = bytearray(db.read_bytes())  # a page 1 that is bad after all still raises
    bad[HEADER_SIZE + 40] ^= 1
    db.write_bytes(bytes(bad))
    with pytest.raises(csql.PageAuthenticationError):
        csql.connect(str(db), keyring=keyring).close()
