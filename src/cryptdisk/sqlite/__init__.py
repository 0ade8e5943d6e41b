"""Encrypted, authenticated SQLite: an apsw VFS over cryptdisk's mutable file format.

The easy tier::

    import cryptdisk.sqlite

    db = cryptdisk.sqlite.connect("app.db", keyring=keyring)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t(x)")

Every file SQLite writes (database, rollback journal, WAL, temporary files) is
encrypted page by page with AES-GCM and a fresh random nonce per write; a page
that was flipped, moved, swapped, or copied from another file raises
:class:`PageAuthenticationError` (a :class:`cryptdisk.AuthenticationError`),
and pages cut from the end of the database raise :class:`PageTruncatedError`.
Decrypted pages live only in SQLite's own page cache. ``docs/sqlite.md``
describes the layout, the threat model and what is not detected (a whole-file
rollback, or one page replaced by an older version of itself).
"""

from ._connect import connect, vfs_for
from ._errors import PageAuthenticationError, PageTruncatedError
from ._vfs import EncryptedFile, EncryptedVFS

__all__ = [
    "EncryptedFile",
    "EncryptedVFS",
    "PageAuthenticationError",
    "PageTruncatedError",
    "connect",
    "vfs_for",
]
