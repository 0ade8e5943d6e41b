"""kill -9 of `cryptdisk serve --sqlite` (its supervisor and worker processes) during
inserts from several clients: every acknowledged commit survives, and no transaction is
half applied; with a rollback journal and in WAL mode (group commit: synchronous=NORMAL,
the WAL synced after the write lock is released, before the client hears of the commit)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

import psutil
import psycopg
import pytest

from tests.server.certs import sqlite_serve_config

CLIENTS, ACKED_BEFORE_KILL = 4, 200


def serve(db: str, config, cwd) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "cryptdisk", "serve", db, "--sqlite",
                             "--config", str(config), "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=cwd)
    for line in proc.stdout:
        m = re.search(r"on 127\.0\.0\.1:(\d+)", line)
        if m:
            return proc, int(m[1])
    raise AssertionError("the server did not start")


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_kill_9_during_inserts_keeps_every_acknowledged_commit(tmp_path, journal) -> None:
    ca, _cert, config = sqlite_serve_config(tmp_path, "c.toml", "cd" * 32)
    db = str(tmp_path / "app.db")
    env = {**os.environ, "CRYPTDISK_PASSWORD": "pw"}
    subprocess.run([sys.executable, "-m", "cryptdisk", "serve", db, "--sqlite", "--config",
                    str(config), "--add-user", "u", "--admin"], env=env, check=True,
                   capture_output=True, timeout=120)
    proc, port = serve(db, config, tmp_path)
    dsn = dict(host="localhost", port=port, user="u", password="pw", dbname="app",
               sslmode="verify-full", sslrootcert=str(ca))
    with psycopg.connect(**dsn, autocommit=True) as c:
        c.execute("CREATE TABLE a (id INTEGER PRIMARY KEY)")
        c.execute("CREATE TABLE b (id INTEGER PRIMARY KEY)")
        c.execute(f"PRAGMA journal_mode={journal}")  # for the sessions opened from now on
    acked: set[int] = set()
    lock = threading.Lock()
    enough = threading.Event()

    def client(n: int) -> None:
        try:
            with psycopg.connect(**dsn) as c:
                i = n
                while True:
                    c.execute("INSERT INTO a VALUES (%s)", (i,))
                    c.execute("INSERT INTO b VALUES (%s)", (i,))
                    c.commit()  # acknowledged from here on
                    with lock:
                        acked.add(i)
                        if len(acked) >= ACKED_BEFORE_KILL:
                            enough.set()
                    i += CLIENTS
        except psycopg.Error:
            return  # the server was killed

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    assert enough.wait(300), "the clients made no progress"
    # every process at once: the supervisor and its workers (which would otherwise drain
    # when it dies), so writes are cut mid-way as by a machine crash
    for pid in [*(p.pid for p in psutil.Process(proc.pid).children()), proc.pid]:
        os.kill(pid, signal.SIGKILL)
    proc.wait(60)
    proc.stdout.close()
    for t in threads:
        t.join(120)
    proc, port = serve(db, config, tmp_path)
    try:
        with psycopg.connect(**{**dsn, "port": port}, autocommit=True) as c:
            in_a = {r[0] for r in c.execute("SELECT id FROM a")}
            in_b = {r[0] for r in c.execute("SELECT id FROM b")}
            assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert c.execute("PRAGMA journal_mode").fetchone() == (journal,)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        proc.stdout.close()
    assert acked <= in_a            # every acknowledged commit is there
    assert in_a == in_b             # nothing half applied
