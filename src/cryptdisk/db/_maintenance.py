"""Changing stored data: drop, truncate, move between policies, merge, clean up.

Every change follows one order: write new files (named for the catalog version
that will name them), publish the catalog, then delete what it no longer
names. A process killed at any point leaves either the old catalog (new files
are orphans) or the new one (old files are orphans); the writers that open the
database later delete the orphans they can prove abandoned
(:meth:`collect_garbage`, :mod:`._rollback`), so no part is ever half-visible
or counted twice, and no part of a newer catalog is taken for an orphan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from ..errors import CatalogError, CryptdiskError, DatabaseError, DiskFileNotFoundError
from . import _sql
from ._catalog import PartMeta, load_catalog, remove_catalog_temps
from ._memory import out_of_memory
from ._partread import read_part
from ._parts import check_footer, verify_part
from ._policies import role_check_statement
from ._rollback import (
    Survey,
    part_file_name,
    pin_evidence,
    read_pins,
    remove_pin_temps,
    rollback_error,
    survey,
)
from ._storage import DiskFile, open_read, policy_disk, policy_disks, stale_cleanup

#: Rows sorted at a time by OPTIMIZE of a table with an ORDER BY (see _sorted_batches).
MERGE_ROWS = 1 << 18

if TYPE_CHECKING:
    from ._catalog import TableMeta
    from ._state import DatabaseState
else:
    DatabaseState = object  # the type checker's view only: see _state

__all__ = ["MaintenanceMixin"]

def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


log = logging.getLogger("cryptdisk.db")


class MaintenanceMixin(DatabaseState):
    """Maintenance methods of :class:`~cryptdisk.db.Database`."""

    def _remove_parts(self, parts: list[PartMeta]) -> None:
        """Delete the files of ``parts`` (the catalog no longer names them); while a
        :class:`~cryptdisk.db.Reader` runs a query (it may read them from the catalog it
        started with) they wait for the last one to end (a crash meanwhile leaves them to
        :meth:`collect_garbage`)."""
        for part in parts:
            self.cache.drop_part(part.id)
            self._open_parts.forget(part.id)
        if self._readers_running:
            self._doomed_parts.extend(parts)
            return
        for part in parts:
            disk = self.config.disks.get(part.disk)
            if disk is not None:
                with contextlib.suppress(DiskFileNotFoundError, FileNotFoundError):
                    disk.remove(part.path)

    @contextlib.contextmanager
    def _committing(self, undo: Callable[[], Any],
                    written: Iterable[PartMeta] = ()) -> Iterator[None]:
        """Around a commit (and what follows it) of a change made in memory: on an
        exception, ``undo`` it unless the catalog was published meanwhile, and delete the
        files the change ``written`` (see :meth:`_discard_unpublished`). Once the
        catalog is published the change is committed whatever happens next (an error or
        interrupt after the rename: :func:`._catalog.save_catalog` keeps the version):
        undoing it, or deleting its files, would lose data the catalog names."""
        version = self.catalog.version
        try:
            yield
        except BaseException:
            if not self._published_since(version):
                undo()
                self._discard_unpublished(written)
            raise

    def _published_since(self, version: int) -> bool:
        """Whether a catalog later than ``version`` was published (by this connection)."""
        return self.catalog.version > version

    def _discard_unpublished(self, written: Iterable[PartMeta]) -> None:
        """Delete the files ``written`` for a change whose commit failed, now rather than at
        the next writer's open, when it is certain that no catalog names them: the catalog
        on disk is still the one this connection had (it holds the writer lock, and their
        names are new). After a failure whose outcome is unknown
        (``catalog.unsettled``) they stay: that catalog may be published and name them
        (Database._settle deletes them once the catalog read again is the one before).
        Best effort: a file that cannot be removed is left to the next writer's open. At a
        URL they stay for a later commit (see :meth:`_collect_abandoned`)."""
        if self._remote is not None:
            return
        if self.catalog.unsettled is not None:  # kept until the catalog is read again
            self._unsettled_files.extend(written)
            return
        for part in written:
            disk = self.config.disks.get(part.disk)
            try:
                if disk is not None:
                    disk.remove(part.path)
            except (DiskFileNotFoundError, FileNotFoundError):
                pass
            except Exception as exc:
                log.warning("cryptdisk: %s: removing %s of a change that was not committed "
                            "failed (%s): the next writer's open removes it", self.path,
                            part.path, type(exc).__name__)

    def _remove_replaced(self, parts: list[PartMeta]) -> None:
        """:meth:`_remove_parts` after a commit: an error leaves them to garbage collection."""
        try:
            self._remove_parts(parts)
        except Exception as exc:
            log.warning("cryptdisk: %s: catalog version %d is committed; removing the %d "
                        "part(s) it replaced failed (%s): the next writer's open removes "
                        "them", self.path, self.catalog.version, len(parts),
                        type(exc).__name__)

    def _replace_parts(self, meta: TableMeta, new: list[PartMeta], **changes: Any) -> None:
        """Publish ``new`` as the table's parts (and other field changes), then delete the old."""
        old, saved = meta.parts, {k: getattr(meta, k) for k in changes}
        meta.parts = new
        for k, v in changes.items():
            setattr(meta, k, v)

        def undo() -> None:
            meta.parts = old
            for k, v in saved.items():
                setattr(meta, k, v)

        kept = {(p.disk, p.path) for p in old}
        with self._committing(undo, [p for p in new if (p.disk, p.path) not in kept]):
            self._commit()
        self._remove_replaced([p for p in old if p.id not in {n.id for n in new}
                               or p.path not in {n.path for n in new}])

    def _drop(self, st: _sql.DropTable) -> None:
        if st.if_exists and st.name not in self.catalog.tables:
            return
        meta = self.table(st.name)
        del self.catalog.tables[meta.name]
        with self._committing(lambda: self.catalog.tables.__setitem__(meta.name, meta)):
            self._commit()
        with contextlib.suppress(Exception):
            self.con.unregister(meta.name)
        self._remove_replaced(meta.parts)
        try:  # its policy attachments go with it (a crash before: see _forget_policies)
            self._forget_policies(meta.name)
        except CryptdiskError as exc:  # dropped: the next table of the name removes them
            log.warning("DROP TABLE %s: its policies stay in %s until a table of the name "
                        "is created (%s)", meta.name, self.policies_path, exc)

    def _truncate(self, st: _sql.Truncate) -> None:
        self._replace_parts(self.table(st.name), [])

    def _alter(self, st: _sql.AlterSetting) -> None:
        meta = self.table(st.name)
        unknown = set(st.settings) - {"storage_policy"}
        if unknown:
            raise DatabaseError(f"unknown table setting(s) {', '.join(sorted(unknown))}; "
                                "the only setting is storage_policy")
        self.move(meta.name, st.settings["storage_policy"])

    def move(self, table: str, policy: str,
             on_bytes: Callable[[int], None] | None = None) -> None:
        """Move a table's parts to another storage policy (crash-safe; verifies digests)."""
        with self._mutex:
            self._writable(f"move table {table} to policy {policy}")
            role_check_statement(self, "move()", table)
            meta = self.table(table)
            target = policy_disk(self.policy(policy))
            moved: list[PartMeta] = []
            copied: list[PartMeta] = []  # (the new files, for an error to delete)
            try:
                for part in meta.parts:
                    if part.disk == target.name:
                        moved.append(part)
                        continue
                    source = self.config.disks[part.disk]
                    verify_part(source, part)
                    name = part_file_name(self.catalog.version + 1, part.id, f".{target.name}")
                    path = f"{meta.prefix(self.catalog.db_id)}/{name}"
                    # a part without a SHA-256 (it was encrypted) gets one on a plain disk
                    digest = None if part.sha256 or target.is_encrypted else hashlib.sha256()
                    # (before: a close that fails after the rename leaves the file in place)
                    copied.append(dataclasses.replace(part, disk=target.name, path=path))
                    with source.open_read(part.path) as src, target.open_write(path) as dst:
                        while chunk := src.read(8 << 20):
                            if digest is not None:
                                digest.update(chunk)
                            dst.write(chunk)
                            if on_bytes is not None:
                                on_bytes(len(chunk))
                    info = target.info(path)
                    moved.append(dataclasses.replace(  # keeps the key range
                        part, disk=target.name, path=path, key_id=info.key_id,
                        sha256=digest.hexdigest() if digest is not None else part.sha256,
                        algorithm=info.algorithm, bytes_on_disk=info.stored_size,
                        disk_type=None, encrypted=None))
            except BaseException:  # copies no catalog names: gone now, not at next open
                self._discard_unpublished(copied)
                raise
            self._replace_parts(meta, moved, policy=policy,
                                encrypted=bool(target.is_encrypted))

    def _optimize_stmt(self, st: _sql.Optimize) -> None:
        self.optimize(st.name, final=st.final)

    def optimize(self, table: str, *, final: bool = False,
                 on_rows: Callable[[int], None] | None = None) -> bool:
        """Merge the table's parts into as few as possible, re-encrypted under new data keys.

        Without ``final`` a table already in one part under the current key is
        left alone. Returns True if the parts were rewritten.
        """
        with self._mutex:
            self._writable(f"optimize table {table}")
            role_check_statement(self, "optimize()", table)
            meta = self.table(table)
            current = self.keyring.current_key_id
            if not meta.parts or (not final and len(meta.parts) == 1
                                  and meta.parts[0].key_id in (None, current)):
                return False
            from ._insert import PART_ROWS
            from ._parts import write_parts

            for part in meta.parts:
                verify_part(self.config.disks[part.disk], part)
            schema = self._merged_schema(meta)
            batches: Any
            if meta.order_by:
                batches = self._sorted_batches(meta)
            else:  # one part at a time: memory stays at about one part
                # (each part's own schema: a column may be REQUIRED in one, not another)
                batches = (batch for part in list(meta.parts)
                           for batch in read_part(self.config.disks[part.disk], part, None)
                           .cast(schema).to_batches(max_chunksize=1 << 20))
            disk = policy_disk(self.policy(meta.policy))
            new = write_parts(disk, meta.prefix(self.catalog.db_id), batches, schema,
                              version=self.catalog.version + 1, max_rows=PART_ROWS,
                              on_rows=on_rows,
                              key=meta.key)
            self._replace_parts(meta, new)
            return True

    def _merged_schema(self, meta: TableMeta) -> pa.Schema:
        """The schema of ``meta``'s merged parts: the table's, with each column that no row
        group of any part holds a NULL in (its authenticated footer's statistics say so)
        written as Parquet REQUIRED. A reader then decodes no definition levels for it
        (pyarrow turns each value's level into a validity bit: half the CPU of decoding a
        column of 8-byte numbers); the column stays nullable in the table, and a later
        insert's NULLs go into parts of their own. A row that is NULL after all fails the
        write (Arrow refuses the cast), never stores a wrong value."""
        schema = self.arrow_schema(meta)
        nullable: set[str] = set()
        for part in meta.parts:  # (one part open at a time: a table may have thousands)
            op = self._open_parts.get(part)
            nullable.update(f.name for f in schema if f.name not in nullable and any(
                op.nulls(rg, f.name) != 0 for rg in range(op.num_row_groups)))
        fields = [f if f.name in nullable else f.with_nullable(False) for f in schema]
        return pa.schema(fields, metadata=schema.metadata)

    def _sorted_batches(self, meta: TableMeta) -> Any:
        """The table's rows in ``ORDER BY`` order, sorted one key interval at a time.

        The row groups' minimum keys split the key's domain into intervals of about
        :data:`MERGE_ROWS` rows; each interval's rows (read from the row groups whose
        statistics overlap it) are sorted by DuckDB, then the rows with a NULL key.
        So a merge holds one interval in memory, not the table (a single key value
        with more rows than that is one interval). A part with a row group whose key
        has no statistics falls back to one sort of the whole table.
        """
        from ._pushdown import Filter
        from ._scan import TableScan

        cols = meta.order
        key = cols[0]
        schema = self.arrow_schema(meta)
        names = [c for c, _t in meta.columns]
        firsts: list[tuple[Any, int]] = []
        for part in meta.parts:
            op = self._open_parts.get(part)
            ranges = op.ranges(key)
            for rg in range(op.num_row_groups):
                found = None if ranges is None else ranges[rg]
                if found is None:
                    if op.nulls(rg, key) == op.rows(rg):
                        continue  # NULL keys only: the last interval
                    # no statistics: one sort in memory (not through arrow_table: this
                    # runs on write_parts' source thread, while the caller holds _mutex)
                    data = TableScan(self._open_parts, meta, schema, names, [], None).to_table()
                    yield from data.sort_by([(c, "ascending") for c in cols]).to_batches(
                        max_chunksize=1 << 20)
                    return
                firsts.append((found[0], op.rows(rg)))
        firsts.sort(key=lambda f: f[0])
        splits: list[Any] = []
        rows = 0
        for low, n in firsts:
            if rows >= MERGE_ROWS and (not splits or low > splits[-1]):
                splits.append(low)
                rows = 0
            rows += n
        bounds = list(zip([None, *splits], [*splits, None], strict=True))
        order = ", ".join(f"{_quote(c)} ASC NULLS LAST" for c in cols)
        view = "__cd_optimize"
        for low, high in [*bounds, ("null", "null")]:
            if low == "null":
                flt: list[Any] = []
                params: list[Any] = []
                where = f"{_quote(key)} IS NULL"
            else:
                flt = [Filter(key, low, high)]
                conds = [f"{_quote(key)} IS NOT NULL"]  # NULL keys: the last interval
                params = []
                if low is not None:
                    conds.append(f"{_quote(key)} >= ?")
                    params.append(low)
                if high is not None:
                    conds.append(f"{_quote(key)} < ?")
                    params.append(high)
                where = " AND ".join(conds)
            scan = TableScan(self._open_parts, meta, schema, names, flt, None)
            self.con.register(view, scan)
            try:
                reader = self.con.sql(f"SELECT * FROM {view} WHERE {where} ORDER BY {order}",
                                      params=params).to_arrow_reader(1 << 20)
                yield from reader
            except duckdb.OutOfMemoryException as exc:
                raise out_of_memory(f"OPTIMIZE {meta.name}: sorting {MERGE_ROWS:,} rows at "
                                    "a time", exc, "raise memory_limit") from None
            finally:
                scan.close()
                self.con.unregister(view)
            if scan.error is not None:
                raise scan.error

    def _live(self, catalog: Any) -> set[tuple[str, str]]:
        return {(p.disk, p.path) for t in catalog.tables.values() for p in t.parts}

    def _survey(self) -> Survey:
        return survey(policy_disks(self.config), f"cryptdisk-db/{self.catalog.db_id}",
                      self._live(self.catalog), self.catalog.version)

    def rollback_evidence(self) -> str | None:
        """A sentence naming what proves this database's catalog was rolled back, or None.

        Looks at the pins (``PATH/pin`` and the one given to ``connect(pin=...)``)
        and at the versions in the names of the files the catalog does not name.
        Safe beside a writer: pins are read before the catalog, and the catalog
        again after the files are listed.
        """
        with self._mutex:
            pins = read_pins(self._pins, self.keyring, self._remote)
            shared = self.read_only or self._remote is not None  # others commit meanwhile
            if shared:
                self._stamp = None
                self.refresh()
            found = self._survey()
            if found.newer and shared:
                after = load_catalog(self.path, self.keyring, self._remote)
                if after is not None:
                    found = found.newer_than(after.version, self._live(after))
            return (pin_evidence(pins, self.catalog.db_id, self.catalog.version)
                    or found.evidence())

    def collect_garbage(self, *, unversioned: bool = False) -> int:
        """Delete the files of this database that were provably abandoned; returns how many.

        A file is abandoned when the catalog does not name it and has passed the
        version the file was written for (its name says which), or when it is a
        temporary (of a part, of the catalog, of a pin): this connection holds
        the writer lock, so no live writer owns one. Files written for the next
        version are deleted after this connection's first commit; files with no
        version in their name are kept unless ``unversioned`` is true. If a file
        or a pin proves the catalog was rolled back, nothing is deleted and
        :class:`~cryptdisk.errors.CatalogError` says what proves it.
        """
        with self._mutex:
            self._writable("collect garbage")
            pins = read_pins(self._pins, self.keyring)
            found = self._survey()  # nothing moves: this connection holds the writer lock
            evidence = (pin_evidence(pins, self.catalog.db_id, self.catalog.version)
                        or found.evidence())
            if evidence is not None:
                raise rollback_error(self.path,
                                     self.catalog.version, evidence)
            remove_catalog_temps(self.path)
            for pin in self._pins:
                remove_pin_temps(pin)
            prefix = f"cryptdisk-db/{self.catalog.db_id}"
            for disk in policy_disks(self.config):
                with contextlib.suppress(CryptdiskError, OSError):
                    stale_cleanup(disk, prefix)
            self._pending = found.pending
            if found.unversioned and not unversioned:
                log.info("cryptdisk: %s: kept %d file(s) the catalog does not name and that "
                         "carry no catalog version (collect_garbage(unversioned=True) "
                         "deletes them)", self.path,
                         len(found.unversioned))
            doomed = found.abandoned + (found.unversioned if unversioned else [])
            return self._remove_files(doomed)

    def _remove_files(self, files: list[tuple[Any, str]]) -> int:
        removed = 0
        for disk, name in files:
            with contextlib.suppress(DiskFileNotFoundError, FileNotFoundError):
                disk.remove(name)
                removed += 1
        return removed

    def _collect_abandoned(self) -> int:
        """After a commit to a database at a URL: delete the files named for a version the
        catalog has reached that it does not name. No writer can publish them any more (a
        commit of version N is conditional on catalog N - 1 being the stored one), and
        no catalog ever named them; files named for later versions are other writers'."""
        return self._remove_files(self._survey().abandoned)

    def _collect_pending(self) -> None:
        """After a commit: the files written for the version just passed, if still unnamed."""
        if self._pending:
            live = self._live(self.catalog)
            self._remove_files([(d, n) for d, n in self._pending if (d.name, n) not in live])
            self._pending = []

    def open_part_file(self, part: PartMeta) -> DiskFile:
        """Open one part of the catalog to read its Parquet bytes as they are (a backup).

        A part without a SHA-256 (on an encrypted disk) is checked here, through the
        returned file: its size and its footer's part id and row count must be the
        catalog's, and each read authenticates what it reads. For a part with one, the
        caller compares the SHA-256 of the bytes it read with ``part.sha256``. A part that
        is not the catalog's raises :class:`~cryptdisk.errors.CatalogError`; a missing file
        :class:`~cryptdisk.errors.DiskFileNotFoundError`.
        """
        disk = self.config.disks.get(part.disk)
        if disk is None:
            raise CatalogError(f"part {part.path} is on disk {part.disk!r}, which the config "
                               "does not define")
        if not part.sha256 and not (part.is_encrypted and disk.is_encrypted):
            raise CatalogError(f"part {part.path} on disk {disk.name!r} has no SHA-256 in the "
                               "catalog, which only a part on an encrypted disk may lack")
        f = open_read(disk, part.path)
        try:
            if not part.sha256:
                check_footer(f, disk, part)
        except BaseException:
            f.close()
            raise
        return f

    def check(self) -> int:
        """Verify every part against one catalog version; returns the parts checked.

        Each part is read whole: a part on a plain disk must match the SHA-256 the catalog
        recorded, a part on an encrypted disk must authenticate (every segment) and its
        footer name the catalog's part id and rows (see :func:`._parts.verify_part`).

        On a read-only connection another process may publish a new catalog
        (and delete the parts it replaced) while this runs: a part that fails is
        looked at again under the newest catalog, and the check starts over on
        it if it moved on. Damage is reported only when it persists in a
        catalog version that did not change meanwhile. A catalog that was
        rolled back (:meth:`rollback_evidence`) fails the check.
        """
        with self._mutex:
            evidence = self.rollback_evidence()
            if evidence is not None:
                raise CatalogError(f"{self.path}: the catalog (version "
                                   f"{self.catalog.version}) was rolled back: {evidence}",
                                   hint="put the newest catalog back")
            while True:
                catalog = self.catalog
                try:
                    return self._verify_parts(catalog)
                except CatalogError:
                    if not self.read_only:
                        raise  # a writer's catalog cannot change under it
                    self._stamp = None  # reload even if the file looks unchanged
                    self.refresh()
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
