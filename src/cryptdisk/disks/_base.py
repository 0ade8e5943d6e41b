"""The Disk contract: where cryptdisk keeps files.

A disk maps relative POSIX-style paths (``"db/t/part-1.parquet"``) to files.
Every disk type (local, fsspec, encrypted, clickhouse) passes the one
conformance suite in ``tests/disks/conformance.py``.

Contract:

- **Atomic publish.** ``open_write(path)`` returns a writable binary file.
  Nothing is visible at ``path`` until ``close()`` returns; then the whole file
  is (durably, on disks that can fsync). An exception inside a ``with`` block,
  ``abort()``, or ``close()`` while an exception raised since the open is
  propagating (wrappers such as ``fsspec.open()`` close from ``__exit__``),
  discards it and leaves any previous file at ``path`` intact.
  A process killed while writing leaves the old state; stray temporary files
  are named ``.*.cdtmp`` and are never listed.
- **Positional reads.** ``open_read(path)`` returns a seekable binary file with
  ``pread(offset, size)`` that is safe to call from several threads at once
  (DuckDB reads one file object from many threads). ``size`` is the
  plaintext size. On encrypted disks every byte returned has authenticated.
- **Listing.** ``list(prefix)`` returns the published files whose path starts
  with ``prefix`` (``"dir/"`` lists a directory), sorted, as paths relative to
  the disk root.
- **Removal and rename.** ``remove(path)`` deletes a file (missing file:
  :class:`DiskFileNotFoundError`); ``rename(src, dst)`` replaces ``dst``
  atomically where the backing store can.
- Errors are :class:`cryptdisk.errors.CryptdiskError` subclasses;
  a missing file raises :class:`DiskFileNotFoundError` (a ``FileNotFoundError``).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import IO, Any

__all__ = ["Disk", "FileInfo"]


@dataclass(frozen=True)
class FileInfo:
    """What a disk knows about one file, without reading its data."""

    path: str
    size: int  # plaintext bytes
    stored_size: int  # bytes on the backing store
    encrypted: bool
    format: str  # "plain", "cryptdisk" or "clickhouse"
    key_id: int | None = None
    algorithm: str | None = None
    mtime: float | None = None  # seconds since the epoch, when the store knows it


class Disk(abc.ABC):
    """A place to keep files (see the module docstring for the contract)."""

    #: Name from the config (``[disks.NAME]``).
    name: str
    #: Type from the config: ``local``, ``fsspec``, ``encrypted``, ``clickhouse``.
    type: str

    @property
    @abc.abstractmethod
    def is_encrypted(self) -> bool:
        """True if files written through this disk are encrypted at rest."""

    @property
    @abc.abstractmethod
    def path(self) -> str:
        """Where the files live, for display (``system.disks.path``); never holds secrets."""

    @abc.abstractmethod
    def open_read(self, path: str) -> IO[bytes]:
        """A seekable binary file with thread-safe ``pread(offset, size)`` and ``size``."""

    @abc.abstractmethod
    def open_write(self, path: str) -> IO[bytes]:
        """A writable binary file, published atomically on ``close()``."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def info(self, path: str) -> FileInfo: ...

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]: ...

    @abc.abstractmethod
    def remove(self, path: str) -> None: ...

    @abc.abstractmethod
    def rename(self, src: str, dst: str) -> None: ...

    def read_bytes(self, path: str) -> bytes:
        with self.open_read(path) as f:
            return f.read()

    def write_bytes(self, path: str, data: bytes) -> None:
        with self.open_write(path) as f:
            f.write(data)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} type={self.type} path={self.path!r}>"

    def __reduce__(self) -> Any:
        raise TypeError("disks hold keys and cannot be pickled; reload them from the config")
