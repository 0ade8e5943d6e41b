"""Rotating an encrypted SQLite database's keys while other connections use it.

A rotation rewraps the 128-byte header of the database, its rollback journal and its WAL
under the keyring's current key (``cryptdisk.keys.rewrap_file``: read, rewrap, write
back). A writer that starts a new rollback journal (every transaction in TRUNCATE and
PERSIST mode, or with a journal size limit) writes a new header with a new data key at
the same offset; were that to fall between the rotation's read and its write, the
rotation would put the old transaction's data key back over the new journal, and the
journal would no longer roll back after a crash (its records then read as torn:
the transaction's pages stay in the database half written). So :func:`rotate` holds
SQLite's write lock (``BEGIN EXCLUSIVE`` on a connection of its own) while it rewraps:
no transaction writes, commits or rolls back meanwhile, a hot journal is rolled back
first, and in WAL mode no writer restarts the WAL.

It rewraps through the descriptors its connection's VFS holds (``_fds``): POSIX drops
a process's locks on a file when any of its descriptors of that file is closed.
"""

from __future__ import annotations

import os

import apsw

from ..errors import DatabaseError
from ..format import KeyLookup
from ..keys import rewrap_descriptor
from . import _fds
from ._connect import connect

__all__ = ["rotate"]


def rotate(path: str | os.PathLike[str], keyring: KeyLookup, *,
           busy_timeout_ms: int = 30000) -> list[tuple[str, bool]]:
    """Rewrap the database at ``path``, its journal and its WAL (when not empty) under
    ``keyring.current_key()``, holding SQLite's write lock; returns ``(file, rewrapped)``
    for each (False: it already was under the current key).

    Waits up to ``busy_timeout_ms`` for the transactions of other connections to end
    (raises :class:`~cryptdisk.errors.DatabaseError` after that; nothing is rewrapped
    then). ``keyring`` must hold the keys the files are under now.
    """
    name = os.fspath(path)
    if not os.path.isfile(name):
        raise DatabaseError(f"{name}: no such database file")
    conn = connect(name, keyring=keyring, flags=apsw.SQLITE_OPEN_READWRITE,
                   busy_timeout_ms=busy_timeout_ms, implementation="python")
    try:
        # the WAL stays as it is (the last connection to close would checkpoint it into the
        # database and delete it): a rotation rewrites headers, not pages
        conn.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
        try:
            conn.execute("BEGIN EXCLUSIVE")
        except apsw.BusyError:
            raise DatabaseError(
                f"{name}: another connection held a transaction for {busy_timeout_ms / 1000:g} s; "
                "nothing was rewrapped", hint="run the rotation again") from None
        try:
            done = []
            for suffix in ("", "-journal", "-wal"):
                file = name + suffix
                if not os.path.isfile(file) or (suffix and os.path.getsize(file) == 0):
                    continue
                fd, key = _fds.acquire(file, True)
                try:
                    done.append((file, rewrap_descriptor(fd, file, keyring)))
                finally:
                    _fds.release(key)
            return done
        finally:
            conn.execute("ROLLBACK")
    finally:
        conn.close()
