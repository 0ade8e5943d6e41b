"""``to_table``: workers write a DataFrame's partitions as parts; one commit publishes them.

The client opens the database for writing (its lock is held for the whole job,
so no other writer commits meanwhile) and fixes the catalog version the parts
are written for. Each task carries ``(database path, config path, table,
version, current key id)`` and its partition; the worker writes it with
:meth:`Database.stage_parts` on its own read-only connection (keys loaded on the
worker) and returns the parts' catalog entries. When every task has succeeded,
the client reads each part whole, checks it, and commits them all at once
(:meth:`Database.commit_parts`). A failed job commits nothing; the parts it
wrote are orphans that the database's next writer removes after its first commit.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from ..db import connect, location
from ..errors import CryptdiskError
from ._read import (
    _config_path,
    _dask_dataframe,
    _process_database,
    _release_arrow_memory,
    _reopen_may_help,
)

__all__ = ["to_table"]


def _stage_partition(pdf: Any, spec: tuple[Any, ...]) -> list[dict[str, Any]]:
    db_path, config, table, version, options, key_id = spec
    for attempt in (0, 1):
        with _process_database(db_path, config, fresh=attempt > 0,
                               storage_options=options) as (db, opened):
            if not opened and db.keyring.current_key_id != key_id:
                continue  # kept from before a rotation: its current key is not the caller's
            try:
                staged = db.stage_parts(table, pdf, version)
                break
            except CryptdiskError as exc:
                # Kept from before the database was replaced or its keys rotated.
                if opened or not _reopen_may_help(exc):
                    raise
    _release_arrow_memory()
    return staged


def to_table(df: Any, db_path: str | os.PathLike[str], table: str, config: Any = None, *,
             storage_options: dict[str, Any] | None = None) -> int:
    """Insert the rows of Dask DataFrame ``df`` into ``table``; returns the row count.

    Columns match by name (table columns ``df`` lacks get NULL). Workers write the
    parts in parallel; nothing is visible until all are written and verified, then
    one catalog commit publishes them. ``config`` is ``None`` or a config path, as
    for :func:`read_table`; the calling process holds the database's write lock. At an
    ``s3://`` URL (with ``storage_options`` as for :func:`read_table`) there is no lock:
    the commit is conditional on the catalog the job started from, so of two jobs
    committing at once one gets :class:`~cryptdisk.errors.PublishConflictError` and
    publishes nothing.
    """
    _dask_dataframe()
    dask: Any = importlib.import_module("dask")

    path = location(db_path)
    config_path = _config_path(config)
    options = dict(storage_options) if storage_options else None
    with connect(path, config_path,
                 **({"storage_options": options} if options else {})) as db:
        meta = db.table(table)
        # The current key's id (not the key): a worker whose kept connection has
        # another current key opens a new one, so parts are sealed under this one.
        spec = (path, config_path, meta.name, db.catalog.version + 1, options,
                db.keyring.current_key_id)
        tasks = [dask.delayed(_stage_partition)(part, spec) for part in df.to_delayed()]
        staged = dask.compute(*tasks)
        return db.commit_parts(meta.name, [p for parts in staged for p in parts])
