"""``read_table``: a Dask partition per part, per run of small parts, or per few row groups.

Every process (the client and each worker) keeps a read-only connection per
``(database, config)`` (:func:`_process_database`, the :data:`OPEN_DATABASES`
most recently used): the keys are loaded and the catalog read once per process,
and a part's footer is decrypted once per process, not once per read or per
task; a kept connection that fails is replaced by a new one, once (a database
replaced at the same path, keys rotated). On the client one catalog version plans
the read (parts outside the filters' key range and row groups whose statistics
rule every row out are left out); a later ``read_table`` only checks that the
catalog is unchanged. A partition is one part, a run of row groups of a large
part, or several small parts. Each task carries ``(database path, config path,
table, [(part id, row groups)], columns, filters)``, no key and no connection;
the worker reads those parts with :meth:`Database.read_part` on its own
connection.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

from ..db import Database, connect, location
from ..errors import CatalogError, ConfigError, CryptdiskError, DatabaseError

__all__ = ["read_table"]

#: Row groups (64Ki rows each) per partition before a part is split into several.
ROW_GROUPS_PER_PARTITION = 16
#: Rows of a partition below which the next small part joins it (4 row groups): each
#: task costs the scheduler and the worker's event loop a few milliseconds of CPU,
#: about what a worker takes to read 20k rows.
MIN_PARTITION_ROWS = 4 * 65536
#: Rows per row group of a part (the last one of a part may hold fewer).
_GROUP_ROWS = 65536

#: Read-only connections a process keeps (the least recently used one beyond is closed
#: once no task reads it): each holds DuckDB's threads, a few MB, and up to 64 open parts.
OPEN_DATABASES = 8


class _Kept:
    """One kept connection: the pid that opened it, and the tasks using it right now."""

    __slots__ = ("db", "dropped", "pid", "users")

    def __init__(self, db: Database) -> None:
        self.db, self.pid, self.users, self.dropped = db, os.getpid(), 0, False


#: (database path or URL, config path, storage options as JSON) -> its kept connection,
#: least recently used first
_OPEN: collections.OrderedDict[tuple[str, str | None, str], _Kept] = \
    collections.OrderedDict()
_OPEN_LOCK = threading.Lock()


def _forget_open() -> None:
    """In a forked child: the parent's connections are not this process's (DuckDB's must
    not cross a fork, nor be closed here: db/_forksafe.py keeps them); a new lock."""
    global _OPEN_LOCK
    _OPEN.clear()
    _OPEN_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_open)


def _dask_dataframe() -> Any:
    try:
        import dask.dataframe as dd
    except ImportError as exc:
        raise CryptdiskError(f"cryptdisk.dask needs Dask's dataframe ({exc})",
                             hint="pip install 'cryptdisk[dask]'") from None
    return dd


def _config_path(config: Any) -> str | None:
    if config is None:
        return None
    if not isinstance(config, str | os.PathLike):
        raise ConfigError(f"config must be a path to a cryptdisk TOML config, not "
                          f"{type(config).__name__}: a config object holds keys, and Dask "
                          "tasks carry the path so that each worker loads the keys itself")
    return os.path.abspath(os.fspath(config))


def _drop(kept: _Kept) -> list[Database]:
    """Mark ``kept`` as no longer kept (under ``_OPEN_LOCK``); returns it to close if no
    task uses it, else its last user closes it."""
    kept.dropped = True
    return [kept.db] if kept.users == 0 and kept.pid == os.getpid() else []


def _on_worker(exc: CryptdiskError) -> CryptdiskError:
    """``exc`` (raised opening a database) with the Dask worker that raised it in front
    of its message, when this process is one: the client, which loaded the keys to plan,
    would otherwise show a worker's missing key variable or file as its own. Same class
    and attributes; unchanged outside a worker."""
    try:
        from distributed import get_worker

        address = get_worker().address
    except (ImportError, ValueError):  # not a worker: the client planning, or no Dask
        return exc
    if len(exc.args) != 1 or not isinstance(exc.args[0], str):
        return exc  # not one message to prefix (pickled back to the client by its args)
    out = type(exc).__new__(type(exc))
    out.__dict__.update(getattr(exc, "__dict__", {}))
    out.args = (f"on Dask worker {address} (pid {os.getpid()}): {exc}",)
    out.hint = ((exc.hint + "; ") if exc.hint else "") + (
        "each worker opens the database and loads its keys itself: it needs the config, "
        "the key files and the environment variables (a key, a PIN) that the config names, "
        "as the client has them")
    return out


@contextlib.contextmanager
def _process_database(db_path: str, config: str | None, *, fresh: bool = False,
                      storage_options: dict[str, Any] | None = None
                      ) -> Iterator[tuple[Database, bool]]:
    """This process's read-only connection to ``db_path`` (opened once, keys loaded here),
    and whether this call opened it, for the ``with`` block.

    At most :data:`OPEN_DATABASES` stay open between calls; the least recently used one
    beyond is closed when its last user leaves. ``fresh``: stop keeping the connection
    (closed when its users leave) and open a new one. A child forked after the parent
    opened one opens its own. ``storage_options``: those of a database at a URL (never
    credentials).
    """
    key = (db_path, config, json.dumps(storage_options, sort_keys=True))
    to_close: list[Database] = []
    opened = False
    with _OPEN_LOCK:
        kept = _OPEN.get(key)
        if kept is not None and (kept.pid != os.getpid() or fresh):
            del _OPEN[key]  # the parent's (never used here), or replaced by a new one
            to_close += _drop(kept)
            kept = None
        if kept is None:
            try:
                db = connect(db_path, config, read_only=True, cache_bytes=0,
                             **({"storage_options": storage_options} if storage_options
                                else {}))
            except CryptdiskError as exc:
                raise _on_worker(exc) from None
            kept = _OPEN[key] = _Kept(db)
            opened = True
        _OPEN.move_to_end(key)
        kept.users += 1
        while len(_OPEN) > OPEN_DATABASES:
            to_close += _drop(_OPEN.popitem(last=False)[1])
    for db in to_close:
        db.close()
    try:
        yield kept.db, opened
    finally:
        with _OPEN_LOCK:
            kept.users -= 1
            last = kept.dropped and kept.users == 0 and kept.pid == os.getpid()
        if last:
            kept.db.close()


def _reopen_may_help(exc: CryptdiskError) -> bool:
    """Whether a new connection may succeed where a kept one failed: not for the caller's
    table, columns or filters (a new connection says the same), but for a database
    replaced or re-keyed since the connection loaded its keys and catalog."""
    return not isinstance(exc, ConfigError) and not (
        isinstance(exc, DatabaseError) and not isinstance(exc, CatalogError))


def _plan(path: str, config: str | None, table: str, columns: list[str] | None,
          filters: list[Any], types: tuple[bool, str | None],
          storage_options: dict[str, Any] | None
          ) -> tuple[str, list[str], list[tuple[str, list[int], int]], Any]:
    """(table name, columns, ``[(part, row groups, rows of the part)]``, empty pandas
    frame), on this process's connection.

    The connection is kept for the next read (the catalog is reloaded only when a
    writer has published a new one); a connection that fails (say, a database
    replaced at the same path) is replaced by a new one, once.
    """
    for attempt in (0, 1):
        with _process_database(path, config, fresh=attempt > 0,
                               storage_options=storage_options) as (db, opened):
            try:
                plan = db.scan_plan(table, filters)  # reloads a newer catalog first
                meta = db.table(table)
                cols = meta.pick_columns(columns, "read_table")
                empty = _to_pandas(db.arrow_schema(meta).empty_table().select(cols), types)
                rows = {p.id: p.rows for p in meta.parts}
                return meta.name, cols, [(p, g, rows.get(p, 0)) for p, g in plan], empty
            except CryptdiskError as exc:
                if opened or not _reopen_may_help(exc):
                    raise
    raise AssertionError("unreachable")


def _conjunction(filters: Any) -> list[Any]:
    """``[(column, op, value), ...]``; Dask's and pyarrow's OR-of-ANDs form (a list of
    lists) with one AND-ed list (``[[...]]``) is the same; with several it is refused."""
    items = list(filters or [])
    groups = [f for f in items if isinstance(f, list) and f
              and all(isinstance(g, tuple | list) for g in f)]
    if not groups:
        return items
    if len(items) == 1:
        return list(groups[0])
    raise DatabaseError(
        f"filters: {len(items)} OR-ed lists of filters; read_table takes one AND-ed list, "
        "[(column, op, value), ...]",
        hint="read with the filters all the groups share, then select the rows of each "
        "group with df[...] (or one read_table per group, if the groups cannot overlap)")


#: ``dtype_backend`` values, as ``dd.read_parquet`` takes them (None: NumPy dtypes).
DTYPE_BACKENDS = (None, "numpy_nullable", "pyarrow")


def _types_mapper(arrow_strings: bool, dtype_backend: str | None) -> Any:
    """The ``types_mapper`` of Arrow's ``to_pandas`` for a partition and for the meta.

    Strings come as pandas' ``string[pyarrow]`` with ``arrow_strings``: the dtype Dask
    gives string columns (``dataframe.convert-string``); with pandas' default ``str``
    dtype Dask would add a task converting every partition. ``numpy_nullable``: integer,
    boolean and floating columns as pandas' nullable dtypes (``Int64``, ``boolean``,
    ``Float64``), so a partition with a NULL keeps the meta's dtype (NumPy's ``int64``
    becomes ``float64`` there, its ``bool`` ``object``); ``pyarrow``: every column as
    ``pd.ArrowDtype``.
    """
    import pandas as pd
    import pyarrow as pa

    if dtype_backend == "pyarrow":
        return pd.ArrowDtype
    mapping: dict[Any, Any] = {}
    if arrow_strings or dtype_backend == "numpy_nullable":
        string = pd.StringDtype("pyarrow") if arrow_strings else pd.StringDtype()
        mapping.update({pa.string(): string, pa.large_string(): string,
                        pa.string_view(): string})
    if dtype_backend == "numpy_nullable":
        mapping.update({pa.bool_(): pd.BooleanDtype(), pa.float32(): pd.Float32Dtype(),
                        pa.float64(): pd.Float64Dtype()})
        for bits in (8, 16, 32, 64):
            mapping[getattr(pa, f"int{bits}")()] = pd.api.types.pandas_dtype(f"Int{bits}")
            mapping[getattr(pa, f"uint{bits}")()] = pd.api.types.pandas_dtype(f"UInt{bits}")
    return mapping.get if mapping else None


def _to_pandas(table: Any, types: tuple[bool, str | None]) -> Any:
    return table.to_pandas(types_mapper=_types_mapper(*types))


def _partitions(plan: list[tuple[str, list[int], int]], per_partition: int,
                min_rows: int) -> list[list[tuple[str, list[int]]]]:
    """The plan's ``(part, row groups)`` pieces, grouped into partitions.

    A part with more than ``per_partition`` row groups to read is split into pieces of
    ``per_partition``; consecutive pieces smaller than ``min_rows`` share a partition
    while it holds fewer than ``min_rows`` rows (estimated from the row groups read;
    ``min_rows`` is capped at ``per_partition`` row groups).
    """
    min_rows = min(min_rows, per_partition * _GROUP_ROWS)  # never more than a split's rows
    out: list[list[tuple[str, list[int]]]] = []
    open_rows = 0  # rows in out[-1] if it may take more pieces, else min_rows
    for part, groups, rows in plan:
        for i in range(0, len(groups), per_partition):
            chunk = groups[i:i + per_partition]
            est = min(len(chunk) * _GROUP_ROWS, rows) if rows else len(chunk) * _GROUP_ROWS
            if out and est < min_rows and open_rows + est <= min_rows:
                out[-1].append((part, chunk))
                open_rows += est
            else:
                out.append([(part, chunk)])
                open_rows = est if est < min_rows else min_rows
    return out


def _read_partition(spec: tuple[Any, ...]) -> Any:
    db_path, config, table, pieces, columns, filters, types, options = spec
    for attempt in (0, 1):
        with _process_database(db_path, config, fresh=attempt > 0,
                               storage_options=options) as (db, opened):
            try:
                tables = [db.read_part(table, part, columns, filters, groups)
                          for part, groups in pieces]
                break
            except CryptdiskError as exc:
                # A kept connection predates a database replaced at the same path or
                # keys rotated since: a new one loads the keys and catalog of now.
                if opened or not _reopen_may_help(exc):
                    raise
    import pyarrow as pa

    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    del tables
    out = _to_pandas(table, types)
    del table
    _release_arrow_memory()
    return out


def _release_arrow_memory() -> None:
    """Give the memory Arrow's pool freed back to the system (under 1 ms).

    Arrow's allocator keeps what a partition's read freed (about 130 MB after a few
    partitions of 1M rows), which Dask counts as the worker's unmanaged memory: a
    worker whose memory limit is a few times a partition pauses at 80% and, unable
    to spill it, never resumes (a cluster of 600 MB workers hung on a 1.7 GB table).
    """
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def read_table(db_path: str | os.PathLike[str], table: str, columns: list[str] | None = None,
               filters: list[tuple[str, str, Any]] | None = None, config: Any = None, *,
               row_groups_per_partition: int = ROW_GROUPS_PER_PARTITION,
               min_partition_rows: int = MIN_PARTITION_ROWS,
               storage_options: dict[str, Any] | None = None,
               dtype_backend: str | None = None) -> Any:
    """Table ``table`` of the database at ``db_path`` as a Dask DataFrame.

    One partition per part that can hold matching rows; a part with more than
    ``row_groups_per_partition`` such row groups (64Ki rows each) is split, and
    parts with fewer than ``min_partition_rows`` rows to read share partitions of up
    to that many rows (0: one part per partition).
    ``columns`` default to all; ``filters`` is ``[(column, op, value), ...]``,
    AND-ed, ``op`` one of ``= == != < <= > >= in, not in``, compared as the
    embedded engine compares; filters on the table's first ``ORDER BY`` column
    leave out whole parts. ``config`` is ``None`` (the key file beside the
    database) or a config *path*: every worker must see the same paths.
    ``db_path`` may be the URL of a database on an object store (``s3://bucket/db``,
    see :func:`cryptdisk.db.publish`), with fsspec ``storage_options`` such as
    ``endpoint_url`` (never credentials: each worker takes them from its environment).
    ``dtype_backend`` is ``dd.read_parquet``'s: None (NumPy dtypes: an integer column
    with a NULL comes as ``float64`` in that partition), ``"numpy_nullable"`` or
    ``"pyarrow"``.
    """
    dd = _dask_dataframe()
    import dask
    from dask.dataframe.utils import pyarrow_strings_enabled

    # Partitions come with Dask's string dtype (``dataframe.convert-string``, on by
    # default) already, so from_map need not add a task converting each one.
    arrow_strings = bool(pyarrow_strings_enabled())
    if dtype_backend not in DTYPE_BACKENDS:
        raise DatabaseError(f"dtype_backend must be one of {DTYPE_BACKENDS}, not "
                            f"{dtype_backend!r}")
    types = (arrow_strings, dtype_backend)
    if row_groups_per_partition < 1:
        raise DatabaseError("row_groups_per_partition must be at least 1")
    if min_partition_rows < 0:
        raise DatabaseError("min_partition_rows must be 0 or more")
    path = location(db_path)
    config_path = _config_path(config)
    options = dict(storage_options) if storage_options else None
    filters = [tuple(f) for f in _conjunction(filters)]
    name, cols, plan, empty = _plan(path, config_path, table, columns, filters, types, options)
    specs = [(path, config_path, name, pieces, cols, filters, types, options)
             for pieces in _partitions(plan, row_groups_per_partition, min_partition_rows)]
    if not specs:
        return dd.from_pandas(empty, npartitions=1)
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_map(_read_partition, specs, meta=empty, label="cryptdisk-read-table",
                           enforce_metadata=False)
