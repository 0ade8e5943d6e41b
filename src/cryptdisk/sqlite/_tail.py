"""A saved copy of the one segment being rewritten in place, for journals and the WAL.

SQLite appends to its rollback journal and WAL in pieces that do not line up
with segments, so the segment at the end of the file is read, extended and
written again, and it still holds bytes of earlier, committed records. A
``pwrite`` is not atomic: a process killed between two kernel pages of a
record (SIGKILL is checked there), or a power cut, leaves the record half old,
half new, and it no longer authenticates, taking committed bytes with it.

So before such a rewrite the store puts the segment's current record, still
encrypted, in ``<file>-cdtail``: ``index u64le || length u64le || record``
(the Python VFS writes it with one ``pwritev``; the C VFS keeps the file
mapped and copies into it, so the file may be longer than the record).
When a segment of that file later fails authentication and the side file
holds an authentic record for the same index, the store uses it: the file is
then as it was before the interrupted write, exactly what SQLite expects after
a crash. The saved record is ciphertext under the file's own key and binds the
file id and index, so it cannot be moved elsewhere; what it can give an
attacker is the previous version of the last segment, which is no more than
cutting the file short (already undetectable without a trusted size).

Power loss is worse than a killed process: the kernel may write a rewrite back
half done at any time, not only while ``pwrite`` runs, and the record holds
bytes of commits SQLite reported durable (or frames a checkpoint copied, which
recovery would otherwise read again over newer pages). So the copy is synced
before the rewrite is issued (the directory too, the first time), and the store
syncs the file before a copy whose rewrite SQLite has not synced yet is replaced
(see :class:`cryptdisk.format.MutableStore`).
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["SUFFIX", "TailSave", "remove_tail"]

SUFFIX = "-cdtail"


class TailSave:
    """The side file of one journal or WAL (opened lazily)."""

    def __init__(self, path: str) -> None:
        self.path = path + SUFFIX
        self._fd = -1

    def save(self, index: int, record: memoryview) -> None:
        """Keep ``record`` of segment ``index``, synced (the directory too, the first time)."""
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            with contextlib.suppress(OSError):  # as SQLite, which ignores directory errors
                fd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        os.pwritev(self._fd, [index.to_bytes(8, "little"), len(record).to_bytes(8, "little"),
                              record], 0)
        os.fdatasync(self._fd)

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


def remove_tail(path: str) -> None:
    """Delete the side file of ``path`` (after SQLite deleted the journal or WAL)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path + SUFFIX)
