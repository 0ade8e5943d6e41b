"""``cryptdisk bench backup``: backup and restore of the embedded database beside restic.

The issue's experiment: a database of N rows (default 10M, quick 200k; the README's
table ``c_int BIGINT, c_str VARCHAR (md5), c_float DOUBLE``, ``ORDER BY c_int``), then
1% more rows. Its table is on the ``plain`` policy, so restic (Debian's package, its
default settings) backs up exactly the Parquet bytes that cryptdisk backs up (cryptdisk
reads them through the database's catalog, restic as files under ``DB/plain``).

Per round and tool, each phase in its own worker process (:mod:`._bodies_backup`): the
first backup into a new repository, the second backup after the 1% change, and the
restore of the second backup (cryptdisk: into a new database, ``Database.check()``
included; restic: the files). Figures: MB/s of the parts' plaintext bytes, CPU seconds
per GB (the process and its children: restic's too), peak RSS, and the repository's
growth on the second backup as a share of the first backup's size.
"""

from __future__ import annotations

import shutil

from ._model import BenchOptions, Progress, Recorder, Skipped
from ._suite import Strategy, experiment_dir, interleave
from ._worker import run_worker

__all__ = ["PHASES", "run"]

EXPERIMENT = "backup"
PHASES = ("first", "second", "restore")
_B = "cryptdisk.bench._bodies_backup:"
#: The issue's targets, restated in the notes beside what was measured.
TARGETS = ("first backup at least as fast as restic's; second backup after a 1% change "
           "stores under 2% of the first; restore at least 300 MB/s")
NOTES: list[str] = []


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Measure both tools' three phases in interleaved rounds (see the module docstring)."""
    rows = options.pick(200_000, 10_000_000, options.rows)
    repeats = options.pick(2, 3, options.repeats)
    NOTES.clear()
    NOTES.append(f"Targets (issue 19): {TARGETS}.")
    have_restic = shutil.which("restic") is not None
    if not have_restic:
        record(Skipped(EXPERIMENT, "restic", "restic is not installed",
                       "apt-get install restic"))
    with experiment_dir(options, "backup") as workdir:
        progress("backup: building the database", 0, 1)
        prepared = run_worker(options.cleanup, _B + "prepare",
                              dict(workdir=str(workdir), rows=rows)).samples[0]
        progress("backup: building the database", 1, 1)
        sizes = {"first_bytes": prepared.extra["first_bytes"],
                 "second_bytes": prepared.extra["second_bytes"]}
        NOTES.append(f"{rows:,} rows, then {prepared.extra['extra_rows']:,} more: "
                     f"{sizes['first_bytes'] / 1e6:.0f} MB of Parquet parts, then "
                     f"{sizes['second_bytes'] / 1e6:.0f} MB.")
        strategies = []
        for phase in PHASES:  # a round runs the phases in order, each tool in turn
            args = dict(workdir=str(workdir), phase=phase, **sizes)
            strategies.append(Strategy("cryptdisk", _B + "cryptdisk_phase", args,
                                       baseline="restic" if have_restic else None))
            if have_restic:
                strategies.append(Strategy("restic", _B + "restic_phase", args))
        interleave(options, EXPERIMENT, strategies, record, progress, "backup", repeats)
