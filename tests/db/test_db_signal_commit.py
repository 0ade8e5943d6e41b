"""SIGTERM (raised as the ``cryptdisk`` command raises it, ``Terminated``) at random moments
of a real process that writes in a loop (UPDATE, DELETE, INSERT, OPTIMIZE): each time, the
database opens, every row reads, ``check()`` passes, and a writer's open (garbage
collection) loses nothing. SIGINT (a Ctrl-C, ``KeyboardInterrupt``) too: the write's waits
on its worker threads end on it (see cryptdisk.db._waits); test_db_interrupt_commit.py
injects KeyboardInterrupt at each path after a publish. A child that does not end on the
signal (an open bug: a signal at some moments around a part's mmap or inside DuckDB can
leave the process waiting) is killed, and the database must survive that as any crash."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

import cryptdisk

from .test_db_crash import env

CHILD = os.path.join(os.path.dirname(__file__), "signal_child.py")
TRIALS = int(os.environ.get("CRYPTDISK_CRASH_TRIALS", "10"))


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_while_writing(tmp_path, signum):
    path = str(tmp_path / "db")
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (id BIGINT, n BIGINT) ORDER BY id")
        for lo in range(0, 100, 25):
            db.sql(f"INSERT INTO t SELECT i, 0 FROM range({lo}, {lo + 25}) r(i)")
    rng = random.Random(signum)
    hung: list[str] = []
    for _trial in range(TRIALS):
        child = subprocess.Popen([sys.executable, CHILD, path], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env())
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "go"
        time.sleep(rng.uniform(0.0, 0.6))
        child.send_signal(signum)
        try:
            _out, err = child.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            # A known, open bug: a signal at some moments of a statement (around a part's
            # mmap, inside DuckDB) can leave the process waiting for good. The database
            # must then survive the kill -9 that follows as it survives any crash.
            child.send_signal(signal.SIGUSR1)  # its threads' stacks
            time.sleep(2)
            child.kill()
            _out, err = child.communicate()
            hung.append(err[-3000:])
        else:
            assert child.returncode in (130, 131), err[-4000:]
        for _open in range(2):  # a writer's open collects garbage: the second sees after it
            with cryptdisk.connect(path) as db:
                ids = db.sql("SELECT id FROM t ORDER BY id").column("id").to_pylist()
                # between a DELETE and its INSERT, one id is missing
                assert len(ids) in (99, 100) and len(set(ids)) == len(ids)
                assert set(ids) <= set(range(100))
                assert db.check() > 0
        with cryptdisk.connect(path) as db:  # the next child starts again at id 1: the
            for i in set(range(100)) - set(ids):  # id this one left out is put back
                db.sql(f"INSERT INTO t VALUES ({i}, 0)")
    if hung:  # (shown with the test's output: pytest -rP)
        print(f"{len(hung)} of {TRIALS} children did not end on the signal and were killed; "
              f"the last one's stacks:\n{hung[-1]}")
    assert len(hung) <= TRIALS // 2, "most children did not end on the signal"
