"""Converting databases: plain SQLite or SQLCipher to cryptdisk's encrypted SQLite and back.

Plain SQLite in either direction goes through SQLite's online backup API, so
the source may be in use by other processes while it is copied, and the copy
is page for page (same page size, same journal mode setting). A SQLCipher
source is opened with the ``sqlcipher3`` package, which cannot hand pages to
apsw, so it is copied logically: schema, then rows table by table, then
indexes, triggers and views. Neither path writes plaintext to disk.

The copy is made under a temporary name beside the destination
(``.DST.PID-XXXXXXXX.cdconvert``), synced, and linked to the destination's name only
once whole (the link fails if a file took that name meanwhile; on a filesystem
without hard links it is renamed there, the name checked free just before), so a
conversion killed at any point leaves no destination or a whole one, never an empty or
partial database under its name. What a killed conversion left under its temporary name
(its copy, and the journal or WAL of that copy) is deleted by the next conversion to the
same destination once its process is gone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from collections.abc import Callable
from typing import Any

import apsw

from .._durable import fsync_path, link_new
from ..errors import CryptdiskError, DatabaseError, NotEncryptedError
from ..format import KeyLookup
from ._connect import _create_private, connect

__all__ = ["decrypt_database", "encrypt_database", "encrypt_sqlcipher_database"]

Progress = Callable[[int, int], None]  # (pages done, pages total)
_STEP = 256  # pages per backup step


def _check_paths(src: str, dst: str) -> None:
    if os.path.isdir(src):
        raise DatabaseError(f"{src}: is a directory, not a database file")
    if not os.path.isfile(src):
        raise DatabaseError(f"{src}: no such database file")
    if os.path.getsize(src) == 0:  # SQLite reads it as a new database: nothing to copy
        raise DatabaseError(f"{src}: empty file (0 bytes), not a database to copy",
                            hint="check the path (SQLite would open an empty file as a new, "
                            "empty database)")
    _check_paths_free(dst)


_COMPANIONS = ("-journal", "-wal", "-shm", "-journal-cdtail", "-wal-cdtail")
_TEMP = ".cdconvert"


def _remove(path: str, *, main: bool = True) -> None:
    """Delete the database ``path`` (unless not ``main``) with its journal, WAL, WAL
    index and -cdtail side files."""
    for suffix in ("", *_COMPANIONS) if main else _COMPANIONS:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)


def _temp_name(dst: str) -> str:
    """Where the copy for ``dst`` is made: beside it (a link then gives it its name)."""
    directory, base = os.path.split(os.path.abspath(dst))
    return os.path.join(directory, f".{base}.{os.getpid()}-{secrets.token_hex(4)}{_TEMP}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # (this process: another thread may be converting)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (EPERM: it exists, another user's)
        return True
    return True


def _remove_stale(dst: str) -> None:
    """Delete the temporary copies for ``dst`` (with their journals and WALs) that
    conversions killed before they finished left, once their process is gone."""
    directory, base = os.path.split(os.path.abspath(dst))
    pattern = re.compile(re.escape(f".{base}.") + r"([0-9]+)-[0-9a-f]{8}"
                         + re.escape(_TEMP) + "(?:" + "|".join(_COMPANIONS) + ")?")
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        found = pattern.fullmatch(name)
        if found is not None and not _alive(int(found.group(1))):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))


def _publish(tmp: str, dst: str) -> None:
    """Give the whole, closed copy ``tmp`` the name ``dst``: synced first, then linked
    (never over a file that took the name meanwhile), the directory synced."""
    for suffix in ("-journal", "-wal"):  # closed, checkpointed: nothing of it is there
        with contextlib.suppress(FileNotFoundError):
            if os.path.getsize(tmp + suffix) > 0:
                raise DatabaseError(f"{dst}: the copy made for it left a non-empty "
                                    f"{suffix[1:]} when it closed; {dst} was not written")
    _remove(tmp, main=False)
    fsync_path(tmp)
    try:
        _check_paths_free(dst)
        link_new(tmp, dst)
    except FileExistsError:
        raise DatabaseError(f"{dst} already exists (made while the copy ran); refusing to "
                            "overwrite it", hint="remove it or choose another destination"
                            ) from None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fsync_path(os.path.dirname(os.path.abspath(dst)))


#: link(2)'s errors on a filesystem without hard links
def _check_paths_free(dst: str) -> None:
    for suffix in ("", "-journal", "-wal"):
        if os.path.lexists(dst + suffix):
            raise DatabaseError(f"{dst + suffix} already exists; refusing to overwrite it",
                                hint="remove it or choose another destination")


def _checkpoint(target: apsw.Connection) -> None:
    """Copy a WAL-mode copy's WAL into it and empty it, so the closed file is whole."""
    if str(target.execute("PRAGMA journal_mode").fetchall()[0][0]).lower() == "wal":
        target.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


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
    _copy_to_new(_open_plain(src), lambda tmp: connect(tmp, keyring=keyring), dst, progress)


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
    def open_plain(tmp: str) -> apsw.Connection:  # plaintext: owner-only, as `decrypt`'s
        _create_private(tmp, apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)
        return apsw.Connection(tmp)

    _copy_to_new(source, open_plain, dst, progress)


def _copy_to_new(source: apsw.Connection, open_target: Callable[[str], apsw.Connection],
                 dst: str, progress: Progress | None) -> None:
    """Back ``source`` up into a new database at ``dst`` (made under a temporary name, see
    the module docstring); a failure removes what was made."""
    try:
        _remove_stale(dst)
        tmp = _temp_name(dst)
    except BaseException:
        source.close()
        raise
    try:
        try:
            target = open_target(tmp)
        except apsw.CantOpenError:
            raise _cannot_create(dst) from None
        try:
            _backup(target, source, progress)
            _checkpoint(target)
        except apsw.FullError:  # SQLITE_FULL: the disk (or a quota) is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dst) from None
        except apsw.IOError:  # SQLite says no more ("not an error"): a failed read or write
            raise OSError(errno.EIO, "I/O error while copying into it (a full disk, or a "
                          "file size limit?)", dst) from None
        finally:
            target.close()
        _publish(tmp, dst)
    except BaseException:
        _remove(tmp)
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
    _remove_stale(dst)
    tmp = _temp_name(dst)
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
        target = connect(tmp, keyring=keyring)
        try:
            target.execute(f"PRAGMA page_size={int(page_size)}")
            _copy_logical(source, target, schema, progress)
            _checkpoint(target)
        finally:
            target.close()
        _publish(tmp, dst)
    except BaseException:
        _remove(tmp)
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
