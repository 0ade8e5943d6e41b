"""The OLAP data set, generated once as Parquet and loaded into every engine.

Row ``n`` (0 <= n < N), as in the ClickHouse experiment but with a hash every
engine can reproduce: ``h(n)`` is SplitMix64's finaliser (a documented 64-bit
mix, computed with numpy's wrapping uint64 arithmetic) instead of cityHash64:

- ``c_int Int64 = h(n)`` reinterpreted as signed,
- ``c_str String = lower hex md5 of the decimal text of n`` (DuckDB's ``md5``),
- ``c_float Float64 = n / h(n) * 1e7`` (h as unsigned, as ClickHouse divides by UInt64).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["generate", "splitmix64"]


def splitmix64(n: Any) -> Any:
    """SplitMix64's output function of ``n`` (a numpy uint64 array), wrapping."""
    import numpy as np

    z = n.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def generate(path: Path, rows: int, chunk: int = 1_000_000) -> Path:
    """Write ``rows`` rows to ``path`` (Parquet, one row group per ``chunk`` rows)."""
    import duckdb
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("c_int", pa.int64()), ("c_str", pa.string()), ("c_float", pa.float64())])
    con = duckdb.connect()
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, chunk):
            stop = min(rows, start + chunk)
            n = np.arange(start, stop, dtype=np.uint64)
            h = splitmix64(n)
            sql = f"SELECT md5(CAST(range AS VARCHAR)) AS s FROM range({start}, {stop})"  # noqa: S608
            c_str = con.sql(sql + " ORDER BY range").to_arrow_table().column("s")
            with np.errstate(divide="ignore"):
                c_float = n.astype(np.float64) / h.astype(np.float64) * 1e7
            batch = pa.table({"c_int": h.view(np.int64), "c_str": c_str, "c_float": c_float},
                             schema=schema)
            writer.write_table(batch)
    con.close()
    return path
