"""kill -9 a real writer at random moments; the database must stay consistent.

After each kill the database opens, every insert the child reported as
committed is there (and the one in flight is either wholly there or absent),
no file on disk is outside the catalog but those written for the commit that
did not happen, and every part matches its digest.
"""

import os
import random
import signal
import subprocess
import sys
import threading

import pytest

import cryptdisk

from .dbhelpers import SCHEMA, gen, write_config

CHILD = os.path.join(os.path.dirname(__file__), "crash_child.py")
PAUSE_CHILD = os.path.join(os.path.dirname(__file__), "pause_child.py")
TRIALS = int(os.environ.get("CRYPTDISK_CRASH_TRIALS", "10"))


def env():
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))


def disk_files(root):
    out = []
    for r, _d, fs in os.walk(root):
        out += [os.path.relpath(os.path.join(r, f), root) for f in fs]
    return sorted(out)


def check_consistent(path, cfg, committed):
    with cryptdisk.connect(path, cfg) as db:
        rows = db.query("SELECT c_int, count(*) FROM t GROUP BY c_int ORDER BY c_int")
        ids = [i for i, _n in rows]
        assert all(n == 2000 for _i, n in rows), rows  # whole inserts only
        assert ids == list(range(len(ids)))  # no gaps: every committed insert is there
        assert len(ids) in (committed, committed + 1)  # plus maybe the one in flight
        # every part holds the catalog's columns (an ALTER's rewrite is whole or absent)
        assert db.arrow_table("t").column_names == [c for c, _t in db.table("t").columns]
        live = {(d, p) for d, p in db.query("SELECT disk, path FROM system.parts")}
        on_disk = set()
        for disk in ("secure", "open"):
            root = os.path.join(os.path.dirname(cfg), "store", disk)
            on_disk |= {(disk, f) for f in disk_files(root)}
        assert live <= on_disk  # nothing missing
        # No temporaries, and no orphans but those written for the version that the
        # killed writer never published (kept until the catalog passes it).
        pending = f"v{db.catalog.version + 1}-"
        assert all(os.path.basename(p).startswith(pending) for _d, p in on_disk - live)
        db.check()
        return len(ids)


@pytest.mark.slow
@pytest.mark.parametrize("operation", ["insert", "optimize", "move", "rotate", "alter"])
def test_kill_during_writes(tmp_path, operation):
    cfg_a = write_config(tmp_path, [1, 2], 1, "a.toml")
    cfg_b = write_config(tmp_path, [1, 2], 2, "b.toml")
    path = str(tmp_path / "db")
    with cryptdisk.connect(path, cfg_a) as db:
        db.sql(f"CREATE TABLE t {SCHEMA}")
    rng = random.Random(operation)
    committed = 0
    for _trial in range(TRIALS):
        child = subprocess.Popen([sys.executable, CHILD, path, str(cfg_a), str(cfg_b),
                                  operation], stdout=subprocess.PIPE, text=True, env=env())
        # Kill points come from the child's own reports: after its n-th report the
        # child is already working on the next step (a commit, a merge, a move...).
        reported = ""
        for _ in range(rng.randrange(1, 8)):
            line = child.stdout.readline()
            assert line, "child died before it was killed"
            reported += line
        child.send_signal(signal.SIGKILL)
        out = reported + child.stdout.read()
        child.stdout.close()
        child.wait()
        committed += out.count("committed")
        committed = check_consistent(path, str(cfg_a), committed)


@pytest.mark.slow
@pytest.mark.parametrize("operation", ["big-insert", "big-insert-sorted"])
def test_kill_while_an_insert_writes_its_parts_on_several_threads(tmp_path, operation):
    """kill -9 while one insert's threads are busy: DuckDB producing the next batches, part
    threads sorting and encoding blocks (random keys: a part per block, two at once; keys
    in order: blocks appended to one part), their threads hashing and encrypting, earlier
    parts published. The insert is wholly absent, the next writer's commit removes its
    files, nothing is lost."""
    from .crash_child import BIG

    cfg = write_config(tmp_path, [1], 1, "a.toml")
    path = str(tmp_path / "db")
    with cryptdisk.connect(path, cfg) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_str")
        db.sql(f"INSERT INTO t {gen(1000)}")
    rng = random.Random(7)
    killed_at, expected = [], 1000
    for trial in range(max(2, TRIALS // 3)):
        child = subprocess.Popen([sys.executable, CHILD, path, str(cfg), str(cfg),
                                  operation], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env=env())
        assert child.stdin is not None and child.stdout is not None
        # kill after a random number of the child's own row reports (up to 4 parts' worth);
        # the reporting thread waits after each for the word to go on
        wanted, written = rng.randrange(1, BIG - 40_000), 0
        while True:
            line = child.stdout.readline()
            assert line.startswith("rows "), f"child ended before it was killed: {line!r}"
            written += int(line.split()[1])
            if written >= wanted:
                break
            child.stdin.write("go\n")
            child.stdin.flush()
        child.send_signal(signal.SIGKILL)  # while a thread waits in its report
        rest = child.stdout.read()
        child.stdout.close()
        child.wait()
        child.stdin.close()
        assert "committed" not in rest
        killed_at.append(written)
        with cryptdisk.connect(path, cfg) as db:
            assert db.query("SELECT count(*) FROM t") == [(expected,)]
            db.check()
            db.sql(f"INSERT INTO t {gen(1, 5000 + trial)}")  # its commit removes the orphans
            expected += 1
            live = {p for (p,) in db.query("SELECT path FROM system.parts")}
            on_disk = set(disk_files(os.path.join(tmp_path, "store", "secure")))
            assert on_disk == live, on_disk - live
            assert db.query("SELECT count(*) FROM t") == [(expected,)]
    assert max(killed_at) > 40_000  # some kills came after a part had been published


def test_second_process_gets_locked_error(tmp_path):
    path = str(tmp_path / "db")
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA}")
        code = ("import cryptdisk, sys\n"
                "try:\n"
                f"    cryptdisk.connect({path!r})\n"
                "except cryptdisk.DatabaseLockedError as e:\n"
                "    print('locked:', e); sys.exit(3)\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env(), timeout=60)
        assert done.returncode == 3, done.stderr
        assert "open for writing in another process" in done.stdout
        reader = subprocess.run(
            [sys.executable, "-c", f"import cryptdisk; print(cryptdisk.connect({path!r}, "
             "read_only=True).query('SELECT count(*) FROM t'))"],
            capture_output=True, text=True, env=env(), timeout=60)
        assert reader.stdout.strip() == "[(0,)]", reader.stderr


@pytest.mark.slow
@pytest.mark.parametrize("operation", ["insert", "optimize"])
def test_readers_see_whole_inserts_while_another_process_writes(tmp_path, operation):
    cfg = write_config(tmp_path, [1], 1, "a.toml")
    path = str(tmp_path / "db")
    with cryptdisk.connect(path, cfg) as db:
        db.sql(f"CREATE TABLE t {SCHEMA}")
    child = subprocess.Popen([sys.executable, CHILD, path, str(cfg), str(cfg), operation],
                             stdout=subprocess.PIPE, text=True, env=env())
    try:
        reported = 0  # inserts the writer has reported committed
        seen = []
        with cryptdisk.connect(path, cfg, read_only=True, cache_bytes=1 << 20) as reader:
            # Driven by the writer's reports, not a clock: read until it reports a commit
            # the reader's first look could not have seen, then look again.
            while not seen or reported <= seen[0]:
                line = child.stdout.readline()
                assert line, "the writer died"
                if line.startswith("committed "):
                    reported = int(line.split()[1]) + 1
                rows = reader.query("SELECT count(*), count(DISTINCT c_int) FROM t")[0]
                assert rows[0] == 2000 * rows[1]  # whole inserts only
                assert rows[1] >= reported  # every reported commit is visible
                seen.append(rows[1])
        assert seen == sorted(seen) and seen[-1] > seen[0]  # commits appear, never vanish
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def pause_writer(path, name, statement, config=None):
    """A writer process stopped just before it renames a temporary onto ``name``."""
    args = [sys.executable, PAUSE_CHILD, path, name, statement] + ([str(config)] if config else [])
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env())
    assert child.stdout.readline() == "open\n"
    line = child.stdout.readline()
    assert line.startswith("paused "), line
    return child, line.split(" ", 1)[1].strip()


def kill(child):
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()


def test_catalog_temporaries_of_killed_writers_are_removed_by_the_next_writer(tmp_path):
    path = str(tmp_path / "db")
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA}")
        db.sql(f"INSERT INTO t {gen(100)}")
    child, temp = pause_writer(path, "catalog", f"INSERT INTO t {gen(10, 1000)}")
    try:
        assert os.path.dirname(temp) == path and os.path.exists(temp)
        # The writer is alive: no second writer can open, and a reader leaves its
        # temporary alone.
        with pytest.raises(cryptdisk.DatabaseLockedError):
            cryptdisk.connect(path)
        with cryptdisk.connect(path, read_only=True) as reader:
            assert reader.query("SELECT count(*) FROM t") == [(100,)]
        assert os.path.exists(temp)
    finally:
        kill(child)
    assert os.path.exists(temp)
    with cryptdisk.connect(path) as db:
        assert not [n for n in os.listdir(path) if n.endswith(".cdtmp")]
        assert db.query("SELECT count(*) FROM t") == [(100,)]  # never published
        db.check()


@pytest.mark.slow
def test_check_on_a_reader_passes_while_another_process_optimizes(tmp_path):
    cfg = write_config(tmp_path, [1], 1, "a.toml")
    path = str(tmp_path / "db")
    with cryptdisk.connect(path, cfg) as db:
        db.sql(f"CREATE TABLE t {SCHEMA}")
    child = subprocess.Popen([sys.executable, CHILD, path, str(cfg), str(cfg), "optimize"],
                             stdout=subprocess.PIPE, text=True, env=env())
    steps = []  # the child's progress: an insert or an OPTIMIZE each

    def follow():
        for line in child.stdout:
            steps.append(line)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        checks = 0
        with cryptdisk.connect(path, cfg, read_only=True, cache_bytes=1 << 20) as reader:
            while len(steps) < 120:  # about 80 merges, each deleting the parts it merged
                assert child.poll() is None, "the writer died"
                reader.check()
                checks += 1
        assert checks > 10
    finally:
        child.kill()
        child.wait()
        follower.join()
        child.stdout.close()


SIGTERM_CHILD = """\
import os, sys, time
from cryptdisk.cli import main
real_replace, name = os.replace, sys.argv[-1]
def replace(src, dst, *args, **kwargs):
    if os.path.basename(os.fspath(dst)) == name:
        print("paused " + os.fspath(src), flush=True)
        time.sleep(600)
    return real_replace(src, dst, *args, **kwargs)
os.replace = replace
sys.argv = ["cryptdisk"] + sys.argv[1:-1]
sys.exit(main())
"""


@pytest.mark.parametrize("name", ["catalog", "pin"])
def test_sigterm_ends_a_cli_writer_cleanly(tmp_path, name):
    """kill (SIGTERM) a ``cryptdisk sql`` writer while it publishes the catalog or its pin:
    it ends as an error does (status 143, a message), deleting its temporary and letting go
    of the lock, with no second writer needed to clean up after it."""
    path = str(tmp_path / "db")
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA}")
        db.sql(f"INSERT INTO t {gen(100)}")
    child = subprocess.Popen([sys.executable, "-c", SIGTERM_CHILD, "sql", path, "-q",
                              f"INSERT INTO t {gen(10, 1000)}", name],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env())
    line = child.stdout.readline()
    assert line.startswith("paused "), line + child.stderr.read()
    temp = line.split(" ", 1)[1].strip()
    assert os.path.exists(temp) and temp.endswith(".cdtmp")
    child.send_signal(signal.SIGTERM)
    _out, err = child.communicate(timeout=60)
    assert child.returncode == 128 + signal.SIGTERM, err
    assert "cryptdisk: error: terminated (SIGTERM)" in err
    assert "Traceback" not in err
    assert not os.path.exists(temp)
    leftovers = [os.path.join(r, f) for r, _d, fs in os.walk(path) for f in fs
                 if f.endswith(".cdtmp")]
    assert not leftovers
    with cryptdisk.connect(path) as db:  # the lock was let go
        # the catalog's rename never ran: the insert is absent; the pin came after it
        assert db.query("SELECT count(*) FROM t") == [(100 if name == "catalog" else 110,)]
        db.check()


def test_a_new_database_and_its_key_are_durable_in_their_parent(tmp_path, monkeypatch):
    """A database whose creation returned survives a power loss: its directory's name and
    its key file's are fsynced in their parent, the key before a catalog is encrypted under
    it (a power loss cannot be staged here, so the fsyncs are recorded). Before, neither
    name was ever fsynced in the parent: only the catalog, in the database's directory."""
    path = tmp_path / "new.db"
    key = tmp_path / "new.db.key"
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        synced.append((target, path.is_dir(), key.exists(), (path / "catalog").exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    cryptdisk.connect(str(path)).close()
    monkeypatch.undo()
    parent = [(d, k, c) for t, d, k, c in synced if t == str(tmp_path)]
    assert (True, False, False) in parent  # the directory, before its key
    assert (True, True, False) in parent  # the key, before the catalog
    with cryptdisk.connect(str(path)) as db:
        assert db.catalog.version >= 1
