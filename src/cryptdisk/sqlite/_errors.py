"""Errors of the encrypted SQLite store, as both cryptdisk and apsw exceptions.

apsw hands an exception raised inside a VFS method back to the caller of the
SQL statement unchanged, and tells SQLite the error code of the apsw class it
derives from. So :class:`PageAuthenticationError` is a
:class:`cryptdisk.errors.SegmentAuthenticationError` for the application and
``SQLITE_CORRUPT`` for SQLite, which then abandons the statement and rolls back.
"""

from __future__ import annotations

import apsw

from ..errors import CryptdiskError, SegmentAuthenticationError, TruncatedFileError

__all__ = ["PageAuthenticationError", "PageSizeError", "PageTruncatedError", "WalIndexError"]


class PageAuthenticationError(SegmentAuthenticationError, apsw.CorruptError):
    """A page (or journal/WAL segment) failed authentication: tampered, moved or spliced."""


class PageTruncatedError(TruncatedFileError, apsw.CorruptError):
    """The database file is shorter than its own header says: pages were cut away."""


class PageSizeError(CryptdiskError, apsw.IOError):
    """A VACUUM or backup would shrink the page size below the size of the file's records.

    A database file's records are as large as its pages were when it was created. A
    smaller page would share a record with other pages, so writing it rewrites them
    all, and a write cut by a crash would take pages with it that the journal does not
    hold. SQLite sees an I/O error and rolls the statement back; ``VACUUM INTO`` a new
    file makes a database with the smaller pages.
    """


class WalIndexError(CryptdiskError, apsw.CantOpenError):
    """The WAL index cannot be shared with another process that has the database open.

    cryptdisk keeps the WAL index in a memory file system (``$CRYPTDISK_SHM_DIR``,
    default ``/dev/shm``), not beside the database. A process that sees another
    one (another container) or keeps its index beside the database (cryptdisk
    without its C extension) cannot share it; the message says which.
    """
