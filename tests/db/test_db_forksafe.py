"""A process that forks while DuckDB connections are open: the child never frees them.

Freeing a DuckDB instance of the parent's in a forked child is a segmentation fault
(see ``cryptdisk.db._forksafe``). These fail on code that keeps a connection where the
child frees it: a scan thread's thread-local (at the fork), a database (at exit).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pyarrow as pa

from cryptdisk.db import _scan


def _status(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return status


def test_a_child_forked_after_the_scan_threads_filtered_rows_survives_the_fork(db):
    db.sql("CREATE TABLE t (n BIGINT)")
    db.insert("t", pa.table({"n": pa.array(range(100), pa.int64())}))
    assert db.sql("SELECT count(*) AS c FROM t WHERE n > 5").to_pylist() == [{"c": 94}]
    table = pa.table({"n": pa.array(range(100), pa.int64())})
    pool = _scan._pool()
    tasks = [pool.submit(_scan._rows_kept, table, "n > 5", "t")
             for _ in range(4 * _scan.scan_workers())]
    assert all(t.result().to_pylist().count(True) == 94 for t in tasks)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0)
    assert _status(pid) == 0  # 139 (SIGSEGV) without _forksafe
    # the parent's connections and scan threads carry on
    again = [pool.submit(_scan._rows_kept, table, "n < 10", "t") for _ in range(4)]
    assert all(t.result().to_pylist().count(True) == 10 for t in again)
    assert db.sql("SELECT count(*) AS c FROM t WHERE n > 5").to_pylist() == [{"c": 94}]


def test_a_forked_child_that_exits_normally_and_opens_its_own_database(tmp_path):
    script = textwrap.dedent(f"""
        import os, sys
        import pyarrow as pa
        import cryptdisk
        db = cryptdisk.connect({str(tmp_path / "a")!r})
        db.sql("CREATE TABLE t (n BIGINT)")
        db.insert("t", pa.table({{"n": pa.array(range(10), pa.int64())}}))
        assert db.sql("SELECT sum(n) AS s FROM t").column(0).to_pylist() == [45]
        pid = os.fork()
        if pid == 0:
            own = cryptdisk.connect({str(tmp_path / "b")!r})
            ok = own.sql("SELECT 42 AS x").column(0).to_pylist() == [42]
            own.close()
            sys.exit(0 if ok else 3)  # a normal exit: the interpreter frees what it holds
        _, status = os.waitpid(pid, 0)
        print("child", status)
        print("parent", db.sql("SELECT sum(n) AS s FROM t").column(0).to_pylist()[0])
        db.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["child", "0", "parent", "45"], out.stdout + out.stderr


def test_the_scan_pool_starts_its_threads_as_it_is_made_in_a_process_and_a_forked_child():
    # a scan thread's submit (a part's open reading its key ahead) then finds one idle
    # instead of starting a thread, which waited for the GIL the main thread held
    script = textwrap.dedent("""
        import os, sys, threading
        from cryptdisk.db import _scan
        def scan_threads():
            return sum(t.name.startswith("cryptdisk-scan") for t in threading.enumerate())
        want = min(_scan.scan_workers(), _scan._PRESTART)
        assert scan_threads() == 0
        pool = _scan._pool()
        print("made", scan_threads() == want)
        nested = pool.submit(lambda: pool.submit(lambda: 7).result()).result()
        print("nested", nested, scan_threads() == want or want == _scan.scan_workers())
        pid = os.fork()
        if pid == 0:
            _scan._pool()
            os._exit(0 if scan_threads() == want else 3)
        _, status = os.waitpid(pid, 0)
        print("child", status)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["made", "True", "nested", "7", "True", "child", "0"], \
        out.stdout + out.stderr


def test_a_forked_child_does_not_keep_a_database_locked_after_its_parent_died(tmp_path):
    """A process forked (multiprocessing, Dask) from one that has a database open for
    writing shared the LOCK descriptor, and an flock belongs to the open file: once the
    parent died, the child (which never opened the database) kept it locked, and every
    writer got 'open for writing in another process' until the child exited. The child
    now closes its copy as it starts."""
    import signal

    import cryptdisk

    path = str(tmp_path / "a")
    script = textwrap.dedent(f"""
        import os, time
        import cryptdisk
        db = cryptdisk.connect({path!r})
        db.sql("CREATE TABLE t (n BIGINT)")
        pid = os.fork()
        if pid == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for n in (0, 1, 2):
                os.dup2(null, n)
            time.sleep(120)
            os._exit(0)
        print(pid, flush=True)
        os._exit(0)  # dies with the database open (as kill -9 does)
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    child = int(out.stdout)
    try:
        os.kill(child, 0)  # alive
        db = cryptdisk.connect(path)  # DatabaseLockedError before
        assert db.sql("SELECT count(*) AS c FROM t").to_pylist() == [{"c": 0}]
        db.close()
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_forked_child_letting_go_of_its_parents_database_keeps_its_own_lock(tmp_path):
    """A forked child closes its copy of the parent's LOCK descriptor as it starts, so the
    number is free: the child's own database's LOCK may get it. The parent's database,
    closed or collected in the child, closed that number again, which was the child's own
    database's lock: a second writer could then open it."""
    script = textwrap.dedent(f"""
        import fcntl, gc, os
        import cryptdisk
        db = cryptdisk.connect({str(tmp_path / "a")!r})
        pid = os.fork()
        if pid == 0:
            own = cryptdisk.connect({str(tmp_path / "b")!r})
            del db
            gc.collect()  # the parent's database, collected in the child
            fd = os.open({str(tmp_path / "b" / "LOCK")!r}, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                print("unlocked", flush=True)
            except BlockingIOError:
                print("locked", flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["locked"], out.stdout + out.stderr
