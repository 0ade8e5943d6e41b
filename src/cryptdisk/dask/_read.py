"""``read_table``: one Dask partition per part (or per few row groups of a large part).

Every process (the client and each worker) keeps one read-only connection per
``(database, config)`` (:func:`_process_database`): the keys are loaded and the
catalog read once per process, and a part's footer is decrypted once per
process, not once per read or per task. On the client one catalog version plans
the read (parts outside the filters' key range and row groups whose statistics
rule every row out are left out); a later ``read_table`` only checks that the
catalog is unchanged. Each task carries ``(database path, config path, table,
part id, row groups, columns, filters)``, no key and no connection; the worker
reads that part with :meth:`Database.read_part` on its own connection.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..db import Database, connect
from ..errors import CatalogError, ConfigError, CryptdiskError, DatabaseError

__all__ = ["read_table"]

#: Row groups (64Ki rows each) per partition before a part is split into several.
ROW_GROUPS_PER_PARTITION = 16

_OPEN: dict[tuple[str, str | None], Database] = {}
_OPEN_LOCK = threading.Lock()


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


def _process_database(db_path: str, config: str | None, *, fresh: bool = False) -> Database:
    """This process's read-only connection to ``db_path`` (opened once, keys loaded here).

    ``fresh``: close the one kept (if any) and open a new one.
    """
    with _OPEN_LOCK:
        db = _OPEN.get((db_path, config))
        if db is not None and fresh:
            del _OPEN[(db_path, config)]
            db.close()
            db = None
        if db is None:
            db = connect(db_path, config, read_only=True, cache_bytes=0)
            _OPEN[(db_path, config)] = db
        return db


def _plan(path: str, config: str | None, table: str, columns: list[str] | None,
          filters: list[Any], arrow_strings: bool) -> tuple[str, list[str], Any, Any]:
    """(table name, columns, scan plan, empty pandas frame), on this process's connection.

    The connection is kept for the next read (the catalog is reloaded only when a
    writer has published a new one); a connection that fails (say, a database
    replaced at the same path) is replaced by a new one, once.
    """
    for attempt in (0, 1):
        db = _process_database(path, config, fresh=attempt > 0)
        try:
            plan = db.scan_plan(table, filters)  # reloads a newer catalog first
            meta = db.table(table)
            cols = meta.pick_columns(columns, "read_table")
            empty = _to_pandas(db.arrow_schema(meta).empty_table().select(cols), arrow_strings)
            return meta.name, cols, plan, empty
        except CryptdiskError as exc:
            # The caller's table, columns or filters: a new connection says the same.
            if attempt or isinstance(exc, ConfigError) or (
                    isinstance(exc, DatabaseError) and not isinstance(exc, CatalogError)):
                raise
    raise AssertionError("unreachable")


def _string_dtype(arrow_type: Any) -> Any:
    """pandas' ``string[pyarrow]`` for Arrow strings: the dtype Dask gives string columns
    (``dataframe.convert-string``); with pandas' default ``str`` dtype (NaN as missing
    value) Dask would add a task converting every partition."""
    import pandas as pd
    import pyarrow as pa

    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or \
            pa.types.is_string_view(arrow_type):
        return pd.StringDtype("pyarrow")
    return None


def _to_pandas(table: Any, arrow_strings: bool) -> Any:
    return table.to_pandas(types_mapper=_string_dtype if arrow_strings else None)


def _read_partition(spec: tuple[Any, ...]) -> Any:
    db_path, config, table, part, row_groups, columns, filters, arrow_strings = spec
    db = _process_database(db_path, config)
    return _to_pandas(db.read_part(table, part, columns, filters, row_groups), arrow_strings)


def read_table(db_path: str | os.PathLike[str], table: str, columns: list[str] | None = None,
               filters: list[tuple[str, str, Any]] | None = None, config: Any = None, *,
               row_groups_per_partition: int = ROW_GROUPS_PER_PARTITION) -> Any:
    """Table ``table`` of the database at ``db_path`` as a Dask DataFrame.

    One partition per part that can hold matching rows; a part with more than
    ``row_groups_per_partition`` such row groups (64Ki rows each) is split.
    ``columns`` default to all; ``filters`` is ``[(column, op, value), ...]``,
    AND-ed, ``op`` one of ``= == != < <= > >= in, not in``, compared as the
    embedded engine compares; filters on the table's first ``ORDER BY`` column
    leave out whole parts. ``config`` is ``None`` (the key file beside the
    database) or a config *path*: every worker must see the same paths.
    """
    dd = _dask_dataframe()
    import dask
    from dask.dataframe.utils import pyarrow_strings_enabled

    # Partitions come with Dask's string dtype (``dataframe.convert-string``, on by
    # default) already, so from_map need not add a task converting each one.
    arrow_strings = bool(pyarrow_strings_enabled())
    if row_groups_per_partition < 1:
        raise DatabaseError("row_groups_per_partition must be at least 1")
    path = os.path.abspath(os.fspath(db_path))
    config_path = _config_path(config)
    filters = [tuple(f) for f in filters or []]
    name, cols, plan, empty = _plan(path, config_path, table, columns, filters, arrow_strings)
    specs = []
    for part, groups in plan:
        for i in range(0, len(groups), row_groups_per_partition):
            specs.append((path, config_path, name, part,
                          groups[i:i + row_groups_per_partition], cols, filters,
                          arrow_strings))
    if not specs:
        return dd.from_pandas(empty, npartitions=1)
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_map(_read_partition, specs, meta=empty, label="cryptdisk-read-table",
                           enforce_metadata=False)
