"""What the database's mixins may use of :class:`~cryptdisk.db.Database`.

:class:`~cryptdisk.db.Database` is assembled from mixins (inserts, maintenance,
rotation), each in its own module. :class:`DatabaseState` declares the state
and the methods they share, so mypy checks every ``self.x`` a mixin uses, and
checks that ``Database`` provides each of them with a compatible type. The
mixins subclass it for the type checker only (at run time their base is
``object``), so it changes no behaviour and adds nothing to the MRO.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from ..keys import Keyring
    from ._cache import ColumnCache
    from ._catalog import Catalog, PartMeta, TableMeta
    from ._sigint import StatementLock

__all__ = ["DatabaseState"]


class DatabaseState(Protocol):
    """The attributes and methods of a database that its mixins rely on."""

    #: The database directory (absolute).
    path: str
    read_only: bool
    config: Any
    keyring: Keyring
    #: True when the database was opened without a config: its keys are its key files.
    own_keys: bool
    #: The role whose policies reads go through (``connect(..., role=)``), or None.
    role: str | None
    catalog: Catalog
    cache: ColumnCache
    #: An insert sorts and writes its rows in blocks of about this many bytes.
    insert_block_bytes: int
    #: The in-memory DuckDB connection.
    con: Any
    #: Held by every public method: one statement at a time per connection (an RLock
    #: that keeps the signals' exceptions of a statement on the main thread).
    _mutex: StatementLock
    #: The catalog file's stamp when last loaded (None forces a reload).
    _stamp: Any
    #: The directory's files when it is at a URL (a ``_remote.RemoteDirectory``), or None.
    _remote: Any
    #: The pin files recording the published catalog version.
    _pins: list[str]
    #: Files (disk, path) to delete once the next catalog is published.
    _pending: list[tuple[Any, str]]
    _unsettled_files: list[Any]
    #: Parts opened and checked, kept for the next reads (an ``_scan.OpenParts``).
    _open_parts: Any
    #: Queries :class:`~cryptdisk.db.Reader` objects are running now.
    _readers_running: int
    #: Parts the catalog no longer names, deleted when the last running reader ends.
    _doomed_parts: list[Any]
    #: The Arrow schemas of tables' columns, by their (name, type) list.
    _schemas: dict[Any, pa.Schema]
    #: The sealed policy file (``cryptdisk serve``'s masking and row access policies).
    policies_path: str

    def table(self, name: str) -> TableMeta: ...

    def policy(self, name: str) -> Any: ...

    def arrow_schema(self, meta: TableMeta) -> pa.Schema: ...

    def arrow_table(self, name: str, columns: list[str] | None = None) -> pa.Table: ...

    def refresh(self) -> None: ...

    def _writable(self, what: str, *, adds: bool = False, staged: bool = False) -> None: ...

    def _check_open(self) -> None: ...

    def _commit(self) -> None: ...

    def _committing(self, undo: Callable[[], Any], written: Iterable[PartMeta] = ()
                    ) -> contextlib.AbstractContextManager[None]:
        ...

    def _published_since(self, version: int) -> bool: ...

    def _discard_unpublished(self, written: Iterable[PartMeta]) -> None: ...

    def _prepare(self, sql: str, push: bool = True) -> Any: ...  # (see Database._prepare)

    def _release(self) -> None: ...

    def _expose(self, name: str, source: Any) -> None: ...

    def _run_duckdb(self, sql: str, prepared: tuple[str, str] | None = None,
                    rows: bool = False) -> Any: ...

    def _new_table(self, st: Any) -> TableMeta: ...

    def _check_types(self, meta: TableMeta, what: str | None = None) -> None: ...

    def _temporary_table(self, name: str) -> bool: ...

    def _forget_policies(self, table: str) -> None: ...

    def _replace_parts(self, meta: TableMeta, new: list[PartMeta], **changes: Any) -> None: ...

    def _remove_parts(self, parts: list[PartMeta]) -> None: ...

    def _query_text(self, prepared: Any) -> str: ...

    def _write(self, meta: TableMeta, schema: pa.Schema, disk: Any, query: str,
               columns: list[str] | None, version: int,
               on_rows: Callable[[int], None] | None, by_name: bool = False
               ) -> list[PartMeta]: ...

    def _insert_rows(self, meta: TableMeta, schema: pa.Schema, disk: Any, query: str,
                     columns: list[str] | None, what: str, oom_hint: str,
                     on_rows: Callable[[int], None] | None = None,
                     by_name: bool = False) -> list[PartMeta]: ...

    def _bind_exposed(self, sql: str) -> str: ...

    def _publish(self, meta: TableMeta, parts: list[PartMeta], *, own: bool = True
                 ) -> int: ...

    def optimize(self, table: str, *, final: bool = False,
                 on_rows: Callable[[int], None] | None = None) -> bool: ...
