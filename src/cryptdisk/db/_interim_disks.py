"""A minimal stand-in for ``cryptdisk.disks`` and ``cryptdisk.config`` (interim).

The real disks, storage policies and config loader are built on another
branch. Until they land, the database uses these two local disk types over the
:class:`cryptdisk.disks._base.Disk` contract and a tiny TOML loader. Only
:mod:`cryptdisk.db._storage` imports this module, so swapping in the real
``cryptdisk.disks`` is a change of a few lines there.

Config stand-in (TOML)::

    [keyring]                      # as cryptdisk.Keyring.from_config reads it
    ...
    [disks.secure]
    type = "encrypted"             # or "local" (plaintext)
    path = "data/secure"           # relative to the config file

    [policies.default]             # the policy new tables use
    volumes = [{ name = "main", disks = ["secure"] }]
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import tomllib
from dataclasses import dataclass, field
from typing import IO, Any

from .. import open as cd_open
from ..disks._base import Disk, FileInfo
from ..errors import ConfigError, DiskError, DiskFileNotFoundError, NotEncryptedError
from ..format import HEADER_SIZE, Header
from ..keys import Keyring, rewrap_file

__all__ = ["Config", "EncryptedLocalDisk", "LocalDisk", "StoragePolicy", "Volume", "load_config"]


class _PlainReader:
    """A local file with a thread-safe ``pread`` and ``size``."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "rb")
        self.size = os.fstat(self._f.fileno()).st_size
        self.name = path

    def pread(self, offset: int, size: int) -> bytes:
        return os.pread(self._f.fileno(), size, offset)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> _PlainReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


class _AtomicWriter:
    """Write to ``.NAME.XXXX.cdtmp``, fsync and rename over the destination on close."""

    def __init__(self, path: str) -> None:
        directory = os.path.dirname(path)
        fd, self._tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".cdtmp",
                                         dir=directory)
        self._f = os.fdopen(fd, "wb")
        self._path = path
        self.closed = False

    def write(self, data: Any) -> int:
        return self._f.write(data)

    def tell(self) -> int:
        return self._f.tell()

    def flush(self) -> None:
        self._f.flush()

    def writable(self) -> bool:
        return True

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self._f.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            os.replace(self._tmp, self._path)
            _fsync_dir(os.path.dirname(self._path))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            raise

    def __enter__(self) -> _AtomicWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalDisk(Disk):
    """Plain files under a local directory."""

    type = "local"

    def __init__(self, name: str, root: str) -> None:
        self.name = name
        self._root = os.path.abspath(root)

    @property
    def is_encrypted(self) -> bool:
        return False

    @property
    def path(self) -> str:
        return self._root

    def local_path(self, path: str) -> str:
        """The OS path of ``path`` (lets pyarrow read plain parts natively)."""
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise DiskError(f"invalid path {path!r} on disk {self.name!r}")
        return os.path.join(self._root, *parts)

    def open_read(self, path: str) -> IO[bytes]:
        try:
            return _PlainReader(self.local_path(path))  # type: ignore[return-value]
        except FileNotFoundError:
            raise DiskFileNotFoundError(f"{path}: no such file on disk {self.name!r}") from None

    def open_write(self, path: str) -> IO[bytes]:
        full = self.local_path(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        return _AtomicWriter(full)  # type: ignore[return-value]

    def exists(self, path: str) -> bool:
        return os.path.isfile(self.local_path(path))

    def info(self, path: str) -> FileInfo:
        try:
            size = os.stat(self.local_path(path)).st_size
        except FileNotFoundError:
            raise DiskFileNotFoundError(f"{path}: no such file on disk {self.name!r}") from None
        return FileInfo(path, size, size, False, "plain")

    def list(self, prefix: str = "") -> list[str]:
        base = self.local_path(prefix) if prefix else self._root
        out: list[str] = []
        for root, _dirs, files in os.walk(base):
            for f in files:
                if f.endswith(".cdtmp"):
                    continue
                out.append(os.path.relpath(os.path.join(root, f), self._root).replace(os.sep, "/"))
        return sorted(out)

    def remove(self, path: str) -> None:
        try:
            os.unlink(self.local_path(path))
        except FileNotFoundError:
            raise DiskFileNotFoundError(f"{path}: no such file on disk {self.name!r}") from None

    def rename(self, src: str, dst: str) -> None:
        full = self.local_path(dst)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        os.replace(self.local_path(src), full)

    def remove_stale_temporaries(self, prefix: str = "") -> int:
        """Delete ``.*.cdtmp`` files left by a killed writer; returns how many."""
        base = self.local_path(prefix) if prefix else self._root
        count = 0
        for root, _dirs, files in os.walk(base):
            for f in files:
                if f.startswith(".") and f.endswith(".cdtmp"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(root, f))
                        count += 1
        return count


class EncryptedLocalDisk(LocalDisk):
    """Sealed cryptdisk files under a local directory, under a keyring."""

    type = "encrypted"

    def __init__(self, name: str, root: str, keyring: Keyring) -> None:
        super().__init__(name, root)
        self._keyring = keyring

    @property
    def is_encrypted(self) -> bool:
        return True

    def open_read(self, path: str) -> IO[bytes]:
        try:
            return cd_open(self.local_path(path), "rb", keyring=self._keyring)  # type: ignore[return-value]
        except FileNotFoundError:
            raise DiskFileNotFoundError(f"{path}: no such file on disk {self.name!r}") from None

    def open_write(self, path: str) -> IO[bytes]:
        full = self.local_path(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        return cd_open(full, "wb", keyring=self._keyring)  # type: ignore[return-value]

    def info(self, path: str) -> FileInfo:
        full = self.local_path(path)
        try:
            stored = os.stat(full).st_size
            with open(full, "rb") as f:
                header = Header.parse(f.read(HEADER_SIZE), full)
        except FileNotFoundError:
            raise DiskFileNotFoundError(f"{path}: no such file on disk {self.name!r}") from None
        with self.open_read(path) as f:
            size = f.size  # type: ignore[attr-defined]
        return FileInfo(path, size, stored, True, "cryptdisk", header.key_id,
                        header.algorithm.label)

    def rewrap(self, path: str) -> bool:
        """Rewrap one file's header under the keyring's current key (see keys.rewrap_file)."""
        try:
            return rewrap_file(self.local_path(path), self._keyring)
        except NotEncryptedError:
            raise DiskError(f"{path} on encrypted disk {self.name!r} is not encrypted") from None


@dataclass
class Volume:
    name: str
    disks: list[Disk]


@dataclass
class StoragePolicy:
    name: str
    volumes: list[Volume]

    @property
    def disk(self) -> Disk:
        """The disk new parts go to (first disk of the first volume)."""
        return self.volumes[0].disks[0]


@dataclass
class Config:
    keyring: Keyring
    disks: dict[str, Disk] = field(default_factory=dict)
    policies: dict[str, StoragePolicy] = field(default_factory=dict)
    path: str | None = None


def load_config(path: str | os.PathLike[str]) -> Config:
    """Load the TOML config described in the module docstring."""
    name = os.fspath(path)
    keyring = Keyring.from_config(name)
    with open(name, "rb") as f:
        data = tomllib.load(f)
    base = os.path.dirname(os.path.abspath(name))
    disks: dict[str, Disk] = {}
    for dname, spec in (data.get("disks") or {}).items():
        if not isinstance(spec, dict) or not isinstance(spec.get("path"), str):
            raise ConfigError(f"disk {dname!r} needs a path", path=name, where=f"[disks.{dname}]")
        root = os.path.join(base, os.path.expanduser(spec["path"]))
        kind = spec.get("type", "local")
        if kind == "local":
            disks[dname] = LocalDisk(dname, root)
        elif kind == "encrypted":
            disks[dname] = EncryptedLocalDisk(dname, root, keyring)
        else:
            raise ConfigError(f"disk {dname!r}: unknown type {kind!r} (local, encrypted)",
                              path=name, where=f"[disks.{dname}]")
    policies: dict[str, StoragePolicy] = {}
    for pname, spec in (data.get("policies") or {}).items():
        volumes = []
        for i, vol in enumerate(spec.get("volumes") or []):
            names = vol.get("disks") or []
            missing = [d for d in names if d not in disks]
            if missing or not names:
                raise ConfigError(f"policy {pname!r} names unknown disk(s) {missing or '(none)'}",
                                  path=name, where=f"[policies.{pname}]")
            volumes.append(Volume(vol.get("name", f"v{i}"), [disks[d] for d in names]))
        if not volumes:
            raise ConfigError(f"policy {pname!r} has no volumes", path=name,
                              where=f"[policies.{pname}]")
        policies[pname] = StoragePolicy(pname, volumes)
    return Config(keyring, disks, policies, name)
