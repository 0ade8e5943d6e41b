"""``cryptdisk bench dask``: a cryptdisk table read by Dask workers against plain Parquet.

The same rows (k BIGINT in order, s = md5(k), f DOUBLE; 12 parts) go into an
encrypted cryptdisk table (``ORDER BY k``) and into 12 plain Parquet files
(64Ki-row row groups, LZ4, as cryptdisk's parts). On a ``distributed.LocalCluster``
of 1, 2, ... N single-threaded worker processes (N: ``--threads``, default
cores + 1, so one point oversubscribes the machine), two shapes run, each one
Dask aggregation fused with the read (a task per partition and one more, see
:data:`SHAPES_NOTE`): a full scan (``sum(f)``, ``count(s)``, ``count(k)`` as one
reduction) and a filtered aggregation (``sum(f)`` where k falls in the middle
tenth; both readers skip the other parts or files by their statistics).
``cryptdisk.dask.read_table`` is the
cryptdisk strategy, ``dd.read_parquet`` on the plain files the baseline. Each
run is a fresh process with a fresh cluster (:mod:`._bodies_dask`): each shape
once untimed, then timed; answers are checked against DuckDB's. Runs are
interleaved (rotating order) over readers and worker counts; the figures are
rows of the table per second, the ratio is cryptdisk/plain paired by round,
and each reader's scaling is its rows/s at N workers over its rows/s at 1
(paired by round).
"""

from __future__ import annotations

import os

from ._model import BenchOptions, Measurement, Progress, Recorder
from ._stats import paired_ratio
from ._suite import Strategy, experiment_dir, interleave, keep_measurements
from ._worker import run_worker

__all__ = ["PARTS", "READERS", "run"]

EXPERIMENT = "dask"
READERS = ("cryptdisk", "plain")
PARTS = 12  # divisible by 1, 2, 3 and 4 workers
NOTES: list[str] = []
#: What each shape computes (the first note after the table's size).
SHAPES_NOTE = (
    "Full scan: sum(f), count(s) and count(k) over all rows as one Dask reduction "
    "(per partition one pandas Series of the three, one task adding them up: "
    "split_every=False); filtered sum: df.f.sum() with the reader given k >= 0.45 N "
    "and k < 0.55 N. Both are fused with the read (.optimize() before compute: "
    "dask.compute does not fuse), a task per partition and one more, identically for "
    "both readers; answers checked against DuckDB's on the plain files.")
_B = "cryptdisk.bench._bodies_dask:"


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Both readers at 1..N workers, interleaved; records rows/s, ratios and scaling."""
    rows = options.pick(1_000_000, 10_000_000, options.rows)
    repeats = options.pick(2, 3, options.repeats)
    max_workers = options.threads or (os.cpu_count() or 1) + 1
    measured: list[Measurement] = []
    with experiment_dir(options, "dask") as workdir:
        db, plain = str(workdir / "db"), str(workdir / "plain")
        progress(f"dask: writing {rows:,} rows twice", 0, 1)
        prepared = run_worker(options.cleanup, _B + "prepare",
                              dict(db=db, plain=plain, rows=rows, parts=PARTS)).samples[0]
        progress(f"dask: writing {rows:,} rows twice", 1, 1)
        strategies = [
            Strategy(reader, _B + "scan",
                     dict(reader=reader, workers=n, db=db, plain=plain, rows=rows,
                          answers=prepared.extra["answers"]),
                     baseline=None if reader == "plain" else "plain")
            for n in range(1, max_workers + 1) for reader in READERS]
        interleave(options, EXPERIMENT, strategies, keep_measurements(measured, record),
                   progress, f"dask {rows:,} rows", repeats, rotate=True)
    _finish(measured, record, rows, prepared.value, prepared.extra["encrypted_bytes"])


def _finish(measured: list[Measurement], record: Recorder, rows: int, plain_bytes: float,
            encrypted_bytes: float) -> None:
    """Ratios and scaling into each measurement's ``extra`` and the notes, then record."""
    by = {(m.case, m.strategy): m for m in measured}
    NOTES[:] = [f"{rows:,} rows in {PARTS} parts: {encrypted_bytes / 1e6:.0f} MB encrypted, "
                f"{plain_bytes / 1e6:.0f} MB plain Parquet.", SHAPES_NOTE]
    for m in measured:
        shape, _, workers = m.case.partition(", ")
        plain = by.get((m.case, "plain"))
        if m.strategy != "plain" and plain is not None:
            m.extra["ratio_to_plain"] = paired_ratio(plain.values, m.values).median
        one = by.get((f"{shape}, 1 worker", m.strategy))
        if one is not None and one is not m:
            m.extra["scaling_vs_1_worker"] = paired_ratio(m.values, one.values).median
            NOTES.append(f"{shape}, {m.strategy}: {workers} run "
                         f"{m.extra['scaling_vs_1_worker']:.2f}x the rows/s of 1 worker")
        if "ratio_to_plain" in m.extra:
            NOTES.append(f"{m.case}: cryptdisk takes {m.extra['ratio_to_plain']:.2f}x the "
                         "time of plain Parquet")
        for note in (_cpu_note(m, rows), _time_note(m)):
            if note:
                NOTES.append(note)
        record(m)


def _cpu_note(m: Measurement, rows: int) -> str | None:
    """Where one compute's CPU went (medians), from the components the body recorded."""
    x = m.extra
    keys = ("client_main_cpu_s", "client_loop_cpu_s", "worker_task_cpu_s",
            "worker_task_cpu_max_s", "worker_other_cpu_s", "tasks", "task_spec_bytes")
    if not all(isinstance(x.get(k), int | float) for k in keys):
        return None
    return (f"{m.case}, {m.strategy}, CPU s per compute: client {x['client_main_cpu_s']:.3f} "
            f"(calling thread: planning, graph, submit) + {x['client_loop_cpu_s']:.3f} (event "
            f"loop: scheduler, nannies); workers {x['worker_task_cpu_s']:.3f} in tasks "
            f"(busiest worker {x['worker_task_cpu_max_s']:.3f}; "
            f"{x['worker_task_cpu_s'] / rows * 1e9:.0f} ns per table row) + "
            f"{x['worker_other_cpu_s']:.3f} in their other threads (event loop, profiler); "
            f"{x['tasks']:.0f} tasks, {x['task_spec_bytes'] / 1e3:.0f} kB pickled")


def _time_note(m: Measurement) -> str | None:
    """Where one compute's wall time went (medians), from distributed's task stream."""
    x = m.extra
    keys = ("head_s", "tail_s", "in_tasks_s", "in_tasks_max_s", "gaps_s", "reads_min",
            "reads_max", "plan_s")
    if not all(isinstance(x.get(k), int | float) for k in keys):
        return None
    wall = m.extra.get("rows", 0) / (m.median * 1e6) if m.median else 0.0
    return (f"{m.case}, {m.strategy}, wall s per compute {wall:.3f}: "
            f"{x['head_s']:.3f} before the first task starts (planning {x['plan_s']:.3f}, "
            f"graph, submission, first assignment), {x['tail_s']:.3f} after the last ends "
            f"(result to the client); workers in tasks {x['in_tasks_s']:.3f} (busiest "
            f"{x['in_tasks_max_s']:.3f}), idle between their tasks {x['gaps_s']:.3f}; "
            f"{x['reads_min']:.0f} to {x['reads_max']:.0f} read tasks per worker")
