"""Worker bodies of ``fs_scan`` and ``olap_db``: one strategy per call, in a fresh process.

Each body times itself with :class:`~cryptdisk.bench._measure.Stopwatch` (process
CPU of all its threads) and checks every answer it times against the expected
one; a wrong answer raises, and the harness reports the strategy as failed.
"""

from __future__ import annotations

import math
import shutil
from typing import Any

from ._measure import Sample, Stopwatch

__all__ = ["db_insert", "db_prepare", "db_queries", "scan", "scan_prepare"]


# -- fs_scan: DuckDB reading Parquet through cryptdisk:// ---------------------------------


def _duckdb(config: str | None) -> Any:
    import duckdb

    con = duckdb.connect()
    if config is not None:
        from ..fs import CryptdiskFileSystem

        con.register_filesystem(CryptdiskFileSystem(config=config, skip_instance_cache=True))
    return con


def _same(got: Any, expected: Any) -> bool:
    """Equal results, allowing for float sums added in another order by other threads."""
    return bool(got == expected or math.isclose(float(got), float(expected), rel_tol=1e-9))


def scan_prepare(config: str, local: str, targets: list[str], rows: int,
                 queries: dict[str, str]) -> list[Sample]:
    """Write the N-row Parquet file locally and copy it to ``targets`` (cryptdisk:// URLs).

    Returns one sample: the file's size, with each query's answer on the local file.
    """
    con = _duckdb(config)
    con.execute(f"""
        COPY (SELECT (hash(range) >> 1)::BIGINT AS c_int,
                     md5(range::VARCHAR) AS c_str,
                     range / ((hash(range) >> 1)::DOUBLE + 1) * 1e7 AS c_float
              FROM range({int(rows)}))
        TO '{local}' (FORMAT parquet)""")  # noqa: S608 - our own scratch path and an int
    from ..fs import CryptdiskFileSystem

    fs = CryptdiskFileSystem(config=config, skip_instance_cache=True)
    for url in targets:
        with open(local, "rb") as fin, fs.open(url, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    answers = {case: con.execute(sql.format(url=local)).fetchall()[0][0]
               for case, sql in queries.items()}
    con.close()
    import os

    return [Sample("prepare", "bytes", float(os.path.getsize(local)), extra=answers)]


def scan(config: str, url: str, rows: int, size: float, queries: dict[str, str],
         expected: dict[str, Any]) -> list[Sample]:
    """Each query once untimed (page cache, Parquet metadata, decrypted cache), then timed."""
    con = _duckdb(config if url.startswith("cryptdisk://") else None)
    out = []
    for case, template in queries.items():
        sql = template.format(url=url)
        con.execute(sql).fetchall()
        with Stopwatch() as sw:
            result = con.execute(sql).fetchall()[0][0]
        if not _same(result, expected[case]):
            raise AssertionError(f"{case} on {url} returned {result}, expected {expected[case]}")
        out.append(sw.seconds(f"{case} rows={rows}", size, rows=rows))
    con.close()
    return out


# -- olap_db: cryptdisk's embedded database, plain table vs encrypted table ----------------


def db_prepare(path: str, tables: dict[str, str], schema: str) -> list[Sample]:
    """Create the database and one table per strategy (strategy -> storage policy)."""
    from ..db import connect

    with connect(path) as db:
        for table, policy in tables.items():
            db.sql(f"CREATE TABLE {table} {schema} SETTINGS storage_policy = '{policy}'")
    return []


def db_insert(path: str, table: str, sql: str, rows: int) -> list[Sample]:
    """Empty ``table`` (untimed), then insert ``rows`` rows (timed); work = bytes stored."""
    from ..db import connect

    with connect(path) as db:
        db.sql(f"TRUNCATE TABLE {table}")
        with Stopwatch() as sw:
            db.sql(f"INSERT INTO {table} " + sql)
        stored = db.query(
            f"SELECT sum(bytes) FROM system.parts WHERE \"table\" = '{table}'"  # noqa: S608 - constant table names
        )[0][0]
        (count,) = db.query(f"SELECT count(*) FROM {table}")[0]  # noqa: S608
    if count != rows:
        raise AssertionError(f"{table} holds {count} rows after inserting {rows}")
    return [sw.seconds("insert", int(stored), rows=rows)]


def db_queries(path: str, table: str, queries: dict[str, str], warm: int,
               stored: float | None) -> list[Sample]:
    """Each query cold (a fresh open: nothing decrypted yet) and ``warm`` times warm,
    with all of DuckDB's threads and with one; the decrypted cache's peak and bound
    go in the samples' ``extra``."""
    from ..db import connect

    out: list[Sample] = []
    answers: dict[str, Any] = {}
    for qname, template in queries.items():
        sql = template.format(table=table)
        for threads in ("all", "1"):
            # DuckDB's threads only; cryptdisk's decryption helper thread runs either way
            with connect(path, read_only=True, threads=None if threads == "all" else 1) as db:
                times = []
                for _ in range(1 + warm):
                    with Stopwatch() as sw:
                        (row,) = db.query(sql)
                    times.append(sw)
                    got = answers.setdefault(qname, row[0])
                    if not _same(row[0], got):
                        raise AssertionError(f"{qname} on {table}: {row[0]}, then {got}")
                cache: dict[str, Any] = {"cache_bound_bytes": db.cache.bound,
                                         "cache_peak_bytes": db.cache.peak}
            out.append(times[0].seconds(f"{qname} cold threads={threads}", stored, **cache))
            out += [sw.seconds(f"{qname} warm threads={threads}", stored, **cache)
                    for sw in times[1:]]
    return out
