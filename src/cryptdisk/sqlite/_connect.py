"""Opening encrypted databases: one registered VFS per keyring, and ``connect``."""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import Any

import apsw

from ..errors import ConfigError
from ..format import KeyLookup
from . import _native
from ._native import NativeVFS
from ._vfs import EncryptedVFS

__all__ = ["IMPLEMENTATIONS", "connect", "implementation", "vfs_for"]

#: The two VFSes: "c" (``csrc/cryptdisk_vfs/``, the default when it was built) and "python"
#: (the reference). They read and write the same files.
IMPLEMENTATIONS = ("c", "python")
ENV = "CRYPTDISK_SQLITE_VFS"

_lock = threading.Lock()
_registry: dict[tuple[int, str], tuple[KeyLookup, EncryptedVFS | NativeVFS]] = {}


#: The build prerequisites of the C VFS, named by the warnings and errors (Debian packages).
BUILD_PACKAGES = "gcc libssl-dev libsqlite3-dev libgcrypt20-dev"
_fallback_warned = False


def _warn_fallback() -> None:
    """Say once per process that the slower Python VFS stands in for the missing C one."""
    global _fallback_warned
    if _fallback_warned:
        return
    _fallback_warned = True
    warnings.warn(
        "cryptdisk.sqlite: the C VFS was not built when cryptdisk was installed, so the "
        "Python VFS is used (same files, about half the speed). To build it: apt-get install "
        f"{BUILD_PACKAGES}, then reinstall cryptdisk (pip install -e .). Set "
        f"{ENV}=python to choose the Python VFS without this warning.",
        RuntimeWarning, stacklevel=4)


def implementation(requested: str | None = None) -> str:
    """The VFS ``connect`` uses: ``requested``, else ``$CRYPTDISK_SQLITE_VFS``, else C if built.

    Falling back to the Python VFS because the C one was not built warns once
    (a ``RuntimeWarning`` naming the packages to install).
    """
    name = requested or os.environ.get(ENV)
    if name is None:
        name = "c" if _native.available() else "python"
        if name == "python":
            _warn_fallback()
    if name not in IMPLEMENTATIONS:
        source = "implementation" if requested else ENV
        raise ConfigError(f"{source} must be one of {', '.join(IMPLEMENTATIONS)}, not {name!r}")
    if name == "c" and not _native.available():
        raise ConfigError(
            "the C VFS of cryptdisk.sqlite was not built (it needs a C compiler and the "
            "OpenSSL and SQLite headers at install time)",
            hint=f"apt-get install {BUILD_PACKAGES}, then reinstall cryptdisk; or use "
            "implementation='python'",
        )
    return name


def vfs_for(keyring: KeyLookup, implementation_: str | None = None) -> EncryptedVFS | NativeVFS:
    """The encrypted VFS of ``keyring``, registered with SQLite on first use."""
    if not isinstance(keyring, KeyLookup):
        raise TypeError(f"keyring must be a cryptdisk.Keyring, not {type(keyring).__name__}")
    impl = implementation(implementation_)
    with _lock:
        entry = _registry.get((id(keyring), impl))
        if entry is None or entry[0] is not keyring:
            vfs = NativeVFS(keyring) if impl == "c" else EncryptedVFS(keyring)
            entry = (keyring, vfs)
            _registry[(id(keyring), impl)] = entry
        return entry[1]


def connect(
    path: str | os.PathLike[str],
    *,
    keyring: KeyLookup,
    flags: int = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE,
    temp_store_memory: bool = True,
    busy_timeout_ms: int = 5000,
    implementation: str | None = None,
    **kwargs: Any,
) -> apsw.Connection:
    """Open (or create) an encrypted SQLite database and return an ``apsw.Connection``.

    ``flags`` are SQLite's open flags (default read-write, create); other
    keyword arguments go to :class:`apsw.Connection` (e.g. ``statementcachesize``).
    New files are encrypted under ``keyring.current_key()`` and created with mode 0600
    (their journal, WAL and WAL index take the database's mode); existing files are
    opened with whichever key of the keyring their header names, so a wrong
    key fails here, at open, with :class:`cryptdisk.WrongKeyError` or
    :class:`cryptdisk.KeyNotFoundError`.

    ``busy_timeout_ms`` is how long a statement waits for another connection's
    lock before raising ``apsw.BusyError`` (SQLite's busy timeout).

    ``temp_store_memory`` sets ``PRAGMA temp_store=MEMORY`` so temporary
    tables, sorts and statement journals stay in memory (temporary files would
    be encrypted too; memory is simply faster). ``PRAGMA mmap_size`` has no
    effect on this VFS: SQLite must read pages through it to decrypt them.

    ``implementation`` picks the VFS: ``"c"`` (compiled at install time; the
    default when it was built) or ``"python"`` (the reference). Both read and
    write the same files; ``$CRYPTDISK_SQLITE_VFS`` sets the default.
    """
    name = os.fspath(path)
    if not isinstance(name, str):
        raise TypeError("path must be a str or os.PathLike[str]")
    vfs = vfs_for(keyring, implementation)
    made = _create_private(name, flags)
    try:
        conn = apsw.Connection(name, flags=flags, vfs=vfs.vfs_name, **kwargs)
    except BaseException:
        if made:
            with contextlib.suppress(OSError):
                if os.stat(name).st_size == 0:
                    os.unlink(name)
        raise
    try:
        conn.set_busy_timeout(busy_timeout_ms)
        if flags & apsw.SQLITE_OPEN_READONLY:
            # A read-only connection cannot checkpoint the WAL; at close SQLite would
            # try the exclusive lock for it anyway, and through the Python VFS apsw
            # raises that refusal from close().
            conn.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
        if temp_store_memory:
            conn.execute("PRAGMA temp_store=MEMORY")
        # Reading page 1 authenticates the header and the first page now rather
        # than at the first query; an empty new database has nothing to read.
        conn.execute("PRAGMA schema_version").fetchall()
    except BaseException:
        conn.close()
        raise
    return conn


def _create_private(name: str, flags: int) -> bool:
    """Create ``name`` empty with mode 0600 when this open would create it; True if it did.

    SQLite's own file creation uses 0644 (less the umask), and the journal, WAL and WAL
    index copy the database's mode: an empty file is a new database to SQLite, so making
    it first keeps the whole database owner-only. Names SQLite does not treat as a path
    (``:memory:``, ``""``, URIs) and opens that do not create are left to SQLite, as is
    any error (SQLite reports it as it would)."""
    if (not flags & apsw.SQLITE_OPEN_CREATE or flags & apsw.SQLITE_OPEN_READONLY
            or flags & apsw.SQLITE_OPEN_URI or flags & apsw.SQLITE_OPEN_MEMORY
            or name in ("", ":memory:") or name.startswith("file:")):
        return False
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    os.close(fd)
    return True
