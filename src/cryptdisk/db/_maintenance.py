"""Changing stored data: drop, truncate, move between policies, merge, clean up.

Every change follows one order: write new files, publish the catalog, then
delete what it no longer names. A process killed at any point leaves either
the old catalog (new files are orphans) or the new one (old files are
orphans); the next writer to open the database deletes orphans
(:meth:`collect_garbage`), so no part is ever half-visible or counted twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import CatalogError, CryptdiskError, DatabaseError, DiskFileNotFoundError
from . import _sql
from ._catalog import PartMeta, remove_catalog_temps
from ._partread import read_part
from ._parts import verify_part
from ._storage import policy_disk, policy_disks, stale_cleanup

if TYPE_CHECKING:
    from ._catalog import TableMeta

__all__ = ["MaintenanceMixin"]


class MaintenanceMixin:
    """Maintenance methods of :class:`~cryptdisk.db.Database`."""

    catalog: Any
    config: Any
    cache: Any
    con: Any
    _stamp: Any

    def _remove_parts(self, parts: list[PartMeta]) -> None:
        for part in parts:
            self.cache.drop_part(part.id)
            disk = self.config.disks.get(part.disk)
            if disk is not None:
                with contextlib.suppress(DiskFileNotFoundError, FileNotFoundError):
                    disk.remove(part.path)

    def _replace_parts(self, meta: TableMeta, new: list[PartMeta], **changes: Any) -> None:
        """Publish ``new`` as the table's parts (and other field changes), then delete the old."""
        old, saved = meta.parts, {k: getattr(meta, k) for k in changes}
        meta.parts = new
        for k, v in changes.items():
            setattr(meta, k, v)
        try:
            self._commit()  # type: ignore[attr-defined]
        except BaseException:
            meta.parts = old
            for k, v in saved.items():
                setattr(meta, k, v)
            raise
        self._remove_parts([p for p in old if p.id not in {n.id for n in new}
                            or p.path not in {n.path for n in new}])

    def _drop(self, st: _sql.DropTable) -> None:
        if st.if_exists and st.name not in self.catalog.tables:
            return
        meta = self.table(st.name)  # type: ignore[attr-defined]
        del self.catalog.tables[meta.name]
        try:
            self._commit()  # type: ignore[attr-defined]
        except BaseException:
            self.catalog.tables[meta.name] = meta
            raise
        with contextlib.suppress(Exception):
            self.con.unregister(meta.name)
        self._remove_parts(meta.parts)

    def _truncate(self, st: _sql.Truncate) -> None:
        self._replace_parts(self.table(st.name), [])  # type: ignore[attr-defined]

    def _alter(self, st: _sql.AlterSetting) -> None:
        meta = self.table(st.name)  # type: ignore[attr-defined]
        unknown = set(st.settings) - {"storage_policy"}
        if unknown:
            raise DatabaseError(f"unknown table setting(s) {', '.join(sorted(unknown))}; "
                                "the only setting is storage_policy")
        self.move(meta.name, st.settings["storage_policy"])

    def move(self, table: str, policy: str,
             on_bytes: Callable[[int], None] | None = None) -> None:
        """Move a table's parts to another storage policy (crash-safe; verifies digests)."""
        with self._mutex:  # type: ignore[attr-defined]
            self._writable("move")  # type: ignore[attr-defined]
            meta = self.table(table)  # type: ignore[attr-defined]
            target = policy_disk(self.policy(policy))  # type: ignore[attr-defined]
            moved = []
            for part in meta.parts:
                if part.disk == target.name:
                    moved.append(part)
                    continue
                source = self.config.disks[part.disk]
                verify_part(source, part)
                path = f"{meta.prefix(self.catalog.db_id)}/{part.id}.{target.name}.parquet"
                with source.open_read(part.path) as src, target.open_write(path) as dst:
                    while chunk := src.read(8 << 20):
                        dst.write(chunk)
                        if on_bytes is not None:
                            on_bytes(len(chunk))
                info = target.info(path)
                moved.append(PartMeta(part.id, target.name, path, part.rows, part.bytes,
                                      part.sha256, info.key_id, info.algorithm,
                                      info.stored_size))
            self._replace_parts(meta, moved, policy=policy)

    def _optimize_stmt(self, st: _sql.Optimize) -> None:
        self.optimize(st.name, final=st.final)

    def optimize(self, table: str, *, final: bool = False,
                 on_rows: Callable[[int], None] | None = None) -> bool:
        """Merge the table's parts into as few as possible, re-encrypted under new data keys.

        Without ``final`` a table already in one part under the current key is
        left alone. Returns True if the parts were rewritten.
        """
        with self._mutex:  # type: ignore[attr-defined]
            self._writable("OPTIMIZE")  # type: ignore[attr-defined]
            meta = self.table(table)  # type: ignore[attr-defined]
            current = self.keyring.current_key_id  # type: ignore[attr-defined]
            if not meta.parts or (not final and len(meta.parts) == 1
                                  and meta.parts[0].key_id in (None, current)):
                return False
            from ._insert import PART_ROWS
            from ._parts import write_parts

            for part in meta.parts:
                verify_part(self.config.disks[part.disk], part)
            schema = self.arrow_schema(meta)  # type: ignore[attr-defined]
            if meta.order_by:  # one sort over the whole table, in memory
                data = self.arrow_table(meta.name)  # type: ignore[attr-defined]
                data = data.sort_by([(c, "ascending") for c in meta.order_by.split(",")])
                batches: Any = data.to_batches(max_chunksize=1 << 20)
            else:  # one part at a time: memory stays at about one part
                batches = (batch for part in list(meta.parts)
                           for batch in read_part(self.config.disks[part.disk], part, None)
                           .to_batches(max_chunksize=1 << 20))
            disk = policy_disk(self.policy(meta.policy))  # type: ignore[attr-defined]
            new = write_parts(disk, meta.prefix(self.catalog.db_id), batches, schema,
                              max_rows=PART_ROWS, on_rows=on_rows)
            self._replace_parts(meta, new)
            return True

    def collect_garbage(self) -> int:
        """Delete files of this database that the catalog does not name; returns how many.

        Also deletes the temporaries of writers killed mid-write (parts and the
        catalog): this connection holds the writer lock, so no live writer owns one.
        """
        with self._mutex:  # type: ignore[attr-defined]
            self._writable("collect garbage")  # type: ignore[attr-defined]
            remove_catalog_temps(self.path)  # type: ignore[attr-defined]
            live = {(p.disk, p.path) for t in self.catalog.tables.values() for p in t.parts}
            prefix = f"cryptdisk-db/{self.catalog.db_id}"
            removed = 0
            for disk in policy_disks(self.config):
                try:
                    stale_cleanup(disk, prefix)
                    names = disk.list(prefix)
                except (CryptdiskError, OSError):
                    continue
                for name in names:
                    if (disk.name, name) not in live:
                        with contextlib.suppress(DiskFileNotFoundError, FileNotFoundError):
                            disk.remove(name)
                            removed += 1
            return removed

    def check(self) -> int:
        """Verify every part's SHA-256 against one catalog version; returns the parts checked.

        On a read-only connection another process may publish a new catalog
        (and delete the parts it replaced) while this runs: a part that fails is
        looked at again under the newest catalog, and the check starts over on
        it if it moved on. Damage is reported only when it persists in a
        catalog version that did not change meanwhile.
        """
        with self._mutex:  # type: ignore[attr-defined]
            self.refresh()  # type: ignore[attr-defined]
            while True:
                catalog = self.catalog
                try:
                    return self._verify_parts(catalog)
                except CatalogError:
                    if not self.read_only:  # type: ignore[attr-defined]
                        raise  # a writer's catalog cannot change under it
                    self._stamp = None  # reload even if the file looks unchanged
                    self.refresh()  # type: ignore[attr-defined]
                    if self.catalog.version == catalog.version:
                        raise

    def _verify_parts(self, catalog: Any) -> int:
        n = 0
        for meta in catalog.tables.values():
            for part in meta.parts:
                disk = self.config.disks.get(part.disk)
                if disk is None:
                    raise CatalogError(f"table {meta.name}: part {part.path} is on disk "
                                       f"{part.disk!r}, which the config does not define")
                verify_part(disk, part)
                n += 1
        return n
