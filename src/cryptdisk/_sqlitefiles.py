"""SQLite's files beside a database, and its locks as another process sees them.

A SQLite database ``NAME`` (plain, or encrypted by :mod:`cryptdisk.sqlite`) keeps beside
it a WAL (``NAME-wal``) or a rollback journal (``NAME-journal``), the WAL index or its lock
file (``NAME-shm``) and, encrypted, the saved last segment of the WAL and journal
(``NAME-wal-cdtail``, ``NAME-journal-cdtail``). Tools that copy files one by one
(``cryptdisk convert``, a restore) ask here whether a connection has the database open.
"""

from __future__ import annotations

import fcntl
import os
import struct

__all__ = ["JOURNAL_MAGIC", "LOCK_LEN", "LOCK_START", "SHM_DMS_BYTE", "SQLITE_COMPANIONS",
           "SQLITE_JOURNALS", "flock_struct", "journal_holds_rollback", "locked", "sqlite_open"]

#: what SQLite (and cryptdisk's VFS) keep beside a database file
SQLITE_COMPANIONS = ("-wal", "-journal", "-shm", "-wal-cdtail", "-journal-cdtail")
#: what may hold part of a database's committed state (a WAL's frames, a hot journal)
SQLITE_JOURNALS = ("-wal", "-journal")
#: the first bytes of a rollback journal that holds a transaction to roll back (a hot
#: journal): SQLite writes zeros there first, the magic once the journal's records are
#: synced, and zeros again when the transaction ends (``journal_mode=PERSIST`` keeps the
#: file, its header zeroed)
JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")
#: SQLite's lock bytes in a database file (unix VFS): PENDING, RESERVED, then the 510
#: bytes of the SHARED range; its EXCLUSIVE lock is a write lock on all of them
LOCK_START, LOCK_LEN = 0x40000000, 2 + 510
#: the dead-man switch of ``-shm`` (SQLite's unix VFS and cryptdisk's lock file alike):
#: every connection holding the WAL index keeps a read lock on it
SHM_DMS_BYTE = 128


def flock_struct(kind: int, start: int, length: int) -> bytes:
    """A ``struct flock`` for ``fcntl`` (an open-file-description lock: pid 0)."""
    return struct.pack("@hhqqi4x", kind, os.SEEK_SET, start, length, 0)


def journal_holds_rollback(head: bytes | None) -> bool:
    """Whether a rollback journal whose plaintext starts with ``head`` (its first
    ``len(JOURNAL_MAGIC)`` bytes; None: it does not open or read) holds a transaction
    SQLite would roll back, as a copy of the database's files can tell: it starts with
    the magic, or it cannot be read. A shorter or zeroed header is one SQLite deletes or
    reuses without rolling anything back."""
    return head is None or head.startswith(JOURNAL_MAGIC)


def locked(path: str, start: int, length: int) -> bool:
    """Whether any process (or connection of this one) holds a lock on those bytes of
    ``path`` (an open-file-description lock test: it sees the ``fcntl`` locks of every
    process, this one's included)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        out = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, flock_struct(fcntl.F_WRLCK, start, length))
    finally:
        os.close(fd)
    return bool(struct.unpack("@hhqqi4x", out)[0] != fcntl.F_UNLCK)


def sqlite_open(path: str, *, file_locks: bool = True) -> bool:
    """Whether SQLite's locks say a connection has the database ``path`` open: a lock on
    its lock bytes (a transaction; in WAL mode, every connection from its first read until
    it closes) or on the dead-man switch of ``path-shm`` (a connection holding the WAL
    index). Rollback-journal connections between transactions hold no lock: they go
    undetected, as SQLite itself cannot tell them. ``file_locks=False``: only ``-shm``."""
    return ((file_locks and locked(path, LOCK_START, LOCK_LEN))
            or locked(path + "-shm", SHM_DMS_BYTE, 1))
