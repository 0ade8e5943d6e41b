"""oltp-cpu experiment: CPU per SQLite transaction, one process, plain against cryptdisk.

A quick, load-insensitive companion to the oltp experiment for tuning the VFS.
Each run is a fresh worker (:mod:`._bodies_oltp_cpu`) that loads a scale-1
pgbench database, warms its cache, and runs one kind of transaction in its own
process for ``--duration`` seconds; the figure is CPU microseconds per
transaction (user+system), with the system part and wall time in ``extra``.
Plain and cryptdisk runs are interleaved (A B A B); ``CRYPTDISK_SQLITE_VFS``
picks the VFS implementation (c or python), ``--case`` the cases by name::

    cryptdisk bench oltp-cpu --case 'tpcb wal+normal' --duration 10 --repeats 3
"""

from __future__ import annotations

from ._model import BenchOptions, Progress, Recorder
from ._suite import Strategy, experiment_dir, interleave
from .oltp import _vfs_implementation

__all__ = ["CASES", "NOTES", "run"]

NOTES: list[str] = []
EXPERIMENT = "oltp-cpu"
#: (transaction kind, journal mode, synchronous): TPC-B-like in each durability setting the
#: oltp experiment measures, and select-only.
CASES = [("tpcb", "wal", "normal"), ("tpcb", "wal", "full"), ("tpcb", "delete", "full"),
         ("select", "wal", "normal")]


def _name(kind: str, journal: str, synchronous: str) -> str:
    return f"{kind} {journal}+{synchronous}"


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Every case, plain and cryptdisk interleaved; one Measurement per (case, strategy)."""
    duration = options.pick(1.0, 5.0, options.duration)
    repeats = options.pick(2, 3, options.repeats)
    names = [_name(*c) for c in CASES]
    todo = [c for c, n in zip(CASES, names, strict=True)
            if options.case is None or options.case in n]
    if not todo:
        raise ValueError(f"no oltp-cpu case matches --case {options.case!r} (cases: "
                         + "; ".join(names) + ")")
    NOTES.clear()
    NOTES.append(f"cryptdisk's SQLite VFS: the {_vfs_implementation()} "
                 "(CRYPTDISK_SQLITE_VFS picks c or python).")
    NOTES.append("One process, no contention: each run loads a fresh scale-1 pgbench database, "
                 "warms for a tenth of the duration, then times its transactions; checked: no "
                 "cryptdisk database file holds the table names in plaintext.")
    with experiment_dir(options, "oltp-cpu") as workdir:
        for kind, journal, synchronous in todo:
            case = _name(kind, journal, synchronous)
            runs = [Strategy(s, "cryptdisk.bench._bodies_oltp_cpu:cpu_per_transaction", dict(
                        strategy=s, kind=kind, workdir=str(workdir), journal=journal,
                        synchronous=synchronous, duration=duration, case=case),
                        baseline=None if s == "plain" else "plain")
                    for s in ("plain", "cryptdisk")]
            interleave(options, EXPERIMENT, runs, record, progress, f"oltp-cpu: {case}",
                       repeats)
