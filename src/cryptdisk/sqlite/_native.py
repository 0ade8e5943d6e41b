"""The C implementation of the encrypting VFS (``csrc/cryptdisk_vfs/``), registered per keyring.

It writes and reads exactly the files the Python VFS (:mod:`._vfs`) does; it
exists because SQLite calls its VFS several times per transaction and each
call into Python costs more than encrypting the page. Python keeps what
touches keys: the C code calls :meth:`NativeVFS._header_for` to authenticate
an existing file's header and unwrap its data key, or to make the header of a
new file, and builds its exceptions with :func:`_exception` so that the
application gets the same :class:`PageAuthenticationError` (with path and
offset) from either VFS.

``_cvfs`` is a Python extension and a SQLite loadable extension in one file:
it must call the SQLite library apsw was built with, which it reaches through
the routines SQLite hands a loadable extension, so it is loaded once into a
private in-memory connection before the first registration.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import threading
from typing import Any

import apsw

from ..format import KeyLookup as _KeyLookup
from ._errors import PageAuthenticationError, PageSizeError, PageTruncatedError, WalIndexError
from ._header import header_and_key, new_headers_and_keys, stored_header_and_key

try:  # the C extension, which has no type stubs (Any)
    _cvfs: Any = importlib.import_module(f"{__package__}._cvfs")
except ImportError:  # built without a C compiler or OpenSSL headers: see setup.py
    _cvfs = None

__all__ = ["NativeVFS", "available", "cipher_library", "plain_base"]

log = logging.getLogger("cryptdisk.sqlite")
_counter = itertools.count(1)
_lock = threading.Lock()
_EXCEPTIONS = (PageAuthenticationError, PageTruncatedError)  # by ERR_AUTH, ERR_TRUNCATED (cvfs.h)
_ERR_SHM = 2
_ERR_PAGESIZE = 3


def available() -> bool:
    """Whether the C VFS was built (``pip install`` with a C compiler and libssl-dev)."""
    return _cvfs is not None


def cipher_library() -> str | None:
    """The library and version of the C VFS's AES-GCM (``"libgcrypt 1.10.1"``), None without it.

    The build takes libgcrypt when its headers are there, else OpenSSL (setup.py).
    """
    return _cvfs.cipher_library() if _cvfs is not None else None


def _load_into_sqlite() -> None:
    with _lock:
        _load_into_sqlite_locked()


def _load_into_sqlite_locked() -> None:
    if _cvfs.ready():
        return
    conn = apsw.Connection(":memory:")
    try:
        conn.enable_load_extension(True)
        conn.load_extension(_cvfs.__file__, "sqlite3_cvfs_init")
    finally:
        conn.close()
    if not _cvfs.ready():  # pragma: no cover - SQLite always calls the entry point
        raise RuntimeError("SQLite did not initialise cryptdisk's C VFS")


_plain_base: str | None = None


def plain_base() -> str:
    """The base VFS for the Python VFS: ``""`` (SQLite's default) without the C VFS.

    With it, ``cryptdisk-plain``: the default VFS's files, with the WAL index in
    a memory file system rather than beside the database (``csrc/cryptdisk_vfs/shm.c``),
    so that both VFSes keep it in the same place.
    """
    global _plain_base
    if _cvfs is None:
        return ""
    with _lock:
        if _plain_base is None:
            _load_into_sqlite_locked()
            _cvfs.register("cryptdisk-plain", None, _exception, _warn)
            _plain_base = "cryptdisk-plain"
        return _plain_base


def _exception(code: int, message: str, offset: int, path: str) -> Exception:
    if code == _ERR_SHM:
        return WalIndexError(message)
    if code == _ERR_PAGESIZE:
        return PageSizeError(message)
    return _EXCEPTIONS[code](message, offset=offset, path=path)


def _warn(message: str) -> None:
    log.warning("%s", message)


class NativeVFS:
    """The C encrypting VFS of one keyring, registered with SQLite as ``cryptdisk-c-N``.

    Use :func:`cryptdisk.sqlite.connect` rather than this class; ``repr``
    shows only the name.
    """

    def __init__(self, keyring: _KeyLookup, name: str | None = None) -> None:
        if not isinstance(keyring, _KeyLookup):
            raise TypeError("keyring must be a cryptdisk.Keyring")
        if _cvfs is None:
            raise RuntimeError("cryptdisk was built without its C VFS (see setup.py)")
        _load_into_sqlite()
        self.vfs_name = name or f"cryptdisk-c-{next(_counter)}"
        self.keyring = keyring
        self._failed: dict[str, tuple[bytes, Exception]] = {}  # see stored_header_and_key
        _cvfs.register(self.vfs_name, self._header_for, _exception, _warn)

    def _header_for(self, path: str, header: bytes | None, segment_size: int, lead: int,
                    frame_extra: int, count: int = 0, attempt: int | None = None
                    ) -> tuple[bytes, bytes] | list[tuple[bytes, bytes]] | None:
        # count: the C VFS asks for that many new files' headers at once (headers.c);
        # attempt: how often it read this existing header before (answer None: read it
        # again); not given by a _cvfs built before it read headers again: one read
        if count:
            return new_headers_and_keys(self.keyring, segment_size, lead, frame_extra, count)
        if header is not None:
            return stored_header_and_key(self.keyring, path, header, attempt, self._failed)
        return header_and_key(self.keyring, path, None, segment_size, lead, frame_extra)

    def __repr__(self) -> str:
        return f"<NativeVFS {self.vfs_name!r}>"

    def __reduce__(self) -> Any:
        raise TypeError("a NativeVFS cannot be pickled; register one per process")
