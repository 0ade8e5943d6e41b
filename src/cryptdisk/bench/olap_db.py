"""OLAP on cryptdisk's embedded database: an encrypted table against a plain one.

The ClickHouse experiment on this database: insert N rows of (c_int BIGINT =
hash of n, c_str = md5 of n, c_float = n / hash(n) * 1e7), then ``avg(c_float)``
and ``sum(c_int)`` with all threads and with one, cold (first query after
opening the database; the OS page cache is warm) and warm (repeated); ``--case
TEXT`` runs only the queries whose name contains TEXT (after the insert). Strategies
run interleaved (plain, encrypted, plain, ...), each run in a fresh worker process
(:mod:`._bodies_scan`), with process CPU seconds (all threads: the CPU ratio is
what encryption costs on a busy machine) and the worker's peak RSS. It also
reports the decrypted cache's measured peak against its bound.
"""

from __future__ import annotations

from typing import Any

from ._measure import Stopwatch
from ._model import BenchOptions, Measurement, Progress, Recorder
from ._stats import paired_ratio
from ._suite import Strategy, experiment_dir, interleave, keep_measurements
from ._worker import run_worker

__all__ = ["INSERT_SQL", "QUERIES", "STRATEGIES", "TABLES", "create_tables", "run",
           "time_query"]

EXPERIMENT = "olap-db"
STRATEGIES = {"plain": "plain", "cryptdisk": "default"}  # strategy -> storage policy
TABLES = {"plain": "t_plain", "cryptdisk": "t_encrypted"}
SCHEMA = "(c_int BIGINT, c_str VARCHAR, c_float DOUBLE)"
INSERT_SQL = ("SELECT (hash(n) >> 1)::BIGINT, md5(n::VARCHAR), "
              "n / (hash(n) >> 1)::DOUBLE * 1e7 FROM range(1, {rows} + 1) r(n)")
QUERIES = {"avg(c_float)": "SELECT avg(c_float) FROM {table}",
           "sum(c_int)": "SELECT sum(c_int) FROM {table}"}
WARM = 3  # warm repeats per query and run
_B = "cryptdisk.bench._bodies_scan:"


def create_tables(db: Any) -> None:
    for strategy, policy in STRATEGIES.items():
        db.sql(f"CREATE TABLE {TABLES[strategy]} {SCHEMA} SETTINGS storage_policy = '{policy}'")


def time_query(db: Any, sql: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one query, result fetched."""
    with Stopwatch() as sw:
        db.query(sql)
    return sw.wall, sw.cpu


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Insert and scan on plain and encrypted tables, interleaved; record medians."""
    rows = options.pick(200_000, 10_000_000, options.rows)
    repeats = options.pick(2, 3, options.repeats)
    wanted = {n: q for n, q in QUERIES.items() if options.case is None or options.case in n}
    if not wanted:
        raise ValueError(f"no olap-db query matches --case {options.case!r} (queries: "
                         + "; ".join(QUERIES) + ")")
    measured: list[Measurement] = []
    keep = keep_measurements(measured, record)
    with experiment_dir(options, "olap-db") as workdir:
        path = str(workdir / "db")
        run_worker(options.cleanup, _B + "db_prepare", dict(
            path=path, tables={TABLES[s]: p for s, p in STRATEGIES.items()}, schema=SCHEMA))
        label = f"olap-db {rows:,} rows"
        inserts = [Strategy(s, _B + "db_insert", dict(path=path, table=TABLES[s],
                                                      sql=INSERT_SQL.format(rows=rows),
                                                      rows=rows),
                            baseline=None if s == "plain" else "plain") for s in STRATEGIES]
        interleave(options, EXPERIMENT, inserts, keep, progress, label + ": insert", repeats)
        stored = {m.strategy: m.work for m in measured}
        queries = [Strategy(s, _B + "db_queries", dict(path=path, table=TABLES[s],
                                                       queries=wanted, warm=WARM,
                                                       stored=stored.get(s)),
                            baseline=None if s == "plain" else "plain") for s in STRATEGIES]
        interleave(options, EXPERIMENT, queries, keep, progress, label + ": queries", repeats)
    cache = {"cache_bound_bytes": max((m.extra.get("cache_bound_bytes", 0) for m in measured),
                                      default=0),
             "cache_peak_bytes": max((m.extra.get("cache_peak_bytes", 0) for m in measured),
                                     default=0)}
    plain = {m.case: m for m in measured if m.strategy == "plain"}
    for m in measured:
        m.extra.update(rows=rows, **cache)
        if m.case in plain:
            m.extra["median_ratio_vs_plain"] = paired_ratio(m.values, plain[m.case].values).median
        record(m)
