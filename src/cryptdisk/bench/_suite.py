"""Run experiments: interleave strategies, collect results, tolerate missing peers.

An experiment module exposes ``run(options, record, progress)`` and runs its timed
bodies in fresh worker processes (:func:`interleave`, :mod:`._worker`), so CPU and
peak RSS are each body's own. A peer whose package is missing is recorded as
:class:`Skipped` with the install command; a body or module that crashes is a
:class:`Failure` with its traceback, and the other strategies go on.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._cleanup import Cleanup
from ._model import BenchOptions, Failure, Measurement, Progress, Skipped
from ._worker import BenchRunError, run_worker

__all__ = ["EXPERIMENTS", "INSTALL_BENCH", "Results", "Strategy", "experiment_dir", "interleave",
           "keep_measurements", "round_order", "run_experiment"]

INSTALL_BENCH = "pip install 'cryptdisk[bench]'"

#: Experiment name -> modules that contribute to it (lazily imported, in order).
EXPERIMENTS: dict[str, list[str]] = {
    "crypto": ["cryptdisk.bench.crypto"],
    "io": ["cryptdisk.bench.fileio"],
    "olap": ["cryptdisk.bench.olap", "cryptdisk.bench.fs_scan", "cryptdisk.bench.olap_db"],
    "oltp": ["cryptdisk.bench.oltp"],
    # one part of olap alone
    "fs-scan": ["cryptdisk.bench.fs_scan"],
    "olap-db": ["cryptdisk.bench.olap_db"],
    "backup": ["cryptdisk.bench.backup"],
    # the analytical engine's query shapes against DuckDB's file and chdb
    "olap-engine": ["cryptdisk.bench.olap_engine"],
    "server": ["cryptdisk.bench.server"],
    # CPU per SQLite transaction in one process, plain against cryptdisk (VFS tuning)
    "oltp-cpu": ["cryptdisk.bench.oltp_cpu"],
    "fields": ["cryptdisk.bench.fields"],  # field-level protection (issue 18)
    # listing and opening many small files with and without encrypted names
    "names": ["cryptdisk.bench.names"],
    "dask": ["cryptdisk.bench.dask_scan"],
    # provider-held keys (SoftHSM2) against a local key file: opens and a cold scan
    "keys": ["cryptdisk.bench.keys_speed"],
}


@dataclass
class Results:
    """Everything a run produced: what the JSON holds and the report reads."""

    environment: dict[str, Any]
    options: dict[str, Any]
    command: str
    measurements: list[Measurement] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)
    started: str = ""
    elapsed_s: float = 0.0
    failures: list[Failure] = field(default_factory=list)

    def record(self, item: Measurement | Skipped | Failure) -> None:
        if isinstance(item, Skipped):
            self.skipped.append(item)
        elif isinstance(item, Failure):
            self.failures.append(item)
        else:
            self.measurements.append(item)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "cryptdisk-bench/1",
            "command": self.command, "started": self.started, "elapsed_s": self.elapsed_s,
            "environment": self.environment, "options": self.options,
            "measurements": [m.to_dict() for m in self.measurements],
            "skipped": [asdict(s) for s in self.skipped],
            "failures": [asdict(f) for f in self.failures],
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Results:
        names = set(Measurement.__dataclass_fields__)
        ms = [Measurement(**{k: v for k, v in m.items() if k in names}) for m in d["measurements"]]
        return cls(d["environment"], d["options"], d["command"], ms,
                   [Skipped(**s) for s in d["skipped"]], d.get("notes", {}),
                   d.get("started", ""), d.get("elapsed_s", 0.0),
                   [Failure(**f) for f in d.get("failures", [])])


@dataclass
class Strategy:
    """One way to run a body: a name, a worker target and its arguments."""

    name: str
    target: str
    args: dict[str, Any]
    extra_cpu: Callable[[], float] | None = None  # CPU seconds of a daemon (gocryptfs)
    baseline: str | None = None  # the strategy this one is compared with (same case)
    before: Callable[[], None] | None = None  # run (untimed) before each run, e.g. drop caches
    python: str | None = None  # the interpreter of the worker (a side venv), default ours


def _add(acc: dict[tuple[str, str, str], Measurement], experiment: str, strategy: Strategy,
         sample: Any, extra_cpu: float, rss: float) -> None:
    key = (sample.case, strategy.name, sample.unit)
    m = acc.get(key)
    if m is None:
        extra = dict(sample.extra)
        if strategy.baseline:
            extra.setdefault("baseline", strategy.baseline)
        m = acc[key] = Measurement(experiment, sample.case, strategy.name, sample.unit, [],
                                   sample.better, [], sample.work, sample.work_unit, rss, extra)
    m.values.append(sample.value)
    if sample.cpu_s is not None:
        m.cpu_s.append(sample.cpu_s + extra_cpu)
    m.peak_rss_mb = max(m.peak_rss_mb or 0.0, rss)
    if sample.work is not None:
        m.work = sample.work


def round_order(strategies: list[Any], round_: int) -> list[Any]:
    """The order of the strategies in round ``round_``: rotated by one each round.

    So no strategy always runs right after the same other one (whose leftover
    writeback or cache state would then always fall on it), and over
    ``len(strategies)`` rounds each runs first, second and third once.
    """
    shift = round_ % len(strategies)
    return strategies[shift:] + strategies[:shift]


def _summarise(m: Measurement, runs: list[tuple[float | None, dict[str, Any]]]) -> None:
    """Per-run figures a body reported become their median over the runs."""
    works = [w for w, _ in runs if w is not None]
    if len(works) > 1:
        m.work = statistics.median(works)
    for key, value in runs[0][1].items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        values = [e.get(key) for _, e in runs]
        if len(values) > 1 and all(isinstance(v, int | float) for v in values):
            m.extra[key] = statistics.median(values)  # type: ignore[type-var]


def keep_measurements(measured: list[Measurement],
                      record: Callable[[Any], None]) -> Callable[[Any], None]:
    """A recorder for :func:`interleave` that appends each :class:`Measurement` to
    ``measured`` (for the experiment to finish and record) and records anything else
    (skips, failures) at once."""

    def keep(item: object) -> None:
        if isinstance(item, Measurement):
            measured.append(item)
        else:
            record(item)

    return keep


def interleave(options: BenchOptions, experiment: str, strategies: list[Strategy],
               record: Callable[[Any], None], progress: Progress, label: str,
               repeats: int, *, rotate: bool = False) -> None:
    """Run every strategy ``repeats`` times, A B A B ..., each run in a fresh worker.

    ``rotate``: the order turns by one each round (A B C, B C A, C A B; see
    :func:`round_order`). Each :class:`Measurement` holds every run's value and CPU
    seconds; its ``work`` and the numbers in its ``extra`` are medians over the runs.
    A strategy whose worker fails is recorded as a :class:`Failure` with the
    worker's traceback and dropped from later rounds; the others go on.
    """
    acc: dict[tuple[str, str, str], Measurement] = {}
    per_run: dict[tuple[str, str, str], list[tuple[float | None, dict[str, Any]]]] = {}
    alive = list(strategies)
    total = repeats * len(strategies)
    done = 0
    for round_ in range(repeats):
        for s in round_order(alive, round_) if rotate and alive else list(alive):
            progress(label, done, total)
            if s.before is not None:
                s.before()
            before = s.extra_cpu() if s.extra_cpu else 0.0
            try:
                res = run_worker(options.cleanup, s.target, s.args, python=s.python)
            except BenchRunError as exc:
                record(Failure(experiment, s.name, str(exc), exc.traceback))
                alive.remove(s)
                continue
            finally:
                done += 1
            daemon = (s.extra_cpu() - before) if s.extra_cpu else 0.0
            for sample in res.samples:
                _add(acc, experiment, s, sample, daemon, res.peak_rss_mb)
                per_run.setdefault((sample.case, s.name, sample.unit), []).append(
                    (sample.work, sample.extra))
    progress(label, total, total)
    for key, m in acc.items():
        _summarise(m, per_run[key])
        record(m)


def _missing(exc: ImportError, module: str, experiment: str) -> Skipped | Failure:
    """A peer's missing package is a skip (with the install command); our own module, a bug."""
    name = exc.name or ""
    if name == module or name.startswith("cryptdisk"):
        return Failure(experiment, module, f"cannot import {module}: {exc}",
                       traceback.format_exc())
    return Skipped(experiment, module, f"needs the Python package {name or exc}",
                   INSTALL_BENCH)


def run_experiment(name: str, options: BenchOptions, results: Results, progress: Progress,
                   modules: list[str] | None = None) -> None:
    """Run every module of experiment ``name``; a crash becomes a :class:`Failure`."""
    ensure_cleanup(options)
    for module in modules if modules is not None else EXPERIMENTS[name]:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            results.record(_missing(exc, module, name))
            continue
        t0 = time.perf_counter()
        try:
            mod.run(options, results.record, progress)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # one broken peer must not lose the others' results
            detail = traceback.format_exception_only(exc)[-1].strip()
            results.record(Failure(name, module, f"crashed: {detail}", traceback.format_exc()))
        notes = list(getattr(mod, "NOTES", []) or [])
        if notes:
            results.notes.setdefault(str(getattr(mod, "EXPERIMENT", name)), []).extend(notes)
        results.notes.setdefault("_timing", []).append(
            f"{module}: {time.perf_counter() - t0:.1f} s")


def new_results(command: str, options: BenchOptions) -> Results:
    from ._env import environment

    opts = {k: (str(v) if k == "workdir" else v) for k, v in vars(options).items()
            if k != "cleanup"}
    return Results(environment(), opts, command,
                   started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def ensure_cleanup(options: BenchOptions) -> Cleanup:
    """The options' :class:`Cleanup`, created (in ``options.workdir``) if missing."""
    if options.cleanup is None:
        options.cleanup = Cleanup(options.workdir)
    cleanup: Cleanup = options.cleanup
    return cleanup


@contextlib.contextmanager
def experiment_dir(options: BenchOptions, name: str) -> Iterator[Path]:
    """A fresh scratch directory for one experiment under ``options.workdir``, removed after.

    When the caller gave no :class:`Cleanup` (an experiment run on its own, as the
    tests do), one is made here for the workers and run at the end.
    """
    owned = options.cleanup is None
    cleanup = ensure_cleanup(options)
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=options.workdir))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if owned:
            cleanup.run()
            options.cleanup = None
