"""A database directory at an fsspec URL (``s3://bucket/db``): its catalog and pin.

The machines of a cluster without a shared file system open the same database
from an object store: its directory (``catalog``, ``pin``) is a prefix of the
store, its parts are on the config's disks (an encrypted disk over the same
store), its keys come from the config (key files on each machine, or a KMS),
never from the bucket. Each sealed file is fetched whole in one GET and
authenticated in memory, so a reader never mixes two versions of a file that
is replaced meanwhile. Credentials come from the environment, as for the fsspec
disk: ``storage_options`` and the URL may not hold them.

:func:`publish` puts a local database's catalog and pin there (its writer lock
held meanwhile), never behind a newer catalog. An object store has no lock: on
S3 a writer at the URL commits with an upload conditional on the catalog it read
(``If-Match`` on its ETag), so of two writers one wins and the other publishes
nothing; elsewhere a database at a URL is read-only.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable
from typing import Any

from ..errors import (
    AuthenticationError,
    CatalogError,
    ConfigError,
    DatabaseError,
    FormatError,
    PublishConflictError,
)
from ..format import (
    HEADER_SIZE,
    FileObjectSource,
    Header,
    Kind,
    SealedReader,
    SealedWriter,
    new_header,
    open_header,
)
from ..keys import Keyring

__all__ = ["PUBLISHED_FILE", "RemoteDirectory", "check_published", "is_url", "location",
           "publish", "seal"]


def is_url(path: Any) -> bool:
    """Whether ``path`` names a database by URL (``scheme://...``) rather than a local path."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def location(path: str | os.PathLike[str]) -> str:
    """The normalised name of a database: its URL without a trailing ``/``, or an
    absolute local path. A URL holding credentials, a query or a fragment is refused
    (:class:`~cryptdisk.errors.ConfigError`, which does not quote it) before anything
    else can show it."""
    text = os.fspath(path)
    if is_url(text):
        _check_url(text)
        return text.rstrip("/")
    if text.startswith("file://"):
        text = text[len("file://"):]
    return os.path.abspath(text)


def _check_url(url: str) -> None:
    from ..disks import check_url

    check_url(url, "a database URL")
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
        self._disk.fs.invalidate_cache(self._full(name))  # never a listing's old ETag
        try:
            info = self._disk.fs.info(self._full(name))
        except FileNotFoundError:
            return None
        return tuple(sorted((str(k), str(v)) for k, v in info.items()))

    def stamp_of(self, name: str, etag: str | None) -> Any:
        """:meth:`stamp` of ``name`` if it is still the object with ``etag``, else None."""
        stamp = self.stamp(name)
        tags = [v for k, v in stamp or () if k.lower() == "etag"]
        return stamp if etag is not None and tags and tags[0].strip('"') == etag else None

    def etag(self, name: str) -> str | None:
        """The ETag of object ``name`` without quotes (None: absent, or none given)."""
        self._disk.fs.invalidate_cache(self._full(name))
        try:
            info = self._disk.fs.info(self._full(name))
        except FileNotFoundError:
            return None
        tag = info.get("ETag") or info.get("etag")
        return tag.strip('"') if isinstance(tag, str) else None

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
        return None if data is None else self.open_sealed(name, data, keyring)

    def open_sealed(self, name: str, data: bytes, keyring: Keyring) -> bytes:
        """The authenticated plaintext of ``data``, the stored bytes of sealed file ``name``."""
        where = f"{self.url}/{name}"
        header = Header.parse(data[:HEADER_SIZE], where)
        dek = open_header(header, keyring, where)
        reader = SealedReader(FileObjectSource(io.BytesIO(data)), header, dek, where)
        return reader.read_at(0, reader.size)

    def read_tagged(self, name: str) -> tuple[bytes | None, str | None]:
        """The bytes of ``name`` and the S3 ETag of exactly those bytes (None, None: absent).

        The ETag is only known on S3 for an object uploaded in one PUT (its MD5, as
        every file :meth:`write_bytes` writes): elsewhere it is None.
        """
        for _attempt in range(5):
            data = self.read_bytes(name)
            if data is None or not self._conditional:
                return data, None
            tag = self.etag(name)
            if tag is not None and tag == hashlib.md5(
                    data, usedforsecurity=False).hexdigest():
                return data, tag
        raise DatabaseError(f"{self.url}/{name} keeps changing while it is read",
                            hint="another process publishes there; try again")

    @property
    def _conditional(self) -> bool:
        protocol = self._disk.fs.protocol
        return "s3" in (protocol if isinstance(protocol, tuple) else (protocol,))

    @property
    def conditional(self) -> bool:
        """Whether uploads here can be conditional (S3's If-Match / If-None-Match)."""
        return self._conditional

    def commit_sealed(self, name: str, plaintext: bytes, keyring: Keyring,
                      replaces: str | None,
                      on_published: Callable[[str], None] | None = None) -> str:
        """Seal ``plaintext`` and upload it as ``name`` if the object is still the one
        whose ETag is ``replaces``; returns the new ETag.

        Published means the object is the one uploaded, whatever the upload raised: an
        upload whose reply was lost but which landed returns as one that succeeded, and
        an interrupt after it landed calls ``on_published(etag)`` (as a return does)
        before it propagates. An error means it was not published, except a
        :class:`~cryptdisk.errors.DatabaseError` saying the store could not tell.
        """
        if replaces is None or not self._conditional:
            raise DatabaseError(f"{self.url}/{name}: a commit here must be conditional on "
                                "the catalog it read (an ETag from S3)")
        data = seal(plaintext, keyring)
        tag = hashlib.md5(data, usedforsecurity=False).hexdigest()
        try:
            self.write_bytes(name, data, replaces=replaces)
        except BaseException as exc:
            if not isinstance(exc, Exception) and self._outcome(name, tag, replaces) == "landed":
                if on_published is not None:
                    on_published(tag)
            raise
        if on_published is not None:
            on_published(tag)
        return tag

    def _outcome(self, name: str, tag: str, replaces: str | None) -> str:
        """After an upload of ``name`` (ETag ``tag``) that raised: ``landed``, ``kept`` (the
        object is still ``replaces``', or absent for a new one), ``other`` (another
        writer's), or ``unknown`` (the store did not answer)."""
        try:
            now = self.etag(name)
        except Exception:
            return "unknown"
        if now == tag:
            return "landed"
        return "kept" if now == replaces else "other"

    def write_bytes(self, name: str, data: bytes, *, replaces: str | None = None,
                    new: bool = False) -> None:
        """Replace ``name`` with ``data`` in one upload (an object store publishes it whole).

        On S3, ``replaces`` (an ETag) makes the upload conditional on the object still
        being that one (``If-Match``), ``new`` on there being none (``If-None-Match``):
        a lost race raises :class:`~cryptdisk.errors.PublishConflictError` and changes
        nothing. An upload that raised is checked against the object's ETag: one that
        landed (its reply lost) returns; one the store cannot say about raises a
        :class:`~cryptdisk.errors.DatabaseError` that says so.
        """
        if not self._conditional or (replaces is None and not new):
            with self._disk.open_write(name) as f:
                f.write(data)
            return
        condition = {"IfMatch": f'"{replaces}"'} if replaces is not None else {}
        try:
            self._disk.fs.pipe_file(self._full(name), data, mode="create" if new else
                                    "overwrite", **condition)
        except Exception as exc:
            outcome = self._outcome(name, hashlib.md5(data, usedforsecurity=False).hexdigest(),
                                    replaces)
            if outcome == "landed":
                return  # it landed (an answer lost, or a retry of an upload that had)
            if outcome == "other":
                raise PublishConflictError(
                    f"{self.url}/{name} was replaced by another process meanwhile; nothing "
                    "was overwritten", hint="try again: the newer catalog is checked first"
                ) from None
            if outcome == "unknown":
                raise DatabaseError(
                    f"{self.url}/{name}: the upload failed ({type(exc).__name__}) and the "
                    "store did not answer whether it landed: it may be published",
                    hint="read it again before repeating the change") from None
            raise DatabaseError(f"{self.url}/{name}: the upload failed: {exc}") from None


def seal(plaintext: bytes, keyring: Keyring) -> bytes:
    """``plaintext`` as the bytes of a sealed file under the keyring's current key."""
    out = io.BytesIO()
    header, dek = new_header(Kind.SEALED, keyring.current_key())
    writer = SealedWriter(out, header, dek)
    writer.write(plaintext)
    writer.close()
    return out.getvalue()


def publish(db: Any, url: str, storage_options: dict[str, Any] | None = None) -> int:
    """Copy the catalog and pin of the open, writable database ``db`` to ``url``.

    Refuses a destination that holds another database's catalog, a newer version
    of this one's (the copy would roll it back) or another catalog of the same
    version (a diverged copy). The catalog goes first, then the pin (never ahead
    of the catalog). On S3 the catalog's upload is conditional on the catalog
    checked being still there (``If-Match``, or ``If-None-Match`` for the first
    publish): of two processes publishing at once, one wins and the other gets
    :class:`~cryptdisk.errors.PublishConflictError`, having overwritten nothing.
    Returns the version published.
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
    with open(os.path.join(db.path, CATALOG_FILE), "rb") as f:
        catalog = f.read()
    stored, tag = remote.read_tagged(CATALOG_FILE)
    if stored is not None:
        try:
            there = remote.open_sealed(CATALOG_FILE, stored, db.keyring)
        except (AuthenticationError, FormatError) as exc:
            raise CatalogError(f"publish: {url}/{CATALOG_FILE} cannot be trusted: {exc}",
                               hint="check who else writes there; delete it to publish "
                               "anew") from None
        other = Catalog.from_json(there, f"{url}/{CATALOG_FILE}")
        if other.db_id != db.catalog.db_id:
            raise DatabaseError(f"publish: {url} holds another database ({other.db_id}, "
                                f"not {db.catalog.db_id})", hint="publish to a new prefix")
        if other.version > db.catalog.version:
            raise DatabaseError(f"publish: {url} holds version {other.version} of the catalog, "
                                f"newer than this one's {db.catalog.version}; refusing to "
                                "roll it back")
        if other.version == db.catalog.version and stored != catalog:
            raise DatabaseError(f"publish: {url} holds another catalog of version "
                                f"{other.version}: it was published from another copy of "
                                "this database, which has diverged from this one")
        last = _published(db.path).get(url, {}).get("version")
        ours = {p.id for t in db.catalog.tables.values() for p in t.parts}
        ours |= {t.id for t in db.catalog.tables.values()}
        if (other.version > last) if isinstance(last, int) else any(
                t.id not in ours or any(p.id not in ours for p in t.parts)
                for t in other.tables.values()):
            raise DatabaseError(
                f"publish: {url} holds commits this copy does not have (catalog version "
                f"{other.version}" + (f", this copy published {last})" if last is not None
                                      else ", with parts this copy does not name)") +
                "; publishing would lose them", hint="write at the URL instead")
    pin_path = os.path.join(db.path, PIN_FILE)
    pin = None
    if os.path.exists(pin_path):
        with open(pin_path, "rb") as f:
            pin = f.read()
    if stored != catalog:
        remote.write_bytes(CATALOG_FILE, catalog, replaces=tag, new=stored is None)
    if pin is not None:
        remote.write_bytes(PIN_FILE, pin)
    _record_publish(db.path, url, storage_options, db.catalog.version)
    return int(db.catalog.version)


#: In a local database published to a URL: where (see :func:`check_published`).
PUBLISHED_FILE = "published"


def _published(db_path: str) -> dict[str, Any]:
    """URL -> ``{"storage_options", "version"}`` of each publish of the local database."""
    path = os.path.join(db_path, PUBLISHED_FILE)
    try:
        with open(path) as f:
            doc = json.load(f)
        if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
            raise ValueError("not a table of URLs")
        return doc
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise DatabaseError(f"{path} cannot be read ({exc})",
                            hint="delete it to detach this copy from the store") from None


def _record_publish(db_path: str, url: str, storage_options: dict[str, Any] | None,
                    version: int) -> None:
    doc = _published(db_path)  # URLs and options without credentials (checked)
    doc[url] = {"storage_options": storage_options or {}, "version": version}
    path = os.path.join(db_path, PUBLISHED_FILE)
    tmp = path + ".cdtmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def check_published(db: Any) -> None:
    """Refuse to write to a local copy whose store has commits made there.

    Writers at the URL commit there; their parts are on the disks this copy shares,
    named for versions beyond the published catalog's, and this copy's commits would
    take them for a dead writer's and delete them. So a writer of a local database
    published to a URL first checks that the catalog there is still the version this
    copy published.
    """
    from ._catalog import CATALOG_FILE, Catalog

    path = os.path.join(db.path, PUBLISHED_FILE)
    for url, where in _published(db.path).items():
        detach = (f"write at {url} instead; or, if that copy is abandoned, remove it from "
                  f"{path} (delete the file to detach this copy from every store)")
        try:
            stored = RemoteDirectory(url, dict(where.get("storage_options") or {})
                                     ).read_sealed(CATALOG_FILE, db.keyring)
        except (OSError, AuthenticationError, FormatError, ConfigError) as exc:
            raise DatabaseError(f"{db.path} was published to {url}, whose catalog cannot be "
                                f"read ({exc}); refusing to write a copy that may be behind "
                                "it", hint=detach) from None
        if stored is None:
            continue
        there = Catalog.from_json(stored, f"{url}/{CATALOG_FILE}")
        last = where.get("version")
        if there.db_id == db.catalog.db_id and isinstance(last, int) and there.version > last:
            raise CatalogError(
                f"{db.path} was published to {url} at version {last}, and "
                f"the catalog there is at version {there.version}, ahead of this copy's "
                f"publish: refusing to write (nothing was deleted)", hint=detach)
