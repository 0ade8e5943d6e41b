"""DuckDB scans through ``cryptdisk://``: encrypted disk vs plain disk vs the local file.

One N-row Parquet file (c_int Int64 = hash of n, c_str = md5 hex of n,
c_float = n / hash(n) * 1e7; the OLAP experiment's columns) is written three
ways: plain on local disk (DuckDB reads it directly), through ``cryptdisk://``
onto a plain ``local`` disk, and through ``cryptdisk://`` onto an ``encrypted``
disk, which is also read through a second encrypted disk with its
decrypted-segment cache turned off (every query decrypts again).
``select avg(c_float)`` and ``select sum(c_int)`` then run on each in
interleaved rounds (A B C D A B C D ...), warm, with DuckDB's default threads.
Recorded per strategy: wall seconds, process CPU seconds, peak RSS; the
ratios to the direct read go in ``extra``.

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

Run it alone with ``python -m cryptdisk.bench.fs_scan [--quick] [--rows N]``.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._model import BenchOptions, Measurement, Progress, Recorder

__all__ = ["QUERIES", "run"]

EXPERIMENT = "fs_scan"
QUERIES = {
    "avg(c_float)": "SELECT avg(c_float) FROM read_parquet('{url}')",
    "sum(c_int)": "SELECT sum(c_int) FROM read_parquet('{url}')",
}
STRATEGIES = ("direct local file", "cryptdisk:// plain disk", "cryptdisk:// encrypted disk",
              "cryptdisk:// encrypted disk, no cache")


def _config(workdir: Path) -> Path:
    key = os.urandom(32).hex()
    path = workdir / "fs_scan.toml"
    path.write_text(f"""
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
    path.chmod(0o600)
    return path


def _generate(con: Any, path: Path, rows: int) -> None:
    con.execute(f"""
        COPY (SELECT (hash(range) >> 1)::BIGINT AS c_int,
                     md5(range::VARCHAR) AS c_str,
                     range / ((hash(range) >> 1)::DOUBLE + 1) * 1e7 AS c_float
              FROM range({rows}))
        TO '{path}' (FORMAT parquet)""")  # noqa: S608 - our own scratch path and an int


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _setup(workdir: Path, rows: int) -> tuple[Any, dict[str, str], int]:
    import duckdb

    from ..fs import CryptdiskFileSystem

    config = _config(workdir)
    local = workdir / "local.parquet"
    con = duckdb.connect()
    _generate(con, local, rows)
    fs = CryptdiskFileSystem(config=str(config), skip_instance_cache=True)
    con.register_filesystem(fs)
    for disk in ("plain", "secure"):
        with open(local, "rb") as fin, fs.open(f"cryptdisk://{disk}/t.parquet", "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    urls = {STRATEGIES[0]: str(local), STRATEGIES[1]: "cryptdisk://plain/t.parquet",
            STRATEGIES[2]: "cryptdisk://secure/t.parquet",
            STRATEGIES[3]: "cryptdisk://nocache/t.parquet"}
    return con, urls, local.stat().st_size


def _time(con: Any, sql: str) -> tuple[float, float, Any]:
    cpu0, t0 = _cpu(), time.perf_counter()
    result = con.execute(sql).fetchall()
    return time.perf_counter() - t0, _cpu() - cpu0, result


def _same(a: Any, b: Any) -> bool:
    """Equal results, allowing for float sums added in another order by other threads."""
    x, y = a[0][0], b[0][0]
    return bool(x == y or math.isclose(float(x), float(y), rel_tol=1e-9))


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Measure the three strategies on both queries (see the module docstring)."""
    rows = options.rows or (200_000 if options.quick else 10_000_000)
    repeats = options.repeats or (5 if options.quick else 15)
    workdir = Path(tempfile.mkdtemp(prefix="fs_scan-", dir=options.workdir))
    try:
        progress("fs_scan: writing Parquet", 0, 1)
        con, urls, size = _setup(workdir, rows)
        progress("fs_scan: writing Parquet", 1, 1)
        total = len(QUERIES) * repeats
        for qi, (case, template) in enumerate(QUERIES.items()):
            walls: dict[str, list[float]] = {s: [] for s in STRATEGIES}
            cpus: dict[str, list[float]] = {s: [] for s in STRATEGIES}
            expected = None
            for s in STRATEGIES:  # one warm-up each: page cache, Parquet metadata
                _time(con, template.format(url=urls[s]))
            for rep in range(repeats):
                for s in STRATEGIES:  # interleaved: A B C A B C ...
                    wall, cpu, result = _time(con, template.format(url=urls[s]))
                    expected = result if expected is None else expected
                    if not _same(result, expected):
                        raise RuntimeError(f"{s} returned {result}, expected {expected}")
                    walls[s].append(wall)
                    cpus[s].append(cpu)
                progress(f"fs_scan: {case}", qi * repeats + rep + 1, total)
            base = statistics.median(walls[STRATEGIES[0]])
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            for s in STRATEGIES:
                record(Measurement(
                    experiment=EXPERIMENT, case=f"{case} rows={rows}", strategy=s, unit="s",
                    values=walls[s], better="lower", cpu_s=cpus[s], work=size,
                    peak_rss_mb=peak,
                    extra={"ratio_to_direct": statistics.median(walls[s]) / base,
                           "rows": rows}))
        con.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m cryptdisk.bench.fs_scan``: print medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int)
    parser.add_argument("--repeats", type=int)
    args = parser.parse_args(argv)
    results: list[Measurement] = []

    def record(m: Any) -> None:
        if isinstance(m, Measurement):
            results.append(m)

    with tempfile.TemporaryDirectory() as tmp:
        run(BenchOptions(workdir=Path(tmp), quick=args.quick, rows=args.rows,
                         repeats=args.repeats), record, lambda *a: None)
    for m in results:
        lo, hi = m.spread
        print(f"{m.case:28s} {m.strategy:30s} median {m.median * 1000:8.1f} ms "
              f"(min {lo * 1000:.1f}, max {hi * 1000:.1f})  cpu {statistics.median(m.cpu_s):.3f} s"
              f"  x{m.extra['ratio_to_direct']:.2f} of direct", file=sys.stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
