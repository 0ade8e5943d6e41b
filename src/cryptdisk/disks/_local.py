"""``local``: a directory on this machine."""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any, cast

from ..errors import DiskError, DiskFileNotFoundError, DiskIsADirectoryError
from ..format import discard_temp, owned_file
from ._base import Disk, DiskConfig, FileInfo
from ._files import AtomicWriteFile, FdReader, PreadFile
from ._paths import is_temp, norm_path, temp_name

__all__ = ["LocalDisk"]


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs(directory: str) -> None:
    """``os.makedirs(directory, exist_ok=True)``, each directory it creates mode 0700 (owner
    only, like the files) and durable in its parent (an ``fsync`` of the parent): the
    ``fsync`` of the directory a file is published in keeps that file's name, not the
    directory's own name in a directory made for it, so without this a power loss could
    take a new file with its path."""
    missing = []
    d = directory
    while not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    for made in reversed(missing):
        try:
            os.mkdir(made, 0o700)
        except FileExistsError:
            if not os.path.isdir(made):  # a file in the way
                raise
    for made in reversed(missing):
        _fsync_dir(os.path.dirname(made))


#: Bytes a file being written may hold dirty in the page cache before its writeback is
#: started (asynchronously, Linux's ``sync_file_range``): the fsync that publishes the file
#: then waits for the last few MB, not for the whole file (a 500 MB part: about 0.4 s).
WRITE_BEHIND_BYTES = 16 << 20


def _writeback_starter() -> Callable[[int, int, int], object] | None:
    """``start(fd, offset, length)``: begin writing a range back, without waiting; or None
    where the system has no ``sync_file_range``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return lambda fd, offset, length: call(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE


_START_WRITEBACK = _writeback_starter()


@contextlib.contextmanager
def _naming(path: str) -> Iterator[None]:
    """A write error that names no file (a full disk's) names ``path``."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:
            raise type(exc)(exc.errno, exc.strerror, path) from None
        raise


class _WriteBehind:
    """Write through a buffered file, starting the writeback of every
    :data:`WRITE_BEHIND_BYTES` written (best effort: the publishing fsync is what makes
    the file durable; a failed start is ignored)."""

    def __init__(self, raw: Any, name: str) -> None:
        self._raw = raw
        self._name = name
        self._started = 0
        self._written = 0

    def write(self, data: Any) -> int:
        with _naming(self._name):
            return self._write(data)

    def _write(self, data: Any) -> int:
        n: int = self._raw.write(data)
        self._written += n
        start = _START_WRITEBACK
        if start is not None and self._written - self._started >= WRITE_BEHIND_BYTES:
            self._raw.flush()
            start(self._raw.fileno(), self._started, self._written - self._started)
            self._started = self._written
        return n


class LocalDisk(Disk):
    """Files in a directory. Publishing is temp file + fsync + rename + fsync of the directory
    (a directory made for the file: fsynced in its parent too).

    The directory is created on the first write, so configuring a disk has no
    side effect.
    """

    type = "local"
    config_settings = frozenset({"type", "path"})

    @classmethod
    def from_config(cls, name: str, spec: Mapping[str, Any], where: str,
                    config: DiskConfig) -> Disk:
        path = os.path.expanduser(config.string(spec, "path", where))
        return cls(name, os.path.join(config.base, path))

    def __init__(self, name: str, root: str | os.PathLike[str]) -> None:
        self.name = name
        self.root = os.path.abspath(os.fspath(root))

    @property
    def is_encrypted(self) -> bool:
        return False

    @property
    def path(self) -> str:
        return self.root + "/"

    def os_path(self, path: str) -> str:
        """The absolute path of a disk file on this machine."""
        return os.path.join(self.root, norm_path(path))

    def _missing(self, path: str) -> DiskFileNotFoundError:
        return DiskFileNotFoundError(f"{path}: no such file on disk {self.name!r}")

    def open_fd(self, path: str, shown: str | None = None, disk: str | None = None) -> int:
        """A read-only descriptor of a disk file (a directory is refused, not opened).

        Errors name ``shown`` on disk ``disk`` (a wrapping disk's view of the
        file), by default ``path`` on this disk.
        """
        shown, disk = shown or path, disk or self.name
        try:
            fd = os.open(self.os_path(path), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise DiskFileNotFoundError(f"{shown}: no such file on disk {disk!r}") from None
        except IsADirectoryError:
            fd = -1
        if fd < 0 or stat.S_ISDIR(os.fstat(fd).st_mode):
            if fd >= 0:
                os.close(fd)
            raise DiskIsADirectoryError(f"{shown}: is a directory on disk {disk!r}")
        return fd

    def open_read(self, path: str) -> IO[bytes]:
        fd = self.open_fd(path)
        return cast("IO[bytes]", PreadFile(FdReader(fd), path, {"format": "plain"}))

    def open_write(self, path: str) -> IO[bytes]:
        rel = norm_path(path)
        full = os.path.join(self.root, rel)
        directory = os.path.dirname(full)
        if os.path.isdir(full):
            raise DiskIsADirectoryError(f"{path}: is a directory on disk {self.name!r}")
        try:
            _make_dirs(directory)
        except (FileExistsError, NotADirectoryError):
            raise _parent_is_a_file(path, self.name) from None
        tmp = os.path.join(self.root, temp_name(rel))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                     0o600)
        raw = owned_file(fd)  # buffered: many small writes become few syscalls

        def publish() -> None:
            with _naming(full):
                raw.flush()
                os.fsync(raw.fileno())
                raw.close()
            try:
                os.replace(tmp, full)
            except IsADirectoryError:  # made since the open
                raise DiskIsADirectoryError(f"{path}: is a directory on disk "
                                            f"{self.name!r}") from None
            _fsync_dir(directory)

        def discard() -> None:
            discard_temp(raw, tmp)

        return cast("IO[bytes]", AtomicWriteFile(_WriteBehind(raw, full).write, publish, discard,
                                                 path))

    def exists(self, path: str) -> bool:
        return os.path.isfile(self.os_path(path))

    def info(self, path: str) -> FileInfo:
        try:
            st = os.stat(self.os_path(path))
        except FileNotFoundError:
            raise self._missing(path) from None
        if not os.path.isfile(self.os_path(path)):
            raise self._missing(path)
        return FileInfo(norm_path(path), st.st_size, st.st_size, False, "plain",
                        mtime=st.st_mtime)

    def list(self, prefix: str = "") -> list[str]:
        clean = norm_path(prefix, allow_empty=True)
        # Walk only below the deepest directory the prefix names.
        base = clean if prefix.endswith("/") else os.path.dirname(clean)
        start = os.path.join(self.root, base)
        out: list[str] = []
        for dirpath, _dirs, files in os.walk(start):
            rel_dir = os.path.relpath(dirpath, self.root)
            for fname in files:
                rel = fname if rel_dir == "." else f"{rel_dir}/{fname}".replace(os.sep, "/")
                if not is_temp(rel) and _under(rel, clean, prefix):
                    out.append(rel)
        return sorted(out)

    def local_path(self, path: str) -> str:
        """The OS path of a disk file (plain: other tools may read it natively)."""
        return self.os_path(path)

    def remove_stale_temps(self, max_age: float = 3600.0, prefix: str = "") -> int:
        """Delete temporary files older than ``max_age`` seconds (left by killed writers)
        below the directory ``prefix``.

        Returns how many were removed. Younger ones may belong to a writer that
        is still running, so they are kept; a caller that holds an exclusive
        lock over ``prefix`` (the database) passes ``max_age=0``.
        """
        import time

        cutoff = time.time() - max_age
        removed = 0
        start = os.path.join(self.root, norm_path(prefix, allow_empty=True))
        for dirpath, _dirs, files in os.walk(start):
            for fname in files:
                full = os.path.join(dirpath, fname)
                if is_temp(fname) and os.lstat(full).st_mtime <= cutoff:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(full)
                        removed += 1
        return removed

    def remove(self, path: str) -> None:
        try:
            os.unlink(self.os_path(path))
        except FileNotFoundError:
            raise self._missing(path) from None
        except IsADirectoryError:
            raise DiskIsADirectoryError(f"{path}: is a directory on disk {self.name!r}") \
                from None

    def rename(self, src: str, dst: str) -> None:
        """Replace ``dst`` by the file ``src``; a directory is refused (not a file)."""
        if os.path.isdir(self.os_path(src)):
            raise DiskIsADirectoryError(f"{src}: is a directory on disk {self.name!r}")
        target = self.os_path(dst)
        try:
            _make_dirs(os.path.dirname(target))
        except (FileExistsError, NotADirectoryError):
            raise _parent_is_a_file(dst, self.name) from None
        try:
            os.replace(self.os_path(src), target)
        except FileNotFoundError:
            raise self._missing(src) from None
        except IsADirectoryError:
            raise _destination_is_a_directory(dst, self.name) from None
        _fsync_dir(os.path.dirname(target))


def _parent_is_a_file(path: str, disk: str) -> DiskError:
    exc = DiskError(f"{path}: cannot be written on disk {disk!r}: a parent directory of it "
                    "is a file")
    exc.parent_is_a_file = True  # type: ignore[attr-defined]
    return exc


def _destination_is_a_directory(path: str, disk: str) -> DiskIsADirectoryError:
    """A rename's destination ``path`` is a directory (marked so that a wrapping disk says
    it of the destination, not of the source)."""
    exc = DiskIsADirectoryError(f"{path}: is a directory on disk {disk!r}")
    exc.at_destination = True  # type: ignore[attr-defined]
    return exc


def _under(rel: str, clean: str, prefix: str) -> bool:
    """Does ``rel`` match the listing prefix (a directory when it ends in '/', else a string)?"""
    if not clean:
        return True
    if prefix.endswith("/"):
        return rel.startswith(clean + "/")
    return rel.startswith(clean)
