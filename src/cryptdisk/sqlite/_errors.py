"""Errors of the encrypted SQLite store, as both cryptdisk and apsw exceptions.

apsw hands an exception raised inside a VFS method back to the caller of the
SQL statement unchanged, and tells SQLite the error code of the apsw class it
derives from. So :class:`PageAuthenticationError` is a
:class:`cryptdisk.errors.SegmentAuthenticationError` for the application and
``SQLITE_CORRUPT`` for SQLite, which then abandons the statement and rolls back.
"""

from __future__ import annotations

import apsw

from ..errors import SegmentAuthenticationError, TruncatedFileError

__all__ = ["PageAuthenticationError", "PageTruncatedError"]


class PageAuthenticationError(SegmentAuthenticationError, apsw.CorruptError):
    """A page (or journal/WAL segment) failed authentication: tampered, moved or spliced."""


class PageTruncatedError(TruncatedFileError, apsw.CorruptError):
    """The database file is shorter than its own header says: pages were cut away."""
