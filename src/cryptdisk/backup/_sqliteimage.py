"""A SQLite database's plaintext image, read and written a few pages at a time.

Backing up, SQLite's backup API copies the database in one read transaction (one
committed state) into a *snapshot file* beside it, ``PATH.backup-<12 hex>``, written
through the encrypted VFS under a random key that lives only in this process's memory (the
disk never holds plaintext; a killed backup's snapshot is ciphertext nobody can open, and
the next backup of PATH deletes it). The image is then read from the snapshot through the
VFS (:class:`apsw.VFSFile`), page by page. Restoring, the image is written page by page
through the VFS into a new file under the target's keys. Memory stays bounded either way.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import tempfile
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import apsw

from .._flocks import hold, let_go
from ..errors import BackupAuthenticationError, BackupError
from ..keys import Key, Keyring

__all__ = ["SnapshotReader", "snapshot", "write_image"]

_OPEN_MAIN = apsw.SQLITE_OPEN_MAIN_DB

#: The snapshots' key: random, one per process (cryptdisk.sqlite keeps a VFS for every
#: keyring it is given, so a key per backup would pile up in a long-lived process).
_scratch: Keyring | None = None
_scratch_lock = threading.Lock()


def _scratch_keyring() -> Keyring:
    global _scratch
    with _scratch_lock:
        if _scratch is None:
            _scratch = Keyring.single(Key.generate(1))
        return _scratch


def _forget_scratch() -> None:
    global _scratch, _scratch_lock
    _scratch, _scratch_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_scratch)
_READ_PAGES = 256  # pages per read of the snapshot (1 MiB at 4 KiB pages)


def page_size(header: bytes) -> int:
    """The page size that a database header (its first 100 bytes) gives."""
    if len(header) < 100 or not header.startswith(b"SQLite format 3\0"):
        raise BackupAuthenticationError("the SQLite image does not start with SQLite's header")
    size = int.from_bytes(header[16:18], "big")
    size = 65536 if size == 1 else size
    if size < 512 or size & (size - 1):
        raise BackupAuthenticationError(f"the SQLite image names page size {size}")
    return size


class SnapshotReader:
    """The snapshot's plaintext, read through the VFS: ``read(n)`` as a file's."""

    def __init__(self, file: Any, size: int) -> None:
        self._file, self._size, self._pos = file, size, 0
        self._page = page_size(file.xRead(100, 0)) if size else 512
        self._buf = memoryview(b"")

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (-1: the rest of the block read last); the snapshot is read in whole
        pages, ``_READ_PAGES`` at a time."""
        if not self._buf:
            left = self._size - self._pos
            if left <= 0:
                return b""
            data = bytes(self._file.xRead(min(left, self._page * _READ_PAGES), self._pos))
            self._pos += len(data)
            self._buf = memoryview(data)
        out = self._buf if n < 0 else self._buf[:n]
        self._buf = self._buf[len(out):]
        return bytes(out)


def _leftovers(path: str, directory: str) -> list[str]:
    base = re.escape(os.path.basename(path))
    pattern = re.compile(base + r"\.backup-[0-9a-f]{12}")
    try:
        return [os.path.join(directory, n) for n in os.listdir(directory)
                if pattern.fullmatch(n)]
    except OSError:
        return []


def _delete_unlocked(paths: list[str]) -> None:
    """Delete the snapshots of killed backups (a running backup holds its own's flock)."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        finally:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def _snapshot_dir(path: str) -> str:
    """Beside the database (its file system has room for a copy) when writable, else the
    temporary directory."""
    directory = os.path.dirname(path)
    return directory if os.access(directory, os.W_OK | os.X_OK) else tempfile.gettempdir()


@contextlib.contextmanager
def snapshot(path: str, keyring: Keyring) -> Iterator[tuple[SnapshotReader, bool]]:
    """Copy the database at ``path`` (one committed state) into a snapshot file and yield
    (its image as a reader, whether the database is in WAL mode)."""
    from ..sqlite import connect as sqlite_connect
    from ..sqlite import vfs_for

    directory = _snapshot_dir(path)
    _delete_unlocked(_leftovers(path, directory))
    snap = os.path.join(directory, f"{os.path.basename(path)}.backup-{uuid.uuid4().hex[:12]}")
    ephemeral = _scratch_keyring()
    fd = hold(os.open(snap, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600))  # a forked child closes its copy: the flock dies with us
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # ours while we live: see _delete_unlocked
        src = sqlite_connect(path, keyring=keyring, flags=apsw.SQLITE_OPEN_READONLY)
        try:
            wal = src.execute("PRAGMA journal_mode").fetchall()[0][0] == "wal"
            dst = sqlite_connect(snap, keyring=ephemeral)
            try:
                dst.execute("PRAGMA journal_mode=OFF")  # a scratch copy: no journal
                dst.execute("PRAGMA synchronous=OFF")
                try:
                    with dst.backup("main", src, "main") as b:  # one read transaction
                        b.step(-1)
                except (apsw.FullError, apsw.IOError) as exc:
                    raise _snapshot_failed(path, snap, exc) from None
            finally:
                dst.close()
        finally:
            src.close()
        file = apsw.VFSFile(vfs_for(ephemeral).vfs_name, snap,
                            [_OPEN_MAIN | apsw.SQLITE_OPEN_READONLY, 0])
        try:
            yield SnapshotReader(file, file.xFileSize()), wal
        finally:
            file.xClose()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(snap)
        let_go(fd)
        os.close(fd)


def _snapshot_failed(path: str, snap: str, exc: Exception) -> BackupError:
    """SQLITE_FULL, or SQLITE_IOERR (SQLite says "not an error": a write failed, as one
    past a file size limit does), while the snapshot was written."""
    what = ("no space left on device" if isinstance(exc, apsw.FullError)
            else "a write failed (a full disk, or a file size limit?)")
    return BackupError(f"{path}: writing its snapshot {snap}: {what}; no backup was taken",
                       hint="a SQLite backup needs room for one copy of the database beside "
                       "it (or in the temporary directory when its directory is not "
                       "writable)")


def _write_failed(dest: str, exc: Exception) -> OSError:
    """SQLITE_FULL or SQLITE_IOERR from the VFS as the OSError a write gives."""
    if isinstance(exc, apsw.FullError):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dest)
    return OSError(errno.EIO, "I/O error while writing it (a full disk, or a file size "
                   "limit?)", dest)


def _read_exact(stream: Any, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        data = stream.read(n - got)
        if not data:
            break
        parts.append(data)
        got += len(data)
    return b"".join(parts)


def write_image(stream: Any, dest: str, keyring: Keyring, mode: int) -> int:
    """Write the image that ``stream`` reads into the new file ``dest`` through the VFS
    under ``keyring``, page by page, in rollback-journal mode (header bytes 18-19); return
    its size. The caller checks the stream's SHA-256."""
    from ..sqlite import vfs_for

    file = apsw.VFSFile(vfs_for(keyring).vfs_name, dest,
                        [_OPEN_MAIN | apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
                         | apsw.SQLITE_OPEN_EXCLUSIVE, 0])
    try:
        os.chmod(dest, mode)
        first = _read_exact(stream, 100)
        if not first:
            return 0
        size = page_size(first)
        page = bytearray(first + _read_exact(stream, size - 100))
        page[18] = page[19] = 1
        offset = 0
        while page:
            if len(page) != size:
                raise BackupAuthenticationError("the SQLite image is not a whole number of "
                                                "pages")
            try:
                file.xWrite(bytes(page), offset)
            except (apsw.FullError, apsw.IOError) as exc:
                raise _write_failed(dest, exc) from None
            offset += size
            page = bytearray(_read_exact(stream, size))
        try:
            file.xSync(apsw.SQLITE_SYNC_FULL)
        except (apsw.FullError, apsw.IOError) as exc:
            raise _write_failed(dest, exc) from None
        return offset
    finally:
        file.xClose()
