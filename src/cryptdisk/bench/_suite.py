"""Run experiments: interleave strategies, collect results, tolerate missing peers.

An experiment module exposes ``run(options, record, progress)``. Modules
written on other branches may not exist yet; :func:`run_experiment` records
them as :class:`Skipped` with the reason instead of failing the suite.
"""

from __future__ import annotations

import importlib
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ._cleanup import Cleanup
from ._model import BenchOptions, Measurement, Progress, Recorder, Skipped
from ._worker import BenchRunError, run_worker

__all__ = ["EXPERIMENTS", "INSTALL_BENCH", "Results", "Strategy", "interleave", "run_experiment"]

INSTALL_BENCH = "pip install 'cryptdisk[bench]'"

#: Experiment name -> modules that contribute to it (lazily imported, in order).
EXPERIMENTS: dict[str, list[str]] = {
    "crypto": ["cryptdisk.bench.crypto"],
    "io": ["cryptdisk.bench.fileio"],
    "olap": ["cryptdisk.bench.olap", "cryptdisk.bench.fs_scan", "cryptdisk.bench.olap_db"],
    "oltp": ["cryptdisk.bench.oltp"],
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

    def record(self, item: Measurement | Skipped) -> None:
        if isinstance(item, Skipped):
            self.skipped.append(item)
        else:
            self.measurements.append(item)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "cryptdisk-bench/1",
            "command": self.command, "started": self.started, "elapsed_s": self.elapsed_s,
            "environment": self.environment, "options": self.options,
            "measurements": [m.to_dict() for m in self.measurements],
            "skipped": [asdict(s) for s in self.skipped],
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Results:
        names = set(Measurement.__dataclass_fields__)
        ms = [Measurement(**{k: v for k, v in m.items() if k in names}) for m in d["measurements"]]
        return cls(d["environment"], d["options"], d["command"], ms,
                   [Skipped(**s) for s in d["skipped"]], d.get("notes", {}),
                   d.get("started", ""), d.get("elapsed_s", 0.0))


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


def interleave(options: BenchOptions, experiment: str, strategies: list[Strategy],
               record: Recorder, progress: Progress, label: str, repeats: int) -> None:
    """Run every strategy ``repeats`` times, A B A B ..., each run in a fresh worker.

    A strategy whose worker fails is recorded as :class:`Skipped` with the error
    and dropped from later rounds; the others go on.
    """
    acc: dict[tuple[str, str, str], Measurement] = {}
    alive = list(strategies)
    total = repeats * len(strategies)
    done = 0
    for _ in range(repeats):
        for s in list(alive):
            progress(label, done, total)
            if s.before is not None:
                s.before()
            before = s.extra_cpu() if s.extra_cpu else 0.0
            try:
                res = run_worker(options.cleanup, s.target, s.args, python=s.python)
            except BenchRunError as exc:
                record(Skipped(experiment, s.name, f"failed: {exc}"))
                alive.remove(s)
                continue
            finally:
                done += 1
            daemon = (s.extra_cpu() - before) if s.extra_cpu else 0.0
            for sample in res.samples:
                _add(acc, experiment, s, sample, daemon, res.peak_rss_mb)
    progress(label, total, total)
    for m in acc.values():
        record(m)


def _missing(exc: ImportError, module: str) -> Skipped | None:
    name = exc.name or ""
    experiment = module.rsplit(".", 1)[-1]
    if name == module:
        return Skipped(experiment, module, f"{module} is not part of this build yet")
    return Skipped(experiment, module, f"needs the Python package {name or exc}",
                   INSTALL_BENCH)


#: Modules whose bodies run inside ``run()``: they run in a child process of their own.
OWN_MODULES = {"cryptdisk.bench.crypto", "cryptdisk.bench.fileio", "cryptdisk.bench.olap"}


def run_experiment(name: str, options: BenchOptions, results: Results, progress: Progress,
                   modules: list[str] | None = None) -> None:
    """Run every module of experiment ``name``; failures become Skipped entries."""
    from ._module_runner import run_module

    for module in modules if modules is not None else EXPERIMENTS[name]:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            skipped = _missing(exc, module)
            if skipped is not None:
                skipped.experiment = name
                results.record(skipped)
            continue
        t0 = time.perf_counter()
        notes: list[str] = []
        try:
            if module in OWN_MODULES:
                mod.run(options, results.record, progress)
                notes = list(getattr(mod, "NOTES", []) or [])
            else:
                notes = run_module(module, options, results.record, progress,
                                   ensure_cleanup(options))
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # one broken peer must not lose the others' results
            detail = traceback.format_exception_only(exc)[-1].strip()
            results.record(Skipped(name, module, f"crashed: {detail}"))
        if notes:
            results.notes.setdefault(_experiment_of(module, name), []).extend(notes)
        results.notes.setdefault("_timing", []).append(
            f"{module}: {time.perf_counter() - t0:.1f} s")


def _experiment_of(module: str, name: str) -> str:
    mod = importlib.import_module(module)
    return str(getattr(mod, "EXPERIMENT", name))


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
