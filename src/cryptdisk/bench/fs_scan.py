"""DuckDB scans through ``cryptdisk://``: encrypted disk vs plain disk vs the local file.

One N-row Parquet file (c_int Int64 = hash of n, c_str = md5 hex of n,
c_float = n / hash(n) * 1e7; the OLAP experiment's columns) is written three
ways: plain on local disk (DuckDB reads it directly), through ``cryptdisk://``
onto a plain ``local`` disk, and through ``cryptdisk://`` onto an ``encrypted``
disk, which is also read through a second encrypted disk with its
decrypted-segment cache turned off (every query decrypts again).
``select avg(c_float)`` and ``select sum(c_int)`` then run on each in
interleaved rounds (A B C D A B C D ...), each run in a fresh worker process
(:mod:`._bodies_scan`): each query once to warm up, then timed, with DuckDB's
default threads. Recorded per strategy: wall seconds, process CPU seconds, the
worker's peak RSS; the paired ratio to the direct read goes in ``extra``.

What limits it (profiled on 10M rows, 2 cores): DuckDB reads a column as
~1 MB ``read()`` calls on a Python file object, one per column chunk, and
re-reads them on every query. Without a cache the time inside ``read()`` is
decryption plus copies: a fresh buffer per read cost ~7x the AES work in page
faults (now a reused per-thread buffer, one copy into the returned ``bytes``),
and handing segments to a thread pool from DuckDB's own threads only added
waiting (now a few segments per call). With the cache of decrypted reads a
repeated read returns the same ``bytes`` object: time inside ``read()`` fell
to ~0.4 ms per query, below the plain disk's ~9 ms of ``os.pread`` copies.
What remains over the direct read is DuckDB's Python-filesystem path (the GIL,
a Python call and a ``memcpy`` per read), common to both ``cryptdisk://`` disks.
"""

from __future__ import annotations

import os
from pathlib import Path

from ._model import BenchOptions, Measurement, Progress, Recorder
from ._stats import paired_ratio
from ._suite import Strategy, experiment_dir, interleave, keep_measurements
from ._worker import run_worker

__all__ = ["QUERIES", "STRATEGIES", "run"]

EXPERIMENT = "fs_scan"
QUERIES = {
    "avg(c_float)": "SELECT avg(c_float) FROM read_parquet('{url}')",
    "sum(c_int)": "SELECT sum(c_int) FROM read_parquet('{url}')",
}
STRATEGIES = ("direct local file", "cryptdisk:// plain disk", "cryptdisk:// encrypted disk",
              "cryptdisk:// encrypted disk, no cache")
_B = "cryptdisk.bench._bodies_scan:"


def _config(workdir: Path) -> Path:
    key = os.urandom(32).hex()
    path = workdir / "fs_scan.toml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"""
[keyring]
[[keyring.keys]]
id = 1
hex = "{key}"

[disks.plain]
type = "local"
path = "plain"

[disks.secure]
type = "encrypted"
disk = "plain"
path = "enc/"

[disks.nocache]
type = "encrypted"
disk = "plain"
path = "enc/"
cache_mb = 0
""")
    return path


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Measure the four strategies on both queries (see the module docstring)."""
    rows = options.pick(200_000, 10_000_000, options.rows)
    repeats = options.pick(5, 15, options.repeats)
    with experiment_dir(options, "fs_scan") as workdir:
        config = str(_config(workdir))
        local = str(workdir / "local.parquet")
        urls = dict(zip(STRATEGIES, (local, "cryptdisk://plain/t.parquet",
                                     "cryptdisk://secure/t.parquet",
                                     "cryptdisk://nocache/t.parquet"), strict=True))
        progress("fs_scan: writing Parquet", 0, 1)
        prepared = run_worker(options.cleanup, _B + "scan_prepare", dict(
            config=config, local=local, targets=[urls[STRATEGIES[1]], urls[STRATEGIES[2]]],
            rows=rows, queries=QUERIES)).samples[0]
        progress("fs_scan: writing Parquet", 1, 1)
        strategies = [
            Strategy(s, _B + "scan", dict(config=config, url=urls[s], rows=rows,
                                          size=prepared.value, queries=QUERIES,
                                          expected=prepared.extra),
                     baseline=None if s == STRATEGIES[0] else STRATEGIES[0])
            for s in STRATEGIES]
        measured: list[Measurement] = []
        interleave(options, EXPERIMENT, strategies, keep_measurements(measured, record),
                   progress, "fs_scan", repeats)
    direct = {m.case: m for m in measured if m.strategy == STRATEGIES[0]}
    for m in measured:
        base = direct.get(m.case)
        if base is not None:
            m.extra["ratio_to_direct"] = paired_ratio(m.values, base.values).median
        record(m)
