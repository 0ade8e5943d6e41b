"""OLTP experiment: pgbench's workload on plain SQLite, cryptdisk's encrypted SQLite, SQLCipher.

Reproduces the PostgreSQL-TDE pgbench comparison: the TPC-B-like read-write
transaction and the select-only transaction (exactly pgbench's built-in
scripts, see :mod:`._oltp_sqlite`), pgbench's four tables at scale factor s
(100,000 accounts per s), client processes from 1 to 2x cores, a fixed
duration per run, strategies interleaved and rotated (A B C, B C A, C A B: no
strategy always follows the same one), the page cache's dirty data written out
(``sync``) before each run. Cases:

- select-only with the data in SQLite's page cache, and with a cache far
  smaller than the database;
- TPC-B-like with WAL + synchronous=NORMAL, WAL + FULL, and the rollback
  journal (DELETE) + FULL, data in cache; WAL + NORMAL with a small cache.

Each run is one worker process (:mod:`._bodies_oltp`) that starts the clients,
and reports TPS, latency p50/p95/p99 and CPU seconds per transaction
(user+system of the client processes during the timed window; for
PostgreSQL the server's processes plus pgbench); the figures in ``extra`` are
medians over the runs. PostgreSQL 15 with the real
``pgbench`` runs the same cases (its own durability settings, unix socket) as
a reference when it is installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ._bodies_oltp import percentiles
from ._model import BenchOptions, Measurement, Progress, Recorder, Skipped
from ._oltp_sqlite import DbSpec, database_files, load
from ._suite import Strategy, experiment_dir, interleave, round_order

if TYPE_CHECKING:
    from ._oltp_pg import PgCluster

__all__ = ["NOTES", "Case", "cases", "round_order", "run"]

NOTES: list[str] = []
EXPERIMENT = "oltp"
STRATEGIES = ["plain", "cryptdisk", "sqlcipher"]
BIG_CACHE_KIB = 256 * 1024  # holds every database of these runs
SMALL_CACHE_KIB = 2 * 1024


@dataclass(frozen=True)
class Case:
    kind: str  # "tpcb-like" or "select-only"
    scale: int
    journal: str
    synchronous: str
    cache_kib: int
    clients: int

    @property
    def name(self) -> str:
        cache = "in-cache" if self.cache_kib == BIG_CACHE_KIB else f"cache={self.cache_kib}KiB"
        return (f"{self.kind} scale={self.scale} {cache} {self.journal}+{self.synchronous} "
                f"clients={self.clients}")


def cases(options: BenchOptions) -> list[Case]:
    """The run's cases: fewer clients and one small scale in quick mode (``--case`` then
    picks among them by name)."""
    cores = os.cpu_count() or 1
    clients = [1, 2] if options.quick else sorted({1, cores, 2 * cores})
    big = 1 if options.quick else 4
    out = [Case("select-only", 1, "wal", "normal", BIG_CACHE_KIB, c) for c in clients]
    out.append(Case("select-only", big, "wal", "normal", SMALL_CACHE_KIB, 1))
    out += [Case("tpcb-like", 1, "wal", "normal", BIG_CACHE_KIB, c) for c in clients]
    out.append(Case("tpcb-like", 1, "wal", "full", BIG_CACHE_KIB, 1))
    out.append(Case("tpcb-like", 1, "delete", "full", BIG_CACHE_KIB, 1))
    out.append(Case("tpcb-like", big, "wal", "normal", SMALL_CACHE_KIB, 1))
    return out


def _vfs_implementation() -> str:
    from ..sqlite import cipher_library, implementation

    if implementation() == "python":
        return "Python implementation"
    return f"C implementation, AES-GCM from {cipher_library()}"


def _strategies(record: Recorder) -> list[str]:
    out = ["plain", "cryptdisk"]
    try:
        import sqlcipher3  # noqa: F401
    except ImportError:
        record(Skipped(EXPERIMENT, "sqlcipher", "the sqlcipher3 package is not installed",
                       "pip install 'cryptdisk[bench]'"))
    else:
        out.append("sqlcipher")
    return out


def _measurement(case: Case, strategy: str, runs: list[dict[str, float]]) -> Measurement:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    txns = med("txns")
    return Measurement(
        experiment=EXPERIMENT, case=case.name, strategy=strategy, unit="TPS",
        values=[r["tps"] for r in runs], cpu_s=[r["cpu_s"] for r in runs], work=txns,
        work_unit="transactions", peak_rss_mb=max(r.get("rss_mb", 0.0) for r in runs),
        extra={"p50_ms": med("p50_ms"), "p95_ms": med("p95_ms"), "p99_ms": med("p99_ms"),
               "cpu_us_per_txn": statistics.median(
                   r["cpu_s"] / r["txns"] * 1e6 for r in runs if r["txns"]) if txns else None,
               "retries": sum(r.get("retries", 0) for r in runs)},
    )


def _prepare(workdir: Path, strategies: list[str], scales: set[int],
             progress: Progress) -> dict[tuple[str, int], DbSpec]:
    specs = {}
    for scale in sorted(scales):
        for strategy in strategies:
            secret = os.urandom(32).hex() if strategy != "plain" else ""
            spec = DbSpec(strategy, str(workdir / f"{strategy}-s{scale}.db"), secret)
            progress(f"oltp: loading {strategy} scale={scale}", 0, 1)
            load(spec, scale)
            specs[(strategy, scale)] = spec
    return specs


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Run every case for every strategy, interleaved; record one Measurement per pair."""
    duration = options.pick(3.0, 10.0, options.duration)
    repeats = options.pick(2, 3, options.repeats)
    NOTES.clear()
    NOTES.append("SQLite TPC-B-like transactions start with BEGIN IMMEDIATE (several writer "
                 "processes deadlock on a deferred BEGIN); pgbench's statements otherwise.")
    NOTES.append("Strategies run in an order rotated each round (A B C, B C A, C A B), each "
                 "run after a sync, so one strategy's leftover writeback never always falls on "
                 "the same other one.")
    NOTES.append("Plain and cryptdisk use the same SQLite (apsw); SQLCipher 4 (sqlcipher3) "
                 "uses its own build, default cipher settings, the same PRAGMAs.")
    NOTES.append(f"cryptdisk's SQLite VFS: the {_vfs_implementation()} "
                 "(CRYPTDISK_SQLITE_VFS picks c or python).")
    NOTES.append("cryptdisk's database files claim SQLite's safe append (a journal record "
                 "reads back as written or, not authentic, as zeros), so a DELETE-mode "
                 "commit syncs its journal once; plain SQLite and SQLCipher sync it twice "
                 "(docs/sqlite-vfs.md, \"Durability\").")
    with experiment_dir(options, "oltp") as workdir:
        strategies = _strategies(record)
        todo = [c for c in cases(options) if options.case is None or options.case in c.name]
        if not todo:
            raise ValueError(f"no oltp case matches --case {options.case!r} (cases: "
                             + "; ".join(c.name for c in cases(options)) + ")")
        specs = _prepare(workdir, strategies, {c.scale for c in todo}, progress)
        for case in todo:
            runs = [Strategy(s, "cryptdisk.bench._bodies_oltp:run_case", dict(
                        strategy=s, path=specs[(s, case.scale)].path,
                        secret=specs[(s, case.scale)].secret, journal=case.journal,
                        synchronous=case.synchronous, cache_kib=case.cache_kib,
                        case=asdict(case), duration=duration),
                        baseline=None if s == "plain" else "plain",
                        before=os.sync)  # the previous run's dirty pages are not this run's
                    for s in strategies]
            interleave(options, EXPERIMENT, runs, record, progress, f"oltp: {case.name}",
                       repeats, rotate=True)  # A B C, B C A, C A B
        _check_plaintext(specs, record)
        _run_postgres(options, todo, duration, repeats, workdir, record, progress)


def _check_plaintext(specs: dict[tuple[str, int], DbSpec], record: Recorder) -> None:
    """The cryptdisk databases must not contain pgbench's table names in the clear."""
    for (strategy, _scale), spec in specs.items():
        if strategy != "cryptdisk":
            continue
        for name in database_files(spec.path):
            with open(name, "rb") as f:
                if b"pgbench_accounts" in f.read():
                    raise RuntimeError(f"{name}: plaintext found in an encrypted database")
    NOTES.append("Checked: no cryptdisk database file contains the table names in plaintext.")


def _run_postgres(options: BenchOptions, todo: list[Case], duration: float, repeats: int,
                  workdir: Path, record: Recorder, progress: Progress) -> None:
    from ._oltp_pg import INSTALL, PgCluster, find_pg_bin

    bindir = find_pg_bin()
    if bindir is None:
        record(Skipped(EXPERIMENT, "postgresql", "PostgreSQL (initdb, pg_ctl, pgbench) is not "
                       "installed", INSTALL))
        return
    cluster = PgCluster(bindir, workdir)
    try:
        cluster.start()
    except (RuntimeError, OSError) as exc:
        record(Skipped(EXPERIMENT, "postgresql", f"could not start a cluster: {exc}", INSTALL))
        cluster.stop()
        return
    try:
        _pg_cases(cluster, todo, duration, repeats, record, progress)
    finally:
        cluster.stop()


def _pg_cases(cluster: PgCluster, todo: list[Case], duration: float, repeats: int, record: Recorder,
              progress: Progress) -> None:
    from ._oltp_pg import parse_tps, read_latencies

    logs = cluster.root / "logs"
    logs.mkdir()
    if cluster.as_user:
        shutil.chown(logs, "postgres")
    loaded = None
    seen = set()
    for case in todo:
        key = (case.kind, case.scale, case.clients)
        if key in seen:
            continue  # PostgreSQL has no journal-mode/cache variants of the same case
        seen.add(key)
        if loaded != case.scale:
            progress(f"oltp: pgbench -i -s {case.scale}", 0, 1)
            cluster.pgbench("-i", "-q", "-s", str(case.scale))
            loaded = case.scale
        runs = []
        for _ in range(repeats):
            progress(f"oltp: postgresql {case.kind} scale={case.scale} clients={case.clients}",
                     0, 1)
            runs.append(_pg_run(cluster, case, duration, logs, parse_tps, read_latencies))
        name = f"{case.kind} scale={case.scale} clients={case.clients} (postgresql defaults)"
        m = _measurement(case, "postgresql", runs)
        m.case = name
        record(m)


def _pg_run(cluster: PgCluster, case: Case, duration: float, logs: Path,
            parse_tps: Callable[[str], float],
            read_latencies: Callable[[Path], list[float]]) -> dict[str, float]:
    import psutil

    post = psutil.Process(cluster.postmaster_pid())

    def cpu() -> float:
        t = post.cpu_times()
        own = float(t.user + t.system + t.children_user + t.children_system)
        for child in post.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                c = child.cpu_times()
                own += c.user + c.system
        r = os.times()
        return own + r.children_user + r.children_system

    before = cpu()
    args = ["-c", str(case.clients), "-j", str(case.clients), "-T", str(max(1, round(duration))),
            "-l", "--log-prefix", str(logs / "pgb")]
    if case.kind == "select-only":
        args.append("-S")
    out = cluster.pgbench(*args)
    used = cpu() - before
    lat = sorted(read_latencies(logs / "pgb"))
    tps = parse_tps(out)
    return {"tps": tps, "txns": float(len(lat)) or tps * duration, "cpu_s": used,
            **percentiles(lat), "retries": 0, "rss_mb": 0.0}
