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

import itertools
import logging
import threading
from typing import Any

import apsw

from ..format import KeyLookup as _KeyLookup
from ._errors import PageAuthenticationError, PageTruncatedError
from ._header import header_and_key

try:
    from . import _cvfs  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler or OpenSSL headers: see setup.py
    _cvfs = None

__all__ = ["NativeVFS", "available"]

log = logging.getLogger("cryptdisk.sqlite")
_counter = itertools.count(1)
_lock = threading.Lock()
_EXCEPTIONS = (PageAuthenticationError, PageTruncatedError)  # by the C code's error number


def available() -> bool:
    """Whether the C VFS was built (``pip install`` with a C compiler and libssl-dev)."""
    return _cvfs is not None


def _load_into_sqlite() -> None:
    with _lock:
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


def _exception(code: int, message: str, offset: int, path: str) -> Exception:
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
        _cvfs.register(self.vfs_name, self._header_for, _exception, _warn)

    def _header_for(self, path: str, header: bytes | None, segment_size: int, lead: int,
                    frame_extra: int) -> tuple[bytes, bytes]:
        return header_and_key(self.keyring, path, header, segment_size, lead, frame_extra)

    def __repr__(self) -> str:
        return f"<NativeVFS {self.vfs_name!r}>"

    def __reduce__(self) -> Any:
        raise TypeError("a NativeVFS cannot be pickled; register one per process")
