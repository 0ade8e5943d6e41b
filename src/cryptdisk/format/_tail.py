"""A saved copy of the one segment being rewritten in place (``<file>-cdtail`` and the like).

The side file holds ``index u64le || length u64le || record``: the record of
segment ``index`` as it was on disk (ciphertext under the file's own key, bound
to the file id and the index). :mod:`cryptdisk.sqlite` keeps one per journal and
WAL (see :mod:`cryptdisk.sqlite._tail`); append-only logs opened with
:func:`cryptdisk.format.open_log` keep one too (``<file>-cdlogtail``), see
:class:`cryptdisk.format.MutableStore`.
"""

from __future__ import annotations

import contextlib
import errno
import os

__all__ = ["LOG_SUFFIX", "SUFFIX", "TailSave", "remove_tail"]

SUFFIX = "-cdtail"
#: the side file of an append-only log (:func:`cryptdisk.format.open_log`)
LOG_SUFFIX = "-cdlogtail"


class TailSave:
    """The side file of one file (opened lazily).

    ``sync``: each copy is synced before :meth:`save` returns (the directory too, the
    first time), and the store syncs the file before a copy is replaced; without it
    the copies survive a killed process (the kernel keeps what was written) but not
    a power cut.
    """

    def __init__(self, path: str, suffix: str = SUFFIX, *, sync: bool = True) -> None:
        self.path = path + suffix
        self.sync = sync
        self._fd = -1

    def save(self, index: int, record: memoryview) -> None:
        """Keep ``record`` of segment ``index``, synced (the directory too, the first time).

        A failure is an :class:`OSError` naming the side file (``ENOSPC`` on a full disk).
        """
        try:
            self._save(index, record)
        except OSError as e:
            if e.filename is None:
                raise OSError(e.errno, e.strerror, self.path) from e
            raise

    def _save(self, index: int, record: memoryview) -> None:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            if self.sync:
                with contextlib.suppress(OSError):  # as SQLite, which ignores directory errors
                    fd = os.open(os.path.dirname(self.path) or ".",
                                 os.O_RDONLY | os.O_DIRECTORY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
        head = index.to_bytes(8, "little") + len(record).to_bytes(8, "little")
        done = os.pwritev(self._fd, [head, record], 0)
        if done < 16 + len(record):  # short (a full disk): the rest, whose write says why
            rest = memoryview(head + bytes(record))[done:]
            while rest:
                n = os.pwrite(self._fd, rest, 16 + len(record) - len(rest))
                if n == 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                rest = rest[n:]
        if self.sync:
            os.fdatasync(self._fd)

    def index(self) -> int:
        """The index of the segment saved last; -1 if there is none."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return -1
        try:
            head = os.pread(fd, 8, 0)
        finally:
            os.close(fd)
        return int.from_bytes(head, "little") if len(head) == 8 else -1

    def load(self, index: int, into: memoryview) -> int:
        """Read the saved record of segment ``index`` into ``into``; its length, or 0."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0
        try:
            head = os.pread(fd, 16, 0)
            if len(head) != 16 or int.from_bytes(head[:8], "little") != index:
                return 0
            length = int.from_bytes(head[8:], "little")
            if not 0 < length <= len(into):
                return 0
            return os.preadv(fd, [into[:length]], 16)
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def remove_tail(path: str, suffix: str = SUFFIX) -> None:
    """Delete the side file of ``path`` if it can be (best effort: a side file left
    behind, even a directory of that name, is harmless, as its copy is used only if it
    authenticates as a record of the file it was saved for)."""
    with contextlib.suppress(OSError):
        os.unlink(path + suffix)
