"""pgbench's schema, data and transactions on SQLite: plain, cryptdisk and SQLCipher.

The transactions are pgbench's built-in scripts, statement for statement:

- ``tpcb-like``: ``BEGIN; UPDATE pgbench_accounts SET abalance = abalance + :delta
  WHERE aid = :aid; SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
  UPDATE pgbench_tellers ...; UPDATE pgbench_branches ...; INSERT INTO
  pgbench_history ... CURRENT_TIMESTAMP; END`` with aid, bid, tid, delta drawn
  uniformly as pgbench does. SQLite starts it with ``BEGIN IMMEDIATE`` (several
  writer processes would otherwise deadlock on the lock upgrade and abort).
- ``select-only``: ``SELECT abalance FROM pgbench_accounts WHERE aid = :aid``.

Each client is a separate process (``spawn``), opens its own connection, waits
at a common start, runs for a fixed time and reports its transaction count,
latencies and the CPU seconds it used in that window.
"""

from __future__ import annotations

import array
import os
import random
import resource
import time
from dataclasses import dataclass
from typing import Any

from ._measure import peak_rss_mb

__all__ = ["SCHEMA", "ClientResult", "DbSpec", "client_main", "load", "open_db"]

ACCOUNTS_PER_SCALE = 100_000
SCHEMA = [
    "CREATE TABLE pgbench_branches(bid INTEGER PRIMARY KEY, bbalance INT, filler CHAR(88))",
    "CREATE TABLE pgbench_tellers(tid INTEGER PRIMARY KEY, bid INT, tbalance INT, "
    "filler CHAR(84))",
    "CREATE TABLE pgbench_accounts(aid INTEGER PRIMARY KEY, bid INT, abalance INT, "
    "filler CHAR(84))",
    "CREATE TABLE pgbench_history(tid INT, bid INT, aid INT, delta INT, mtime TIMESTAMP, "
    "filler CHAR(22))",
]
TPCB = [
    "UPDATE pgbench_accounts SET abalance = abalance + ? WHERE aid = ?",
    "SELECT abalance FROM pgbench_accounts WHERE aid = ?",
    "UPDATE pgbench_tellers SET tbalance = tbalance + ? WHERE tid = ?",
    "UPDATE pgbench_branches SET bbalance = bbalance + ? WHERE bid = ?",
    "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) "
    "VALUES (?, ?, ?, ?, CURRENT_TIMESTAMP)",
]
SELECT = "SELECT abalance FROM pgbench_accounts WHERE aid = ?"


@dataclass
class DbSpec:
    """What a client needs to open one strategy's database (picklable, no key object)."""

    strategy: str  # "plain", "cryptdisk", "sqlcipher"
    path: str
    secret: str  # hex key (cryptdisk) or passphrase (sqlcipher); bench-only, random
    journal: str = "wal"
    synchronous: str = "normal"
    cache_kib: int = 65536


@dataclass
class ClientResult:
    transactions: int
    retries: int
    latencies_us: array.array  # type: ignore[type-arg]
    cpu_s: float
    max_rss_kib: int  # VmHWM: ru_maxrss would carry the parent's high-water mark over exec


def open_db(spec: DbSpec) -> Any:
    """A connection with the run's journal mode, synchronous level and page cache size."""
    if spec.strategy == "sqlcipher":
        import sqlcipher3

        conn: Any = sqlcipher3.connect(spec.path, isolation_level=None, timeout=60)
        conn.execute("PRAGMA key = '" + spec.secret + "'")  # default cipher settings
    elif spec.strategy == "cryptdisk":
        from ..keys import Key, Keyring
        from ..sqlite import connect

        keyring = Keyring([Key(1, bytes.fromhex(spec.secret))])
        conn = connect(spec.path, keyring=keyring)
        conn.set_busy_timeout(60_000)
    else:
        import apsw

        conn = apsw.Connection(spec.path)
        conn.set_busy_timeout(60_000)
        conn.execute("PRAGMA temp_store=MEMORY")  # as cryptdisk's connect does
    conn.execute(f"PRAGMA journal_mode={spec.journal}").fetchall()
    conn.execute(f"PRAGMA synchronous={spec.synchronous}")
    conn.execute(f"PRAGMA cache_size=-{spec.cache_kib}")
    return conn


def load(spec: DbSpec, scale: int) -> None:
    """Create pgbench's tables at ``scale`` (pgbench -i), in one transaction."""
    conn = open_db(spec)
    try:
        conn.execute("BEGIN")
        for sql in SCHEMA:
            conn.execute(sql)
        conn.executemany("INSERT INTO pgbench_branches VALUES(?, 0, NULL)",
                         [(b,) for b in range(1, scale + 1)])
        conn.executemany("INSERT INTO pgbench_tellers VALUES(?, ?, 0, NULL)",
                         [(t, (t - 1) // 10 + 1) for t in range(1, 10 * scale + 1)])
        filler = " " * 84
        conn.executemany("INSERT INTO pgbench_accounts VALUES(?, ?, 0, ?)",
                         ((a, (a - 1) // ACCOUNTS_PER_SCALE + 1, filler)
                          for a in range(1, ACCOUNTS_PER_SCALE * scale + 1)))
        conn.execute("COMMIT")
    finally:
        conn.close()


def _is_busy(exc: BaseException) -> bool:
    return "locked" in str(exc) or "busy" in str(exc).lower()


def _warm(conn: Any, scale: int) -> None:
    """Read every account once so a cache that can hold the table does."""
    conn.execute("SELECT sum(abalance) FROM pgbench_accounts").fetchall()


def client_main(spec: DbSpec, kind: str, scale: int, seed: int, ready: Any, start: Any,
                stop_at: Any, out: Any) -> None:
    """One client process: open and warm, say so (``ready``), then run ``kind``
    transactions from ``start`` until ``stop_at``."""
    conn = open_db(spec)
    _warm(conn, scale)
    ready.wait()
    rnd = random.Random(seed)
    naccounts = ACCOUNTS_PER_SCALE * scale
    lat = array.array("d")
    done = retries = 0
    start.wait()
    deadline = stop_at.value
    clock = time.perf_counter
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    while True:
        t0 = clock()
        if t0 >= deadline:
            break
        try:
            if kind == "select-only":
                conn.execute(SELECT, (rnd.randint(1, naccounts),)).fetchall()
            else:
                _tpcb(conn, rnd, scale, naccounts)
        except Exception as exc:
            if not _is_busy(exc):
                raise
            retries += 1
            continue
        lat.append((clock() - t0) * 1e6)
        done += 1
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    conn.close()
    out.send(ClientResult(done, retries, lat, cpu, int(peak_rss_mb() * 1024)))


def _tpcb(conn: Any, rnd: random.Random, scale: int, naccounts: int) -> None:
    aid = rnd.randint(1, naccounts)
    bid = rnd.randint(1, scale)
    tid = rnd.randint(1, 10 * scale)
    delta = rnd.randint(-5000, 5000)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(TPCB[0], (delta, aid))
        conn.execute(TPCB[1], (aid,)).fetchall()
        conn.execute(TPCB[2], (delta, tid))
        conn.execute(TPCB[3], (delta, bid))
        conn.execute(TPCB[4], (tid, bid, aid, delta))
        conn.execute("COMMIT")
    except BaseException:
        try:
            conn.execute("ROLLBACK")
        except Exception:  # noqa: S110 - the transaction may already be gone
            pass
        raise


def database_files(path: str) -> list[str]:
    return [path + s for s in ("", "-journal", "-wal", "-shm", "-journal-cdtail", "-wal-cdtail")
            if os.path.exists(path + s)]
