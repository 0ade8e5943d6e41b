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
touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import tempfile
import threading
from typing import BinaryIO

__all__ = ["collect_stale_spools", "collect_stale_spools_once", "open_spool"]

PREFIX = ".cryptdisk-"
SUFFIX = ".cdtmp"
#: The name a spool has between its creation and its lock (never collected).
NEW_SUFFIX = ".cdtmp-new"

_collected: set[str] = set()
_collected_lock = threading.Lock()


def open_spool() -> tuple[BinaryIO, str]:
    """A new spool file, locked for this process: ``(file opened "wb", its path)``."""
    directory = tempfile.gettempdir()
    fd, new = tempfile.mkstemp(prefix=PREFIX, suffix=NEW_SUFFIX, dir=directory)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = os.path.join(directory,
                            f"{PREFIX}{os.getpid()}.{secrets.token_hex(6)}{SUFFIX}")
        os.rename(new, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(new)
        raise
    # The lock belongs to the open file description: it lasts until the file is closed.
    return os.fdopen(fd, "wb"), path


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

