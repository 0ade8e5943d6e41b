"""Local spool files of fsspec writers, and the collection of those left by killed writers.

An :class:`~cryptdisk.disks.FsspecDisk` writer spools a file to the local temporary
directory (``tempfile.gettempdir()``, ``$TMPDIR``) until ``close()`` uploads it. The
spool holds exactly the bytes the disk stores: ciphertext under an ``encrypted`` or
``clickhouse`` disk, which encrypts before its inner disk sees a byte.

A spool is named ``.cryptdisk-<pid>.<random>.cdtmp`` (mode 0600) and its writer holds an
exclusive ``flock`` on it from before it gets that name until it is removed: the file is
created under a name collection ignores (``...cdtmp-new``), locked, then renamed. A spool
is stale, and :func:`collect_stale_spools` deletes it, only when it belongs to this user,
its pid names no live process, and its lock can be taken (a writer in another pid
namespace sharing the directory still holds it). A spool whose writer is alive is never
touched. A process forked while a spool is open closes its copy of the spool's descriptor
as it starts (:mod:`cryptdisk._flocks`): the lock dies with its writer, not with the
writer's last child, and the child never writes to, closes or removes the parent's spool.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import secrets
import stat
import tempfile
import threading
from typing import Any

from .._flocks import hold, let_go

__all__ = ["Spool", "collect_stale_spools", "collect_stale_spools_once", "open_spool"]

PREFIX = ".cryptdisk-"
SUFFIX = ".cdtmp"
#: The name a spool has between its creation and its lock (never collected).
NEW_SUFFIX = ".cdtmp-new"

_collected: set[str] = set()
_collected_lock = threading.Lock()


class _Raw(io.RawIOBase):
    """The spool's descriptor under its buffer: it writes only in the process that opened
    it (a forked child's copy of the buffer must not flush to a descriptor number the
    child may have reused since its copy was closed at fork), and never closes it."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.pid = os.getpid()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self.pid != os.getpid():
            raise OSError(errno.EBADF, "the spool belongs to the process that opened it")
        if self.fd < 0:
            return len(memoryview(data).cast("B"))  # removed: what is left goes nowhere
        return os.write(self.fd, data)


class Spool:
    """A spool being written by this process, locked from open to :meth:`remove`."""

    def __init__(self, fd: int, path: str) -> None:
        self.path = path
        self._raw = _Raw(fd)
        self._file = io.BufferedWriter(self._raw, 64 * 1024)
        #: write bytes (buffered)
        self.write = self._file.write
        #: write the buffered bytes to the file
        self.flush = self._file.flush

    def remove(self) -> None:
        """Delete the spool, unlinked while still locked (a collector never sees it
        unlocked and in use), and close it. In a process forked from its writer: nothing
        (its descriptor was closed at fork; the spool is the writer's)."""
        raw = self._raw
        if raw.fd < 0 or raw.pid != os.getpid():
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        finally:
            fd, raw.fd = raw.fd, -1
            let_go(fd)
            os.close(fd)  # closing the descriptor drops the flock
            self._file.close()  # (its buffer goes nowhere)


def open_spool() -> Spool:
    """A new spool file, locked for this process until :meth:`Spool.remove`."""
    directory = tempfile.gettempdir()
    fd, new = tempfile.mkstemp(prefix=PREFIX, suffix=NEW_SUFFIX, dir=directory)
    hold(fd)  # a forked child closes its copy: the lock dies with this process
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = os.path.join(directory,
                            f"{PREFIX}{os.getpid()}.{secrets.token_hex(6)}{SUFFIX}")
        os.rename(new, path)
    except BaseException:
        let_go(fd)
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(new)
        raise
    # The lock belongs to the open file description: it lasts until it is closed.
    return Spool(fd, path)


def _owner_pid(name: str) -> int | None:
    """The pid in a spool's name, or None if the name is not a spool's."""
    if not (name.startswith(PREFIX) and name.endswith(SUFFIX)):
        return None
    pid, dot, _rest = name[len(PREFIX):-len(SUFFIX)].partition(".")
    return int(pid) if dot and pid.isdigit() else None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def collect_stale_spools(directory: str | None = None) -> int:
    """Delete the spools of dead writers in ``directory`` (default: the temporary
    directory); returns how many were deleted. See the module docstring for the rule."""
    directory = directory or tempfile.gettempdir()
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    removed = 0
    uid = os.geteuid()
    for name in names:
        pid = _owner_pid(name)
        if pid is None or _alive(pid):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # gone, a symlink, or not ours to read
        try:
            st = os.fstat(fd)
            if st.st_uid != uid or not stat.S_ISREG(st.st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live writer holds it
            # Unlink only the file we hold locked (not one that replaced it meanwhile).
            with contextlib.suppress(FileNotFoundError):
                now = os.lstat(path)
                if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                    os.unlink(path)
                    removed += 1
        finally:
            os.close(fd)
    return removed


def collect_stale_spools_once() -> None:
    """:func:`collect_stale_spools` the first time a process opens an fsspec disk (for
    each temporary directory it uses)."""
    directory = tempfile.gettempdir()
    with _collected_lock:
        if directory in _collected:
            return
        _collected.add(directory)
    collect_stale_spools(directory)

