"""What every experiment records: one :class:`Measurement` per (case, strategy).

Experiments are modules with ``run(options, record, progress)``; they call
``record(measurement)`` for each result. Figures are medians of repeated,
interleaved runs (A B A B ...), so drift on a shared machine cancels in ratios.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BenchOptions", "Failure", "Measurement", "Progress", "Recorder", "Skipped"]


@dataclass
class BenchOptions:
    """Knobs shared by all experiments."""

    workdir: Path  # scratch space; the experiment removes what it creates
    quick: bool = False  # small sizes, a couple of minutes for everything
    rows: int | None = None  # olap rows (default 10M, quick 200k)
    duration: float | None = None  # seconds per timed test (io, oltp)
    repeats: int | None = None  # runs per strategy (interleaved)
    threads: int | None = None  # default: one per core
    size: int | None = None  # crypto: bytes of the file for the peak-RSS test
    side_venvs: bool = True  # olap: may create a venv (pip) for duckdb 1.5.5 + OpenSSL
    case: str | None = None  # oltp, server, oltp-cpu, olap-engine: only matching cases
    # Added by the harness (cryptdisk.bench._cleanup.Cleanup); experiments that start
    # processes or mounts register them there so Ctrl-C leaves nothing behind.
    cleanup: Any = None
    workers: str | None = None  # server: cryptdisk serve --workers (default: its own, auto)
    drop_page_cache: bool = False  # olap-engine: evict each store's files before each run

    def pick(self, quick: Any, full: Any, given: Any = None) -> Any:
        """``given`` if set, else the quick or full default."""
        if given is not None:
            return given
        return quick if self.quick else full


@dataclass
class Measurement:
    """Repeated runs of one case under one strategy.

    ``values`` are in ``unit`` (higher or lower is better per ``better``);
    ``cpu_s`` is process CPU seconds (user+sys of the benchmark process, its
    children and any daemon it drives) per run, never system-wide CPU%;
    ``work`` is the amount of data or transactions per run, so CPU per GB or
    per transaction can be derived.
    """

    experiment: str  # "io", "olap", "oltp", "crypto"
    case: str  # "seq-read", "avg(c_float) warm threads=all", "tpcb scale=1 clients=2", ...
    strategy: str  # "plain", "cryptdisk", "chdb AES_128_CTR", "sqlcipher", ...
    unit: str  # "MB/s", "s", "TPS", "seeks/s", "GB/s"
    values: list[float]
    better: str = "higher"  # or "lower"
    cpu_s: list[float] = field(default_factory=list)
    work: float | None = None  # bytes (io/crypto/olap) or transactions (oltp) per run
    work_unit: str = "bytes"
    peak_rss_mb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    @property
    def spread(self) -> tuple[float, float]:
        return float(min(self.values)), float(max(self.values))

    @property
    def cpu_per_gb(self) -> float | None:
        if not self.cpu_s or not self.work or self.work_unit != "bytes":
            return None
        return float(statistics.median(self.cpu_s)) / (float(self.work) / 1e9)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (numbers such as ``Decimal`` from a database become floats)."""
        d = asdict(self)
        d["values"] = [float(v) for v in self.values]
        d["cpu_s"] = [float(v) for v in self.cpu_s]
        if self.work is not None:
            d["work"] = float(self.work)
        d.update(median=self.median, min=self.spread[0], max=self.spread[1],
                 cpu_s_per_gb=self.cpu_per_gb)
        return d


@dataclass
class Skipped:
    """A strategy or peer that could not run, with how to make it run."""

    experiment: str
    strategy: str
    reason: str
    install: str | None = None  # the command that installs what is missing


@dataclass
class Failure:
    """A strategy or experiment module that crashed: an error, not a skip.

    ``traceback`` is the Python traceback of the crash (from the worker process
    when a body failed there); the report and the JSON keep it, and
    ``cryptdisk bench`` exits non-zero when a run has any.
    """

    experiment: str
    strategy: str
    error: str
    traceback: str = ""


Recorder = Callable[[Measurement | Skipped | Failure], None]
Progress = Callable[[str, float, float], None]  # (task description, completed, total)
