"""OLAP on cryptdisk's embedded database: an encrypted table against a plain one.

The ClickHouse experiment on this database: insert N rows of (c_int BIGINT =
hash of n, c_str = md5 of n, c_float = n / hash(n) * 1e7), then ``avg(c_float)``
and ``sum(c_int)`` with all threads and with one, cold (first query after
opening the database; the OS page cache is warm) and warm (repeated), run
interleaved (plain, encrypted, plain, ...), with process CPU seconds (all
threads: the CPU ratio is what encryption costs on a busy machine) and peak
RSS. It also reports the decrypted cache's measured peak against its bound.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import time
from collections.abc import Callable
from typing import Any

from ._model import BenchOptions, Measurement, Progress, Recorder

__all__ = ["INSERT_SQL", "QUERIES", "STRATEGIES", "create_tables", "run", "time_query"]

EXPERIMENT = "olap-db"
STRATEGIES = {"plain": "plain", "cryptdisk": "default"}  # strategy -> storage policy
TABLES = {"plain": "t_plain", "cryptdisk": "t_encrypted"}
SCHEMA = "(c_int BIGINT, c_str VARCHAR, c_float DOUBLE)"
INSERT_SQL = ("SELECT (hash(n) >> 1)::BIGINT, md5(n::VARCHAR), "
              "n / (hash(n) >> 1)::DOUBLE * 1e7 FROM range(1, {rows} + 1) r(n)")
QUERIES = {"avg(c_float)": "SELECT avg(c_float) FROM {table}",
           "sum(c_int)": "SELECT sum(c_int) FROM {table}"}


def create_tables(db: Any) -> None:
    for strategy, policy in STRATEGIES.items():
        db.sql(f"CREATE TABLE {TABLES[strategy]} {SCHEMA} SETTINGS storage_policy = '{policy}'")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_query(db: Any, sql: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one query, result fetched."""
    c0, t0 = _cpu(), time.perf_counter()
    db.query(sql)
    return time.perf_counter() - t0, _cpu() - c0


class _Series:
    def __init__(self) -> None:
        self.wall: dict[tuple[str, str], list[float]] = {}
        self.cpu: dict[tuple[str, str], list[float]] = {}

    def add(self, case: str, strategy: str, wall: float, cpu: float) -> None:
        self.wall.setdefault((case, strategy), []).append(wall)
        self.cpu.setdefault((case, strategy), []).append(cpu)


def _insert_round(db: Any, rows: int, series: _Series, tick: Callable[[], None]) -> None:
    for strategy in STRATEGIES:
        table = TABLES[strategy]
        db.sql(f"TRUNCATE TABLE {table}")
        c0, t0 = _cpu(), time.perf_counter()
        db.sql(f"INSERT INTO {table} " + INSERT_SQL.format(rows=rows))
        series.add("insert", strategy, time.perf_counter() - t0, _cpu() - c0)
        tick()


def _query_round(connect: Callable[..., Any], series: _Series, warm_repeats: int,
                 tick: Callable[[], None]) -> dict[str, int]:
    cache = {"bound": 0, "peak": 0}
    for strategy in STRATEGIES:
        table = TABLES[strategy]
        for qname, template in QUERIES.items():
            sql = template.format(table=table)
            for threads in ("all", "1"):
                # A fresh open: nothing decrypted yet. DuckDB's threads only; cryptdisk's
                # decryption helper thread runs either way (the CPU seconds show it).
                with connect(threads=None if threads == "all" else 1) as db:
                    wall, cpu = time_query(db, sql)
                    series.add(f"{qname} cold threads={threads}", strategy, wall, cpu)
                    for _ in range(warm_repeats):
                        wall, cpu = time_query(db, sql)
                        series.add(f"{qname} warm threads={threads}", strategy, wall, cpu)
                    cache["bound"] = db.cache.bound
                    cache["peak"] = max(cache["peak"], db.cache.peak)
            tick()
    return cache


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Insert and scan on plain and encrypted tables, interleaved; record medians."""
    from ..db import connect

    rows = options.rows or (200_000 if options.quick else 10_000_000)
    repeats = options.repeats or (2 if options.quick else 3)
    workdir = os.path.join(os.fspath(options.workdir), "olap-db")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    path = os.path.join(workdir, "db")
    series = _Series()
    total = repeats * (len(STRATEGIES) + len(STRATEGIES) * len(QUERIES))
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        progress(f"olap-db {rows:,} rows", done, total)

    cache = {"bound": 0, "peak": 0}
    try:
        with connect(path) as db:
            create_tables(db)
            stored = {}
            for _ in range(repeats):
                _insert_round(db, rows, series, tick)
            for strategy in STRATEGIES:
                stored[strategy] = int(db.query(
                    f"SELECT sum(bytes) FROM system.parts WHERE \"table\" = '{TABLES[strategy]}'"  # noqa: S608 - constant table names
                )[0][0])
        for _ in range(repeats):
            got = _query_round(lambda **kw: connect(path, read_only=True, **kw), series, 3,
                               tick)
            cache = {"bound": got["bound"], "peak": max(cache["peak"], got["peak"])}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    peak = _peak_rss_mb()
    for (case, strategy), values in series.wall.items():
        record(Measurement(
            experiment=EXPERIMENT, case=case, strategy=strategy, unit="s", better="lower",
            values=values, cpu_s=series.cpu[(case, strategy)], work=stored.get(strategy),
            peak_rss_mb=peak,
            extra={"rows": rows, "cache_bound_bytes": cache["bound"],
                   "cache_peak_bytes": cache["peak"],
                   "median_ratio_vs_plain": _ratio(series.wall, case, strategy)}))


def _ratio(wall: dict[tuple[str, str], list[float]], case: str, strategy: str) -> float:
    base = statistics.median(wall[(case, "plain")])
    return statistics.median(wall[(case, strategy)]) / base if base else float("nan")


def _cell(m: Measurement) -> str:
    lo, hi = m.spread
    return f"{m.median:.4f} ({lo:.4f}-{hi:.4f})"


def main(argv: list[str] | None = None) -> int:
    """``python -m cryptdisk.bench.olap_db [--quick] [--rows N] [--repeats N]``: print a table."""
    import argparse
    import json
    import sys
    import tempfile
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m cryptdisk.bench.olap_db")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--json", help="also write the measurements to this file")
    args = parser.parse_args(argv)
    results: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="olap-db-") as tmp:
        options = BenchOptions(Path(tmp), quick=args.quick, rows=args.rows, repeats=args.repeats)
        run(options, lambda m: results.append(m) if isinstance(m, Measurement) else None,
            lambda what, n, total: print(f"\r{what}: {n:.0f}/{total:.0f}", end="",
                                         file=sys.stderr))
    print(file=sys.stderr)
    by_case: dict[str, dict[str, Measurement]] = {}
    for m in results:
        by_case.setdefault(m.case, {})[m.strategy] = m
    print(f"{'case':30} {'plain s (min-max)':>26} {'encrypted s (min-max)':>26} {'ratio':>6} "
          f"{'cpu ratio':>9}")
    for case, ms in by_case.items():
        p, e = ms["plain"], ms["cryptdisk"]
        cpu = statistics.median(e.cpu_s) / statistics.median(p.cpu_s) if p.cpu_s else float("nan")
        print(f"{case:30} {_cell(p):>26} {_cell(e):>26} {e.median / p.median:6.3f} {cpu:9.3f}")
    m0 = results[0]
    print(f"rows {m0.extra['rows']:,}; peak RSS {m0.peak_rss_mb:.0f} MB; decrypted cache peak "
          f"{m0.extra['cache_peak_bytes'] / 2**20:.0f} MiB of a "
          f"{m0.extra['cache_bound_bytes'] / 2**20:.0f} MiB bound")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([m.to_dict() for m in results], f, indent=1)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
