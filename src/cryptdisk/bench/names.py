"""names experiment: what encrypting file names costs, listing and opening many small files.

Two encrypted disks over local directories, identical but for
``encrypt_names``, get the same N small files (100 bytes, 100 per directory,
as a partitioned table's would be; ``--rows`` sets N, default 10,000, quick
2,000). Then, interleaved (plain names, encrypted names, ...), each run a fresh
worker (:mod:`._bodies_names`) with a new disk object and the decrypted-read
cache off: ``list()`` of the whole disk, then ``open_read`` and read of every
listed file, each timed::

    cryptdisk bench names --rows 10000 --repeats 7
"""

from __future__ import annotations

import os

from ._bodies_names import write_files
from ._model import BenchOptions, Progress, Recorder
from ._suite import Strategy, experiment_dir, interleave

__all__ = ["NOTES", "run"]

NOTES: list[str] = []
EXPERIMENT = "names"
STRATEGIES = {"plain names": False, "encrypted names": True}


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Write the files on both disks, then time listing and reading them, interleaved."""
    files = options.pick(2_000, 10_000, options.rows)
    repeats = options.pick(3, 5, options.repeats)
    material = os.urandom(32)
    NOTES.clear()
    NOTES.append(f"{files} files of 100 bytes, 100 per directory; both disks are encrypted "
                 "disks over local directories, differing only in encrypt_names; each run a "
                 "fresh process and disk object, the decrypted-read cache off.")
    with experiment_dir(options, "names") as workdir:
        runs = []
        for label, names in STRATEGIES.items():
            root = workdir / label.split()[0]
            progress(f"names: writing {files} files with {label}", 0, 1)
            write_files(str(root), material, names, files)
            runs.append(Strategy(label, "cryptdisk.bench._bodies_names:list_and_read", dict(
                root=str(root), key_hex=material.hex(), names=names, files=files),
                baseline=None if not names else "plain names"))
        interleave(options, EXPERIMENT, runs, record, progress, "names", repeats)
