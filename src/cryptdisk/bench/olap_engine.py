"""The analytical engine's query shapes: cryptdisk against DuckDB's own file and chdb.

The Parquet data set of the olap experiment (c_int = a 64-bit hash, c_str = md5,
c_float) is loaded once into each engine (timed): a cryptdisk database (an
encrypted and a plain table, both ``ORDER BY c_int``), a DuckDB database file
(rows sorted by c_int) and chdb (MergeTree ``ORDER BY c_int``, plain and on an
AES_256_CTR encrypted disk, merged to one part). Then each query shape runs in
a fresh worker process per engine and round: *cold* is the first execution after
opening the store (the OS page cache may hold the files: each run records how much
of them it held; ``--drop-page-cache`` evicts them first), *warm* the median of
``WARM`` repeats in the same process (fewer over ``BIG`` rows: :func:`warm_runs`).
Engines are interleaved per shape and their order turns each round, so a noisy
machine disturbs them alike: compare ratios within one run. cryptdisk's answers
must equal DuckDB's file's. ``cryptdisk encrypted, cache off`` runs the shapes on
the encrypted table with ``cache_bytes=0``: its peak RSS is the engine's bound
without the cache.
"""

from __future__ import annotations

from typing import Any

from ._model import BenchOptions, Failure, Measurement, Progress, Recorder
from ._stats import paired_ratio
from ._suite import Strategy, experiment_dir, interleave, keep_measurements
from ._worker import BenchRunError, run_worker

__all__ = ["EXPERIMENT", "run"]

EXPERIMENT = "olap-engine"
#: The load's case name; ``--case load`` runs the loads alone, ``--repeats`` times.
LOAD = "load the Parquet file"
WARM = 5
#: Over this many rows, ``WARM_BIG`` warm repeats (the second read of a row group fills
#: the cache, the third hits it) and one of count(DISTINCT), which takes about a minute a
#: run at 100M rows, mostly its hash table, cold or warm: 5 repeats of every shape made
#: the 100M run take over an hour.
BIG = 20_000_000
WARM_BIG = 3


def warm_runs(rows: int, name: str) -> int:
    """How many warm repeats shape ``name`` gets at ``rows`` rows."""
    if rows <= BIG:
        return WARM
    return 1 if "DISTINCT" in name else WARM_BIG
_B = "cryptdisk.bench._bodies_engine:"
#: What each strategy's time is compared with, in ``extra`` (median of paired ratios).
_VERSUS = {"vs_chdb_encrypted": "chdb AES_256_CTR", "vs_duckdb_file": "duckdb file",
           "vs_chdb_plain": "chdb plain"}
_NOTES = [
    "Loads: cryptdisk Database.insert(table, parquet) into tables ORDER BY c_int (default and "
    "plain policy; OPTIMIZE untimed, merging the insert's one part per block); DuckDB "
    "CREATE TABLE AS SELECT * FROM read_parquet(...) ORDER BY c_int + "
    "CHECKPOINT; chdb INSERT INTO a MergeTree ORDER BY c_int SELECT FROM file(Parquet) "
    "(OPTIMIZE FINAL untimed). One load per engine.",
    "Shapes: cold = first query in a fresh process just after opening the store (the OS page "
    "cache may hold the files); warm = median of 5 repeats in that process (over 20M rows "
    "3, count(DISTINCT) 1: extra.warm_runs). chdb runs "
    "count(DISTINCT) as uniqExact; its sum(c_int) wraps at 64 bits where DuckDB widens.",
    "cryptdisk encrypted, cache off: the encrypted table read with cache_bytes=0 (peak RSS "
    "without the decoded-column cache).",
    "extra.vs_*: median of the per-round ratios of this strategy's time to that peer's.",
    "extra.page_cache: the share of the store's file bytes in the OS page cache just before "
    "the worker opened it (median over rounds; Linux mincore). With --drop-page-cache every "
    "engine's store files are evicted first (fsync + posix_fadvise DONTNEED per file), so the "
    "cold run reads from disk; without it the files are usually cached (cold = fresh process, "
    "not cold disk).",
]
NOTES = list(_NOTES)


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Load every engine, then run every shape on each, interleaved; record medians."""
    from ._bodies_engine import CACHE_OFF, ENGINES, shapes

    rows = options.pick(200_000, 10_000_000, options.rows)
    repeats = options.pick(1, 3, options.repeats)
    measured: list[Measurement] = []
    keep = keep_measurements(measured, record)
    label = f"olap-engine {rows:,} rows"
    todo = [n for n in shapes(rows) if options.case is None or options.case in n]
    only_load = not todo and options.case is not None and options.case in LOAD
    if not todo and not only_load:
        raise ValueError(f"no olap-engine shape matches --case {options.case!r} (shapes: "
                         + "; ".join(shapes(rows)) + f"; or {LOAD!r})")
    with experiment_dir(options, EXPERIMENT) as workdir:
        data = str(workdir / "data.parquet")
        run_worker(options.cleanup, "cryptdisk.bench._bodies_olap:prepare",
                   dict(path=data, rows=rows, with_answers=False))
        # --case load: the loads alone, repeated into fresh stores, engines interleaved
        rounds = repeats if only_load else 1
        engines: list[str] = []
        loads: dict[str, list[Any]] = {}
        for r in range(rounds):
            work = workdir if rounds == 1 else workdir / f"round-{r}"
            work.mkdir(exist_ok=True)
            order = ENGINES[r % len(ENGINES):] + ENGINES[:r % len(ENGINES)]
            for i, engine in enumerate(order):
                progress(label + ": load", r * len(ENGINES) + i, rounds * len(ENGINES))
                try:
                    res = run_worker(options.cleanup, _B + "load", dict(
                        engine=engine, work=str(work), data=data, rows=rows))
                except BenchRunError as exc:  # chdb missing or broken: the others go on
                    record(Failure(EXPERIMENT, engine, str(exc), exc.traceback))
                    continue
                if r == 0:
                    engines.append(engine)
                loads.setdefault(engine, []).extend((s, res.peak_rss_mb) for s in res.samples)
        for engine, got in loads.items():
            if not got:
                continue
            s = got[0][0]
            keep(Measurement(EXPERIMENT, s.case, engine, s.unit, [g.value for g, _ in got],
                             s.better, [g.cpu_s or 0.0 for g, _ in got], s.work, s.work_unit,
                             max(m for _, m in got), dict(s.extra)))
        progress(label + ": load", rounds * len(ENGINES), rounds * len(ENGINES))
        if "cryptdisk encrypted" in engines:  # the same table, read with cache_bytes=0
            engines.insert(engines.index("cryptdisk encrypted") + 1, CACHE_OFF)
        for name in todo:
            strategies = [Strategy(e, _B + "shape", dict(engine=e, work=str(workdir), name=name,
                                                         rows=rows,
                                                         warm=warm_runs(rows, name),
                                                         drop_cache=options.drop_page_cache))
                          for e in engines]
            interleave(options, EXPERIMENT, strategies, keep, progress, f"{label}: {name}",
                       repeats, rotate=True)
    _finish(measured, record, rows, options.drop_page_cache)


def _finish(measured: list[Measurement], record: Recorder, rows: int,
            dropped: bool = False) -> None:
    """Check cryptdisk's answers against DuckDB's, add the paired ratios, record."""
    by = {(m.case, m.strategy): m for m in measured}
    held: dict[str, list[float]] = {}
    for m in measured:
        if m.case.endswith(" cold") and isinstance(m.extra.get("page_cache"), int | float):
            held.setdefault(m.strategy, []).append(float(m.extra["page_cache"]))
    NOTES[:] = list(_NOTES)
    if held:
        NOTES.append(("Store files evicted before each run (--drop-page-cache); " if dropped
                      else "Store files not evicted (no --drop-page-cache); ")
                     + "share of them in the page cache as each worker opened its store, "
                     "lowest-highest over the shapes (medians over rounds): " + "; ".join(
                         f"{k} {100 * min(v):.0f}-{100 * max(v):.0f}%"
                         for k, v in held.items()))
    for m in measured:
        m.extra["rows"] = rows
        for key, peer in _VERSUS.items():
            other = by.get((m.case, peer))
            if other is not None and other is not m:
                m.extra[key] = paired_ratio(m.values, other.values).median
        duck = by.get((m.case, "duckdb file"))
        if (m.strategy.startswith("cryptdisk") and duck is not None
                and m.extra.get("answer") != duck.extra.get("answer")):
            record(Failure(EXPERIMENT, m.strategy, f"{m.case}: cryptdisk's answer differs "
                           f"from DuckDB's file ({m.extra.get('answer')} against "
                           f"{duck.extra.get('answer')})"))
        record(m)

