"""``cryptdisk://DISK/path``: an fsspec filesystem over the disks of a config.

Every Python data tool that speaks fsspec reads and writes encrypted data
through it (DuckDB, pyarrow, pandas, Dask; Polars through pyarrow datasets or
file objects)::

    fs = fsspec.filesystem("cryptdisk", config="cryptdisk.toml")
    pd.read_parquet("cryptdisk://secure/t.parquet", storage_options={"config": "cryptdisk.toml"})

The filesystem takes **a config path, never key material** (or reads the
path from ``CRYPTDISK_CONFIG``): fsspec caches instances by their arguments
and pickles them to send them to workers, so the only thing that travels is
the path, and each process loads the keys from it.

Reads are positional and thread-safe (DuckDB shares one file object between
threads; each thread keeps its own position). Writes are published
atomically on ``close()``. Directories are implicit, as in object stores:
``mkdir`` does nothing and a directory exists while it holds a file.
"""

from __future__ import annotations

import bisect
import datetime as _dt
import io
import os
import posixpath
import sys
from glob import has_magic
from typing import Any

from fsspec import AbstractFileSystem

from .config import Config, load_config
from .disks import Disk, discardable, positional
from .errors import (
    ConfigError,
    DiskError,
    DiskFileNotFoundError,
    DiskIsADirectoryError,
    PolicyError,
)
from .keys import file_stamp

__all__ = ["CryptdiskFileSystem"]

#: Options fsspec itself understands; anything else is refused (it might be a secret).
_FSSPEC_OPTIONS = {"skip_instance_cache", "use_listings_cache", "listings_expiry_time",
                   "max_paths", "asynchronous", "loop"}
#: The keyword :meth:`CryptdiskFileSystem.mv` passes through fsspec's ``copy`` to ``cp_file``.
_MOVE = "cryptdisk_move"


def _called_by_block_cache(frame: Any) -> bool:
    """Whether ``frame`` is fsspec's ``blockcache::`` opening a file of the layer below."""
    if frame.f_code.co_name != "_open":
        return False
    from fsspec.implementations.cached import CachingFileSystem

    return frame.f_code is CachingFileSystem._open.__code__


def _block_cache_refused(path: str) -> DiskError:
    """fsspec's ``blockcache::`` keeps the byte ranges it reads in a sparse file of its
    ``cache_storage``: over ``cryptdisk://`` those are the decrypted bytes."""
    return DiskError(
        f"blockcache::cryptdisk://{path}: fsspec's blockcache would write the byte ranges "
        "it reads, decrypted, to its cache directory; cryptdisk:// refuses it",
        hint="read cryptdisk:// directly: encrypted disks cache decrypted reads in process "
        "memory (cache_mb); simplecache:: and filecache:: keep whole decrypted files on "
        "disk, so give them a cache_storage on an encrypted volume")


class CryptdiskFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """fsspec filesystem for ``cryptdisk://DISK/path`` URLs (see the module docstring)."""

    protocol = "cryptdisk"
    root_marker = ""

    def __init__(self, config: str | os.PathLike[str] | None = None, **options: Any) -> None:
        unknown = set(options) - _FSSPEC_OPTIONS
        if unknown:
            raise TypeError(
                f"unexpected option(s) {', '.join(sorted(unknown))}: the cryptdisk filesystem "
                "takes only config=PATH; keys and credentials belong in the config file or "
                "the environment, never in storage_options")
        path = config if config is not None else os.environ.get("CRYPTDISK_CONFIG")
        if path is not None and not isinstance(path, str | os.PathLike):
            raise TypeError(f"config must be the path of a cryptdisk config file, not "
                            f"{type(path).__name__} (a loaded config holds keys; fsspec "
                            "caches and pickles the filesystem's arguments)")
        if not path:
            raise ConfigError("no config: pass config=PATH (storage_options={'config': PATH}) "
                              "or set CRYPTDISK_CONFIG")
        super().__init__(**options)
        self.config_path = os.path.abspath(os.fspath(path))
        self._config_stamp = file_stamp(self.config_path)
        self._config: Config = load_config(self.config_path)
        # What fsspec pickles and tokenises: the path only.
        self.storage_options = {"config": self.config_path, **options}

    @property
    def config(self) -> Config:
        """The config, loaded again when its file has changed since (a key rotated:
        another current key, a key removed): fsspec keeps one instance per config path
        for the life of the process (a Dask worker's), which would otherwise write new
        files under the old current key and keep reading with a removed one."""
        stamp = file_stamp(self.config_path)
        if stamp != self._config_stamp:
            self._config = load_config(self.config_path)  # raises: checked again next time
            self._config_stamp = stamp
        return self._config

    def __reduce__(self) -> Any:
        # Unpickling loads the config again by path; no key is ever serialised.
        return _reload, (self.config_path,)

    def __repr__(self) -> str:
        return f"<CryptdiskFileSystem config={self.config_path!r}>"

    # -- paths -----------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]  # type: ignore[return-value]
        text = os.fspath(path) if not isinstance(path, str) else path
        if text.startswith("cryptdisk://"):
            text = text[len("cryptdisk://"):]
        elif text.startswith("cryptdisk:"):
            text = text[len("cryptdisk:"):]
        return text.strip("/")

    def _split(self, path: str) -> tuple[Disk, str]:
        clean = self._strip_protocol(path)
        name, _, rest = clean.partition("/")
        if not name:
            raise IsADirectoryError(f"cryptdisk://: name a disk (disks: "
                                    f"{', '.join(sorted(self.config.disks))})")
        if name not in self.config.disks:
            if "@" in name:  # (not quoted: it may hold a password)
                raise ConfigError("a cryptdisk:// URL names a disk of the config, never "
                                  "credentials (user:password@)",
                                  hint="keys and credentials belong in the config file or "
                                  "the environment")
            # Not a FileNotFoundError: pyarrow (pandas, Dask) would report it as the bare
            # path, and the reader would never learn that the disk name is the problem.
            raise PolicyError(f"cryptdisk://{clean}: no disk named {name!r} in "
                              f"{self.config_path} (disks: {', '.join(sorted(self.config.disks))})",
                              hint="a cryptdisk:// URL is cryptdisk://DISK/PATH, DISK a disk "
                              "of the config")
        return self.config.disks[name], rest

    # -- listing and metadata --------------------------------------------------------------

    def _file_entry(self, disk: Disk, rel: str) -> dict[str, Any]:
        info = disk.info(rel)
        return {"name": f"{disk.name}/{rel}", "size": info.size, "type": "file",
                "mtime": info.mtime, "encrypted": info.encrypted, "format": info.format}

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        clean = self._strip_protocol(path)
        if not clean:
            entries = [{"name": n, "size": 0, "type": "directory"} for n in sorted(
                self.config.disks)]
            return entries if detail else [e["name"] for e in entries]
        disk, rel = self._split(clean)
        if rel and disk.exists(rel):
            entries = [self._file_entry(disk, rel)]
            return entries if detail else [e["name"] for e in entries]
        prefix = rel + "/" if rel else ""
        files = disk.list(prefix)
        if rel and not files:
            raise FileNotFoundError(f"cryptdisk://{clean}: no such file or directory")
        out: dict[str, dict[str, Any]] = {}
        for f in files:
            child = f[len(prefix):].split("/", 1)
            if len(child) == 2:
                name = f"{disk.name}/{prefix}{child[0]}"
                out.setdefault(name, {"name": name, "size": 0, "type": "directory"})
            else:
                entry = self._file_entry(disk, f)
                out[entry["name"]] = entry
        entries = [out[k] for k in sorted(out)]
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        clean = self._strip_protocol(path)
        if not clean:
            return {"name": "", "size": 0, "type": "directory"}
        disk, rel = self._split(clean)
        if not rel:
            return {"name": disk.name, "size": 0, "type": "directory"}
        try:
            return self._file_entry(disk, rel)
        except FileNotFoundError:
            pass
        if disk.list(rel + "/"):
            return {"name": clean, "size": 0, "type": "directory"}
        raise FileNotFoundError(f"cryptdisk://{clean}: no such file or directory")

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False,
             detail: bool = False, **kwargs: Any) -> Any:
        """Files below ``path`` (and directories, with ``withdirs``), as fsspec's ``find``.

        One listing of the disk, where fsspec's generic ``find`` lists every
        directory and describes every file; ``detail=True`` describes the files.
        """
        clean = self._strip_protocol(path)
        if not clean:
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail,
                                **kwargs)
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        disk, rel = self._split(clean)
        base = f"{disk.name}/{rel}" if rel else disk.name
        files = disk.list(rel + "/" if rel else "")
        out: dict[str, dict[str, Any] | None] = {}
        if withdirs and (files or not rel):
            out[base] = {"name": base, "size": 0, "type": "directory"}
        for f in files:
            parts = (f[len(rel) + 1:] if rel else f).split("/")
            if maxdepth is None or len(parts) <= maxdepth:
                out[f"{disk.name}/{f}"] = None  # a file, described on demand
            if withdirs:
                for depth in range(1, min(len(parts), (maxdepth or len(parts)) + 1)):
                    name = f"{base}/{'/'.join(parts[:depth])}"
                    out.setdefault(name, {"name": name, "size": 0, "type": "directory"})
        if not out and rel and disk.exists(rel):
            out[base] = None
        names = sorted(out)
        if not detail:
            return names
        return {n: out[n] or self._file_entry(disk, n[len(disk.name) + 1:]) for n in names}

    def modified(self, path: str) -> _dt.datetime:
        mtime = self.info(path).get("mtime")
        if mtime is None:
            raise NotImplementedError(f"cryptdisk://{path}: the store does not report mtimes")
        return _dt.datetime.fromtimestamp(mtime, tz=_dt.UTC)

    def created(self, path: str) -> _dt.datetime:
        return self.modified(path)

    # -- reading and writing ----------------------------------------------------------------

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> Any:
        if "r" in mode and _called_by_block_cache(sys._getframe(1)):
            raise _block_cache_refused(self._strip_protocol(path))
        disk, rel = self._split(path)
        if mode == "rb":
            return disk.open_read(rel)
        if mode in ("wb", "xb"):
            if mode == "xb" and disk.exists(rel):
                raise FileExistsError(f"cryptdisk://{self._strip_protocol(path)} exists")
            if not autocommit:  # inside ``with fs.transaction``: published when it ends
                return _DeferredWriteFile(disk.open_write(rel))
            return disk.open_write(rel)
        if "a" in mode:
            raise ValueError(
                f"cryptdisk://{self._strip_protocol(path)}: files open as 'rb' or 'wb', not "
                f"{mode!r}: each is sealed once and published whole, so nothing appends to "
                "it; write one file per piece (Dask: to_csv('cryptdisk://DISK/dir/*.csv'), "
                "not single_file=True)")
        raise ValueError(f"cryptdisk:// files open as 'rb' or 'wb', not {mode!r} (files are "
                         "written once and published atomically)")

    def cat_file(self, path: str, start: int | None = None, end: int | None = None,
                 **kwargs: Any) -> bytes:
        disk, rel = self._split(path)
        with disk.open_read(rel) as raw:
            f = positional(raw)
            size = f.size
            lo = 0 if start is None else (start if start >= 0 else max(0, size + start))
            hi = size if end is None else (end if end >= 0 else max(0, size + end))
            return f.pread(lo, max(0, hi - lo))

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """Write ``value`` to ``path``; ``mode="create"`` refuses an existing file.

        ``create`` checks, then publishes: two writers racing to create the same
        file may both succeed (the last one's file stays), as on object stores.
        """
        if mode not in ("overwrite", "create"):
            raise ValueError(f"pipe_file mode is 'overwrite' or 'create', not {mode!r}")
        disk, rel = self._split(path)
        if mode == "create" and disk.exists(rel):
            raise FileExistsError(f"cryptdisk://{self._strip_protocol(path)} exists")
        if self._intrans:
            with self.open(path, "wb") as f:  # published when the transaction ends
                f.write(value)
        else:
            disk.write_bytes(rel, value)

    def _kind(self, path: str) -> str | None:
        """``"file"``, ``"directory"`` (implicit: it holds a file) or None (nothing there)."""
        clean = self._strip_protocol(path)
        if not clean:
            return "directory"
        disk, rel = self._split(clean)
        if not rel:
            return "directory"
        if disk.exists(rel):
            return "file"
        return "directory" if disk.list(rel + "/") else None

    def _kinds(self, paths: list[str]) -> dict[str, str | None]:
        """:meth:`_kind` of many paths, from one listing per disk where they share a disk."""
        if len(paths) < 2:
            return {p: self._kind(p) for p in paths}
        by_disk: dict[str, list[str]] = {}
        out: dict[str, str | None] = {}
        for p in paths:
            clean = self._strip_protocol(p)
            disk, rel = self._split(clean) if clean else (None, "")
            if disk is None or not rel:
                out[p] = "directory"
            else:
                by_disk.setdefault(disk.name, []).append(p)
        for name, group in by_disk.items():
            disk = self.config.disks[name]
            rels = {p: self._split(p)[1] for p in group}
            parent = posixpath.dirname(posixpath.commonpath(list(rels.values())))
            listed = disk.list(parent + "/" if parent else "")
            files = set(listed)
            for p, rel in rels.items():
                i = bisect.bisect_left(listed, rel + "/")
                below = i < len(listed) and listed[i].startswith(rel + "/")
                out[p] = "file" if rel in files else "directory" if below else None
        return out

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copy one file; a directory copies as nothing (directories are implicit).

        Within one disk, ``cryptdisk_move=True`` (what :meth:`mv` passes) renames
        instead; across disks it copies, then removes the source.
        """
        move = bool(kwargs.get(_MOVE))
        src, srel = self._split(path1)
        dst, drel = self._split(path2)
        if not srel:
            return  # a whole disk: a directory, its files are paired one by one
        if not drel:
            raise DiskIsADirectoryError(
                f"cryptdisk://{self._strip_protocol(path2)}: is a disk; name a file on it")
        if move and src is dst:
            # Never rename a directory as a whole (fsspec pairs its files too).
            if not src.exists(srel):
                self._directory_or_missing(src, srel, path1)
                return
            if srel != drel:
                src.rename(srel, drel)
            return
        try:
            fin = src.open_read(srel)
        except (FileNotFoundError, IsADirectoryError):
            self._directory_or_missing(src, srel, path1)
            return
        if src is dst and srel == drel:
            fin.close()
            return
        with fin, dst.open_write(drel) as fout:
            while chunk := fin.read(1 << 20):
                fout.write(chunk)
        if move:
            src.remove(srel)

    def _directory_or_missing(self, disk: Disk, rel: str, path: str) -> None:
        """Return if ``rel`` is a directory (it holds a file); else FileNotFoundError."""
        if not disk.list(rel + "/"):
            raise DiskFileNotFoundError(
                f"cryptdisk://{self._strip_protocol(path)}: no such file or directory")

    def mv(self, path1: Any, path2: Any, recursive: bool = False, maxdepth: Any = None,
           **kwargs: Any) -> None:
        """Move files as fsspec's ``copy`` pairs them (``recursive=True`` for directories).

        Each file moves on its own: a rename within one disk (atomic where the
        store can rename), a copy then a removal across disks. A directory
        vanishes with its last file.
        """
        if isinstance(path1, str) and self._strip_protocol(path1) == self._strip_protocol(
                path2):
            return
        if (isinstance(path1, str) and not recursive and not has_magic(path1)
                and self._kind(path1) == "directory"):
            raise DiskIsADirectoryError(
                f"cryptdisk://{self._strip_protocol(path1)}: is a directory; pass "
                "recursive=True to move it")
        self.copy(path1, path2, recursive=recursive, maxdepth=maxdepth, on_error="raise",
                  **{**kwargs, _MOVE: True})

    def rm_file(self, path: str) -> None:
        disk, rel = self._split(path)
        if not rel:
            raise DiskIsADirectoryError(
                f"cryptdisk://{self._strip_protocol(path)}: is a disk, not a file")
        try:
            disk.remove(rel)
        except FileNotFoundError:
            if disk.list(rel + "/"):
                raise DiskIsADirectoryError(
                    f"cryptdisk://{self._strip_protocol(path)}: is a directory; use "
                    "rm(path, recursive=True)") from None
            raise

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: Any = None) -> None:
        """Delete files; directories (implicit) need ``recursive=True``.

        As fsspec's local filesystem: a path that does not exist raises
        ``FileNotFoundError``, a directory without ``recursive=True`` raises
        :class:`DiskIsADirectoryError` (an ``IsADirectoryError`` and a
        ``ValueError``). Everything is checked before the first file goes.
        """
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        kinds = self._kinds(paths)
        files = []
        for p in paths:
            kind = kinds[p]
            if kind is None:
                raise DiskFileNotFoundError(
                    f"cryptdisk://{self._strip_protocol(p)}: no such file or directory")
            if kind == "directory" and not recursive:
                raise DiskIsADirectoryError(
                    f"cryptdisk://{self._strip_protocol(p)}: is a directory; use "
                    "rm(path, recursive=True)")
            if kind == "file":
                files.append(p)
        for p in reversed(files):
            self.rm_file(p)

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        """Write an empty file; ``truncate=False`` of an existing file is refused, as on
        object stores (a sealed file's modification time cannot change alone)."""
        if truncate or not self.exists(path):
            self.pipe_file(path, b"")
            return
        raise NotImplementedError(
            f"cryptdisk://{self._strip_protocol(path)} exists: touch(truncate=False) would "
            "only update its modification time, which a sealed file cannot change alone")

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Directories are implicit; nothing to do."""

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Directories are implicit; nothing to do."""

    def rmdir(self, path: str) -> None:
        """Directories are implicit; they vanish with their last file."""


class _DeferredWriteFile(io.RawIOBase):
    """A file written inside ``with fs.transaction:`` (fsspec's ``autocommit=False``).

    ``close()`` keeps it unpublished; when the transaction ends, fsspec calls
    :meth:`commit` (publish it atomically, as a disk's file publishes on close) or,
    if the block raised, :meth:`discard`. Closing while an exception raised since
    the open propagates discards it at once, as a disk's file does.
    """

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self._inner = inner
        self.name = inner.name
        self.mode = "wb"
        self._exc_at_open = sys.exc_info()[1]

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._checkClosed()
        return int(self._inner.write(data))

    def tell(self) -> int:
        return int(self._inner.tell())

    def close(self) -> None:
        if self.closed:
            return
        in_flight = sys.exc_info()[1]
        if in_flight is not None and in_flight is not self._exc_at_open:
            self.discard()
        super().close()

    def commit(self) -> None:
        """Publish the file (nothing if it was discarded)."""
        self._inner.close()

    def discard(self) -> None:
        """Throw away what was written; any file at the path stays as it was."""
        discardable(self._inner).abort()

    def __repr__(self) -> str:
        return f"<cryptdisk transaction file {self.name!r}>"

    def __reduce__(self) -> Any:
        raise TypeError("open disk files cannot be pickled")


def _reload(config_path: str) -> CryptdiskFileSystem:
    return CryptdiskFileSystem(config=config_path)

