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
  atomically where the backing store can. A directory is not a file:
  ``open_read``, ``remove`` or ``rename`` of one raises
  :class:`DiskFileNotFoundError` or :class:`DiskIsADirectoryError`, naming the
  path as the caller gave it (never a backing disk's stored path).
- Errors are :class:`cryptdisk.errors.CryptdiskError` subclasses;
  a missing file raises :class:`DiskFileNotFoundError` (a ``FileNotFoundError``).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..errors import ConfigError
    from ..keys import Key

__all__ = [
    "Discardable",
    "Disk",
    "DiskConfig",
    "FileInfo",
    "PositionalRead",
    "discardable",
    "positional",
]


@runtime_checkable
class PositionalRead(Protocol):
    """What a file from :meth:`Disk.open_read` offers beside ``IO[bytes]`` (see
    *Positional reads* above): its plaintext ``size`` and a ``pread`` safe across threads."""

    @property
    def size(self) -> int: ...

    def pread(self, offset: int, size: int) -> bytes: ...


@runtime_checkable
class Discardable(Protocol):
    """What a file from :meth:`Disk.open_write` offers beside ``IO[bytes]`` (see *Atomic
    publish* above): ``abort()`` discards what was written."""

    def abort(self) -> None: ...


def positional(f: IO[bytes]) -> PositionalRead:
    """``f``, a file a disk's ``open_read`` returned, as its :class:`PositionalRead` side;
    ``TypeError`` for a file that does not keep the contract."""
    if not isinstance(f, PositionalRead):
        raise TypeError(f"{type(f).__name__} has no size and pread: not a disk's read file")
    return f


def discardable(f: IO[bytes]) -> Discardable:
    """``f``, a file a disk's ``open_write`` returned, as its :class:`Discardable` side;
    ``TypeError`` for a file that does not keep the contract."""
    if not isinstance(f, Discardable):
        raise TypeError(f"{type(f).__name__} has no abort(): not a disk's write file")
    return f


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


class DiskConfig(Protocol):
    """What a disk type's :meth:`Disk.from_config` may ask of the config being loaded.

    :func:`cryptdisk.config.load_config` provides it; ``where`` names the place in
    the file (a line, an XML element) for messages.
    """

    path: str  # the config file
    base: str  # its directory: relative paths start here

    def error(self, message: str, where: str, hint: str | None = None) -> ConfigError:
        """A :class:`ConfigError` naming the file and ``where`` (to raise)."""

    def string(self, spec: Mapping[str, Any], key: str, where: str,
               default: str | None = None) -> str:
        """``spec[key]``, which must be a string (or ``default``), else an error."""

    def disk(self, name: str, referrer: str) -> Disk:
        """The disk named ``name``, built first if needed (for disks over other disks)."""

    def key_entries(self, name: str, spec: Mapping[str, Any], where: str,
                    sizes: tuple[int, ...]) -> Sequence[tuple[int, str, bytes | Key]]:
        """The disk's keys: ``(id, source, material)`` for entries, ``(id, "keyring", Key)``
        for ids of the config's keyring."""

    def current_key_id(self, name: str, spec: Mapping[str, Any], where: str,
                       ids: list[int]) -> int:
        """``current_key_id`` of the disk, or the keyring's, or the only id."""


class Disk(abc.ABC):
    """A place to keep files (see the module docstring for the contract)."""

    #: Name from the config (``[disks.NAME]``).
    name: str
    #: Type from the config: ``local``, ``fsspec``, ``encrypted``, ``clickhouse``.
    type: str
    #: The settings a disk of this type takes in a config, ``type`` included.
    config_settings: ClassVar[frozenset[str]] = frozenset({"type"})

    @classmethod
    def from_config(cls, name: str, spec: Mapping[str, Any], where: str,
                    config: DiskConfig) -> Disk:
        """A disk of this type from its config table ``spec`` (settings already checked
        against :attr:`config_settings`); raises ``config.error(...)`` for a bad value.

        :data:`cryptdisk.disks.DISK_TYPES` maps each config ``type`` to its class.
        """
        raise config.error(f"disk {name!r}: type {cls.type!r} cannot be configured", where)

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
