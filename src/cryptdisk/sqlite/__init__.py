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
Decrypted pages live only in the process's memory (SQLite's page cache). ``docs/sqlite-vfs.md``
describes the layout, the threat model and what is not detected (a whole-file
rollback, or one page replaced by an older version of itself).

:mod:`cryptdisk.sqlite.dbapi` offers the same database through a DB-API 2.0
(PEP 249) interface shaped like the ``sqlite3`` module.

Two VFSes write these files: a C one (built at install time, linked with
OpenSSL; the default) and the Python reference; ``connect(...,
implementation="python")`` or ``$CRYPTDISK_SQLITE_VFS`` picks one, and
:func:`implementation` says which is in use.
"""

from ._connect import IMPLEMENTATIONS, connect, implementation, vfs_for
from ._convert import decrypt_database, encrypt_database, encrypt_sqlcipher_database
from ._errors import PageAuthenticationError, PageSizeError, PageTruncatedError, WalIndexError
from ._native import NativeVFS, cipher_library
from ._rotation import rotate
from ._vfs import EncryptedFile, EncryptedVFS
from ._walindex import wal_index_paths

__all__ = [
    "IMPLEMENTATIONS",
    "EncryptedFile",
    "EncryptedVFS",
    "NativeVFS",
    "PageAuthenticationError",
    "PageSizeError",
    "PageTruncatedError",
    "WalIndexError",
    "cipher_library",
    "connect",
    "decrypt_database",
    "encrypt_database",
    "encrypt_sqlcipher_database",
    "implementation",
    "rotate",
    "vfs_for",
    "wal_index_paths",
]
