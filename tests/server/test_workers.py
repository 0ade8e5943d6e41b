"""`cryptdisk serve --workers 2`: real worker processes behind one listening socket, real
clients (psycopg over TLS). Cancel requests reach the right worker, user and grant changes
made through one worker hold on the next statement in another, concurrent writers in two
workers lose no update, a worker killed with -9 is replaced while the others go on, SIGTERM
drains them all, and the workers die with their supervisor."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from tests.server.certs import sqlite_serve_config

KEY_HEX = "cd" * 32


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "--ppid", str(pid), "-o", "pid="], capture_output=True,
                         text=True).stdout
    return {int(x) for x in out.split()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _wait_until(check: Any, what: str, limit: float = 60.0) -> None:
    """Poll ``check`` (a bound on how long the test may hang, not a timing assertion)."""
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def connections_in_workers(connect: Any, n: int = 2, limit: float = 120.0,
                           **kw: Any) -> list[psycopg.Connection]:
    """``connect(**kw)`` until the connections are in ``n`` different workers; the others
    are closed. A worker answering is the readiness signal: one just forked (at start, or
    in place of one that died) may take a while to accept under load, so this retries
    until each worker has answered, for at most ``limit`` seconds."""
    found: dict[int, psycopg.Connection] = {}
    extra: list[psycopg.Connection] = []
    deadline = time.monotonic() + limit
    try:
        while len(found) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"only workers {sorted(found)} answered")
            c = connect(**kw)
            worker = c.info.backend_pid >> 24
            if worker in found:
                extra.append(c)  # held open: a busier worker leaves the next to the others
                if len(extra) > 4:
                    extra.pop(0).close()
            else:
                found[worker] = c
    except BaseException:
        for c in found.values():
            c.close()
        raise
    finally:
        for c in extra:
            c.close()
    return list(found.values())


class Served:
    def __init__(self, root: Path, workers: str = "2", extra: str = "",
                 processes: int | None = None, stderr: Any = subprocess.DEVNULL) -> None:
        self.ca, _cert, self.config = sqlite_serve_config(root, "c.toml", KEY_HEX, extra)
        self.db = str(root / "app.db")
        env = {**os.environ, "CRYPTDISK_PASSWORD": "pw"}
        subprocess.run([sys.executable, "-m", "cryptdisk", "serve", self.db, "--sqlite",
                        "--config", str(self.config), "--add-user", "u", "--admin"], env=env,
                       check=True, capture_output=True, timeout=120)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cryptdisk", "serve", self.db, "--sqlite", "--config",
             str(self.config), "--listen", "127.0.0.1:0", "--workers", workers],
            stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=root)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"on 127\.0\.0\.1:(\d+) .*\b(\d+) worker processes", line)
        assert m, line
        self.port, self.workers = int(m[1]), int(m[2])
        expected = processes if processes is not None else self.workers
        _wait_until(lambda: len(_children(self.proc.pid)) == expected, "workers started")

    def connect(self, user: str = "u", password: str = "pw", **kw: Any) -> psycopg.Connection:
        return psycopg.connect(host="localhost", port=self.port, user=user, password=password,
                               dbname="app", sslmode="verify-full", sslrootcert=str(self.ca),
                               autocommit=True, **kw)

    def in_each_worker(self, n: int = 2, **kw: Any) -> list[psycopg.Connection]:
        """Connections until there is one in each of ``n`` different workers (the top bits
        of a session's process id name its worker): a worker just forked may not accept
        yet, so this connects again until each has answered (bounded, to fail rather than
        hang; not a timing assertion)."""
        return connections_in_workers(self.connect, n, **kw)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120)


@pytest.fixture
def served(tmp_path: Path) -> Any:
    s = Served(tmp_path)
    try:
        yield s
    finally:
        workers = _children(s.proc.pid)
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait(60)
        if s.proc.stdout is not None:
            s.proc.stdout.close()
        for pid in workers:  # the workers end with it; never leave one behind
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_connections_spread_over_the_workers(served: Served) -> None:
    ready = served.in_each_worker()  # both workers accept (one connection each, held)
    conns = [served.connect() for _ in range(4)]
    try:
        workers = [c.info.backend_pid >> 24 for c in conns]
        # each worker takes some: the less busy one has 5 ms to take a connection before
        # the other does, which a loaded machine may not schedule it within, so the exact
        # 2 + 2 split is the usual outcome but not a certainty
        assert sorted(set(workers)) == [1, 2], workers
    finally:
        for c in [*conns, *ready]:
            c.close()


def test_cancel_request_reaches_the_session_in_another_worker(served: Served) -> None:
    a, b = served.in_each_worker()
    owner = _owner(served, a)
    idle = _cpu(owner)
    errors: list[BaseException] = []
    started = threading.Event()

    def endless() -> None:
        try:
            started.set()
            a.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                      "SELECT count(*) FROM c")
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=endless)
    t.start()
    started.wait()
    # the statement is running in the owner; stop that worker so only the other can take
    # the cancel connection, which it must pass on
    _wait_until(lambda: _cpu(owner) > idle + 0.3, "the statement runs in its worker")
    os.kill(owner, signal.SIGSTOP)
    try:
        a.cancel_safe(timeout=60)  # a new connection, to the worker not stopped
    finally:
        os.kill(owner, signal.SIGCONT)
    t.join(60)
    assert len(errors) == 1 and isinstance(errors[0], psycopg.errors.QueryCanceled)
    assert a.execute("SELECT 1").fetchone() == (1,)
    assert b.execute("SELECT 2").fetchone() == (2,)
    a.close()
    b.close()


def _owner(served: Served, conn: psycopg.Connection) -> int:
    """The worker process that serves ``conn`` (the one holding its TCP connection)."""
    import socket

    with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
        port = sock.getsockname()[1]
    for pid in _children(served.proc.pid):
        if any(c.raddr and c.raddr.port == port for c in psutil.Process(pid).net_connections()):
            return pid
    raise AssertionError("no worker holds the connection")


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_grants_changed_in_one_worker_hold_in_the_other_at_once(served: Served) -> None:
    admin1, admin2 = served.in_each_worker()
    admin1.execute("CREATE TABLE t (x INTEGER)")
    admin1.execute("INSERT INTO t VALUES (1)")
    admin1.execute("CREATE USER bob PASSWORD 'bobpw'")
    admin1.execute("GRANT SELECT ON t TO bob")
    bob = served.connect("bob", "bobpw")
    bob_worker = bob.info.backend_pid >> 24
    same, other = ((admin1, admin2) if admin1.info.backend_pid >> 24 == bob_worker
                   else (admin2, admin1))
    assert bob.execute("SELECT x FROM t").fetchall() == [(1,)]
    other.execute("REVOKE SELECT ON t FROM bob")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        bob.execute("SELECT x FROM t")
    other.execute("CREATE ROLE readers")
    other.execute("GRANT SELECT ON t TO readers")
    other.execute("GRANT readers TO bob")
    assert bob.execute("SELECT x FROM t").fetchall() == [(1,)]
    assert "bob" in {r[0] for r in same.execute("SELECT * FROM system.users")}
    other.execute("ALTER USER bob PASSWORD 'newpw'")
    bob.close()
    with pytest.raises(psycopg.OperationalError):
        served.connect("bob", "bobpw").close()
    served.connect("bob", "newpw").close()
    for c in (admin1, admin2):
        c.close()


def test_users_created_at_once_in_two_workers_are_all_kept(served: Served) -> None:
    conns = served.in_each_worker()
    barrier = threading.Barrier(2)

    def create(conn: psycopg.Connection, prefix: str) -> None:
        barrier.wait()
        for i in range(10):
            conn.execute(f"CREATE USER {prefix}{i} PASSWORD 'p'")

    threads = [threading.Thread(target=create, args=(c, p)) for c, p in zip(conns, "xy")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for c in conns:
        names = {r[0] for r in c.execute("SELECT * FROM system.users")}
        assert {f"{p}{i}" for p in "xy" for i in range(10)} <= names
        c.close()


def test_writers_in_two_workers_lose_no_update(served: Served) -> None:
    a, b = served.in_each_worker()
    a.execute("CREATE TABLE counter (n INTEGER)")
    a.execute("INSERT INTO counter VALUES (0)")
    # one worker holds the write lock; the other's writer waits for it, then goes on
    a.execute("BEGIN")
    a.execute("UPDATE counter SET n = n + 1")
    done = threading.Event()

    def wait_and_write() -> None:
        b.execute("BEGIN")
        b.execute("UPDATE counter SET n = n + 1")
        b.execute("COMMIT")
        done.set()

    t = threading.Thread(target=wait_and_write)
    t.start()
    a.execute("COMMIT")
    t.join(60)
    assert done.is_set()
    assert a.execute("SELECT n FROM counter").fetchone() == (2,)

    def increments(conn: psycopg.Connection, explicit: bool) -> None:
        for _ in range(50):
            if explicit:
                conn.execute("BEGIN")
                conn.execute("UPDATE counter SET n = n + 1")
                conn.execute("COMMIT")
            else:
                conn.execute("UPDATE counter SET n = n + 1")

    threads = [threading.Thread(target=increments, args=(c, e))
               for c in (a, b) for e in (True,)]
    third = served.connect()  # autocommit writes, in whichever worker
    threads.append(threading.Thread(target=increments, args=(third, False)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert b.execute("SELECT n FROM counter").fetchone() == (2 + 150,)
    for c in (a, b, third):
        c.close()


def test_a_killed_worker_is_replaced_and_the_others_go_on(served: Served) -> None:
    a, b = served.in_each_worker()
    a.execute("CREATE TABLE t (id INTEGER PRIMARY KEY)")
    a.execute("INSERT INTO t VALUES (1)")
    before = _children(served.proc.pid)
    victim = _owner(served, a)
    assert victim in before
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(psycopg.OperationalError):
        a.execute("SELECT 1")
    assert b.execute("INSERT INTO t VALUES (2)").rowcount == 1  # the other worker goes on
    _wait_until(lambda: len(_children(served.proc.pid)) == 2
                and victim not in _children(served.proc.pid), "the worker was replaced")
    conns = served.in_each_worker()  # the new worker serves: connect until it answered
    for c in conns:
        assert c.execute("SELECT count(*) FROM t").fetchone() == (2,)
        c.close()
    assert b.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    b.close()
    workers = _children(served.proc.pid)
    assert served.stop() == 0
    assert not any(_alive(p) for p in workers)  # no orphans


def test_sigterm_drains_every_worker(served: Served) -> None:
    a, b = served.in_each_worker()
    workers = _children(served.proc.pid)
    assert served.stop() == 0
    assert not any(_alive(p) for p in workers)
    for c in (a, b):  # idle sessions were told and closed
        with pytest.raises(psycopg.OperationalError):
            c.execute("SELECT 1")
        c.close()


def test_workers_exit_when_the_supervisor_is_killed(served: Served) -> None:
    c = served.connect()
    workers = _children(served.proc.pid)
    assert len(workers) == 2
    served.proc.kill()
    served.proc.wait(60)
    _wait_until(lambda: not any(_alive(p) for p in workers), "the workers exited")
    with pytest.raises(psycopg.OperationalError):
        c.execute("SELECT 1")
    c.close()


def test_no_key_material_in_process_listings(served: Served) -> None:
    for pid in {served.proc.pid, *_children(served.proc.pid)}:
        for name in ("cmdline", "environ"):
            with open(f"/proc/{pid}/{name}", "rb") as f:
                text = f.read()
            assert KEY_HEX.encode() not in text and b"pw" not in text.split(b"\0")


def test_the_analytical_engine_refuses_several_workers(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "cryptdisk", "serve", str(tmp_path / "a.db"),
                          "--workers", "2", "--check"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0
    assert "--workers 2" in out.stderr and "one process" in out.stderr
    assert "Traceback" not in out.stderr


def test_bad_worker_counts_are_refused(tmp_path: Path) -> None:
    for bad in ("0", "x", "65"):
        out = subprocess.run([sys.executable, "-m", "cryptdisk", "serve",
                              str(tmp_path / "s.db"), "--sqlite", "--key-env", "NOPE",
                              "--workers", bad, "--check"], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode != 0 and "Traceback" not in out.stderr


def test_encrypted_access_log_gets_every_line_from_every_worker(tmp_path: Path) -> None:
    from cryptdisk import open as cd_open
    from cryptdisk.keys import Key, Keyring

    log_path = tmp_path / "access.log"
    served = Served(tmp_path, extra=f'access_log = "{log_path}"\naccess_log_encrypted = true',
                    processes=3)  # two workers and the log writer
    try:
        a, b = served.in_each_worker()
        a.execute("CREATE TABLE t (x INTEGER)")
        for i in range(20):
            (a if i % 2 else b).execute("INSERT INTO t VALUES (%s)", (i,))
        # the writer killed: lines sent meanwhile wait in the socket for the next one
        writer = next(p for p in _children(served.proc.pid)
                      if p not in {_owner(served, a), _owner(served, b)})
        os.kill(writer, signal.SIGKILL)
        for i in range(20, 30):
            (a if i % 2 else b).execute("INSERT INTO t VALUES (%s)", (i,))
        _wait_until(lambda: len(_children(served.proc.pid)) == 3
                    and writer not in _children(served.proc.pid), "the writer was replaced")
        a.close()
        b.close()
        assert served.stop() == 0
    finally:
        if served.proc.poll() is None:
            served.proc.kill()
            served.proc.wait(60)
        if served.proc.stdout is not None:
            served.proc.stdout.close()
    import json

    with cd_open(log_path, "rb", keyring=Keyring([Key(1, bytes.fromhex(KEY_HEX))])) as f:
        lines = [json.loads(line) for line in f.read().splitlines()]
    inserts = [e for e in lines if e["kind"] == "INSERT"]
    assert len(inserts) == 30 and all(e["rows"] == 1 and e["tables"] == ["t"] for e in inserts)


def test_a_writer_waiting_longer_than_lock_timeout_gets_55p03(tmp_path: Path) -> None:
    served = Served(tmp_path, extra="lock_timeout = 1")
    try:
        a, b = served.in_each_worker()
        a.execute("CREATE TABLE t (x INTEGER)")
        a.execute("BEGIN")
        a.execute("INSERT INTO t VALUES (1)")  # holds the write lock
        b.execute("BEGIN")
        with pytest.raises(psycopg.errors.LockNotAvailable, match="write lock"):
            b.execute("INSERT INTO t VALUES (2)")
        b.execute("ROLLBACK")
        a.execute("COMMIT")
        b.execute("INSERT INTO t VALUES (3)")  # free again
        assert a.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (3,)]
        a.close()
        b.close()
    finally:
        served.stop()
        if served.proc.stdout is not None:
            served.proc.stdout.close()


def _waits_for_the_lock(served: Served, worker: int) -> bool:
    """Whether ``worker`` waits for another worker's write lock: it writes its pid into the
    first bytes of memory the supervisor made and shares with the workers (an anonymous
    shared mapping of one page), read here through the supervisor's /proc/PID/mem."""
    import struct

    pid = served.proc.pid
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if end - start != 4096 or fields[1] != "rw-s" or "/dev/zero" not in line:
                continue
            mem.seek(start)
            if struct.unpack("q", mem.read(8))[0] == worker:
                return True
    return False


def _cancel_until_done(conn: psycopg.Connection, statements: list[str],
                       waiting: Any = None) -> BaseException | None:
    """Run ``statements`` on ``conn`` in a thread and send CancelRequests (after ``waiting()``
    says it waits, if given) until they end; what they raised. A cancel that arrives before
    the statement is ignored, as in PostgreSQL, hence the repeats; the bound makes a wait
    that no cancel ends fail the test instead of hanging it."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            for st in statements:
                conn.execute(st)
            raised.append(None)
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    if waiting is not None:
        _wait_until(waiting, "the statement waits for the write lock")
    deadline = time.monotonic() + 60
    while t.is_alive() and time.monotonic() < deadline:
        conn.cancel_safe(timeout=30)
        t.join(0.2)
    assert not t.is_alive(), "a CancelRequest did not end the wait for the write lock"
    return raised[0]


def test_a_cancel_ends_a_wait_for_the_write_lock(tmp_path: Path) -> None:
    """A session waiting for another's write lock (another worker's, on the flock; its own
    worker's queue; SQLite's lock, for a statement outside a transaction) stops waiting at a
    CancelRequest with 57014, holds no lock after it, and goes on working."""
    served = Served(tmp_path, extra="lock_timeout = 600")  # no wait here ends by itself
    try:
        a, b = served.in_each_worker()
        same = connections_in_workers(served.connect, 2)  # one more in a's worker
        c = next(x for x in same if x.info.backend_pid >> 24 == a.info.backend_pid >> 24)
        a.execute("CREATE TABLE t (x INTEGER)")
        a.execute("BEGIN")
        a.execute("INSERT INTO t VALUES (1)")  # a holds the write lock
        b_worker = _owner(served, b)
        # another worker's session, in a transaction: it waits on the cross-process flock
        err = _cancel_until_done(b, ["BEGIN", "INSERT INTO t VALUES (2)"],
                                 waiting=lambda: _waits_for_the_lock(served, b_worker))
        assert isinstance(err, psycopg.errors.QueryCanceled), err
        b.execute("ROLLBACK")
        # a session in the same worker as the holder: it waits in that worker's queue
        err = _cancel_until_done(c, ["BEGIN", "INSERT INTO t VALUES (3)"])
        assert isinstance(err, psycopg.errors.QueryCanceled), err
        c.execute("ROLLBACK")
        # outside a transaction: the statement waits for SQLite's lock
        err = _cancel_until_done(b, ["INSERT INTO t VALUES (4)"])
        assert isinstance(err, psycopg.errors.QueryCanceled), err
        assert b.execute("SELECT 1").fetchone() == (1,)  # usable while a still writes
        a.execute("INSERT INTO t VALUES (5)")
        a.execute("COMMIT")
        # no cancelled wait took the lock: every session writes again, in turn
        b.execute("BEGIN")
        b.execute("INSERT INTO t VALUES (6)")
        b.execute("COMMIT")
        c.execute("INSERT INTO t VALUES (7)")
        a.execute("INSERT INTO t VALUES (8)")
        assert [r[0] for r in a.execute("SELECT x FROM t ORDER BY x")] == [1, 5, 6, 7, 8]
        for conn in [a, b, *same]:
            conn.close()
    finally:
        served.stop()
        if served.proc.stdout is not None:
            served.proc.stdout.close()


def test_a_user_added_by_another_command_can_log_in_to_every_worker(served: Served) -> None:
    conns = served.in_each_worker()  # both workers have loaded the user file already
    env = {**os.environ, "CRYPTDISK_PASSWORD": "carolpw"}
    subprocess.run([sys.executable, "-m", "cryptdisk", "serve", served.db, "--sqlite",
                    "--config", str(served.config), "--add-user", "carol"], env=env,
                   check=True, capture_output=True, timeout=120)
    logged_in = served.in_each_worker(user="carol", password="carolpw")  # fails otherwise
    for c in [*logged_in, *conns]:
        c.close()


def test_a_worker_killed_during_writes_loses_no_acknowledged_commit(served: Served) -> None:
    a, b = served.in_each_worker()
    a.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, worker INTEGER)")
    victim = _owner(served, a)
    acked: dict[str, list[int]] = {"a": [], "b": []}
    enough = threading.Event()
    stop = threading.Event()

    def writer(conn: psycopg.Connection, name: str, start: int) -> None:
        i = start
        try:
            while not stop.is_set():
                conn.execute("BEGIN")
                conn.execute("INSERT INTO t VALUES (%s, %s)", (i, start))
                conn.execute("COMMIT")  # acknowledged from here on
                acked[name].append(i)
                if len(acked["a"]) >= 50:
                    enough.set()
                i += 2
        except psycopg.Error:
            return  # its worker was killed

    threads = [threading.Thread(target=writer, args=(a, "a", 0)),
               threading.Thread(target=writer, args=(b, "b", 1))]
    for t in threads:
        t.start()
    assert enough.wait(300), "the writers made no progress"
    os.kill(victim, signal.SIGKILL)
    threads[0].join(60)
    survived = len(acked["b"])
    _wait_until(lambda: len(acked["b"]) > survived + 20, "the other worker's writer goes on")
    stop.set()
    threads[1].join(60)
    c = served.connect()
    ids = {r[0] for r in c.execute("SELECT id FROM t")}
    assert set(acked["a"]) | set(acked["b"]) <= ids
    assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    for conn in (a, b, c):
        conn.close()


def test_failed_logins_add_up_across_the_workers(tmp_path: Path) -> None:
    """Two failed logins reach one worker, the third the other (each in turn the only one
    running, the other stopped): the third is counted as the third, so its delay is the
    third's, not the first's as it would be if each worker counted its own."""
    with open(tmp_path / "stderr.log", "w") as err:
        served = Served(tmp_path, stderr=err)
    try:
        a, b = served.in_each_worker()
        first, second = _owner(served, a), _owner(served, b)

        def fail_login() -> None:
            with pytest.raises(psycopg.OperationalError, match="password authentication"):
                served.connect("mallory", "guess")

        os.kill(second, signal.SIGSTOP)  # only the first worker accepts
        try:
            fail_login()
            fail_login()
        finally:
            os.kill(second, signal.SIGCONT)
        os.kill(first, signal.SIGSTOP)  # only the second worker accepts
        try:
            fail_login()
        finally:
            os.kill(first, signal.SIGCONT)
        a.close()
        b.close()
        assert served.stop() == 0
    finally:
        if served.proc.poll() is None:
            served.proc.kill()
            served.proc.wait(60)
        if served.proc.stdout is not None:
            served.proc.stdout.close()
    failures = re.findall(r"login failed for user 'mallory' .*\(failure (\d+)\)",
                          (tmp_path / "stderr.log").read_text())
    assert failures == ["1", "2", "3"]


def test_the_shared_failure_table_counts_across_forks_and_survives_a_killed_holder() -> None:
    import fcntl

    from cryptdisk.server._users import _SharedFailures

    table = _SharedFailures(b"s" * 32, buckets=1, ways=2)
    try:
        assert [table.add("u:a"), table.add("u:a")] == [1, 2]
        pid = os.fork()
        if pid == 0:  # a forked process counts in the same table
            if table.add("u:a") != 3:
                os._exit(1)
            with table._locked():  # then dies holding the lock
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL  # it counted 3, then died
        fcntl.lockf(table._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by its death
        fcntl.lockf(table._file.fileno(), fcntl.LOCK_UN)
        assert table.add("u:a") == 4
        table.clear("u:a")
        assert table.add("u:a") == 1
        # bounded: a full bucket gives the entry used longest ago to a new key
        table.add("u:b")
        table.add("u:a")
        assert table.add("u:c") == 1  # takes u:b's entry
        assert table.add("u:a") == 3 and table.add("u:b") == 1
    finally:
        table.close()


def test_no_room_for_the_shared_failure_table_is_a_clear_error(monkeypatch: Any) -> None:
    import tempfile

    from cryptdisk.errors import ServerError
    from cryptdisk.server._users import _SharedFailures

    def full(*_a: Any, **_k: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "TemporaryFile", full)
    with pytest.raises(ServerError, match=r"failed-login table.*No space left") as err:
        _SharedFailures(b"s" * 32)
    assert err.value.hint is not None and "--workers 1" in err.value.hint


def _slow_log_writer(path: str, sock: Any, started: str) -> None:
    """The log writer, its writes stopped before any byte of the line reaches the file."""
    from cryptdisk.keys import Key, Keyring
    from cryptdisk.server import _accesslog, _workers

    def stuck(self: Any, data: bytes) -> None:
        Path(started).write_bytes(data)
        time.sleep(600)

    _accesslog.AccessLog.write_line = stuck  # type: ignore[method-assign]
    _workers._write_log(path, Keyring([Key(1, bytes.fromhex(KEY_HEX))]), sock)


def _log_writer(path: str, sock: Any) -> None:
    from cryptdisk.keys import Key, Keyring
    from cryptdisk.server import _workers

    _workers._write_log(path, Keyring([Key(1, bytes.fromhex(KEY_HEX))]), sock)


def test_a_log_writer_killed_mid_line_leaves_it_to_the_next(tmp_path: Path) -> None:
    """The line a writer holds when it is killed (-9) is written by the next writer: it left
    the queue only once written (before, the writer took it off first, and it was lost)."""
    import multiprocessing
    import socket

    from cryptdisk import open as cd_open
    from cryptdisk.keys import Key, Keyring
    from cryptdisk.server._accesslog import line

    ctx = multiprocessing.get_context("fork")
    worker_end, writer_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    path, started = str(tmp_path / "access.log"), str(tmp_path / "started")
    first, second = line({"kind": "INSERT", "n": 1}), line({"kind": "INSERT", "n": 2})
    with worker_end, writer_end:
        stuck = ctx.Process(target=_slow_log_writer, args=(path, writer_end, started))
        stuck.start()
        worker_end.send(first)
        _wait_until(lambda: os.path.exists(started), "the writer took the line")
        assert Path(started).read_bytes() == first
        os.kill(stuck.pid, signal.SIGKILL)  # type: ignore[arg-type]
        stuck.join(60)
        worker_end.send(second)
        writer = ctx.Process(target=_log_writer, args=(path, writer_end))
        # forked with SIGTERM blocked, as the supervisor forks it: it takes the signal once
        # its handler is in place
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            writer.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        # SIGTERM: the writer writes what is queued, then exits
        os.kill(writer.pid, signal.SIGTERM)  # type: ignore[arg-type]
        writer.join(60)
    assert writer.exitcode == 0
    with cd_open(path, "rb", keyring=Keyring([Key(1, bytes.fromhex(KEY_HEX))])) as f:
        assert f.read() == first + second
