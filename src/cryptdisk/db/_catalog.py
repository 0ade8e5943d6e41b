"""The catalog: tables, their parts, and what each part must look like.

It is one JSON document, sealed with the database's keyring (so encrypted and
authenticated) in ``PATH/catalog``, replaced atomically on each change, with a
version counter that only grows. Each part entry holds its row count, its
plaintext size, the SHA-256 of its Parquet bytes and a random part id that is
also written inside the part (authenticated with it on encrypted disks): a
part file swapped for another valid one, or an older copy, no longer matches.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import AuthenticationError, CatalogError, DatabaseError, FormatError
from ..format import HEADER_SIZE, names_known_key, read_named_header
from ..format import open_file as cd_open
from ..keys import Keyring
from ._names import NameDict, fold
from ._views import ViewMeta, Views

log = logging.getLogger("cryptdisk.db")

__all__ = ["CATALOG_FILE", "Catalog", "PartMeta", "TableMeta", "Tables", "catalog_key_id",
           "catalog_stamp", "load_catalog", "remove_catalog_temps", "save_catalog"]

CATALOG_FILE = "catalog"
FORMAT = 1


@dataclass
class PartMeta:
    id: str
    disk: str
    path: str
    rows: int
    bytes: int  # plaintext Parquet bytes
    sha256: str
    key_id: int | None = None
    algorithm: str | None = None
    bytes_on_disk: int | None = None  # stored size (header and tags included)
    disk_type: str | None = None  # the disk's type when written: local, encrypted, ...
    encrypted: bool | None = None  # whether the disk encrypted it (None: an older catalog)
    key_min: Any = None  # min and max of the table's first ORDER BY column (sparse index)
    key_max: Any = None

    @property
    def is_encrypted(self) -> bool:
        """Whether the part was written encrypted (inferred from its key for older catalogs)."""
        if self.encrypted is not None:
            return self.encrypted
        return self.key_id is not None or self.algorithm is not None


@dataclass
class TableMeta:
    id: str
    name: str
    columns: list[tuple[str, str]]  # (name, DuckDB type)
    policy: str
    order_by: str | None = None
    parts: list[PartMeta] = field(default_factory=list)
    encrypted: bool | None = None  # whether its policy encrypts (None: an older catalog)
    #: the columns declared NOT NULL, and each column's DEFAULT (SQL, as declared); kept
    #: in the catalog only when there are any
    not_null: list[str] = field(default_factory=list)
    defaults: dict[str, str] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def order(self) -> list[str]:
        """The ``ORDER BY`` columns, in order (empty without one)."""
        return self.order_by.split(",") if self.order_by else []

    @property
    def key(self) -> str | None:
        """The first ``ORDER BY`` column, the one the sparse index is on (or None)."""
        return self.order[0] if self.order_by else None

    def prefix(self, db_id: str) -> str:
        return f"cryptdisk-db/{db_id}/{self.id}"

    def column_name(self, name: Any) -> Any:
        """The table's column ``name`` names, found in any case as DuckDB finds it (the
        name as the table has it; ``name`` as it is if no column has it)."""
        names = [c for c, _t in self.columns]
        if name in names or not isinstance(name, str):
            return name
        low = fold(name)  # (DuckDB folds ASCII letters only: É and é are two names)
        return next((c for c in names if fold(c) == low), name)

    def named_filters(self, filters: Any) -> list[Any]:
        """``[(column, op, value), ...]`` with each column named as the table has it
        (:meth:`column_name`); anything else is left for the filters' own check."""
        return [(self.column_name(f[0]), *f[1:]) if isinstance(f, tuple | list) and f
                else f for f in filters]

    def pick_columns(self, columns: Any, caller: str) -> list[str]:
        """The names in ``columns`` (all of the table's for ``None``), checked against the
        table: a name it lacks, or no name at all, is a :class:`DatabaseError` (``caller``
        names the function in the latter)."""
        names = [c for c, _t in self.columns]
        cols = names if columns is None else [self.column_name(c) for c in columns]
        unknown = [c for c in cols if c not in names]
        if unknown or not cols:
            raise DatabaseError(f"table {self.name} has no column(s) {', '.join(unknown)}"
                                if unknown else f"{caller}: give at least one column")
        return cols


class Tables(NameDict[TableMeta]):
    """The catalog's tables, each under the name it was created with and found in any case
    (see :class:`~._names.NameDict`)."""

    __slots__ = ()


@dataclass
class Catalog:
    db_id: str
    version: int = 0
    tables: Tables = field(default_factory=Tables)
    #: the views (named queries, see ._views), in the same sealed document
    views: Views = field(default_factory=Views)
    #: of a catalog at a URL on S3: the ETag of the sealed bytes it was read from (or
    #: written as), on which the next commit is conditional (see ._remote)
    etag: str | None = field(default=None, compare=False, repr=False)
    #: the version a failed :func:`save_catalog` may or may not have published (the
    #: catalog could not be looked at after the failure), or None: while it is set, this
    #: in-memory catalog may be behind the one on disk (see Database._commit)
    unsettled: int | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.tables, Tables):
            self.tables = Tables(self.tables)
        if not isinstance(self.views, Views):
            self.views = Views(self.views)

    @classmethod
    def new(cls) -> Catalog:
        return cls(uuid.uuid4().hex)

    def to_json(self) -> bytes:
        doc = {"format": FORMAT, "db_id": self.db_id, "version": self.version,
               "tables": [_table_doc(t) for t in self.tables.values()]}
        if self.views:
            doc["views"] = [v.document() for v in self.views.values()]
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, path: str) -> Catalog:
        try:
            doc = json.loads(data)
            if doc.get("format") != FORMAT:
                raise CatalogError(f"{path}: catalog format {doc.get('format')!r} is not "
                                   f"{FORMAT}; upgrade cryptdisk")
            tables = Tables()
            for t in doc["tables"]:
                parts = [PartMeta(**p) for p in t.pop("parts")]
                t["columns"] = [tuple(c) for c in t["columns"]]
                tables[t["name"]] = TableMeta(**t, parts=parts)
            views = Views()
            for v in doc.get("views", []):
                views[v["name"]] = ViewMeta(**v)
            return cls(doc["db_id"], int(doc["version"]), tables, views)
        except (KeyError, TypeError, ValueError) as exc:
            raise CatalogError(f"{path}: the catalog is malformed ({exc})") from None


def _table_doc(meta: TableMeta) -> dict[str, Any]:
    """``meta`` as the catalog stores it (a table without NOT NULL or DEFAULT as one
    written before they existed)."""
    doc = asdict(meta)
    for key in ("not_null", "defaults"):
        if not doc[key]:
            del doc[key]
    return doc


def load_catalog(db_path: str, keyring: Keyring, remote: Any = None) -> Catalog | None:
    """The catalog of the database at ``db_path``, or None if there is none yet.

    ``remote``: the database's :class:`~._remote.RemoteDirectory` when ``db_path`` is a URL.
    """
    path = f"{db_path}/{CATALOG_FILE}" if remote is not None else \
        os.path.join(db_path, CATALOG_FILE)
    try:
        if remote is not None:
            stored, etag = remote.read_tagged(CATALOG_FILE)
            if stored is None:
                return None
            data = remote.open_sealed(CATALOG_FILE, stored, keyring)
        else:
            with cd_open(path, "rb", keys=keyring) as f:
                data = f.read()
    except FileNotFoundError:
        return None
    except (AuthenticationError, FormatError) as exc:
        raise CatalogError(f"{path}: the catalog cannot be trusted: {exc}",
                           hint="restore the database directory from a backup") from None
    catalog = Catalog.from_json(data, path)
    if remote is not None:
        catalog.etag = etag
    return catalog


def save_catalog(db_path: str, keyring: Keyring, catalog: Catalog, remote: Any = None) -> None:
    """Publish ``catalog`` as version ``catalog.version + 1`` (atomic, durable).

    At a URL (``remote``), the upload is conditional on the stored catalog still being
    the one ``catalog`` was read as (its ETag): another writer's commit meanwhile makes
    it fail with :class:`~cryptdisk.errors.PublishConflictError`, overwriting nothing.
    The rule is the same in both places: published once the new catalog is in place
    (renamed over the old one; the object at the URL), whatever is raised after that.

    Locally a failure is told apart by looking at the catalog file after it: replaced
    (published: ``catalog.version`` stays the new one, an error is logged and an
    interrupt raised), the old one still (not published: the version goes back, the
    failure is raised), or unknown when even that look fails: the version goes back,
    ``catalog.unsettled`` records the one that may be on disk, and an error is raised as
    a :class:`~cryptdisk.errors.CatalogError` saying so (an interrupt as it is). The
    caller then keeps every file the change wrote and reads the catalog again.
    """
    if remote is not None:
        _save_remote(keyring, catalog, remote)
        return
    before = catalog_stamp(db_path)
    catalog.version += 1
    path = os.path.join(db_path, CATALOG_FILE)
    try:
        with cd_open(path, "wb", keys=keyring) as f:
            f.write(catalog.to_json())
    except BaseException as exc:
        after = _stamp_or_error(db_path)
        # Renamed over the catalog already (a failed fsync of the directory, an interrupt
        # after the rename): published. Only the writer holding the lock replaces it.
        if not isinstance(after, OSError) and after not in (before, None):
            if not isinstance(exc, Exception):
                raise  # (an interrupt) catalog.version stays: see Database._committing
            log.warning("cryptdisk: %s: catalog version %d is published, but finishing "
                        "its write failed (%s): it may not survive a power loss",
                        db_path, catalog.version, type(exc).__name__)
            return
        catalog.version -= 1
        if not isinstance(after, OSError):
            raise  # the catalog on disk is the one before: nothing published
        catalog.unsettled = catalog.version + 1
        if not isinstance(exc, Exception):
            raise
        raise CatalogError(
            f"{path}: writing catalog version {catalog.version + 1} failed "
            f"({type(exc).__name__}: {exc}), and whether it was published is unknown: the "
            f"catalog cannot be looked at ({type(after).__name__}: {after})",
            hint="the change may or may not be committed; this connection reads the "
            "catalog again before its next statement, and the files the change wrote "
            "stay until then") from exc


def _save_remote(keyring: Keyring, catalog: Catalog, remote: Any) -> None:
    """:func:`save_catalog` at a URL: the object uploaded in place is published, even when
    the upload's reply was lost (the object's ETag shows it) or an interrupt came after
    it; an error raised then keeps ``catalog`` at the published version and ETag, so the
    caller does not undo a change that the catalog at the URL holds."""
    published: list[str] = []
    catalog.version += 1
    try:
        tag = remote.commit_sealed(CATALOG_FILE, catalog.to_json(), keyring, catalog.etag,
                                   on_published=published.append)
    except BaseException:
        if not published:
            catalog.version -= 1
            raise
        catalog.etag = published[0]
        raise  # (an interrupt) published: catalog.version stays, see Database._committing
    catalog.etag = tag


def _stamp_or_error(db_path: str) -> Any:
    """:func:`catalog_stamp`, or the ``OSError`` that looking at the catalog raised."""
    try:
        return catalog_stamp(db_path)
    except OSError as exc:
        return exc


def remove_catalog_temps(db_path: str) -> int:
    """Delete the temporaries of catalog writes that never published; returns how many.

    :func:`save_catalog` writes ``PATH/.catalog.<random>.cdtmp`` and renames it
    over the catalog; a writer killed in between leaves the temporary. Only the
    writer that holds the database's lock writes the catalog, so the caller must
    hold that lock: then no temporary can belong to a live writer.
    """
    removed = 0
    try:
        names = os.listdir(db_path)
    except FileNotFoundError:
        return 0
    for name in names:
        if name.startswith(f".{CATALOG_FILE}.") and name.endswith(".cdtmp"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(db_path, name))
                removed += 1
    return removed


def catalog_key_id(db_path: str, keyring: Keyring) -> int:
    """The key id in the header of the catalog at ``db_path`` (a directory), read now.

    Read again while it names no key of ``keyring`` and changes between reads: a
    rotation may be rewriting it in place (``cryptdisk.format.read_named_header``).
    """
    path = os.path.join(db_path, CATALOG_FILE)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_named_header(lambda: os.pread(fd, HEADER_SIZE, 0), path,
                                 names_known_key(keyring)).key_id
    finally:
        os.close(fd)


def catalog_stamp(db_path: str, remote: Any = None) -> Any:
    """A cheap token that changes whenever the catalog file is replaced."""
    if remote is not None:
        return remote.stamp(CATALOG_FILE)
    try:
        st = os.stat(os.path.join(db_path, CATALOG_FILE))
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)
