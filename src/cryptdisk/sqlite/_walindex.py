"""Where cryptdisk's WAL index of a database lives (``csrc/cryptdisk_vfs/shm.c``).

Beside the database, ``PATH-shm`` is a lock file holding one line,
``cryptdisk wal-index <32 hex digits>\\n``; the index is ``<dir>/cryptdisk-<token>-shm``
(SQLite's shared memory of the empty anchor ``<dir>/cryptdisk-<token>``), where ``<dir>``
is ``$CRYPTDISK_SHM_DIR`` (default ``/dev/shm``, a memory file system). Every connection
holding the index keeps a read lock on byte 128 of the lock file (SQLite's dead-man
switch); the last one to close deletes all three files, and the first one to open the
database after a crash deletes the index its lock file names before starting a new one.
"""

from __future__ import annotations

import os

__all__ = ["SHM_DIR_ENV", "shm_dir", "wal_index_paths"]

SHM_DIR_ENV = "CRYPTDISK_SHM_DIR"
_LINE = b"cryptdisk wal-index "
_HEX = frozenset(b"0123456789abcdef")


def shm_dir() -> str:
    """The directory of this process's WAL indexes (``$CRYPTDISK_SHM_DIR`` or /dev/shm)."""
    return os.environ.get(SHM_DIR_ENV) or "/dev/shm"  # noqa: S108 (memory, by design)


def wal_index_paths(database: str | os.PathLike[str]) -> list[str]:
    """The WAL index and its anchor that the lock file ``DATABASE-shm`` names in
    :func:`shm_dir` (whether or not they exist), or [] if it names none (no such file,
    or SQLite's own ``-shm``, which is the index itself). Nothing is locked: a caller that
    deletes them must know that no connection holds them (the lock file's byte 128)."""
    try:
        with open(os.fspath(database) + "-shm", "rb") as f:
            line = f.read(len(_LINE) + 33)
    except OSError:
        return []
    token = line[len(_LINE):-1]
    if not line.startswith(_LINE) or line[-1:] != b"\n" or len(token) != 32 \
            or not set(token) <= _HEX:
        return []
    anchor = os.path.join(shm_dir(), f"cryptdisk-{token.decode()}")
    return [anchor + "-shm", anchor]
