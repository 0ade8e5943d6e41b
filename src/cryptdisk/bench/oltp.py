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

Each run reports TPS, latency p50/p95/p99 and CPU seconds per transaction
(user+system of the client processes during the timed window; for
PostgreSQL the server's processes plus pgbench). PostgreSQL 15 with the real
``pgbench`` runs the same cases (its own durability settings, unix socket) as
a reference when it is installed.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ._model import BenchOptions, Measurement, Progress, Recorder, Skipped
from ._oltp_sqlite import DbSpec, database_files, load

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
    """The run's cases: fewer clients and one small scale in quick mode."""
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


def round_order(strategies: list[str], round_: int) -> list[str]:
    """The order of the strategies in round ``round_``: rotated by one each round.

    So no strategy always runs right after the same other one (whose leftover
    writeback or cache state would then always fall on it), and over
    ``len(strategies)`` rounds each runs first, second and third once.
    """
    shift = round_ % len(strategies)
    return strategies[shift:] + strategies[:shift]


def _vfs_implementation() -> str:
    from ..sqlite import _native, implementation

    if implementation() == "python":
        return "Python implementation"
    return f"C implementation, AES-GCM from {_native.cipher_library()}"


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


def _run_clients(spec: DbSpec, case: Case, duration: float) -> dict[str, float]:
    from ._oltp_sqlite import client_main

    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    stop_at = ctx.Value("d", 0.0, lock=False)
    procs, pipes = [], []
    for i in range(case.clients):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=client_main, args=(spec, case.kind, case.scale, 1000 + i, start,
                                                  stop_at, send), daemon=True)
        p.start()
        procs.append(p)
        pipes.append(recv)
    time.sleep(0.5 + 0.3 * case.clients)  # let the clients open and warm their caches
    t0 = time.perf_counter()
    stop_at.value = t0 + duration
    start.set()
    results = []
    try:
        for recv in pipes:
            if not recv.poll(duration + 600):
                raise RuntimeError("a benchmark client did not report")
            results.append(recv.recv())
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    elapsed = max(duration, time.perf_counter() - t0)
    lat = sorted(x for r in results for x in r.latencies_us)
    txns = sum(r.transactions for r in results)
    return {"tps": txns / elapsed, "txns": txns, "cpu_s": sum(r.cpu_s for r in results),
            **_percentiles(lat), "retries": sum(r.retries for r in results),
            "rss_mb": max(r.max_rss_kib for r in results) / 1024}


def _percentiles(lat: list[float]) -> dict[str, float]:
    if not lat:
        return {"p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0}
    def pick(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] / 1000

    return {"p50_ms": pick(0.50), "p95_ms": pick(0.95), "p99_ms": pick(0.99)}


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
    duration = options.duration or (3.0 if options.quick else 10.0)
    repeats = options.repeats or (2 if options.quick else 3)
    workdir = Path(options.workdir) / "oltp"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
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
                 "(docs/sqlite.md, \"Durability\").")
    try:
        strategies = _strategies(record)
        todo = cases(options)
        specs = _prepare(workdir, strategies, {c.scale for c in todo}, progress)
        total = len(todo) * repeats * len(strategies)
        done = 0
        for case in todo:
            runs: dict[str, list[dict[str, float]]] = {s: [] for s in strategies}
            for round_ in range(repeats):
                for strategy in round_order(strategies, round_):  # A B C, B C A, C A B
                    progress(f"oltp: {case.name} {strategy}", done, total)
                    base = specs[(strategy, case.scale)]
                    spec = DbSpec(strategy, base.path, base.secret, case.journal,
                                  case.synchronous, case.cache_kib)
                    os.sync()  # the previous run's dirty pages are not this run's I/O
                    runs[strategy].append(_run_clients(spec, case, duration))
                    done += 1
            for strategy in strategies:
                record(_measurement(case, strategy, runs[strategy]))
        _check_plaintext(specs, record)
        _run_postgres(options, todo, duration, repeats, workdir, record, progress)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


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
            **_percentiles(lat), "retries": 0, "rss_mb": 0.0}


def _main(argv: list[str] | None = None) -> int:
    """``python -m cryptdisk.bench.oltp``: run this experiment alone and print a table."""
    import argparse
    import sys
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m cryptdisk.bench.oltp")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--duration", type=float)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--workdir", default=tempfile.gettempdir())
    args = parser.parse_args(argv)
    options = BenchOptions(workdir=Path(args.workdir), quick=args.quick,
                           duration=args.duration, repeats=args.repeats)
    found: list[Measurement] = []

    def record(item: Measurement | Skipped) -> None:
        if isinstance(item, Skipped):
            print(f"skipped {item.strategy}: {item.reason} ({item.install})", flush=True)
            return
        found.append(item)
        plain = next((m.median for m in found if m.case == item.case
                      and m.strategy == "plain"), None)
        ratio = f" x{item.median / plain:.2f}" if plain and item.strategy != "plain" else ""
        lo, hi = item.spread
        print(f"{item.case:55s} {item.strategy:10s} {item.median:9.0f} TPS{ratio:7s} "
              f"[{lo:.0f}-{hi:.0f}] p50/p95/p99 {item.extra['p50_ms']:.3f}/"
              f"{item.extra['p95_ms']:.3f}/{item.extra['p99_ms']:.3f} ms, "
              f"{item.extra['cpu_us_per_txn'] or 0:.0f} us CPU/txn", flush=True)

    def progress(task: str, done: float, total: float) -> None:
        print(f"  {task}", file=sys.stderr, flush=True)

    run(options, record, progress)
    for note in NOTES:
        print("note:", note)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
