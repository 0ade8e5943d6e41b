"""One descriptor per file per process, shared by every VFS file object that opens it.

SQLite's unix VFS locks the database with POSIX ``fcntl`` locks, and POSIX
drops *all* of a process's locks on a file when *any* descriptor of that file
is closed. The encrypted VFS does its I/O on its own descriptor (so that
``pread``/``pwrite`` go straight to the kernel), so closing that descriptor
while another connection of this process still holds a lock would silently
release the lock. Hence a process-wide table keyed by ``(st_dev, st_ino)``:
the first opener opens the file, later openers share the descriptor, the last
closer closes it. Do not open the same database through the encrypted VFS and
another VFS in one process.
"""

from __future__ import annotations

import errno
import os
import threading

__all__ = ["acquire", "release"]

_lock = threading.Lock()
_table: dict[tuple[int, int], list[int]] = {}  # (dev, ino) -> [fd, refcount]


def acquire(path: str, writable: bool) -> tuple[int, tuple[int, int]]:
    """A descriptor for ``path`` (which must exist) and the key to :func:`release` it."""
    with _lock:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        if st is not None:
            entry = _table.get((st.st_dev, st.st_ino))
            if entry is not None:
                entry[1] += 1
                return entry[0], (st.st_dev, st.st_ino)
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            if not writable or exc.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        fst = os.fstat(fd)
        key = (fst.st_dev, fst.st_ino)
        entry = _table.get(key)
        if entry is not None:  # replaced between stat and open: keep both open, never close
            entry[1] += 1
            return entry[0], key
        _table[key] = [fd, 1]
        return fd, key


def release(key: tuple[int, int]) -> None:
    """Drop one reference; the last one closes the descriptor."""
    with _lock:
        entry = _table.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _table[key]
            os.close(entry[0])
