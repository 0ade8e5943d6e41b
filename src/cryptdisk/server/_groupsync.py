"""Group commit for ``cryptdisk serve --sqlite`` in WAL mode: one ``fdatasync`` of the WAL
makes every commit durable that waits for it, across a server's threads and processes.

SQLite with ``synchronous=FULL`` syncs the WAL inside each COMMIT, while it holds the one
write lock: every writer of the database waits for every other writer's ``fdatasync``. The
server's sessions run with ``synchronous=NORMAL`` instead (SQLite then writes the commit's
frames, and the encrypting VFS seals them into the file, before COMMIT returns, but does
not sync them) and call :meth:`GroupSync.sync` once the COMMIT has returned and the write
lock is released, before the client hears of the commit. So the next writer runs while
this one's ``fdatasync`` does, and commits that come in during one ``fdatasync`` share the
next, as PostgreSQL's commits share its WAL flushes. A commit is acknowledged only after an
``fdatasync`` of the WAL that began after its frames were written: the same guarantee as
``synchronous=FULL`` and as PostgreSQL's default ``synchronous_commit = on`` (it survives
kill -9 of the server and a power cut or OS crash, as far as the disk honours a flush).

The bookkeeping is two counters in memory shared by the server's processes (anonymous
shared memory made with the engine, before the workers are forked), changed only under an
``flock`` of ``PATH.sync-lock`` (and a thread lock inside each process, since an ``flock``
is per open file): ``started``, the syncs begun, and ``completed``, the number of the
latest one that finished. A committer reads ``started`` (say *n*) after its frames are in
the file; sync *n* + 1 begins after that read, so once ``completed`` > *n* its frames are
on disk, and it returns without a sync of its own. Otherwise it takes the lock, looks
again, and syncs itself (whatever has been written by then, its own frames and the frames
of every commit waiting behind it). ``PATH.sync-lock`` holds nothing: truncating or
damaging it changes nothing (were the counters mapped from it, a process touching them
after a truncation would die of SIGBUS). The memory also names the
file the processes lock (device and inode, taken by the first): a process that finds
another file at the path (it was deleted or replaced while the server ran) logs so and
counts for itself alone, as it does without the lock file (a read-only directory), since
counters shared under two different locks could lose a count. A process forked during a
sync closes its copy of the lock file's descriptor as it starts, so it never keeps the
flock.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import threading
from typing import Any

from .._flocks import hold, let_go

__all__ = ["GroupSync"]

log = logging.getLogger("cryptdisk.server")

#: the shared memory, int64 each: syncs started, latest completed; the lock file's device
#: and inode (63 bits each; 0: no process has opened it yet)
_SHARED = 4
_MASK = (1 << 63) - 1


def _local() -> Any:
    """Counters of this process alone."""
    return memoryview(bytearray(16)).cast("q")


class GroupSync:
    """The WAL syncs of one database (``path``, the database file) in one server."""

    def __init__(self, path: str) -> None:
        self.path = path + ".sync-lock"
        self._thread = threading.Lock()
        self._pid = 0
        self._fd = -1
        self._counts: Any = None
        self._shared = memoryview(mmap.mmap(-1, 8 * _SHARED, flags=mmap.MAP_SHARED)).cast("q")
        #: per process: WAL path -> (fd, inode) kept open to be synced
        self._wals: dict[str, tuple[int, int]] = {}

    def _file(self) -> Any:
        """The counters of this process (opened once per process: a forked worker opens its
        own descriptor, since an flock belongs to an open file)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._wals = {}  # descriptors inherited over fork are the parent's to close
            self._fd = -1
            try:
                # a process forked during a sync closes its copy (_flocks): the flock
                # dies with this process
                fd = hold(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
            except OSError:
                self._counts = _local()
                return self._counts
            try:
                self._counts = self._shared[:2] if self._same_file(fd) else _local()
            except OSError:
                let_go(fd)
                os.close(fd)
                self._counts = _local()
            else:
                self._fd = fd
        return self._counts

    def _same_file(self, fd: int) -> bool:
        """Whether ``fd`` is the lock file the server's other processes lock (the first
        process to open it names it in the shared memory, under its flock)."""
        st = os.fstat(fd)
        mine = (st.st_dev & _MASK, st.st_ino & _MASK)
        shared = self._shared
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if shared[3] == 0:
                shared[2], shared[3] = mine
            if (shared[2], shared[3]) == mine:
                return True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        log.error("%s is not the file the server's other processes lock (it was deleted or "
                  "replaced while the server ran): this process makes its commits durable "
                  "with WAL syncs of its own, shared with no other process; restart the "
                  "server to share them again", self.path)
        return False

    def counts(self) -> tuple[int, int]:
        """(syncs started, latest sync completed), as this process sees them."""
        counts = self._file()
        return int(counts[0]), int(counts[1])

    def sync(self, wal: str) -> None:
        """Return once every byte written to the file ``wal`` before this call is on disk
        (an ``fdatasync`` begun after the call, by this thread or another). Raises
        :class:`OSError` when the sync fails."""
        counts = self._file()
        ticket = counts[0]
        if counts[1] > ticket:
            return
        with self._thread:
            if counts[1] > ticket:
                return
            fd = self._fd
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_EX)  # blocks without the GIL
            try:
                if counts[1] > ticket:
                    return
                counts[0] += 1
                number = counts[0]
                os.fdatasync(self._wal_fd(wal))
                counts[1] = number
            finally:
                if fd >= 0:
                    fcntl.flock(fd, fcntl.LOCK_UN)

    def _wal_fd(self, wal: str) -> int:
        """A descriptor of the file now at ``wal``: the one kept open, unless the file was
        replaced since (a WAL is deleted when the last connection closes); a new file's
        directory entry is synced once, as SQLite does for a WAL it creates."""
        kept = self._wals.get(wal)
        st = os.stat(wal)
        if kept is not None and kept[1] == st.st_ino:
            return kept[0]
        if kept is not None:
            os.close(kept[0])
            del self._wals[wal]
        fd = os.open(wal, os.O_RDONLY | os.O_CLOEXEC)
        try:
            ino = os.fstat(fd).st_ino
            directory = os.open(os.path.dirname(os.path.abspath(wal)),
                                os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError:
            os.close(fd)
            raise
        self._wals[wal] = (fd, ino)
        return fd

    def close(self) -> None:
        """Close this process's descriptors: the kept WALs' and the counters file's (its
        mapping goes with the last reference; a later :meth:`sync` opens them again)."""
        if self._pid == os.getpid():
            for fd, _ in self._wals.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wals = {}
            with self._thread:  # (no sync of this process holds the file's flock)
                self._counts = None  # the mapping goes once no sync holds it
                if self._fd >= 0:
                    let_go(self._fd)
                    with contextlib.suppress(OSError):
                        os.close(self._fd)
                self._fd = -1
                self._pid = 0
