"""``SELECT count(DISTINCT col) FROM t``: counted by the scan threads, not DuckDB.

DuckDB's ungrouped ``count(DISTINCT)`` over a text column copies each value into its
aggregate hash table, partitions it and merges the partitions' tables: over 10M
distinct 32-character strings about 2.7 s of CPU, nearly all of the query. For the
statement alone (one ``count(DISTINCT col)`` of a VARCHAR or BLOB column of one table,
no WHERE, GROUP BY or anything else: :func:`count_distinct_item`), cryptdisk counts
instead: the scan's batches go to an exact set in C (``cryptdisk.db._csort.Distinct``)
on ``threads`` threads at once, without the GIL. Each value is hashed (a keyed 64-bit
hash), placed in one of 256 partitions by the hash, each a table of 8-byte slots under
its own lock, and copied into the partition's arena if no equal value is there; values
whose hashes are equal are compared byte by byte, so the count is exact. The tables are
sized at once for the table's rows (its catalog's count, at least the distinct values),
so they do not double and hash every value again as they fill; at most a quarter of
``memory_limit`` goes to them so (more values than that grow them as they come), and a
set that reaches its limit shrinks the tables holding fewer values than they were sized
for to the sizes doubling would have given them (the bytes go to the values' copies), so
a count that fits with tables doubled fits sized from the rows too. It equals
DuckDB's: NULLs are not counted, text is compared byte by byte (only while no
``default_collation`` is set; otherwise DuckDB counts), and an empty table counts 0.

The set's tables and copies count against ``memory_limit`` (DuckDB's setting, as
DuckDB's own hash table would): a count that would pass it fails with the error of
any query that needs more memory than ``memory_limit``; nothing is written to disk.
"""

from __future__ import annotations

import array
import importlib
import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import duckdb
import pyarrow as pa

from ..errors import DatabaseError
from ._memory import out_of_memory
from ._names import fold
from ._pushdown import _identifier, bare_select_of, column_argument

__all__ = ["DistinctCount", "count_distinct_item", "memory_limit_bytes"]

try:  # the C set (csrc/cryptdisk_db/csort.c), which has no type stubs (Any)
    _csort: Any = importlib.import_module(f"{__package__}._csort")
    _SET: Any = getattr(_csort, "Distinct", None)
except ImportError:  # pragma: no cover - not built (setup.py says why): DuckDB counts
    _SET = None

_UNITS = {"bytes": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")


def memory_limit_bytes(con: Any) -> int | None:
    """DuckDB's ``memory_limit`` of connection ``con`` in bytes, as DuckDB reports it (to a
    tenth of its unit: ``2GB`` reads as 1.8 GiB), or None if not read."""
    try:
        rows = con.execute("SELECT current_setting('memory_limit')").fetchall()
    except duckdb.Error:
        return None
    m = _SIZE.fullmatch(str(rows[0][0])) if rows else None
    unit = _UNITS.get((m.group(2) or "bytes").lower()) if m else None
    if m is None or unit is None:
        return None
    return int(float(m.group(1)) * unit)


def count_distinct_item(tree: dict[str, Any] | None, table: str, schema: pa.Schema
                        ) -> tuple[str, str] | None:
    """``(column, result name)`` if the statement is ``SELECT count(DISTINCT col) [AS a]
    FROM table`` and nothing else, with ``col`` a string or binary column, or None.

    Nothing else: one statement, one SELECT of the table alone (no schema, sample, time
    travel or column aliases), no WHERE, GROUP BY, HAVING, QUALIFY, modifier (ORDER BY,
    LIMIT, DISTINCT) or CTE, and one item: ``count`` with DISTINCT and one argument, a
    column of the table (qualified by the table's alias, or its name when it has none),
    without FILTER or ORDER BY. The name is DuckDB's: the alias, else ``count(DISTINCT
    <column as written>)`` (None where its quoting is not certain, see
    :func:`._pushdown._identifier`)."""
    node = bare_select_of(tree, table, 0)
    if node is None:
        return None
    src = node["from_table"]
    items = node.get("select_list") or []
    if len(items) != 1 or not isinstance(items[0], dict):
        return None
    item = items[0]
    qualifier = fold(str(src.get("alias") or src.get("table_name") or ""))
    parts = column_argument(item, qualifier)
    if parts is None or item.get("function_name") != "count" or item.get("distinct") is not True:
        return None
    fields = {fold(f.name): f for f in schema}
    field = fields.get(fold(parts[-1]))
    if field is None or not (pa.types.is_string(field.type) or pa.types.is_binary(field.type)
                             or pa.types.is_large_string(field.type)
                             or pa.types.is_large_binary(field.type)):
        return None
    alias = item.get("alias")
    if isinstance(alias, str) and alias:
        return field.name, alias
    written = [_identifier(n) for n in parts]
    if None in written:
        return None
    return field.name, f"count(DISTINCT {'.'.join(written)})"  # type: ignore[arg-type]


def _add(seen: Any, arr: pa.Array) -> bool:
    """Add ``arr``'s values to ``seen``; False if the set is full (``memory_limit``)."""
    if isinstance(arr, pa.DictionaryArray):
        arr = arr.dictionary_decode()
    typ = arr.type
    wide = pa.types.is_large_string(typ) or pa.types.is_large_binary(typ)
    if not (wide or pa.types.is_string(typ) or pa.types.is_binary(typ)):
        arr = arr.cast(pa.large_binary())  # (string_view, fixed-size binary...)
        wide = True
    if not len(arr):
        return True
    validity, offsets, data = arr.buffers()[:3]
    if arr.null_count == 0:
        validity = None
    return bool(seen.add(offsets, data if data is not None else b"", validity,
                         arr.offset, len(arr), wide))


class DistinctCount:
    """A prepared ``count(DISTINCT col)`` (see the module): :meth:`run` counts ``col``
    over ``scan`` (a :class:`._scan.TableScan` of that column alone) on ``threads``
    threads, within ``limit`` bytes, and returns DuckDB's answer as a one-row table.
    ``rows``, the table's rows by its catalog (at least the values to count), sizes the
    set's tables at once instead of doubling them (see the module)."""

    def __init__(self, scan: Any, column: str, name: str, threads: int, limit: int,
                 rows: int = 0) -> None:
        self.scan, self.column, self.name = scan, column, name
        self.threads, self.limit, self.rows = max(1, threads), limit, max(0, rows)
        self._stopped = threading.Event()

    def stop(self) -> None:
        """Interrupt :meth:`run` (from any thread): it raises DuckDB's interrupt error
        before its next array."""
        self._stopped.set()

    @staticmethod
    def available() -> bool:
        """Whether the C set is built (else DuckDB counts)."""
        return _SET is not None

    def run(self) -> pa.Table:
        seen = _SET(self.limit, int.from_bytes(os.urandom(8), "little"), self.rows)
        warm = self.scan.cached_table()  # every row group cached: no stream
        if warm is not None:
            arrays: Any = iter(warm.column(self.column).chunks)
        else:  # decoded on the scan's pool, handed over in table order
            arrays = (batch.column(0) for batch in self.scan.batches())
        full = False
        # a pool for this statement alone (no thread outlives it: a fork meanwhile is the
        # caller's as with any running query); at most 2 arrays a thread wait for it
        with ThreadPoolExecutor(self.threads, thread_name_prefix="cryptdisk-distinct") as pool:
            pending: list[Future[bool]] = []
            try:
                for arr in arrays:
                    if self._stopped.is_set():
                        raise DatabaseError("INTERRUPT Error: Interrupted!")
                    pending.append(pool.submit(_add, seen, arr))
                    if len(pending) >= 2 * self.threads:
                        done, pending = pending[0], pending[1:]
                        if not done.result():
                            full = True
                            break
                for fut in pending:
                    full = not fut.result() or full
                if self._stopped.is_set():
                    raise DatabaseError("INTERRUPT Error: Interrupted!")
            finally:
                for fut in pending:
                    fut.cancel()
        if full:
            raise out_of_memory("the query", DatabaseError(
                f"count(DISTINCT {self.column}) holds {seen.nbytes():,} bytes of distinct "
                f"values at memory_limit ({self.limit:,} bytes)"),
                "raise memory_limit (SET memory_limit = '8GB') or query fewer rows")
        count = pa.Array.from_buffers(pa.int64(), 1, [  # (pa.array imports pandas)
            None, pa.py_buffer(array.array("q", [int(seen.count())]))])
        return pa.Table.from_arrays([count], names=[self.name])
