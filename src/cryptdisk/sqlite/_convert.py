"""Converting databases: plain SQLite or SQLCipher to cryptdisk's encrypted SQLite and back.

Plain SQLite in either direction goes through SQLite's online backup API, so
the source may be in use by other processes while it is copied, and the copy
is page for page (same page size, same journal mode setting). A SQLCipher
source is opened with the ``sqlcipher3`` package, which cannot hand pages to
apsw, so it is copied logically: schema, then rows table by table, then
indexes, triggers and views. Neither path writes plaintext to disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from typing import Any

import apsw

from ..errors import CryptdiskError, DatabaseError, NotEncryptedError
from ..format import KeyLookup
from ._connect import _create_private, connect

__all__ = ["decrypt_database", "encrypt_database", "encrypt_sqlcipher_database"]

Progress = Callable[[int, int], None]  # (pages done, pages total)
_STEP = 256  # pages per backup step


def _check_paths(src: str, dst: str) -> None:
    if not os.path.isfile(src):
        raise DatabaseError(f"{src}: no such database file")
    for suffix in ("", "-journal", "-wal"):
        if os.path.lexists(dst + suffix):
            raise DatabaseError(f"{dst + suffix} already exists; refusing to overwrite it",
                                hint="remove it or choose another destination")


def _remove(dst: str) -> None:
    for suffix in ("", "-journal", "-wal", "-shm", "-journal-cdtail", "-wal-cdtail"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dst + suffix)


def _backup(target: apsw.Connection, source: apsw.Connection, progress: Progress | None) -> None:
    with target.backup("main", source, "main") as b:
        while not b.done:
            b.step(_STEP)
            if progress is not None:
                progress(b.page_count - b.remaining, b.page_count)


def _open_plain(src: str) -> apsw.Connection:
    conn = apsw.Connection(src, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()
    except apsw.NotADBError:
        conn.close()
        raise DatabaseError(
            f"{src}: not a plain SQLite database",
            hint="for a SQLCipher database pass --sqlcipher-passphrase-env; for a cryptdisk "
            "database use 'cryptdisk sqlite decrypt'",
        ) from None
    return conn


def encrypt_database(src: str, dst: str, keyring: KeyLookup,
                     progress: Progress | None = None) -> None:
    """Copy the plain SQLite database ``src`` to a new encrypted database ``dst``."""
    _check_paths(src, dst)
    _copy_to_new(_open_plain(src), lambda: connect(dst, keyring=keyring), dst, progress)


def decrypt_database(src: str, dst: str, keyring: KeyLookup,
                     progress: Progress | None = None) -> None:
    """Copy the encrypted database ``src`` to a new plain SQLite database ``dst`` (mode
    0600: it holds the plaintext)."""
    _check_paths(src, dst)
    try:
        source = connect(src, keyring=keyring, flags=apsw.SQLITE_OPEN_READONLY)
    except NotEncryptedError:
        raise DatabaseError(f"{src}: not a cryptdisk-encrypted database",
                            hint="to encrypt a plain database use 'cryptdisk sqlite encrypt'"
                            ) from None
    def open_plain() -> apsw.Connection:  # plaintext: owner-only, as `cryptdisk decrypt`'s
        _create_private(dst, apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)
        return apsw.Connection(dst)

    _copy_to_new(source, open_plain, dst, progress)


def _copy_to_new(source: apsw.Connection, open_target: Callable[[], apsw.Connection], dst: str,
                 progress: Progress | None) -> None:
    """Back ``source`` up into a new database; a failure removes what was made at ``dst``."""
    try:
        try:
            target = open_target()
        except apsw.CantOpenError:
            raise _cannot_create(dst) from None
        try:
            _backup(target, source, progress)
        except apsw.FullError:  # SQLITE_FULL: the disk (or a quota) is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dst) from None
        except apsw.IOError:  # SQLite says no more ("not an error"): a failed read or write
            raise OSError(errno.EIO, "I/O error while copying into it (a full disk, or a "
                          "file size limit?)", dst) from None
        finally:
            target.close()
    except BaseException:
        _remove(dst)
        raise
    finally:
        source.close()


def _cannot_create(dst: str) -> DatabaseError:
    """Why SQLite could not create ``dst``, said as the file system would say it."""
    parent = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(parent):
        why = "its directory does not exist"
    elif not os.access(parent, os.W_OK | os.X_OK):
        why = "its directory is not writable (permission denied)"
    else:
        why = "SQLite cannot open it"
    return DatabaseError(f"{dst}: cannot create the database: {why}")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def encrypt_sqlcipher_database(src: str, dst: str, keyring: KeyLookup, passphrase: str,
                               progress: Progress | None = None) -> None:
    """Copy the SQLCipher database ``src`` (opened with ``passphrase``) to encrypted ``dst``."""
    try:
        import sqlcipher3
    except ImportError:  # pragma: no cover - CI installs it
        raise CryptdiskError("reading SQLCipher databases needs the sqlcipher3 package",
                             hint="pip install 'cryptdisk[bench]' (or pip install sqlcipher3)"
                             ) from None
    _check_paths(src, dst)
    source = sqlcipher3.connect(f"file:{src}?mode=ro", uri=True)
    try:
        source.execute("PRAGMA key = '" + passphrase.replace("'", "''") + "'")
        try:
            schema = source.execute(
                "SELECT type, name, sql FROM sqlite_schema WHERE sql IS NOT NULL "
                "AND name NOT LIKE 'sqlite_%' ORDER BY rowid").fetchall()
        except sqlcipher3.DatabaseError:
            raise DatabaseError(f"{src}: cannot open it as SQLCipher with this passphrase",
                                hint="check the passphrase (and that it is a SQLCipher "
                                "database with default settings)") from None
        (page_size,) = source.execute("PRAGMA page_size").fetchone()
        target = connect(dst, keyring=keyring)
        try:
            target.execute(f"PRAGMA page_size={int(page_size)}")
            _copy_logical(source, target, schema, progress)
        finally:
            target.close()
    except BaseException:
        _remove(dst)
        raise
    finally:
        source.close()


def _copy_logical(source: Any, target: apsw.Connection, schema: list[tuple[str, str, str]],
                  progress: Progress | None) -> None:
    tables = [(name, sql) for kind, name, sql in schema if kind == "table"]
    with target:
        for _name, sql in tables:
            target.execute(sql)
        for i, (name, _sql) in enumerate(tables):
            cur = source.execute(f"SELECT * FROM {_quote(name)}")  # noqa: S608 - quoted name
            width = len(cur.description or ())
            insert = f"INSERT INTO {_quote(name)} VALUES({','.join('?' * width)})"
            while rows := cur.fetchmany(1000):
                target.executemany(insert, rows)
            if progress is not None:
                progress(i + 1, len(tables))
        has_seq = source.execute(
            "SELECT 1 FROM sqlite_schema WHERE name = 'sqlite_sequence'").fetchone()
        if has_seq:
            target.execute("DELETE FROM sqlite_sequence")  # the inserts above filled it
            target.executemany("INSERT INTO sqlite_sequence VALUES(?, ?)",
                               source.execute("SELECT name, seq FROM sqlite_sequence").fetchall())
        for kind, _name, sql in schema:
            if kind != "table":
                target.execute(sql)
        (version,) = source.execute("PRAGMA user_version").fetchone()
        target.execute(f"PRAGMA user_version={int(version)}")
