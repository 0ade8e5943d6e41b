"""A database directory at an fsspec URL (``s3://bucket/db``): its catalog and pin, read-only.

The machines of a cluster without a shared file system open the same database
from an object store: its directory (``catalog``, ``pin``) is a prefix of the
store, its parts are on the config's disks (an encrypted disk over the same
store), its keys come from the config (key files on each machine, or a KMS),
never from the bucket. Each sealed file is fetched whole in one GET and
authenticated in memory, so a reader never mixes two versions of a file that
is replaced meanwhile. Credentials come from the environment, as for the fsspec
disk: ``storage_options`` and the URL may not hold them.

A database on a URL is opened read-only: an object store has no lock, so
:func:`publish` copies a local database's directory there (its writer lock held
meanwhile), never behind a newer catalog.
"""

from __future__ import annotations

import io
import os
from typing import Any

from ..errors import ConfigError, DatabaseError
from ..format import HEADER_SIZE, FileObjectSource, Header, SealedReader, open_header
from ..keys import Keyring

__all__ = ["RemoteDirectory", "is_url", "location", "publish"]


def is_url(path: Any) -> bool:
    """Whether ``path`` names a database by URL (``scheme://...``) rather than a local path."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def location(path: str | os.PathLike[str]) -> str:
    """The normalised name of a database: its URL without a trailing ``/``, or an
    absolute local path."""
    text = os.fspath(path)
    if is_url(text):
        return text.rstrip("/")
    if text.startswith("file://"):
        text = text[len("file://"):]
    return os.path.abspath(text)


def _check_url(url: str) -> None:
    netloc = url.partition("://")[2].partition("/")[0]
    if "@" in netloc:
        raise ConfigError("a database URL may not hold credentials (user:password@)",
                          hint="set them in the environment (AWS_ACCESS_KEY_ID, "
                          "AWS_SECRET_ACCESS_KEY, ...) or the store's credential file")
    if "?" in url or "#" in url:
        raise ConfigError("a database URL may not hold a query or fragment",
                          hint="give options in storage_options (never credentials)")


class RemoteDirectory:
    """The files of a database directory under an fsspec URL (see the module docstring)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        from ..disks import FsspecDisk

        _check_url(url)
        self.url = url
        self._disk = FsspecDisk("database", url, dict(storage_options or {}))

    def __repr__(self) -> str:
        return f"<RemoteDirectory {self._disk.path!r}>"

    def _full(self, name: str) -> str:
        return f"{self._disk.root}/{name}"

    def exists(self, name: str) -> bool:
        return self._disk.exists(name)

    def stamp(self, name: str) -> Any:
        """A token that changes whenever the object ``name`` is replaced (None: absent)."""
        try:
            info = self._disk.fs.info(self._full(name))
        except FileNotFoundError:
            return None
        return (info.get("ETag") or info.get("etag"), info.get("LastModified")
                or info.get("mtime"), info.get("size"))

    def read_bytes(self, name: str) -> bytes | None:
        """The stored bytes of ``name`` (one GET), or None if there is none."""
        try:
            return bytes(self._disk.fs.cat_file(self._full(name)))
        except FileNotFoundError:
            return None

    def read_sealed(self, name: str, keyring: Keyring) -> bytes | None:
        """The authenticated plaintext of sealed file ``name``, or None if there is none.

        Raises the format's errors (:class:`~cryptdisk.errors.AuthenticationError`,
        :class:`~cryptdisk.errors.FormatError`) for a file that does not authenticate.
        """
        data = self.read_bytes(name)
        if data is None:
            return None
        where = f"{self.url}/{name}"
        header = Header.parse(data[:HEADER_SIZE], where)
        dek = open_header(header, keyring, where)
        reader = SealedReader(FileObjectSource(io.BytesIO(data)), header, dek, where)
        return reader.read_at(0, reader.size)

    def write_bytes(self, name: str, data: bytes) -> None:
        """Replace ``name`` with ``data`` in one upload (an object store publishes it whole)."""
        with self._disk.open_write(name) as f:
            f.write(data)


def publish(db: Any, url: str, storage_options: dict[str, Any] | None = None) -> int:
    """Copy the catalog and pin of the open, writable database ``db`` to ``url``.

    Refuses a destination that holds another database's catalog, or a newer
    version of this one's (the copy would roll it back). The catalog goes first,
    then the pin (never ahead of the catalog). Returns the version published.
    """
    from ._catalog import CATALOG_FILE, Catalog
    from ._rollback import PIN_FILE

    if db.own_keys:
        raise DatabaseError(
            "publish: the database was made without a config: its parts are in its directory "
            "and its key beside it, which the copy does not take (a key never goes in the "
            "bucket)", hint="make the database with a config whose disks are on the store "
            "(an encrypted disk over an fsspec disk) and whose keys are on each machine or in "
            "a KMS")
    if db.read_only:
        raise DatabaseError("publish: open the database for writing (its lock keeps "
                            "commits out during the copy)")
    if not is_url(url):
        raise DatabaseError(f"publish: {url!r} is not a URL (s3://bucket/prefix, ...)")
    url = location(url)
    remote = RemoteDirectory(url, storage_options)
    db.refresh()
    there = remote.read_sealed(CATALOG_FILE, db.keyring)
    if there is not None:
        other = Catalog.from_json(there, f"{url}/{CATALOG_FILE}")
        if other.db_id != db.catalog.db_id:
            raise DatabaseError(f"publish: {url} holds another database ({other.db_id}, "
                                f"not {db.catalog.db_id})", hint="publish to a new prefix")
        if other.version > db.catalog.version:
            raise DatabaseError(f"publish: {url} holds version {other.version} of the catalog, "
                                f"newer than this one's {db.catalog.version}; refusing to "
                                "roll it back")
    with open(os.path.join(db.path, CATALOG_FILE), "rb") as f:
        catalog = f.read()
    pin_path = os.path.join(db.path, PIN_FILE)
    pin = None
    if os.path.exists(pin_path):
        with open(pin_path, "rb") as f:
            pin = f.read()
    remote.write_bytes(CATALOG_FILE, catalog)
    if pin is not None:
        remote.write_bytes(PIN_FILE, pin)
    return int(db.catalog.version)

