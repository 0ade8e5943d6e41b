"""Clocks for one timed body: wall time, process CPU seconds, peak RSS.

CPU is ``getrusage(RUSAGE_SELF) + getrusage(RUSAGE_CHILDREN)`` user+sys
deltas: the benchmark process and any child it waited for, never
system-wide CPU%. Daemons (gocryptfs) are added by the caller with
:func:`process_cpu` on their pid. Peak RSS is ``ru_maxrss`` of the worker
process that ran the body (each run gets a fresh interpreter, see
:mod:`cryptdisk.bench._worker`), so it is the strategy's own high-water mark
(``VmHWM``; see :func:`peak_rss_mb`).
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Sample", "Stopwatch", "cpu_seconds", "peak_rss_mb", "process_cpu"]


def cpu_seconds() -> float:
    """User+system CPU seconds of this process and its reaped children."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _vm_hwm_kib() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss_mb() -> float:
    """Peak resident set size of this process (or of its largest child) in MiB.

    On Linux this is ``VmHWM`` of the process's own address space, not
    ``ru_maxrss``: after ``exec`` the kernel carries the parent's high-water
    mark into the child's ``ru_maxrss`` (subprocess uses vfork), so a worker
    started by a large harness would inherit the harness's figure.
    """
    hwm = _vm_hwm_kib()
    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if hwm is None:
        hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max(hwm, child_kb) / 1024  # KiB -> MiB


def process_cpu(pid: int) -> float:
    """CPU seconds (user+sys, with reaped children) of another process, e.g. a FUSE daemon."""
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    total: float = t.user + t.system
    return total + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)


@dataclass
class Sample:
    """One timed run of one case: what a worker sends back to the harness."""

    case: str
    unit: str
    value: float
    cpu_s: float | None = None
    work: float | None = None
    work_unit: str = "bytes"
    better: str = "higher"
    extra: dict[str, Any] = field(default_factory=dict)


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.wall`` and ``sw.cpu`` (seconds)."""

    wall: float = 0.0
    cpu: float = 0.0

    def __enter__(self) -> Stopwatch:
        self._c0 = cpu_seconds()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._t0
        self.cpu = cpu_seconds() - self._c0

    def rate(self, case: str, work: float, *, unit: str = "MB/s", scale: float = 1e6,
             work_unit: str = "bytes", **extra: Any) -> Sample:
        """A throughput sample: ``work / scale`` per wall second."""
        value = work / scale / self.wall if self.wall > 0 else float("inf")
        return Sample(case, unit, value, self.cpu, work, work_unit, "higher", dict(extra))

    def seconds(self, case: str, work: float | None = None, *, work_unit: str = "bytes",
                **extra: Any) -> Sample:
        """A latency sample in wall seconds (lower is better)."""
        return Sample(case, "s", self.wall, self.cpu, work, work_unit, "lower", dict(extra))
