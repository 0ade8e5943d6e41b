"""A DB-API 2.0 (PEP 249) interface to encrypted SQLite, shaped like the ``sqlite3`` module.

For code written against ``sqlite3`` (or another PEP 249 driver)::

    from cryptdisk.sqlite import dbapi

    with dbapi.connect("app.db", keyring=keyring) as conn:   # commits on success
        conn.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO t(name) VALUES (?)", ("ada",))
    rows = conn.execute("SELECT * FROM t").fetchall()

It wraps :func:`cryptdisk.sqlite.connect` (the same files, keys and VFS) and
behaves as ``sqlite3`` does by default: ``paramstyle`` is ``"qmark"`` (named
``:name`` parameters work too), a transaction begins implicitly before the
first INSERT, UPDATE, DELETE or REPLACE, and lasts until :meth:`Connection.commit`
or :meth:`Connection.rollback`; closing a connection with a transaction open
rolls it back. ``isolation_level`` is sqlite3's: ``""`` or ``"DEFERRED"`` (the
default), ``"IMMEDIATE"`` or ``"EXCLUSIVE"`` name the implicit ``BEGIN``, and
``None`` turns implicit transactions off (autocommit; ``BEGIN`` and ``COMMIT``
are the application's). ``create_function``, ``create_aggregate`` and
``create_collation`` register Python callables as sqlite3's do, which is what
SQLAlchemy's ``sqlite`` dialect needs of a connection. SQLite's errors become
this module's PEP 249 exceptions (a constraint violation is
:class:`IntegrityError`, a locked database :class:`OperationalError`, ...).
cryptdisk's own errors pass through unchanged, so a tampered page still raises
:class:`cryptdisk.AuthenticationError`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import apsw

from ..errors import CryptdiskError
from ..format import KeyLookup
from ._connect import connect as _connect
from ._native import plain_base
from ._vfs import EncryptedFile

_PY_FILE = f"{EncryptedFile.__module__}.{EncryptedFile.__qualname__}"  # apsw's vfsname

__all__ = [
    "Connection",
    "Cursor",
    "DataError",
    "DatabaseError",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "NotSupportedError",
    "OperationalError",
    "ProgrammingError",
    "Warning",
    "apilevel",
    "connect",
    "paramstyle",
    "threadsafety",
]

apilevel = "2.0"
_ApswConnection = apsw.Connection  # inside Connection, `apsw` is its property
threadsafety = 1  # threads may share the module, not connections
paramstyle = "qmark"


class Warning(Exception):
    """Important warnings (PEP 249); this module raises none."""


class Error(Exception):
    """Base of this module's errors (PEP 249)."""


class InterfaceError(Error):
    """Misuse of the interface, e.g. a closed connection or cursor."""


class DatabaseError(Error):
    """An error reported by the database."""


class DataError(DatabaseError):
    """A value out of range or too big."""


class OperationalError(DatabaseError):
    """The database could not do it now: locked, busy, I/O, out of space..."""


class IntegrityError(DatabaseError):
    """A constraint failed (unique, foreign key, not null, check)."""


class InternalError(DatabaseError):
    """SQLite's internal error."""


class ProgrammingError(DatabaseError):
    """Bad SQL, wrong number of parameters, a closed connection."""


class NotSupportedError(DatabaseError):
    """Something SQLite does not do."""


_ERRORS: tuple[tuple[type[BaseException], type[Error]], ...] = (
    (apsw.ConstraintError, IntegrityError),
    (apsw.TooBigError, DataError),
    (apsw.MismatchError, DataError),
    (apsw.RangeError, ProgrammingError),
    (apsw.SQLError, OperationalError),  # as sqlite3 does (syntax, no such table)
    (apsw.BindingsError, ProgrammingError),
    (apsw.ConnectionClosedError, ProgrammingError),
    (apsw.CursorClosedError, ProgrammingError),
    (apsw.InternalError, InternalError),
    (apsw.ExecutionCompleteError, InterfaceError),
    (apsw.BusyError, OperationalError),
    (apsw.LockedError, OperationalError),
    (apsw.IOError, OperationalError),
    (apsw.FullError, OperationalError),
    (apsw.ReadOnlyError, OperationalError),
    (apsw.CantOpenError, OperationalError),
    (apsw.Error, DatabaseError),
)
_DONE = 101  # SQLITE_DONE: the status backup() passes to progress after its last step
# the statements that begin a transaction, after any whitespace and comments (as sqlite3)
_DML = re.compile(r"(?:\s|--[^\n]*|/\*.*?\*/)*(INSERT|UPDATE|DELETE|REPLACE)\b",
                  re.IGNORECASE | re.DOTALL)


def _translate(exc: BaseException) -> BaseException:
    if isinstance(exc, apsw.Error) and not isinstance(exc, CryptdiskError):
        for source, target in _ERRORS:
            if isinstance(exc, source):
                new = target(str(exc))
                new.__cause__ = exc
                return new
    return exc


_LEVELS = ("", "DEFERRED", "IMMEDIATE", "EXCLUSIVE")


def _level(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"isolation_level must be a str or None, not {type(value).__name__}")
    if value.upper() not in _LEVELS:
        raise ValueError("isolation_level must be None, '', 'DEFERRED', 'IMMEDIATE' or "
                         f"'EXCLUSIVE', not {value!r}")
    return value


def _encrypted(conn: apsw.Connection) -> bool:
    """Whether ``conn``'s main database is written through a cryptdisk VFS (or kept in
    memory, where nothing reaches a disk)."""
    vfs = conn.vfsname("main")
    if vfs is None or not conn.db_filename("main"):
        return True
    first = vfs.split("/")[0]  # apsw names each VFS layer, the outermost first
    return (first.startswith("cryptdisk-") and first != plain_base()) or first == _PY_FILE


def connect(path: str | os.PathLike[str], *, keyring: KeyLookup,
            isolation_level: str | None = "", **kwargs: Any) -> Connection:
    """Open (or create) an encrypted database; ``isolation_level`` as sqlite3's (see the
    module docstring), other keyword arguments go to :func:`cryptdisk.sqlite.connect`
    (``implementation``, ``busy_timeout_ms``, ...)."""
    level = _level(isolation_level)
    try:
        return Connection(_connect(path, keyring=keyring, **kwargs), isolation_level=level)
    except apsw.Error as exc:
        raise _translate(exc) from exc


class Connection:
    """A PEP 249 connection over an ``apsw.Connection`` (``.apsw`` gives it back)."""

    def __init__(self, conn: apsw.Connection, isolation_level: str | None = "") -> None:
        self._conn: apsw.Connection | None = conn
        self._isolation_level = _level(isolation_level)

    @property
    def isolation_level(self) -> str | None:
        """The implicit ``BEGIN``'s kind (``""`` is plain ``BEGIN``), or None: no implicit
        transactions. Setting None commits an open transaction first, as sqlite3 does."""
        return self._isolation_level

    @isolation_level.setter
    def isolation_level(self, value: str | None) -> None:
        level = _level(value)
        if level is None:
            self.commit()
        self._isolation_level = level

    def create_function(self, name: str, narg: int, func: Callable[..., Any] | None, *,
                        deterministic: bool = False) -> None:
        """A scalar SQL function ``name`` of ``narg`` arguments (-1: any), as sqlite3's;
        ``func=None`` removes it."""
        try:
            self.apsw.create_scalar_function(name, func, narg, deterministic=deterministic)
        except apsw.Error as exc:
            raise _translate(exc) from exc

    def create_aggregate(self, name: str, n_arg: int, aggregate_class: Any) -> None:
        """An aggregate SQL function, as sqlite3's: ``aggregate_class()`` is made per
        query, its ``step(*args)`` called per row and ``finalize()`` gives the result."""
        def factory() -> tuple[Any, Callable[..., None], Callable[[Any], Any]]:
            instance = aggregate_class()
            return (instance, lambda ctx, *args: ctx.step(*args), lambda ctx: ctx.finalize())

        try:
            self.apsw.create_aggregate_function(
                name, None if aggregate_class is None else factory, n_arg)
        except apsw.Error as exc:
            raise _translate(exc) from exc

    def create_collation(self, name: str, callable_: Callable[[str, str], int] | None) -> None:
        """A collating sequence, as sqlite3's: ``callable_(a, b)`` returns <0, 0 or >0."""
        try:
            self.apsw.create_collation(name, callable_)
        except apsw.Error as exc:
            raise _translate(exc) from exc

    @property
    def apsw(self) -> apsw.Connection:
        """The underlying ``apsw.Connection`` (for apsw's own API)."""
        if self._conn is None:
            raise ProgrammingError("cannot operate on a closed connection")
        return self._conn

    @property
    def in_transaction(self) -> bool:
        return self._conn is not None and bool(self._conn.in_transaction)

    def cursor(self) -> Cursor:
        return Cursor(self)

    def execute(self, sql: str, parameters: Sequence[Any] | dict[str, Any] = ()) -> Cursor:
        """Shortcut: a new cursor, executed."""
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, seq: Any) -> Cursor:
        return self.cursor().executemany(sql, seq)

    def executescript(self, script: str) -> Cursor:
        """Commit an open transaction, then run every statement of ``script`` (as sqlite3):
        outside any implicit transaction, rows discarded, stopping at the first error."""
        self.commit()
        cursor = self.cursor()
        try:
            for _row in self.apsw.execute(script):
                pass
        except apsw.Error as exc:
            raise _translate(exc) from exc
        return cursor

    def backup(self, target: Connection | _ApswConnection, *, pages: int = -1,
               progress: Callable[[int, int, int], object] | None = None, name: str = "main",
               sleep: float = 0.250, plaintext: bool = False) -> None:
        """Copy database ``name`` into ``target``'s main database with SQLite's online
        backup API, as sqlite3's ``backup``: ``pages`` per step (all at once when 0 or
        less), ``progress(status, remaining, total)`` after each step (status 0, or 101,
        SQLITE_DONE, after the last), ``sleep`` seconds before a step is tried again when
        the source is busy or locked. A ``target`` of this module (or of
        :func:`cryptdisk.sqlite.connect`) is encrypted under its own keyring. An
        ``apsw.Connection`` to a plain file would get the rows as plaintext: that is a
        ``ValueError`` unless ``plaintext=True`` (an in-memory target is always allowed).
        """
        dest = target.apsw if isinstance(target, Connection) else target
        if not isinstance(dest, apsw.Connection):
            kind = f"{type(target).__module__}.{type(target).__qualname__}"
            raise TypeError("target must be a cryptdisk.sqlite.dbapi.Connection (encrypted) "
                            f"or an apsw.Connection, not {kind} (Python's sqlite3 module "
                            "has its own SQLite library, which cannot take part)")
        if dest is self.apsw:
            raise ValueError("target cannot be the same connection instance")
        if not plaintext and not _encrypted(dest):
            raise ValueError(
                f"target {dest.db_filename('main')!r} is a plain SQLite database: the backup "
                "would write this encrypted database's pages to it as plaintext. Back up into "
                "a connection from cryptdisk.sqlite.dbapi.connect (encrypted), or pass "
                "plaintext=True to write a plaintext copy on purpose")
        try:
            with dest.backup("main", self.apsw, name) as step:
                while not step.done:
                    try:
                        step.step(pages if pages > 0 else -1)
                    except (apsw.BusyError, apsw.LockedError):
                        time.sleep(sleep)
                        continue
                    if progress is not None:
                        progress(_DONE if step.done else 0, step.remaining, step.page_count)
        except apsw.Error as exc:
            raise _translate(exc) from exc

    def commit(self) -> None:
        if self.in_transaction:
            self._run("COMMIT")

    def rollback(self) -> None:
        if self.in_transaction:
            self._run("ROLLBACK")

    def close(self) -> None:
        """Roll back an open transaction and close (a second close does nothing)."""
        if self._conn is None:
            return
        try:
            self.rollback()
        finally:
            conn, self._conn = self._conn, None
            conn.close()

    def _run(self, sql: str) -> None:
        try:
            self.apsw.execute(sql)
        except apsw.Error as exc:
            raise _translate(exc) from exc

    def _begin_for(self, sql: str) -> None:
        level = self._isolation_level
        if level is not None and not self.in_transaction and _DML.match(sql):
            self._run(f"BEGIN {level}")

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """Commit when the block succeeds, roll back when it raises (as ``sqlite3``)."""
        if exc_type is None:
            self.commit()
        else:
            self.rollback()

    def __repr__(self) -> str:
        return f"<cryptdisk.sqlite.dbapi.Connection {'closed' if self._conn is None else 'open'}>"


class Cursor:
    """A PEP 249 cursor: ``execute``, ``fetchone/fetchmany/fetchall``, ``description``."""

    arraysize = 1

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._rows: Iterator[tuple[Any, ...]] | None = None
        self._cursor: apsw.Cursor | None = None
        self.description: tuple[tuple[Any, ...], ...] | None = None
        self.rowcount = -1
        self.lastrowid: int | None = None
        self._changes_before: int | None = None  # a write's, until its rows are read
        self._closed = False

    def _live(self) -> apsw.Connection:
        if self._closed:
            raise ProgrammingError("cannot operate on a closed cursor")
        return self.connection.apsw

    def execute(self, sql: str, parameters: Sequence[Any] | dict[str, Any] = ()) -> Cursor:
        conn = self._live()
        self.connection._begin_for(sql)
        before = conn.total_changes()
        columns: list[tuple[tuple[str, str], ...]] = []

        def described(cursor: apsw.Cursor, _sql: str, _bindings: Any) -> bool:
            columns.append(cursor.get_description())  # prepared, not yet run: even 0 rows
            return True

        try:
            self._cursor = conn.cursor()
            self._cursor.exec_trace = described
            self._rows = iter(self._cursor.execute(sql, parameters))
            last = columns[-1] if columns else ()
            self.description = tuple(
                (name, None, None, None, None, None, None) for name, _decl in last) or None
        except apsw.Error as exc:
            self._rows, self.description = None, None
            raise _translate(exc) from exc
        self._after(conn, sql, before)
        return self

    def executemany(self, sql: str, seq: Any) -> Cursor:
        conn = self._live()
        self.connection._begin_for(sql)
        before = conn.total_changes()
        try:
            self._cursor = conn.cursor()
            self._rows = iter(self._cursor.executemany(sql, seq))
            for _ in self._rows:
                raise ProgrammingError("executemany() cannot run statements that return rows")
        except apsw.Error as exc:
            raise _translate(exc) from exc
        self._rows, self.description = None, None
        self._after(conn, sql, before)
        return self

    def _after(self, conn: apsw.Connection, sql: str, before: int) -> None:
        dml = _DML.match(sql) is not None
        self.rowcount = conn.total_changes() - before if dml else -1
        self._changes_before = before if dml else None
        self.lastrowid = conn.last_insert_rowid()

    def fetchone(self) -> tuple[Any, ...] | None:
        self._live()
        if self._rows is None:
            return None
        try:
            row = next(self._rows, None)
        except apsw.Error as exc:
            raise _translate(exc) from exc
        if row is None and self._changes_before is not None:
            # a write with RETURNING counts its changes when it finishes (as sqlite3)
            self.rowcount = self.connection.apsw.total_changes() - self._changes_before
            self._changes_before = None
        return row

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        out = []
        for _ in range(self.arraysize if size is None else size):
            row = self.fetchone()
            if row is None:
                break
            out.append(row)
        return out

    def fetchall(self) -> list[tuple[Any, ...]]:
        out = []
        while (row := self.fetchone()) is not None:
            out.append(row)
        return out

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        while (row := self.fetchone()) is not None:
            yield row

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.close()
        self._rows, self._cursor, self._closed = None, None, True

    def setinputsizes(self, sizes: Any) -> None:
        """Accepted and ignored (PEP 249)."""

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        """Accepted and ignored (PEP 249)."""
