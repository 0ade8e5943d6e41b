"""Restoring over an existing database (``restore(..., replace=True)``, ``--force``).

What may be replaced is checked before anything is restored: a database directory (one
holding a catalog) for a database backup, an encrypted SQLite file (a cryptdisk header)
for a SQLite backup; never a symbolic link, another kind of file, or a database in use:

- a database directory: its ``LOCK`` is taken as a writer takes it (``flock``), and held
  until the new database has taken its place, so no writer opens it meanwhile; a writer
  holding it refuses the restore. The file system must swap directories atomically
  (``renameat2(RENAME_EXCHANGE)``), which is tried on two empty directories first.
- a SQLite file: open is what SQLite's own locks say (a lock on the database file's lock
  bytes: a connection in a transaction, or any connection in WAL mode, which holds a
  shared lock from its first read until it closes; or on the dead-man-switch byte of
  ``-shm``, which every connection holding the WAL index locks). An open file refuses the
  restore. A ``-wal`` or ``-journal`` that nobody holds may hold part of the database's
  committed state (a killed writer's WAL frames, or the hot journal that undoes its
  half-written transaction): before anything beside the file is deleted, the restore
  opens the database once with its keyring, reads it and checkpoints it, so SQLite itself
  applies them (rolling the hot journal back, copying every WAL frame into the file) with
  its own crash safety; the file then holds the old state on its own, and a restore
  killed at any later point leaves it whole. Unless that completed (a keyring that cannot
  open it, a read-only file, a full disk, a busy or partial checkpoint, a WAL with frames
  or a hot journal still there after) the restore is refused, nothing deleted. What
  remains beside it (an empty WAL a read-only connection cannot delete, ``-shm``, a stale
  WAL index, a journal that a closed connection left and SQLite ignores) holds no state:
  it is deleted just before the file is replaced (``rename``, atomic), under a write lock
  on the database's lock bytes (SQLite's exclusive lock), after checking again that
  nobody holds the file and that its WAL and journal are as the restore left them, so
  nobody opens the old file and its companions meanwhile, which would otherwise be
  applied to the new one.
  Rollback-journal connections between transactions hold no lock (SQLite cannot tell
  them): one left open through the restore goes on with the replaced file, whose later
  writes are lost with it; close every connection before a restore.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

import apsw

from .._flocks import hold, let_go
from .._sqlitefiles import (
    LOCK_LEN,
    LOCK_START,
    SQLITE_COMPANIONS,
    SQLITE_JOURNALS,
    flock_struct,
    sqlite_open,
)
from ..errors import BackupError, CryptdiskError
from ..format import MAGIC
from ..keys import Keyring
from ._restoring import exchange, work_path

__all__ = ["Replaced", "check_outside", "check_sqlite_unused", "holding_sqlite", "open_target",
           "settle_sqlite", "target_path"]

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
            let_go(self.lock_fd)
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
        fd = hold(os.open(os.path.join(dest, "LOCK"),  # a forked child closes its copy
                          os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            let_go(fd)
            os.close(fd)
            raise BackupError(f"database {dest} is open for writing (a process holds its "
                              "LOCK): a restore does not replace a database in use",
                              hint="close it there, then restore again") from None
        try:
            _probe_exchange(dest)
        except BaseException:
            let_go(fd)
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


def check_sqlite_unused(dest: str, *, file_locks: bool = True) -> None:
    """Refuse while SQLite's locks say a connection has ``dest`` open: a lock on its lock
    bytes (a transaction; in WAL mode, every connection from its first read until it
    closes) or on the dead-man switch of ``dest-shm`` (a connection holding the WAL
    index). Files beside it that nobody holds are leftovers (see :func:`holding_sqlite`).
    Rollback-journal connections between transactions hold no lock: they go undetected,
    as SQLite itself cannot tell them. ``file_locks=False``: the caller holds the lock
    bytes itself, only ``-shm`` is checked."""
    if sqlite_open(dest, file_locks=file_locks):
        raise BackupError(
            f"{dest} is open: a connection holds SQLite's lock on it (a transaction, or a "
            "connection in WAL mode); a restore does not replace a database in use",
            hint="close it there (every connection), then restore again")


def _journals(dest: str) -> dict[str, tuple[int, int, int]]:
    """The non-empty WAL and journal beside ``dest``: (inode, size, mtime)."""
    out = {}
    for suffix in SQLITE_JOURNALS:
        try:
            st = os.lstat(dest + suffix)
        except FileNotFoundError:
            continue
        if st.st_size:
            out[suffix] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def _refuse_unsettled(dest: str, why: str) -> BackupError:
    return BackupError(
        f"{dest} has a WAL or hot journal that a killed writer left (part of its committed "
        "state), which the restore applies to the file before replacing it, and could not: "
        f"{why}; nothing was replaced",
        hint="open it once with its own key where it can be written (a writable file, room "
        "on its disk): cryptdisk.sqlite.connect(PATH, keyring=...) and any query make SQLite "
        "apply them; then restore again")


def _journal_is_hot(dest: str, keyring: Keyring) -> bool:
    """Whether ``dest-journal`` is a hot journal as SQLite tells one (nobody holds the
    database, which :func:`settle_sqlite` checked): non-empty, and its first byte, read
    through the keyring's VFS, is not zero (a closed ``PERSIST`` connection zeroes it)."""
    from ..sqlite import vfs_for

    name = vfs_for(keyring).vfs_name
    f = apsw.VFSFile(name, dest + "-journal",
                     [apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_MAIN_JOURNAL, 0])
    try:
        if f.xFileSize() == 0:
            return False
        return f.xRead(1, 0) != b"\0"
    finally:
        f.xClose()


def settle_sqlite(dest: str, keyring: Keyring) -> dict[str, tuple[int, int, int]]:
    """Make the file ``dest`` hold its committed state on its own: a non-empty WAL or
    journal beside it that nobody holds (a killed writer's) is applied by SQLite itself:
    reading the database rolls a hot journal back, and ``PRAGMA wal_checkpoint(TRUNCATE)``
    copies every frame of the WAL into the file and empties it (the last connection's
    close deletes it). Refused (nothing deleted) unless that completed: the checkpoint
    neither busy nor partial, no WAL with anything in it and no hot journal left after
    (a read-only file, a full disk, a connection that came meanwhile). Returns what is
    left beside it (a journal SQLite ignores; see :func:`holding_sqlite`)."""
    from ..sqlite import connect

    if not _journals(dest):
        return {}
    check_sqlite_unused(dest)
    counts: tuple[int, int, int] | None = None
    try:
        conn = connect(dest, keyring=keyring)
        try:
            conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()
            try:
                busy, log, done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0]
            except apsw.Error as exc:
                err = conn.system_errno
                cause = (" (the file opened read-only: it cannot be written)"
                         if conn.readonly("main") else f" ({os.strerror(err)})" if err else "")
                raise _refuse_unsettled(dest, "copying its WAL into the file failed: "
                                        f"{type(exc).__name__}: {exc}{cause}") from None
            counts = (int(busy), int(log), int(done))  # type: ignore[arg-type]
        finally:
            conn.close()
    except (CryptdiskError, apsw.Error) as exc:
        if isinstance(exc, BackupError):
            raise
        raise _refuse_unsettled(dest, f"{type(exc).__name__}: {exc}") from None
    busy, log, done = counts
    if busy or log != done:  # log = done = -1: not a WAL database (no WAL left to copy)
        raise _refuse_unsettled(
            dest, f"the checkpoint of its WAL did not complete ({'busy, ' if busy else ''}"
            f"{done} of {log} frames copied into the file)")
    left = _journals(dest)
    if "-wal" in left:
        raise _refuse_unsettled(dest, f"its WAL still holds {left['-wal'][1]} bytes after "
                                "the checkpoint")
    if "-journal" in left:
        try:
            hot = _journal_is_hot(dest, keyring)
        except (CryptdiskError, apsw.Error) as exc:
            raise _refuse_unsettled(dest, f"its journal cannot be read: {type(exc).__name__}: "
                                    f"{exc}") from None
        if hot:
            raise _refuse_unsettled(dest, "its journal is still hot after SQLite opened it")
    return left


@contextlib.contextmanager
def holding_sqlite(dest: str, settled: dict[str, tuple[int, int, int]]) -> Iterator[None]:
    """Hold SQLite's exclusive lock on the database file ``dest`` (a write lock on its lock
    bytes: a connection opening it waits, busy), check again that nobody has it open and
    that its WAL and journal are still ``settled`` (what :func:`settle_sqlite` left), then
    delete the files beside it (an empty WAL a read-only connection left, a stale
    ``-shm`` and its WAL index, a journal SQLite ignores): they hold none of its state,
    and one left there would be applied to the new file. The caller replaces ``dest``
    inside the block."""
    from ..sqlite import wal_index_paths

    try:
        fd = os.open(dest, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        writable = True
    except PermissionError:  # a read-only file (its directory is writable): checked only
        fd = os.open(dest, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        writable = False
    hold(fd)  # an OFD lock belongs to the open file: a forked child closes its copy
    try:
        if writable:
            try:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK,
                            flock_struct(fcntl.F_WRLCK, LOCK_START, LOCK_LEN))
            except (BlockingIOError, PermissionError):
                raise BackupError(f"{dest} is open: a connection holds SQLite's lock on it; "
                                  "a restore does not replace a database in use",
                                  hint="close it there, then restore again") from None
        check_sqlite_unused(dest, file_locks=not writable)
        if _journals(dest) != settled:
            raise BackupError(f"{dest} was written during the restore (its WAL or journal "
                              "changed); a restore does not replace a database in use",
                              hint="close it there, then restore again")
        for index in wal_index_paths(dest):  # a killed process's WAL index
            with contextlib.suppress(FileNotFoundError):
                os.unlink(index)
        for suffix in SQLITE_COMPANIONS:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(dest + suffix)
        yield
    finally:
        let_go(fd)
        os.close(fd)  # drops the lock (on the replaced file, if it was replaced)


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
