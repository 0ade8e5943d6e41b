"""Worker body of the oltp-cpu experiment: CPU per transaction, one process, one strategy.

A run loads a fresh scale-1 pgbench database, warms the cache, then runs one
kind of transaction (TPC-B-like or select-only) in this process for the run's
duration, timed by :class:`~cryptdisk.bench._measure.Stopwatch`. No client
processes, no contention: CPU microseconds per transaction, with the system
part and the wall time, is what is left, so it stays steady on a loaded machine.
"""

from __future__ import annotations

import os
import random
import resource
import shutil
import time

from ._measure import Sample, Stopwatch
from ._oltp_sqlite import ACCOUNTS_PER_SCALE, SELECT, DbSpec, _tpcb, database_files, load, open_db

__all__ = ["cpu_per_transaction"]

#: Transactions between two looks at the clock (a TPC-B-like one takes ~50-100 us).
_BATCH = 50


def _system_seconds() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def cpu_per_transaction(strategy: str, kind: str, workdir: str, journal: str,
                        synchronous: str, duration: float, case: str) -> list[Sample]:
    """One run of ``kind`` ("tpcb" or "select") on ``strategy`` ("plain" or "cryptdisk").

    The value is CPU microseconds per transaction (user+system of this process);
    ``extra`` has the system and wall-clock microseconds per transaction.
    """
    directory = os.path.join(workdir, strategy)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    spec = DbSpec(strategy, os.path.join(directory, "bench.db"),
                  os.urandom(32).hex() if strategy != "plain" else "", journal, synchronous,
                  65536)
    load(spec, 1)
    conn = open_db(spec)
    rnd = random.Random(1)

    def batch() -> None:
        for _ in range(_BATCH):
            if kind == "select":
                conn.execute(SELECT, (rnd.randint(1, ACCOUNTS_PER_SCALE),)).fetchall()
            else:
                _tpcb(conn, rnd, 1, ACCOUNTS_PER_SCALE)

    try:
        conn.execute("SELECT sum(abalance) FROM pgbench_accounts").fetchall()
        warm_until = time.perf_counter() + duration / 10
        while time.perf_counter() < warm_until:  # the first tenth warms up, untimed
            batch()
        count = 0
        system = _system_seconds()
        with Stopwatch() as sw:
            stop = time.perf_counter() + duration
            while time.perf_counter() < stop:
                batch()
                count += _BATCH
        system = _system_seconds() - system
    finally:
        conn.close()
    if strategy != "plain":
        for name in database_files(spec.path):
            with open(name, "rb") as f:
                if b"pgbench_accounts" in f.read():
                    raise RuntimeError(f"{name}: plaintext found in an encrypted database")
    return [Sample(case, "CPU us/txn", sw.cpu / count * 1e6, sw.cpu, count, "transactions",
                   "lower", {"system_us_per_txn": system / count * 1e6,
                             "wall_us_per_txn": sw.wall / count * 1e6})]
