"""``read_table``: one Dask partition per part (or per few row groups of a large part).

The client opens the database read-only once: one catalog version plans the
read (parts outside the filters' key range and row groups whose statistics rule
every row out are left out). Each task carries ``(database path, config path,
table, part id, row groups, columns, filters)``; the worker opens the database
itself (read-only, no decrypted-column cache), loading the keys from the config
or the database's key file, and reads that part with :meth:`Database.read_part`.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..db import Database, connect
from ..errors import ConfigError, CryptdiskError, DatabaseError

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


def _worker_database(db_path: str, config: str | None) -> Database:
    """This process's read-only connection to ``db_path`` (opened once, keys loaded here)."""
    with _OPEN_LOCK:
        db = _OPEN.get((db_path, config))
        if db is None:
            db = connect(db_path, config, read_only=True, cache_bytes=0)
            _OPEN[(db_path, config)] = db
        return db


def _read_partition(spec: tuple[Any, ...]) -> Any:
    db_path, config, table, part, row_groups, columns, filters = spec
    db = _worker_database(db_path, config)
    return db.read_part(table, part, columns, filters, row_groups).to_pandas()


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
    if row_groups_per_partition < 1:
        raise DatabaseError("row_groups_per_partition must be at least 1")
    path = os.path.abspath(os.fspath(db_path))
    config_path = _config_path(config)
    filters = [tuple(f) for f in filters or []]
    with connect(path, config_path, read_only=True, cache_bytes=0) as db:
        meta = db.table(table)
        cols = meta.pick_columns(columns, "read_table")
        plan = db.scan_plan(meta.name, filters)
        empty = db.arrow_schema(meta).empty_table().select(cols).to_pandas()
    specs = []
    for part, groups in plan:
        for i in range(0, len(groups), row_groups_per_partition):
            specs.append((path, config_path, meta.name, part,
                          groups[i:i + row_groups_per_partition], cols, filters))
    if not specs:
        return dd.from_pandas(empty, npartitions=1)
    return dd.from_map(_read_partition, specs, meta=empty, label="cryptdisk-read-table",
                       enforce_metadata=False)
