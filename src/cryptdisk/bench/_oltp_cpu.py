"""CPU seconds per OLTP transaction, in one process: plain SQLite against cryptdisk's.

A quick, load-insensitive companion to ``cryptdisk bench oltp`` for tuning the
VFS: each round loads a fresh scale-1 pgbench database per strategy, warms the
cache, runs ``--transactions`` transactions of one kind and measures the
process's CPU time (``resource.getrusage``). Rounds are interleaved (plain,
cryptdisk, plain, ...) and the median with min-max is printed::

    PYTHONPATH=src python -m cryptdisk.bench._oltp_cpu tpcb --transactions 4000
    PYTHONPATH=src python -m cryptdisk.bench._oltp_cpu select --transactions 40000
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import tempfile
import time

from ._oltp_sqlite import ACCOUNTS_PER_SCALE, SELECT, DbSpec, _tpcb, load, open_db

__all__ = ["cpu_per_transaction", "main"]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _sys() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def cpu_per_transaction(strategy: str, kind: str, count: int, workdir: str,
                        journal: str = "wal", synchronous: str = "normal",
                        split: dict[str, float] | None = None) -> float:
    """Microseconds of CPU per transaction for ``strategy`` ("plain" or "cryptdisk").

    ``split``, if given, receives the system-time and wall-clock microseconds
    per transaction under "sys" and "wall".
    """
    directory = os.path.join(workdir, strategy)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    spec = DbSpec(strategy, os.path.join(directory, "bench.db"), os.urandom(32).hex(),
                  journal, synchronous, 65536)
    load(spec, 1)
    conn = open_db(spec)
    try:
        conn.execute("SELECT sum(abalance) FROM pgbench_accounts").fetchall()
        rnd = random.Random(1)
        for i in range(count // 10 + count):
            if i == count // 10:  # the first tenth warms up
                start, start_sys, start_wall = _cpu(), _sys(), time.perf_counter()
            if kind == "select":
                conn.execute(SELECT, (rnd.randint(1, ACCOUNTS_PER_SCALE),)).fetchall()
            else:
                _tpcb(conn, rnd, 1, ACCOUNTS_PER_SCALE)
        if split is not None:
            split["sys"] = (_sys() - start_sys) / count * 1e6
            split["wall"] = (time.perf_counter() - start_wall) / count * 1e6
        return (_cpu() - start) / count * 1e6
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["tpcb", "select"])
    parser.add_argument("--transactions", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--journal", default="wal")
    parser.add_argument("--synchronous", default="normal")
    args = parser.parse_args()
    results: dict[str, list[float]] = {"plain": [], "cryptdisk": []}
    extra: dict[str, dict[str, list[float]]] = {s: {"sys": [], "wall": []} for s in results}
    with tempfile.TemporaryDirectory(prefix="cryptdisk-oltp-cpu-") as workdir:
        for _ in range(args.rounds):
            for strategy, values in results.items():
                split: dict[str, float] = {}
                values.append(cpu_per_transaction(strategy, args.kind, args.transactions,
                                                  workdir, args.journal, args.synchronous,
                                                  split))
                for key, value in split.items():
                    extra[strategy][key].append(value)
    medians = {}
    for strategy, values in results.items():
        values.sort()
        medians[strategy] = values[len(values) // 2]
        sys_us = sorted(extra[strategy]["sys"])[len(values) // 2]
        wall_us = sorted(extra[strategy]["wall"])[len(values) // 2]
        print(f"{args.kind} {args.journal}+{args.synchronous} {strategy:9s} CPU us/transaction: "
              f"median {medians[strategy]:.1f} (min {values[0]:.1f}, max {values[-1]:.1f}); "
              f"of it system {sys_us:.1f}; wall {wall_us:.1f}")
    print(f"plain/cryptdisk CPU ratio: {medians['plain'] / medians['cryptdisk']:.2f}")


if __name__ == "__main__":
    main()
