"""A restore's work in progress beside its target, and the lock that makes it collectable.

A restore to TARGET holds an exclusive ``flock`` on ``TARGET.restoring.lock`` from before
it creates anything until it is done, and builds the database as
``TARGET.restoring-<12 hex>`` (a directory and ``...key`` for a database; a file and
SQLite's ``-wal``, ``-journal``, ``-shm`` for SQLite). Whoever holds the lock owns every
such name: a restore that takes it deletes the ones killed restores left. A second
restore to the same TARGET while one runs fails at once.

A restore that replaces a database directory swaps it with its finished work in one
``renameat2(RENAME_EXCHANGE)`` (:func:`exchange`): TARGET is the old database or the new
one at every instant, and the old one then lies under the work's name until deleted.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator

from .._flocks import hold, let_go
from ..errors import BackupError

__all__ = ["exchange", "restore_lock", "work_path"]

_SUFFIXES = ("", ".key", "-wal", "-journal", "-shm")


def work_path(dest: str) -> str:
    """A new name for a restore's work in progress beside ``dest``."""
    return f"{dest}.restoring-{uuid.uuid4().hex[:12]}"


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(a: str, b: str) -> None:
    """Swap the paths ``a`` and ``b`` (both must exist) in one atomic step (Linux's
    ``renameat2(RENAME_EXCHANGE)``). Raises :class:`BackupError` where the system or file
    system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        raise BackupError("this system has no renameat2(RENAME_EXCHANGE), which replacing "
                          "a database directory atomically needs",
                          hint="restore into a new path and swap the directories "
                          "yourself") from None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE):
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise BackupError(f"the file system of {b} cannot swap two directories "
                              "atomically (renameat2 RENAME_EXCHANGE), which replacing a "
                              "database needs", hint="restore into a new path and swap the "
                              "directories yourself")
        raise OSError(err, os.strerror(err), b)


def _leftovers(dest: str) -> list[str]:
    directory, base = os.path.split(dest)
    pattern = re.compile(re.escape(base) + r"\.restoring-[0-9a-f]{12}(" +
                         "|".join(re.escape(s) for s in _SUFFIXES if s) + ")?")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(directory, n) for n in names if pattern.fullmatch(n))


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@contextlib.contextmanager
def restore_lock(dest: str, discard: Callable[[str], None] | None = None
                 ) -> Iterator[list[str]]:
    """Hold ``dest``'s restore lock; delete the work that killed restores left and yield
    what was deleted. ``discard(path)`` is called first on each such directory (to delete
    what it put outside itself). Raises :class:`BackupError` while another restore holds
    it."""
    lock = dest + ".restoring.lock"
    while True:
        try:
            fd = hold(os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                              0o600))  # a forked child closes its copy: the lock dies with us
        except OSError as exc:
            raise BackupError(f"{lock}: cannot create the restore's lock file: "
                              f"{exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            let_go(fd)
            os.close(fd)
            raise BackupError(f"another restore to {dest} is running (it holds {lock})",
                              hint="wait for it to finish, or restore to another path") \
                from None
        # The holder before us deletes the file as it finishes: lock the file at the path.
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        let_go(fd)
        os.close(fd)
    try:
        removed = _leftovers(dest)
        for path in removed:
            if discard is not None and os.path.isdir(path) and not os.path.islink(path):
                discard(path)
            _remove(path)
        yield removed
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        let_go(fd)
        os.close(fd)
