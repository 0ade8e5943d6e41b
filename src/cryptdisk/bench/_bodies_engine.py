"""Worker bodies of ``olap-engine``: one engine per call, in a fresh process.

``load`` loads the shared Parquet file into one engine's store (timed);
``shape`` opens that store in a new process and runs one query shape: the
first execution is *cold* (fresh process, store just opened; the OS page cache
may hold the files), then the median of ``warm`` repeats is *warm*. Engines:
``cryptdisk encrypted`` / ``cryptdisk plain`` (tables of one cryptdisk
database on the default and the plain policy, ``ORDER BY c_int``, merged to
one part after the timed insert), ``duckdb
file`` (DuckDB's own database file, rows sorted by c_int), ``chdb plain`` and
``chdb AES_256_CTR`` (ClickHouse MergeTree ``ORDER BY c_int``, plain or on an
encrypted disk, merged to one part). ``cryptdisk encrypted, cache off`` runs
the shapes on the encrypted table with ``cache_bytes=0`` (no load of its own):
its peak RSS is the engine's without the decoded-column cache.
"""

from __future__ import annotations

import hashlib
import os
import statistics
from pathlib import Path
from typing import Any

from ._measure import Sample, Stopwatch

__all__ = ["CACHE_OFF", "ENGINES", "load", "shape", "shapes", "store_files"]

ENGINES = ["cryptdisk encrypted", "cryptdisk plain", "duckdb file", "chdb plain",
           "chdb AES_256_CTR"]
#: A shape-only strategy: the encrypted table of ``cryptdisk encrypted`` read with
#: ``cache_bytes=0``, so its peak RSS is the engine's without the decoded-column cache.
CACHE_OFF = "cryptdisk encrypted, cache off"
_M64 = 2**64
_CHDB_XML = """<clickhouse><storage_configuration><disks>
<raw><type>local</type><path>{raw}/</path></raw>
<enc><type>encrypted</type><disk>raw</disk><path>enc/</path><algorithm>AES_256_CTR</algorithm>
<key_hex id="0">{key}</key_hex><current_key_id>0</current_key_id></enc>
</disks><policies><encrypted><volumes><v><disk>enc</disk></v></volumes></encrypted></policies>
</storage_configuration></clickhouse>
"""


def _key(n: int) -> int:
    """The c_int of row ``n`` (see :mod:`._olap_data`)."""
    import numpy as np

    from ._olap_data import splitmix64

    return int(splitmix64(np.array([n], dtype=np.uint64)).view(np.int64)[0])


def shapes(rows: int) -> dict[str, str]:
    """Query shape -> SQL over table ``{t}``; the point and range keys exist in ``rows`` rows."""
    point = _key(min(12345, rows - 1))
    hi = point + _M64 // 1000  # 0.1% of the key range
    return {
        "avg(c_float)": "SELECT avg(c_float) FROM {t}",
        "sum(c_int)": "SELECT sum(c_int) FROM {t}",
        "point c_int = X": f"SELECT c_int, c_str, c_float FROM {{t}} WHERE c_int = {point}",  # noqa: S608
        "range 0.1% of c_int": "SELECT count(*), sum(c_float) FROM {t} "  # noqa: S608
                               f"WHERE c_int BETWEEN {point} AND {min(hi, 2**63 - 1)}",
        "GROUP BY substr(c_str,1,2)": "SELECT substr(c_str, 1, 2) AS p, count(*) AS n FROM {t} "
                                      "GROUP BY p ORDER BY p",
        "top-10 by c_float": "SELECT c_int, c_str, c_float FROM {t} "
                             "ORDER BY c_float DESC, c_int LIMIT 10",
        "count(DISTINCT c_str)": "SELECT count(DISTINCT c_str) FROM {t}",
        "min/max(c_int)": "SELECT min(c_int), max(c_int) FROM {t}",
        "count(*)": "SELECT count(*) FROM {t}",
        "LIMIT 10": "SELECT c_int, c_str, c_float FROM {t} ORDER BY c_int LIMIT 10",
    }


def _chdb(work: Path, encrypted: bool) -> Any:
    from chdb import session

    name = "chdb-enc" if encrypted else "chdb"
    path = f"{work / name}/db"
    if encrypted:
        path += f"?config-file={work / name / 'config.xml'}"
    return session.Session(path)  # type: ignore[no-untyped-call]


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def load(engine: str, work: str, data: str, rows: int) -> list[Sample]:
    """Load ``data`` (Parquet) into ``engine``'s store under ``work``; the load is timed."""
    w = Path(work)
    if engine.startswith("cryptdisk"):
        from ..db import connect

        table = "t_enc" if engine.endswith("encrypted") else "t_plain"
        policy = "default" if engine.endswith("encrypted") else "plain"
        with connect(str(w / "cd")) as db:
            db.sql(f"CREATE TABLE {table} (c_int BIGINT, c_str VARCHAR, c_float DOUBLE) "
                   f"ORDER BY c_int SETTINGS storage_policy = {_lit(policy)}")
            with Stopwatch() as sw:
                db.insert(table, data)
            db.optimize(table)  # one part per block of unsorted input merged, untimed as chdb's
            count = db.query(f"SELECT count(*) FROM {table}")[0][0]  # noqa: S608
    elif engine == "duckdb file":
        import duckdb

        con = duckdb.connect(str(w / "duck.db"))
        with Stopwatch() as sw:
            con.execute("CREATE TABLE t AS SELECT * FROM "  # noqa: S608
                        f"read_parquet({_lit(data)}) ORDER BY c_int")
            con.execute("CHECKPOINT")
        count = con.execute("SELECT count(*) FROM t").fetchone()[0]  # type: ignore[index]
        con.close()
    else:
        encrypted = engine != "chdb plain"
        name = "chdb-enc" if encrypted else "chdb"
        (w / name / "raw").mkdir(parents=True, exist_ok=True)
        if encrypted:
            (w / name / "config.xml").write_text(_CHDB_XML.format(
                raw=w / name / "raw", key=os.urandom(32).hex()))
        s = _chdb(w, encrypted)
        policy = " SETTINGS storage_policy = 'encrypted'" if encrypted else ""
        s.query("CREATE TABLE t (c_int Int64, c_str String, c_float Float64) "
                f"ENGINE = MergeTree ORDER BY c_int{policy}")
        with Stopwatch() as sw:
            s.query(f"INSERT INTO t SELECT * FROM file({_lit(data)}, Parquet)")  # noqa: S608
        s.query("OPTIMIZE TABLE t FINAL")  # one part, untimed
        count = int(s.query("SELECT count() FROM t", "CSV").bytes().decode())
        s.close()
    if count != rows:
        raise AssertionError(f"{engine} loaded {count} rows, expected {rows}")
    return [sw.seconds("load the Parquet file", rows * 48, rows=rows)]


def _normal(rows: list[tuple[Any, ...]]) -> str:
    """A digest of an answer that engines agree on (floats rounded to 9 digits)."""
    import decimal

    def cell(v: Any) -> str:
        if isinstance(v, decimal.Decimal) and v == v.to_integral_value():
            return str(int(v))  # HUGEINT: Arrow's decimal, DuckDB's Python int
        if isinstance(v, float | decimal.Decimal):
            return f"{float(v):.9g}"
        return str(v)
    text = "\n".join(",".join(cell(v) for v in r) for r in rows)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _runner(engine: str, work: Path) -> tuple[Any, Any]:
    """``(run(sql) -> rows, close)`` for ``engine``'s store, opened now."""
    if engine.startswith("cryptdisk"):
        from ..db import connect

        options: dict[str, Any] = {"cache_bytes": 0} if engine == CACHE_OFF else {}
        db = connect(str(work / "cd"), read_only=True, **options)
        table = "t_plain" if engine == "cryptdisk plain" else "t_enc"
        return (lambda sql: db.query(sql.format(t=table))), db.close
    if engine == "duckdb file":
        import duckdb

        con = duckdb.connect(str(work / "duck.db"), read_only=True)
        return (lambda sql: con.execute(sql.format(t="t")).fetchall()), con.close
    import csv
    import io

    s = _chdb(work, engine != "chdb plain")

    def run_chdb(sql: str) -> list[tuple[Any, ...]]:
        sql = sql.replace("count(DISTINCT c_str)", "uniqExact(c_str)").format(t="t")
        text = s.query(sql, "CSV").bytes().decode()
        return [tuple(_num(v) for v in r) for r in csv.reader(io.StringIO(text))]
    return run_chdb, s.close


def _num(v: str) -> Any:
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def store_files(engine: str, work: Path) -> list[Path]:
    """The directories and files of ``engine``'s store under ``work``."""
    if engine.startswith("cryptdisk"):
        return [work / "cd", work / "cd.key"]
    if engine == "duckdb file":
        return [work / "duck.db", work / "duck.db.wal"]
    return [work / ("chdb" if engine == "chdb plain" else "chdb-enc")]


def shape(engine: str, work: str, name: str, rows: int, warm: int,
          drop_cache: bool = False) -> list[Sample]:
    """Open ``engine``'s store, run shape ``name`` once (cold), then ``warm`` times.

    ``drop_cache``: first evict the store's files from the OS page cache, so the cold
    run reads from disk. Either way the share of the store's bytes the page cache held
    just before the store opened is recorded (``page_cache``, 0..1).
    """
    from ._pagecache import drop, resident

    sql = shapes(rows)[name]
    store = store_files(engine, Path(work))
    if drop_cache:
        drop(store)
    held = resident(store)
    run, close = _runner(engine, Path(work))
    try:
        with Stopwatch() as cold:
            first = run(sql)
        times = []
        for _ in range(warm):
            with Stopwatch() as sw:
                run(sql)
            times.append(sw)
    finally:
        close()
    answer = _normal(first)
    mid = sorted(times, key=lambda s: s.wall)[len(times) // 2]
    extra: dict[str, Any] = {"answer": answer, "warm_runs": warm}
    if held is not None:
        extra["page_cache"] = round(held, 3)
    return [cold.seconds(f"{name} cold", **extra),
            Sample(f"{name} warm", "s", statistics.median(s.wall for s in times), mid.cpu,
                   None, "bytes", "lower", extra)]
