"""kill -9 during write transactions never loses a committed transaction or corrupts the db."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cryptdisk
import cryptdisk.sqlite as csql

CHILD = Path(__file__).with_name("crash_child.py")


@pytest.mark.slow
@pytest.mark.parametrize(("journal", "sync", "trials"), [
    ("delete", "full", 30), ("wal", "normal", 30), ("delete", "off", 12), ("wal", "full", 12),
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
        time.sleep(rnd.uniform(0.3, 0.9))
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate()
        assert child.returncode == -signal.SIGKILL, "the child died before it was killed"
        committed.update(int(x) for x in out.split())
        conn = csql.connect(str(db), keyring=keyring)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            present = {n for (n,) in conn.execute("SELECT n FROM log")}
            missing = committed - present
            assert not missing, f"trial {trial}: committed transactions lost: {sorted(missing)}"
            (updates,) = conn.execute("SELECT coalesce(sum(k), 0) FROM log").fetchall()[0]
            (balance,) = conn.execute("SELECT sum(bal) FROM acc").fetchall()[0]
            assert updates == balance, "a transaction was applied in part"
        finally:
            conn.close()
    assert len(committed) > trials  # the children did commit work between kills
