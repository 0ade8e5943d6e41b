"""Restoring over an existing database (``restore(..., replace=True)``, ``--force``).

What may be replaced is checked before anything is restored: a database directory (one
holding a catalog) for a database backup, an encrypted SQLite file (a cryptdisk header)
for a SQLite backup; never a symbolic link, another kind of file, or a database in use:

- a database directory: its ``LOCK`` is taken as a writer takes it (``flock``), and held
  until the new database has taken its place, so no writer opens it meanwhile; a writer
  holding it refuses the restore. The file system must swap directories atomically
  (``renameat2(RENAME_EXCHANGE)``), which is tried on two empty directories first.
- a SQLite file: its ``-wal``, ``-journal`` or ``-shm`` beside it (a connection has it
  open, or one was killed and left transactions to recover) refuses the restore; these are
  checked again just before the file is replaced (``rename``, atomic).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from dataclasses import dataclass

from ..errors import BackupError
from ..format import MAGIC
from ._restoring import exchange, work_path

__all__ = ["Replaced", "check_outside", "check_sqlite_unused", "open_target", "target_path"]

_SQLITE_COMPANIONS = ("-wal", "-journal", "-shm")


@dataclass
class Replaced:
    """The database a restore replaces: its file mode, and (a directory) the descriptor
    holding its ``LOCK``."""

    path: str
    mode: int
    lock_fd: int | None = None
    ident: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of what was checked

    def is_at(self, path: str) -> bool:
        """Whether ``path`` is (still) the database that was checked."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self.ident

    def release(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # closing the descriptor drops the flock
            self.lock_fd = None


def open_target(dest: str, kind: str, backup_id: str) -> Replaced:
    """Check that ``dest`` is a database of ``kind`` ("db" or "sqlite") that a restore of
    ``backup_id`` may replace, and (a directory) lock it against writers."""
    st = os.lstat(dest)
    what = "a database (a directory)" if kind == "db" else "an encrypted SQLite database"
    if stat.S_ISLNK(st.st_mode):
        raise BackupError(f"{dest} is a symbolic link: --force replaces a database, not a "
                          "link", hint="restore to the path the link names, or a new path")
    if kind == "db":
        if not stat.S_ISDIR(st.st_mode):
            raise BackupError(f"{dest} is a file; backup {backup_id} is of {what}",
                              hint="restore into a new path")
        if not os.path.isfile(os.path.join(dest, "catalog")):
            raise BackupError(f"{dest} is not a cryptdisk database (it has no catalog): "
                              "--force replaces only a database",
                              hint="restore into a new path")
        fd = os.open(os.path.join(dest, "LOCK"),
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BackupError(f"database {dest} is open for writing (a process holds its "
                              "LOCK): a restore does not replace a database in use",
                              hint="close it there, then restore again") from None
        try:
            _probe_exchange(dest)
        except BaseException:
            os.close(fd)
            raise
        return Replaced(dest, stat.S_IMODE(st.st_mode), fd, (st.st_dev, st.st_ino))
    if not stat.S_ISREG(st.st_mode):
        raise BackupError(f"{dest} is not a file; backup {backup_id} is of {what}",
                          hint="restore into a new path")
    with open(dest, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise BackupError(f"{dest} is not an encrypted SQLite database (no cryptdisk "
                              "header): --force replaces only one",
                              hint="restore into a new path")
    check_sqlite_unused(dest)
    return Replaced(dest, stat.S_IMODE(st.st_mode), ident=(st.st_dev, st.st_ino))


def target_path(target: str | os.PathLike[str]) -> str:
    """The absolute path a restore writes to: ``target``'s last name in its directory with
    the symbolic links of that directory resolved, as the kernel resolves them (no lexical
    ``..`` collapsing: ``link/../db`` is ``db`` beside the directory ``link`` names)."""
    path = os.fspath(target)
    if not path:
        raise BackupError("the restore's target is empty", hint="name a new path")
    path = os.path.join(os.getcwd(), path).rstrip("/") or "/"
    parent, name = os.path.split(path)
    if name in ("", ".", ".."):
        raise BackupError(f"{os.fspath(target)} names no file or directory of its own "
                          "(it ends with '.', '..' or is '/')",
                          hint="name the database's own path, e.g. DIR/NAME")
    return os.path.join(os.path.realpath(parent), name)


def check_outside(dest: str, kept: list[tuple[str, str]]) -> None:
    """Refuse to replace the directory ``dest`` when one of ``kept`` (what, local path) is
    in it: deleting the replaced database would delete it too."""
    real = os.path.realpath(dest)
    for what, path in kept:
        p = os.path.realpath(path)
        if p == real or p.startswith(real.rstrip("/") + "/"):
            raise BackupError(f"{what} {path} is inside {dest}: replacing {dest} deletes "
                              "what it holds", hint=f"move {what} out of {dest} first, or "
                              "restore into a new path")


def check_sqlite_unused(dest: str) -> None:
    """Refuse while SQLite's files beside ``dest`` say it is open or needs recovery: a WAL
    or hot journal left there would be applied to the restored database."""
    for suffix in _SQLITE_COMPANIONS:
        if os.path.lexists(dest + suffix):
            raise BackupError(
                f"{dest}{suffix} exists: {dest} is open, or a process using it was killed "
                "and left it to recover; a restore does not replace it then",
                hint="stop its users; if none is left, open and close it once (SQLite "
                "recovers and removes the file), then restore again")


def _probe_exchange(dest: str) -> None:
    """Fail now, before a long restore, where the file system cannot swap directories
    (the probes carry the work-in-progress names, so a killed probe is collected)."""
    a, b = work_path(dest), work_path(dest)
    os.mkdir(a, 0o700)
    try:
        os.mkdir(b, 0o700)
        try:
            exchange(a, b)
        finally:
            os.rmdir(b)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(a)
