"""A table read by Dask workers through cryptdisk.dask against Dask reading plain Parquet.

``python -m cryptdisk.bench.dask_scan --rows 4000000 --workdir DIR``: the same
rows (k BIGINT in order, s = md5(k), f DOUBLE) go into a cryptdisk table
(encrypted, ``ORDER BY k``, 4 parts) and into 4 plain Parquet files (64Ki-row
row groups, LZ4, as cryptdisk's parts). On a ``distributed.LocalCluster`` of 1,
then 2 worker processes (one thread each, loopback), two shapes run on each:
a full scan (``sum(f)`` and ``count`` over k, s, f) and a filtered aggregation
(``sum(f)`` where k falls in the middle tenth). Each is run once to warm up,
then ``--repeats`` times; the best time gives rows/s (of the table's rows).
The two readers are interleaved per repeat, so a busy machine disturbs both.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import tempfile
import time
from typing import Any

__all__ = ["main"]


def _prepare(work: str, rows: int) -> tuple[str, str]:
    import duckdb

    import cryptdisk

    db_path, plain = os.path.join(work, "db"), os.path.join(work, "plain")
    if os.path.isdir(plain):
        return db_path, plain
    os.makedirs(plain)
    per = -(-rows // 4)
    with cryptdisk.connect(db_path) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
        for i in range(4):
            lo, hi = i * per, min(rows, (i + 1) * per)
            gen = (f"SELECT i AS k, md5(i::VARCHAR) AS s, i / 7 AS f "  # noqa: S608 - ints
                   f"FROM range({lo}, {hi}) r(i)")
            db.sql(f"INSERT INTO t {gen}")
            duckdb.sql(f"COPY ({gen}) TO '{plain}/part-{i}.parquet' "
                       "(FORMAT parquet, COMPRESSION lz4, ROW_GROUP_SIZE 65536)")
    return db_path, plain


def _shapes(db_path: str, plain: str, rows: int) -> dict[str, dict[str, Any]]:
    import dask.dataframe as dd

    import cryptdisk.dask

    lo, hi = int(rows * 0.45), int(rows * 0.55)
    flt = [("k", ">=", lo), ("k", "<", hi)]

    def plain_df(columns: list[str], filters: Any = None) -> Any:
        return dd.read_parquet(plain, columns=columns, filters=filters)

    return {
        "full scan": {
            "cryptdisk": lambda: _full(cryptdisk.dask.read_table(db_path, "t")),
            "plain": lambda: _full(plain_df(["k", "s", "f"])),
        },
        "filtered sum": {
            "cryptdisk": lambda: cryptdisk.dask.read_table(db_path, "t", ["f"], flt).f.sum(),
            "plain": lambda: plain_df(["f", "k"], flt).f.sum(),
        },
    }


def _full(df: Any) -> Any:
    return (df.f.sum(), df.s.count(), df.k.count())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cryptdisk.bench.dask_scan")
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    dask: Any = importlib.import_module("dask")  # untyped: Any, as mypy needs here
    distributed: Any = importlib.import_module("distributed")

    work = args.workdir or tempfile.mkdtemp(prefix="cryptdisk-dask-bench-")
    db_path, plain = _prepare(work, args.rows)
    print(f"rows={args.rows} workdir={work}")
    print(f"{'shape':14} {'workers':>7} {'cryptdisk rows/s':>17} {'plain rows/s':>13} "
          f"{'ratio':>6}")
    status = 0
    for n in [int(w) for w in args.workers.split(",")]:
        with distributed.LocalCluster(n_workers=n, processes=True, threads_per_worker=1,
                                      host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                      worker_dashboard_address="127.0.0.1:0") as cluster, \
                distributed.Client(cluster):
            for shape, readers in _shapes(db_path, plain, args.rows).items():
                best = {name: float("inf") for name in readers}
                answers = {}
                for rep in range(args.repeats + 1):
                    for name, build in readers.items():
                        t0 = time.perf_counter()
                        answers[name] = dask.compute(build())
                        if rep:  # the first round warms the workers up
                            best[name] = min(best[name], time.perf_counter() - t0)
                if not _same(answers["cryptdisk"], answers["plain"]):
                    print(f"  answers differ: {answers}")
                    status = 1
                enc, pl = args.rows / best["cryptdisk"], args.rows / best["plain"]
                print(f"{shape:14} {n:>7} {enc:>17,.0f} {pl:>13,.0f} "
                      f"{best['cryptdisk'] / best['plain']:>6.2f}")
    return status


def _same(a: Any, b: Any) -> bool:
    """Equal answers (float sums may differ in their last bits: summation order)."""
    flat_a, flat_b = _flatten(a), _flatten(b)
    return len(flat_a) == len(flat_b) and all(
        math.isclose(float(x), float(y), rel_tol=1e-9) for x, y in zip(flat_a, flat_b,
                                                                     strict=True))


def _flatten(x: Any) -> list[Any]:
    if isinstance(x, tuple | list):
        return [v for item in x for v in _flatten(item)]
    return [x]


if __name__ == "__main__":
    raise SystemExit(main())
