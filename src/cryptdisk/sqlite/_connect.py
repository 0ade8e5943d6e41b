"""Opening encrypted databases: one registered VFS per keyring, and ``connect``."""

from __future__ import annotations

import os
import threading
from typing import Any

import apsw

from ..format import KeyLookup
from ._vfs import EncryptedVFS

__all__ = ["connect", "vfs_for"]

_lock = threading.Lock()
_registry: dict[int, tuple[KeyLookup, EncryptedVFS]] = {}


def vfs_for(keyring: KeyLookup) -> EncryptedVFS:
    """The encrypted VFS of ``keyring``, registered with SQLite on first use."""
    if not isinstance(keyring, KeyLookup):
        raise TypeError(f"keyring must be a cryptdisk.Keyring, not {type(keyring).__name__}")
    with _lock:
        entry = _registry.get(id(keyring))
        if entry is None or entry[0] is not keyring:
            entry = (keyring, EncryptedVFS(keyring))
            _registry[id(keyring)] = entry
        return entry[1]


def connect(
    path: str | os.PathLike[str],
    *,
    keyring: KeyLookup,
    flags: int = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE,
    temp_store_memory: bool = True,
    busy_timeout_ms: int = 5000,
    **kwargs: Any,
) -> apsw.Connection:
    """Open (or create) an encrypted SQLite database and return an ``apsw.Connection``.

    ``flags`` are SQLite's open flags (default read-write, create); other
    keyword arguments go to :class:`apsw.Connection` (e.g. ``statementcachesize``).
    New files are encrypted under ``keyring.current_key()``; existing files are
    opened with whichever key of the keyring their header names, so a wrong
    key fails here, at open, with :class:`cryptdisk.WrongKeyError` or
    :class:`cryptdisk.KeyNotFoundError`.

    ``busy_timeout_ms`` is how long a statement waits for another connection's
    lock before raising ``apsw.BusyError`` (SQLite's busy timeout).

    ``temp_store_memory`` sets ``PRAGMA temp_store=MEMORY`` so temporary
    tables, sorts and statement journals stay in memory (temporary files would
    be encrypted too; memory is simply faster). ``PRAGMA mmap_size`` has no
    effect on this VFS: SQLite must read pages through it to decrypt them.
    """
    name = os.fspath(path)
    if not isinstance(name, str):
        raise TypeError("path must be a str or os.PathLike[str]")
    vfs = vfs_for(keyring)
    conn = apsw.Connection(name, flags=flags, vfs=vfs.vfs_name, **kwargs)
    try:
        conn.set_busy_timeout(busy_timeout_ms)
        if temp_store_memory:
            conn.execute("PRAGMA temp_store=MEMORY")
        # Reading page 1 authenticates the header and the first page now rather
        # than at the first query; an empty new database has nothing to read.
        conn.execute("PRAGMA schema_version").fetchall()
    except BaseException:
        conn.close()
        raise
    return conn
