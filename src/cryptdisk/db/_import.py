"""Importing parts: Parquet parts that cryptdisk wrote, added to a table as they are.

A restore from a backup (or a copy from another database) already has each
part's Parquet bytes. :meth:`ImportMixin.import_parts` copies them through the
table's disk (so they are encrypted under this database's keys) without
decoding or re-encoding them, reads back each part's footer, checks that it
is a cryptdisk part of this table's columns, and publishes all of them in one
commit. As with inserts, a failure before the commit leaves only orphan files
that the next writer removes.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import DatabaseError
from ._catalog import PartMeta
from ._parts import PART_ID_KEY
from ._rollback import part_file_name
from ._stats import key_range_of
from ._storage import open_read, policy_disk

if TYPE_CHECKING:
    from ..disks import Disk
    from ._catalog import TableMeta
    from ._state import DatabaseState
else:
    DatabaseState = object  # the type checker's view only: see _state

__all__ = ["ImportMixin"]

_PART_ID = re.compile(r"[0-9a-f]{32}")
_COPY_BYTES = 8 << 20


def _footer(disk: Disk, path: str) -> tuple[pq.FileMetaData, int]:
    """The Parquet footer of ``path`` (read through the disk, so authenticated) and its size."""
    with open_read(disk, path) as f:
        size = int(f.size)
        tail = bytes(f.pread(size - 8, 8)) if size >= 12 else b""
        if tail[4:] != b"PAR1" or int.from_bytes(tail[:4], "little") + 12 > size:
            raise DatabaseError(f"import_parts: {path}: not a Parquet file")
        n = int.from_bytes(tail[:4], "little") + 8
        raw = f.pread(size - n, n)
    try:
        return pq.read_metadata(pa.BufferReader(raw)), size
    except pa.ArrowException as exc:
        raise DatabaseError(f"import_parts: {path}: unreadable Parquet footer ({exc})") from None


class ImportMixin(DatabaseState):
    """:meth:`import_parts` of :class:`~cryptdisk.db.Database`."""

    def import_parts(self, table: str, parts: Iterable[Any], *,
                     on_bytes: Callable[[int], None] | None = None) -> int:
        """Add Parquet parts that cryptdisk wrote to ``table`` as they are; returns their rows.

        Each item of ``parts`` is a readable binary stream (``read(n)``) of one part's
        plaintext Parquet bytes, e.g. a part restored from a backup. Its bytes are copied
        through the table's storage policy disk (encrypted under this database's keys),
        neither decoded nor re-encoded. Then its footer must hold a cryptdisk part id that
        the catalog does not name yet and exactly the table's columns and types; its row
        count and key range come from the footer, its size (and, on a plain disk, its
        SHA-256) from the bytes written. All parts are published in one commit. An error
        (a stream's, or a check's)
        publishes none of them. ``on_bytes(n)`` is called as bytes are written.
        """
        with self._mutex:
            self._writable(f"import parts into {table}")
            meta: TableMeta = self.table(table)
            schema = self.arrow_schema(meta).remove_metadata()
            disk = policy_disk(self.policy(meta.policy))
            version = self.catalog.version + 1
            prefix = meta.prefix(self.catalog.db_id)
            key = meta.key
            known = {p.id for t in self.catalog.tables.values() for p in t.parts}
            new: list[PartMeta] = []
            copied: list[PartMeta] = []  # (every file written, for an error to delete)
            try:
                for src in parts:
                    path = f"{prefix}/{part_file_name(version, uuid.uuid4().hex)}"
                    # a SHA-256 on a plain disk only, as inserts (see _parts)
                    digest = None if disk.is_encrypted else hashlib.sha256()
                    written = 0
                    copied.append(PartMeta("", disk.name, path, 0, 0, ""))
                    with disk.open_write(path) as dst:
                        while data := src.read(_COPY_BYTES):
                            if digest is not None:
                                digest.update(data)
                            dst.write(data)
                            written += len(data)
                            if on_bytes is not None:
                                on_bytes(len(data))
                    footer, size = _footer(disk, path)
                    part_id = (footer.metadata or {}).get(PART_ID_KEY, b"").decode(
                        "ascii", "replace")
                    what = f"import_parts into {meta.name}: part {len(new)}"
                    if not _PART_ID.fullmatch(part_id):
                        raise DatabaseError(f"{what} is not a part cryptdisk wrote (no part id "
                                            "in its footer)")
                    if part_id in known:
                        raise DatabaseError(f"{what}: the database already has part {part_id}")
                    got = footer.schema.to_arrow_schema().remove_metadata()
                    if not _same_columns(got, schema):
                        raise DatabaseError(f"{what} has columns ({got.to_string()}), the "
                                            f"table ({schema.to_string()})".replace("\n", ", "))
                    if size != written:
                        raise DatabaseError(f"{what}: {written} bytes written, {size} read "
                                            "back")
                    info = disk.info(path)
                    lo, hi = (key_range_of(footer, key) if key else None) or (None, None)
                    known.add(part_id)
                    new.append(PartMeta(part_id, disk.name, path, footer.num_rows,
                                        written,
                                        digest.hexdigest() if digest is not None else "",
                                        info.key_id, info.algorithm,
                                        info.stored_size, key_min=lo, key_max=hi))
            except BaseException:  # no catalog names them: gone now, not at next open
                self._discard_unpublished(copied)
                raise
            return self._publish(meta, new)


def _same_columns(got: pa.Schema, table: pa.Schema) -> bool:
    """Whether a part's columns are the table's. A part's column may be non-null where the
    table's is nullable: OPTIMIZE writes a column without NULLs as Parquet REQUIRED."""
    if len(got) != len(table):
        return False
    return all((g.with_nullable(True) if t.nullable else g).equals(t)
               for g, t in zip(got, table, strict=True))
