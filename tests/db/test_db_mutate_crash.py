"""kill -9 of a real process in the middle of a DELETE or UPDATE: while it rewrites a
part, just before it publishes the catalog, and just after (before the old parts are
deleted). The database then holds the table as it was before the statement or as it is
after it, never a mix; the next writer deletes the leftovers, and nothing else is lost."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import duckdb
import pytest

import cryptdisk

from .dbhelpers import SCHEMA, write_config
from .test_db_crash import disk_files, env

CHILD = os.path.join(os.path.dirname(__file__), "mutate_child.py")
TRIALS = int(os.environ.get("CRYPTDISK_CRASH_TRIALS", "10"))
ROWS = "SELECT c_int, c_str, c_float FROM t ORDER BY c_int"
#: where mutate_child.py reports and waits: in a part's rewrite, before and after the commit
POINTS = ("rewrite", "commit", "published")


def _on_disk(tmp_path):
    return set(disk_files(os.path.join(tmp_path, "store", "secure")))


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
def test_kill_during_delete_and_update(tmp_path, point):
    cfg = str(write_config(tmp_path, [1], 1))
    path = str(tmp_path / "db")
    ref = duckdb.connect()
    ref.sql(f"CREATE TABLE t {SCHEMA}")
    with cryptdisk.connect(path, cfg) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
        for i in range(4):  # 4 parts; every statement matches rows of each
            sql = f"INSERT INTO t SELECT r, 's', 0 FROM range({i * 500}, {i * 500 + 500}) x(r)"
            db.sql(sql)
            ref.sql(sql)
    rng = random.Random(point)
    step = 0
    for _trial in range(TRIALS):
        child = subprocess.Popen([sys.executable, CHILD, path, cfg, str(step)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=env())
        assert child.stdin is not None and child.stdout is not None
        wanted, seen, running = rng.randrange(1, 4), 0, None
        while True:  # kill at the wanted-th report of the point
            line = child.stdout.readline()
            assert line, "child died before it was killed"
            if line.startswith("start "):
                running = line[6:].strip()
            elif line.strip() == "done":
                ref.sql(running)
                running = None
                step += 1
            elif line.strip() in POINTS:  # the child waits there for a word to go on
                seen += line.strip() == point
                if seen == wanted:
                    break
                child.stdin.write("go\n")
                child.stdin.flush()
        child.send_signal(signal.SIGKILL)  # while it waits at the point
        child.wait()
        child.stdout.close()
        child.stdin.close()
        assert running is not None
        with cryptdisk.connect(path, cfg) as db:
            got = db.query(ROWS)
            before = ref.sql(ROWS).fetchall()
            if point == "published":  # committed: the new state
                ref.sql(running)
                assert got == ref.sql(ROWS).fetchall()
                step += 1
            elif point == "commit":  # not yet published: the old state
                assert got == before
            else:  # mid-rewrite: the old state
                assert got == before
            db.check()
            live = {p for (p,) in db.query("SELECT path FROM system.parts")}
            pending = f"v{db.catalog.version + 1}-"
            assert live <= _on_disk(tmp_path)
            assert all(os.path.basename(p).startswith(pending) or point == "published"
                       for p in _on_disk(tmp_path) - live)
            # the next writer's commit deletes the leftovers of the killed statement
            db.execute(f"DELETE FROM t WHERE c_int = {10_000 + step}")  # (matches nothing)
            db.sql("INSERT INTO t SELECT 100000, 'x', 0")
            db.execute("DELETE FROM t WHERE c_int = 100000")
            assert _on_disk(tmp_path) == {p for (p,) in db.query(
                "SELECT path FROM system.parts")}
            assert db.query(ROWS) == ref.sql(ROWS).fetchall()
