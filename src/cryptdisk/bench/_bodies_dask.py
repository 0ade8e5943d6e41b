"""Worker bodies of ``cryptdisk bench dask``: one reader on one LocalCluster per call.

:func:`prepare` writes the rows twice (a cryptdisk table, plain Parquet files);
:func:`scan` starts a ``distributed.LocalCluster`` of N single-threaded worker
processes on loopback, runs each shape once untimed (worker imports, the
database opened and its keys loaded on each worker, the page cache), then
timed, and checks every answer against DuckDB's on the plain files.
"""

from __future__ import annotations

import importlib
import math
import os
from typing import Any

from ._measure import Sample, Stopwatch, process_cpu

__all__ = ["prepare", "scan", "shapes"]


def shapes(rows: int) -> dict[str, dict[str, Any]]:
    """Shape -> what it computes: columns, key filter (or None), DuckDB's SQL for the answer."""
    lo, hi = int(rows * 0.45), int(rows * 0.55)
    return {
        "full scan": {"columns": ["k", "s", "f"], "filters": None,
                      "sql": "SELECT sum(f), count(s), count(k) FROM {src}"},
        "filtered sum": {"columns": ["f"], "filters": [["k", ">=", lo], ["k", "<", hi]],
                         "sql": f"SELECT sum(f) FROM {{src}} WHERE k >= {lo} AND k < {hi}"},  # noqa: S608 - ints
    }


def prepare(db: str, plain: str, rows: int, parts: int) -> list[Sample]:
    """The same rows (k in order, s = md5(k), f = k / 7) as a ``parts``-part encrypted
    table ``t`` (ORDER BY k) and as ``parts`` plain Parquet files (64Ki-row row groups,
    LZ4, as cryptdisk's parts). One sample: plain bytes, the answers in ``extra``."""
    import duckdb

    from ..db import connect

    os.makedirs(plain)
    per = -(-rows // parts)
    with connect(db) as con:
        con.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
        for i in range(parts):
            lo, hi = i * per, min(rows, (i + 1) * per)
            gen = (f"SELECT i AS k, md5(i::VARCHAR) AS s, i / 7 AS f "  # noqa: S608 - ints
                   f"FROM range({lo}, {hi}) r(i)")
            con.sql(f"INSERT INTO t {gen}")
            duckdb.sql(f"COPY ({gen}) TO '{plain}/part-{i:03d}.parquet' "
                       "(FORMAT parquet, COMPRESSION lz4, ROW_GROUP_SIZE 65536)")
        stored = con.query("SELECT sum(bytes) FROM system.parts")[0][0]
    src = f"read_parquet('{plain}/*.parquet')"
    duck: Any = duckdb.connect()
    answers = {name: [float(v) for v in duck.execute(s["sql"].format(src=src)).fetchone()]
               for name, s in shapes(rows).items()}
    duck.close()
    size = sum(os.path.getsize(os.path.join(plain, f)) for f in os.listdir(plain))
    return [Sample("prepare", "bytes", float(size), extra={"answers": answers,
                                                           "encrypted_bytes": float(stored)})]


def _frame(reader: str, db: str, plain: str, shape: dict[str, Any]) -> Any:
    filters = [tuple(f) for f in shape["filters"]] if shape["filters"] else None
    if reader == "cryptdisk":
        import cryptdisk.dask

        return cryptdisk.dask.read_table(db, "t", shape["columns"], filters)
    import dask.dataframe as dd
    cols = sorted(set(shape["columns"]) | ({f[0] for f in filters} if filters else set()))
    return dd.read_parquet(plain, columns=cols, filters=filters)


def _compute(dask: Any, df: Any, name: str) -> list[float]:
    if name == "full scan":
        out = dask.compute(df.f.sum(), df.s.count(), df.k.count())
    else:
        out = dask.compute(df.f.sum())
    return [float(v) for v in out]


def scan(reader: str, workers: int, db: str, plain: str, rows: int,
         answers: dict[str, list[float]]) -> list[Sample]:
    """Each shape once untimed, then timed, on a fresh cluster of ``workers`` processes.

    Rows/s counts the table's rows for both shapes (the filtered sum reads a tenth);
    CPU is this process's and the worker processes' (nannies excluded), also recorded
    apart (``client_cpu_s``, ``workers_cpu_s``).
    """
    import warnings

    dask: Any = importlib.import_module("dask")
    distributed: Any = importlib.import_module("distributed")
    warnings.filterwarnings("ignore", message="The inplace keyword")  # dask 2026.8 + pandas 3.1
    out = []
    with distributed.LocalCluster(n_workers=workers, processes=True, threads_per_worker=1,
                                  host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                  worker_dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as client:
        pids = list(client.run(os.getpid).values())
        for name, shape in shapes(rows).items():
            df = _frame(reader, db, plain, shape)
            _check(_compute(dask, df, name), answers[name], reader, name)
            cpu0 = sum(process_cpu(p) for p in pids)
            with Stopwatch() as sw:
                got = _compute(dask, _frame(reader, db, plain, shape), name)
            workers_cpu = sum(process_cpu(p) for p in pids) - cpu0
            cpu = sw.cpu + workers_cpu
            _check(got, answers[name], reader, name)
            s = sw.rate(f"{name}, {workers} worker{'s' if workers > 1 else ''}", rows,
                        unit="Mrows/s", work_unit="rows", rows=rows, workers=workers,
                        partitions=df.npartitions)
            s.cpu_s = cpu
            # where the CPU went: the client (planning, and LocalCluster's scheduler) and the
            # worker processes (reads, and Dask's per-task work on each worker's event loop)
            s.extra.update(client_cpu_s=sw.cpu, workers_cpu_s=workers_cpu)
            out.append(s)
    return out


def _check(got: list[float], want: list[float], reader: str, name: str) -> None:
    if len(got) != len(want) or not all(math.isclose(g, w, rel_tol=1e-9)
                                        for g, w in zip(got, want, strict=True)):
        raise AssertionError(f"{reader} {name} returned {got}, DuckDB {want}")
