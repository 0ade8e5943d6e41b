"""The embedded database: DuckDB runs the SQL, cryptdisk owns storage, catalog and keys.

Queries never make DuckDB read files: each table a query reads is handed to
DuckDB as a streaming :class:`~cryptdisk.db._scan.TableScan` of the columns it
needs, whose row groups are decrypted and decoded on a thread pool as DuckDB
pulls them, skipping those the query's filters, top-N or key range rule out;
row groups read twice are kept in the bounded
:class:`~cryptdisk.db._cache.ColumnCache`, so warm queries cost the same on
encrypted and plain tables. DuckDB runs in memory with spilling off, so no
plaintext reaches its temporary files: a query that does not fit in
``memory_limit`` fails with a clear error.
"""

from __future__ import annotations

import array
import collections
import contextlib
import decimal
import difflib
import fcntl
import json
import logging
import os
import re
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import duckdb
import pyarrow as pa

from .._flocks import hold, let_go
from ..errors import (
    CatalogError,
    ConfigError,
    CryptdiskError,
    DatabaseError,
    DatabaseLockedError,
    KeyNotFoundError,
    PolicyError,
    PublishConflictError,
)
from ..errors import TableNotFoundError as _TableNotFound
from ..keys import ProviderKey, file_stamp
from . import _sql
from ._agreement import disagreements, record_storage
from ._cache import DEFAULT_COLUMN_CACHE_BYTES, ColumnCache, StatementCache
from ._catalog import (
    CATALOG_FILE,
    Catalog,
    TableMeta,
    catalog_stamp,
    load_catalog,
    save_catalog,
)
from ._columns import (
    SYSTEM_TABLES,
    base_tables,
    current_settings,
    needed_columns,
    parse_tree,
    parse_tree_text,
    parser_cursor,
    referenced_tables,
    rewrite_system_tables,
    scalar,
    schema_qualified_tables,
    share_walks,
    unquoted_words,
)
from ._constraints import check_default
from ._derived import (
    DerivedFailed,
    PushedScan,
    constant_values,
    expression_names,
    push_functions,
)
from ._distinct import DistinctCount, count_distinct_item, memory_limit_bytes
from ._forksafe import track
from ._import import ImportMixin
from ._infoschema import catalog_views, rewrite_catalog_views
from ._insert import INSERT_BLOCK_BYTES, InsertMixin, ctrl_c
from ._keyfiles import default_key_path, sync_parent
from ._maintenance import MaintenanceMixin
from ._memory import out_of_memory
from ._mutate import MutationMixin
from ._names import fold, twin_error
from ._params import Template, bind, check_parameters
from ._policies import (
    quiet_error,
    role_check_statement,
    role_has_policies,
    role_prepare,
    role_query,
    role_rewrites,
)
from ._prepared import (
    Deallocate,
    Execute,
    Prepare,
    argument_literals,
    bind_literals,
    is_query,
    parse_prepared,
)
from ._pushdown import (
    Filter,
    TopN,
    all_pass,
    count_star_only,
    filters_from_tuples,
    head_rows,
    key_extremes_items,
    key_extremes_names,
    key_extremes_only,
    table_filters,
    top_n,
)
from ._remote import RemoteDirectory, check_published, is_url, location
from ._rollback import PIN_FILE, default_pin_path, read_pins, rollback_error, write_pin
from ._rotation import RotationMixin
from ._rows import TIME_ZONE, Rows, exact_table, has_wide, query_rows
from ._scan import OpenParts, TableScan, integer_array, warm_up
from ._schema import SchemaMixin
from ._sigint import StatementLock, interruptible, kept_signals
from ._simpletree import agrees, probe_text, simple_tree
from ._storage import resolve_config
from ._stream import STREAM_BATCH_ROWS, Stream, check_batch_rows
from ._system import system_tables
from ._viewdefs import ViewMixin
from ._views import parse_view_statement

__all__ = ["CONNECTION_HOOKS", "Database", "Reader", "add_connection_hook", "connect"]

log = logging.getLogger("cryptdisk.db")
#: A statement naming a table of at most this many parts opens them (footer decrypted and
#: checked, key statistics read) on the scan pool while DuckDB parses it (a cold query's
#: critical path); with a WHERE, of a larger table, the parts (at most this many) whose
#: integer key range holds an integer the statement's text names (a point or range
#: query's bounds). Other parts, and those of a statement without WHERE that names
#: ``count``, ``min`` or ``max`` (the catalog may answer it without reading a part) or
#: reads no rows (``DESCRIBE``...), open when its scan knows which ones it reads.
_PREOPEN_PARTS = 4
#: ``connect`` opens the parts of the tables whose parts, together, are at most this many
#: (see :meth:`._scan.OpenParts.open_few`), waiting at most ``_CONNECT_WAIT`` seconds.
_CONNECT_OPENS = _PREOPEN_PARTS
_CONNECT_WAIT = 0.25
_NO_PREOPEN = frozenset({"count", "min", "max", "describe", "show", "summarize", "explain"})
_INTEGER = re.compile(r"(?<![\w.])-?\d{1,20}(?![\w.])")


def _numbers(sql: str) -> set[int]:
    """The integers written in ``sql`` (the first 32)."""
    return {int(n) for n in _INTEGER.findall(sql)[:32]}


def _to_preopen(meta: TableMeta, sql: str, words: set[str]) -> tuple[list[Any], set[int]]:
    """The parts of ``meta`` to open while DuckDB parses ``sql`` (whose unquoted words are
    ``words``), and the integers its text names, whose key granules are read ahead (see
    _PREOPEN_PARTS): none without a WHERE."""
    if "where" in words:
        return _parts_to_preopen(meta, sql), _numbers(sql)
    if words & _NO_PREOPEN or len(meta.parts) > _PREOPEN_PARTS:
        return [], set()
    return list(meta.parts), set()


def _parts_to_preopen(meta: TableMeta, sql: str) -> list[Any]:
    """The parts of ``meta`` to open while DuckDB parses ``sql``, a statement with a WHERE
    (see _PREOPEN_PARTS)."""
    if len(meta.parts) <= _PREOPEN_PARTS:
        return list(meta.parts)
    numbers = _numbers(sql)
    found = []
    for part in meta.parts:
        lo, hi = getattr(part, "key_min", None), getattr(part, "key_max", None)
        if (isinstance(lo, int) and isinstance(hi, int)
                and any(lo <= n <= hi for n in numbers)):
            found.append(part)
            if len(found) == _PREOPEN_PARTS:
                break
    return found

#: Called as ``hook(duckdb_connection, config)`` on each new database's DuckDB connection.
CONNECTION_HOOKS: list[Callable[[Any, Any], Any]] = []


def add_connection_hook(hook: Callable[[Any, Any], Any]) -> None:
    """Run ``hook(con, config)`` on the DuckDB connection of every database opened from now
    on: how the layers above db (``cryptdisk.fields``' SQL functions) extend its SQL.

    A hook may return an extension object with ``scan_functions`` (name -> binder, see
    :mod:`._derived`: functions the table scan computes over whole Arrow arrays) and
    ``refresh()`` (called before each statement; True when what the functions compute
    changed, e.g. the field keys were reloaded, which drops the cached derived columns),
    and ``cursor_setup(cursor)`` (called on each :class:`Reader`'s DuckDB cursor: what the
    hook made that belongs to one connection, such as temporary macros; Python functions
    made with ``create_function`` belong to the database instance, which cursors share).
    """
    if hook not in CONNECTION_HOOKS:
        CONNECTION_HOOKS.append(hook)


#: The Arrow type DuckDB produces for each plain column type (``SELECT CAST(NULL AS t)``
#: with its default settings; tests/db check every entry against DuckDB).
ARROW_TYPES: dict[str, pa.DataType] = {
    **dict.fromkeys(("BIGINT", "INT8", "LONG", "INT64"), pa.int64()),
    **dict.fromkeys(("INTEGER", "INT", "INT4", "SIGNED", "INT32"), pa.int32()),
    **dict.fromkeys(("SMALLINT", "INT2", "SHORT", "INT16"), pa.int16()),
    **dict.fromkeys(("TINYINT", "INT1"), pa.int8()),
    "UBIGINT": pa.uint64(), "UINTEGER": pa.uint32(), "USMALLINT": pa.uint16(),
    "UTINYINT": pa.uint8(),
    **dict.fromkeys(("DOUBLE", "FLOAT8"), pa.float64()),
    **dict.fromkeys(("FLOAT", "REAL", "FLOAT4"), pa.float32()),
    **dict.fromkeys(("VARCHAR", "TEXT", "STRING"), pa.string()),
    **dict.fromkeys(("BOOLEAN", "BOOL"), pa.bool_()),
    "DATE": pa.date32(),
}


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _leftover_of_creation(path: str, name: str) -> bool:
    """What a creation interrupted before its first catalog leaves: the lock, a temp catalog."""
    if name == "LOCK" or (name.startswith(".catalog.") and name.endswith(".cdtmp")):
        return True
    full = os.path.join(path, name)
    return name in ("data", "plain") and os.path.isdir(full) and not os.listdir(full)


def _check_new_database_path(path: str) -> None:
    """Refuse to create a database where it would mix with other files.

    A new database is created only in a directory that does not exist yet (its
    parent must) or is empty; a file, or a directory holding anything but the
    leftovers of an interrupted creation, is refused.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise DatabaseError(f"{path} is a file, not a database (a cryptdisk database is a "
                            "directory)", hint="give a database directory, or a new path to "
                            "create one")
    if os.path.isdir(path):
        others = sorted(n for n in os.listdir(path) if not _leftover_of_creation(path, n))
        if others:
            raise DatabaseError(
                f"{path} is not a cryptdisk database (no catalog) and is not empty "
                f"({len(others)} entr{'y' if len(others) == 1 else 'ies'}, e.g. {others[0]!r}); "
                "refusing to create a database among other files",
                hint="give a new path or an empty directory")
        return
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise DatabaseError(f"cannot create database {path}: the directory {parent} does not "
                            "exist", hint=f"create it first (mkdir -p {parent})")


def _open_remote(url: str, config: Any, read_only: bool, pin: Any, role: Any,
                 storage_options: dict[str, Any] | None) -> RemoteDirectory:
    """The directory of a database at a URL, after refusing what such a database cannot do."""
    if config is None:
        raise DatabaseError(
            f"{url}: a database at a URL needs a config (its keys never come from the bucket)",
            hint="pass the config path it was written with")
    if pin is True:
        raise DatabaseError("pin=True names a file beside a local database; give "
                            "pin=FILE (a local file) for a database at a URL")
    if role is not None:
        raise DatabaseError("role= is not available for a database at a URL")
    remote = RemoteDirectory(url, storage_options)
    if not read_only and not remote.conditional:
        raise DatabaseError(
            f"{url}: a database at a URL opens for writing only on S3, whose conditional "
            "uploads make each commit fail rather than overwrite another's",
            hint="open it with read_only=True; write to a local directory with the same "
            "config and copy it there with cryptdisk.db.publish(db, URL)")
    return remote


class Database(InsertMixin, ImportMixin, MaintenanceMixin, RotationMixin, SchemaMixin,
               MutationMixin, ViewMixin):
    """An embedded database in a directory (see :func:`connect`)."""

    #: set by :meth:`close`: every statement after it is refused (see :meth:`_check_open`)
    _closed = False

    def __init__(self, path: str | os.PathLike[str], config: Any = None, *,
                 cache_bytes: int = DEFAULT_COLUMN_CACHE_BYTES, read_only: bool = False,
                 memory_limit: str | None = None, threads: int | None = None,
                 pin: str | os.PathLike[str] | bool | None = None, role: str | None = None,
                 policies: str | os.PathLike[str] | None = None,
                 insert_block_bytes: int = INSERT_BLOCK_BYTES,
                 storage_options: dict[str, Any] | None = None) -> None:
        self.path = location(path)
        #: the directory's files at a URL (see ._remote), or None for a local directory
        self._remote: RemoteDirectory | None = None
        if is_url(self.path):
            self._remote = _open_remote(self.path, config, read_only, pin, role,
                                        storage_options)
        elif storage_options is not None:
            raise DatabaseError("storage_options apply to a database at a URL "
                                "(s3://bucket/prefix); this one is a local directory")
        if not isinstance(insert_block_bytes, int) or insert_block_bytes < 1:
            raise DatabaseError("insert_block_bytes must be a positive number of bytes")
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool)
                                    or threads < 1):
            raise ConfigError(f"threads must be a whole number of at least 1, not {threads!r}")
        if memory_limit is not None and not isinstance(memory_limit, str):
            raise ConfigError(f"memory_limit must be text such as '4GB', not {memory_limit!r}")
        #: an insert sorts and writes its rows in blocks of about this much Arrow data
        self.insert_block_bytes = insert_block_bytes
        self.read_only = read_only
        if role is not None and (not isinstance(role, str) or not role):
            raise DatabaseError("role must be a role name (a non-empty string)")
        #: the role whose masking and row access policies this connection's queries
        #: read through (None: none, the caller's full access)
        self.role = role
        #: the sealed policy file (``cryptdisk serve``'s, default ``PATH.policies``)
        self.policies_path = os.path.abspath(os.fspath(policies)) if policies is not None \
            else self.path + ".policies"
        if self._remote is not None:
            creating = not self._remote.exists("catalog")
        else:
            creating = not os.path.exists(os.path.join(self.path, "catalog"))
        if creating and read_only and self._remote is None and not os.path.lexists(self.path):
            raise DatabaseError(f"no database at {self.path} (no such file or directory)",
                                hint="read_only=True opens a database that exists; connect "
                                "without it to create one")
        if creating and (read_only or self._remote is not None):
            raise DatabaseError(f"{self.path} is not a cryptdisk database (no catalog)",
                                hint=None if self._remote is None else "put one there with "
                                "cryptdisk.db.publish(db, URL)")
        if creating:
            _check_new_database_path(self.path)
        #: what this connect makes for a new database (its directory, its key file): gone
        #: again if the connect fails
        made = [p for p in (self.path, default_key_path(self.path))
                if creating and self._remote is None and not os.path.exists(p)]
        if self._remote is None:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            if creating:  # its name durable in its parent before anything is put in it
                sync_parent(self.path)
        self._lock_fd: int | None = None
        if not read_only and self._remote is None:
            try:
                self._take_lock()
            except BaseException:
                _remove_made(made)
                raise
        self._mutex = StatementLock()  # (see ._sigint: a statement's signals)
        self._readers_running = 0  # queries Reader objects are running (see reader())
        #: the open streams of this database and its readers (see stream), closed by close
        self._streams: weakref.WeakSet[Stream] = weakref.WeakSet()
        self._doomed_parts: list[Any] = []  # deleted when the last of them ends
        self._registered: set[str] = set()  # temporary views (see _bind_exposed)
        self._exposed: dict[str, Any] = {}  # what the statement reads, by table name
        self._handles: list[Any] = []  # its registry sources (see _bind_exposed)
        #: the queries of this connection's PREPAREd names (see ._prepared)
        self._prepared_queries: dict[str, str] = {}
        #: a transaction block (BEGIN ... COMMIT) is open on DuckDB's connection: it holds
        #: queries only (see _writable)
        self._block = False
        self._statement_cache: StatementCache | None = None  # the running statement's
        self._pins = [f"{self.path}/{PIN_FILE}" if self._remote is not None
                      else os.path.join(self.path, PIN_FILE)]
        if pin is True:
            self._pins.append(default_pin_path(self.path))
        elif pin not in (None, False):
            self._pins.append(os.path.abspath(os.fspath(pin)))  # type: ignore[arg-type]
        self._pending: list[tuple[Any, str]] = []
        #: the files of changes whose commit may or may not have published them (see _settle)
        self._unsettled_files: list[Any] = []
        self._scans: list[TableScan] = []
        #: What the last statement's scans read and skipped, per table (see TableScan.stats).
        self.last_scans: dict[str, dict[str, int]] = {}
        self._schemas: dict[tuple[tuple[str, str], ...], pa.Schema] = {}
        #: extensions returned by the connection hooks (see add_connection_hook)
        self._extensions: list[Any] = []
        #: their ``cursor_setup``, run on each reader's cursor
        self._cursor_setups: list[Callable[[Any], Any]] = []
        #: whether field functions may be computed by the scan (see ._derived)
        self.push_field_functions = True
        #: DuckDB's parse trees (JSON text) of recent SELECTs, by statement text: a
        #: repeated statement is parsed for cryptdisk once. A tree depends on the text
        #: alone: it comes from a connection whose parser settings are DuckDB's defaults
        #: (:func:`_parser_connection`), whatever ``SET`` ran on :attr:`con`
        self._trees: collections.OrderedDict[str, str] = collections.OrderedDict()
        #: the result schemas DuckDB gave the recent ``SELECT min(key), max(key) FROM t``
        #: statements (by text and table), so a repeat is answered from the catalog alone
        self._extreme_schemas: collections.OrderedDict[Any, pa.Schema] = \
            collections.OrderedDict()
        self._extremes_pending: Any = None  # the statement running, to record its schema
        #: the count of distinct values running (see :meth:`interrupt`)
        self._counting: DistinctCount | None = None
        self._rows_wanted = False  # (set by query for the statement it runs)
        self._described_texts: dict[str, str] = {}  # see _describe_subqueries
        #: whether only queries and cryptdisk's own statements ran on this database's
        #: DuckDB connection and its readers' cursors (no SET, PRAGMA, CREATE MACRO...):
        #: then a result's column names follow from the parse tree (see _key_extremes)
        self._settings_untouched = True
        #: DuckDB's settings read from :attr:`con`: (connection, DuckDB's count of statements
        #: that may change settings when read, name -> value), or () (see _setting)
        self._settings: tuple[Any, ...] = ()
        try:
            self.own_keys = config is None
            #: the TOML config file the database was opened with (its keys are loaded
            #: again as a rotation starts), or None
            self._config_file = os.fspath(config) if isinstance(config, (str, os.PathLike)) \
                and os.fspath(config).endswith(".toml") else None
            #: the config file's stamp when its keys were loaded (taken first: a change
            #: made while it loads is seen by the next write, see _follow_config_keys)
            self._config_stamp = file_stamp(self._config_file) \
                if self._config_file is not None else None
            resolved: Any = resolve_config(self.path, config, creating)  # (DatabaseState's)
            self.config = resolved
            #: whether this database loaded its config (None or a file path) and so closes
            #: its keys (provider sessions, connections) in :meth:`close`; a config object
            #: the caller passed is the caller's to close
            self._owns_config = not hasattr(config, "keyring")
            self.keyring = self.config.keyring
            self.con = self._new_duckdb(memory_limit, threads)
            #: the connection cryptdisk's own parse trees come from (see _parser_connection)
            self._parser = _parser_connection(self.con)
            # before the catalog, never ahead of it
            pins = read_pins(self._pins, self.keyring, self._remote)
            catalog = load_catalog(self.path, self.keyring, self._remote)
            if catalog is None:
                if pins:
                    raise CatalogError(f"{self.path} has no catalog, but the pin {pins[0][0]} "
                                       f"records version {pins[0][2]} of database "
                                       f"{pins[0][1]}", hint="restore the catalog from a backup")
                catalog = Catalog.new()
                save_catalog(self.path, self.keyring, catalog)
            self._check_storage(catalog)
            self.catalog = catalog
            self._stamp = catalog_stamp(self.path, self._remote)
            self.cache = ColumnCache(cache_bytes)
            self._open_parts = OpenParts(lambda: self.config)
            if not read_only and self._remote is not None:
                evidence = self.rollback_evidence()
                if evidence is not None:  # refused, deleting nothing
                    raise rollback_error(self.path, self.catalog.version, evidence)
            elif not read_only:
                check_published(self)  # a copy behind the store it was published to
                self.collect_garbage()  # refuses a rolled-back catalog, deleting nothing
                if {v for _p, _d, v in pins} != {catalog.version} or len(pins) < len(self._pins):
                    self._write_pins()
            else:
                evidence = self.rollback_evidence()
                if evidence is not None:
                    log.warning("cryptdisk: %s: the catalog (version %d) was rolled back: %s; "
                                "this read-only connection answers from it, without the "
                                "newer data", self.path, self.catalog.version, evidence)
            role_prepare(self)  # its policies read and parsed before its first query
            self._read_settings()  # (once, not at the first statement that needs one)
            warm_up()  # the scan pool's threads and pyarrow's first allocation
            if self._remote is None:  # a few parts opened: a first query reads at once
                self._open_parts.open_few(self.catalog.tables.values(), _CONNECT_OPENS,
                                          _CONNECT_WAIT)
        except BaseException:
            con = getattr(self, "con", None)
            if con is not None:
                with contextlib.suppress(Exception):
                    con.close()
            if getattr(self, "_owns_config", False):
                _close_config_keys(self.config)
            self._release_lock()
            _remove_made(made)
            raise

    # -- setup -------------------------------------------------------------------

    def _take_lock(self) -> None:
        # a forked child closes its copy (_flocks): the lock dies with this process
        fd = hold(os.open(os.path.join(self.path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o600))
        st = os.fstat(fd)
        lock = (st.st_dev, st.st_ino)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            let_go(fd)
            os.close(fd)
            if lock in _LOCKS_HERE:
                raise DatabaseLockedError(
                    f"database {self.path} is open for writing by another connection in "
                    "this process", hint="use that connection (db.reader() gives a thread "
                    "queries of its own), or close it first") from None
            raise DatabaseLockedError(
                f"database {self.path} is open for writing in another process",
                hint="close it there, or open this one with read_only=True "
                "(cryptdisk sql --read-only)") from None
        self._lock_fd = fd
        _LOCKS_HERE.add(lock)
        # A database dropped without close() still lets go of the lock when collected.
        self._unlock = weakref.finalize(self, _unlock, fd, lock, os.getpid())

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            self._unlock()  # closing the descriptor drops the flock
            self._lock_fd = None

    def _new_duckdb(self, memory_limit: str | None, threads: int | None) -> Any:
        con = track(duckdb.connect(":memory:"))  # never freed by a forked child (_forksafe)
        # TIMESTAMPTZ in UTC whatever the machine's TZ (DuckDB's default), for the
        # connection and its readers' cursors: a naive datetime is taken as UTC and values
        # come back in UTC, on every machine (the server tells its clients so).
        con.execute(f"SET GLOBAL TimeZone = '{TIME_ZONE}'")
        # No temporary directory: DuckDB cannot spill plaintext; out of memory is an error.
        con.execute("SET temp_directory = ''")
        # No extension fetched or loaded behind the user's back: a query on an https:// or
        # s3:// path would have DuckDB download native code (httpfs) and load it.
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        # No progress bar: DuckDB draws it on stdout (a pipe too) for a statement running
        # over two seconds, into the output of the program using the database (`cryptdisk
        # sql ... > out.csv`). The readers' cursors take the setting from this connection.
        con.execute("SET enable_progress_bar = false")
        for name, value, sql in (("memory_limit", memory_limit, "SET memory_limit = ?"),
                                 ("threads", threads, "SET threads = ?")):
            if value is None:
                continue
            try:
                con.execute(sql, [value])
            except duckdb.Error as exc:  # (DuckDB's words, not its exception)
                con.close()
                raise ConfigError(f"{name} {value!r}: {str(exc).splitlines()[0]}",
                                  hint="memory_limit takes a size such as '4GB' or '512MB'"
                                  if name == "memory_limit" else None) from None
        for hook in CONNECTION_HOOKS:
            ext = hook(con, self.config)
            if ext is not None and hasattr(ext, "scan_functions"):
                self._extensions.append(ext)
            if ext is not None and hasattr(ext, "cursor_setup"):
                self._cursor_setups.append(ext.cursor_setup)
        return con

    def interrupt(self) -> None:
        """Stop the query running on the database's own connection (DuckDB's interrupt, or
        a count of distinct values between two of its batches); readers have their own."""
        counting = self._counting
        if counting is not None:
            counting.stop()
        with contextlib.suppress(duckdb.Error):
            self.con.interrupt()

    def close(self) -> None:
        """Release the write lock and the cached plaintext."""
        # The streams first, not holding the lock: a batch being computed on another
        # thread is stopped and waited for, and its end releases the stream, which takes
        # the lock (_reader_ends); one started meanwhile is closed under the lock below.
        for stream in list(self._streams):
            stream.close()
        with self._mutex:
            for stream in list(self._streams):  # (their parts, their cursors)
                stream.close()
            self._closed = True
            self.cache.clear()
            self._open_parts.clear()
            _wipe_unwrap_caches(self.config)
            with contextlib.suppress(Exception):
                self._parser.close()
            with contextlib.suppress(Exception):
                self.con.close()
            if self._owns_config:
                _close_config_keys(self.config)
            self._release_lock()

    def reader(self) -> Reader:
        """A :class:`Reader`: runs queries on its own DuckDB cursor, beside this
        connection's statements and other readers' queries, for one thread at a time."""
        self._check_open()
        return Reader(self)

    def _check_open(self) -> None:
        """Refuse a use of a closed database (DuckDB's own error named its connection)."""
        if self._closed:
            raise DatabaseError(f"database {self.path} is closed",
                                hint="open it again with cryptdisk.connect")

    def _reader_ends(self) -> None:
        with self._mutex:
            self._readers_running -= 1
            if not self._readers_running and self._doomed_parts:
                doomed, self._doomed_parts = self._doomed_parts, []
                self._remove_parts(doomed)

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "closed" if self._closed else "read-only" if self.read_only else "read-write"
        return f"<cryptdisk.Database {self.path!r} {mode} tables={len(self.catalog.tables)}>"

    def __reduce__(self) -> Any:
        raise TypeError("a Database cannot be pickled; call cryptdisk.connect in the other "
                        "process")

    # -- catalog -------------------------------------------------------------------

    def table(self, name: str) -> TableMeta:
        meta: TableMeta | None = self.catalog.tables.get(name)  # (in any case, as DuckDB)
        if meta is None:
            known = ", ".join(sorted(self.catalog.tables)) or "none"
            raise _TableNotFound(f"no table {name!r} in {self.path} (tables: {known})")
        return meta

    def policy(self, name: str) -> Any:
        policy = self.config.policies.get(name)
        if policy is None:
            known = ", ".join(sorted(self.config.policies))
            raise PolicyError(f"unknown storage policy {name!r} (policies: {known})")
        return policy

    def _check_storage(self, catalog: Catalog) -> None:
        """Refuse a config that disagrees with how the catalog recorded its tables' storage."""
        problems = disagreements(catalog, self.config)
        if problems:
            first = next(iter(catalog.tables), "t")
            raise CatalogError(
                f"{self.path}: this config disagrees with where the catalog recorded its "
                f"tables: {'; '.join(problems)}",
                hint="open the database with the config it was written with (with no config "
                "if it was made without one); to store a table unencrypted, move it "
                "explicitly under that config: ALTER TABLE "
                f"{first} MODIFY SETTING storage_policy = 'plain'")
        # An older catalog: inferred now, recorded with the next change (_commit). Never
        # written here: the writer has not yet checked that the catalog was not rolled back.
        record_storage(catalog, self.config)

    def _commit(self) -> None:
        record_storage(self.catalog, self.config)  # new tables and parts
        self._follow_config_keys()  # the catalog under the config's current key
        if self._remote is not None:
            try:
                save_catalog(self.path, self.keyring, self.catalog, self._remote)
            except PublishConflictError:
                self._stamp = None  # the next statement loads the other writer's catalog
                raise PublishConflictError(
                    f"{self.path}: another writer committed first; this change was not "
                    "published (the files it wrote are removed by a later commit)",
                    hint="run it again") from None
            except BaseException:
                self._stamp = None  # whatever the store holds now: loaded before the next
                raise
            remote = self._remote
            self._after_publish(lambda: remote.stamp_of(CATALOG_FILE, self.catalog.etag),
                                self._collect_abandoned)
            return
        try:
            save_catalog(self.path, self.keyring, self.catalog)
        except BaseException:
            if self.catalog.unsettled is not None:  # maybe published: see _settle
                self._stamp = None
            raise
        self._after_publish(lambda: catalog_stamp(self.path), self._collect_pending)

    def _settle(self) -> None:
        """After a commit that may or may not have published its catalog (the catalog could
        not be looked at after its write failed, see :func:`._catalog.save_catalog`): read
        the catalog on disk again, the version before the change or the one with it, before
        anything else runs on this connection. Until it can be read, statements fail. When
        it is the version before, the files those changes wrote are deleted then."""
        unsettled = self.catalog.unsettled
        if self._remote is not None or unsettled is None:
            return
        self.refresh()
        if self.catalog.unsettled is not None:
            return  # (not read again: the catalog cannot be looked at yet)
        kept, self._unsettled_files = self._unsettled_files, []
        if self.catalog.version < unsettled:  # still the one before: certainly unpublished
            live = self._live(self.catalog)
            self._discard_unpublished([p for p in kept if (p.disk, p.path) not in live])

    def _after_publish(self, stamp: Callable[[], Any], collect: Callable[[], Any]) -> None:
        """The steps of a commit after its catalog is published: the commit stands
        whatever they raise (an error is logged; an interrupt propagates, and the callers'
        undo sees the published version: see :meth:`_committing`)."""
        self._stamp = None  # (reloaded before the next statement unless set below)
        step = "stamping"
        try:
            # None (reload before the next statement) if another commit came already
            self._stamp = stamp()
            step = "writing its pins"
            self._write_pins()
            step = "collecting its garbage"
            collect()
        except Exception as exc:
            log.warning("cryptdisk: %s: catalog version %d is committed; %s after it "
                        "failed (%s): the next commit or open does it", self.path,
                        self.catalog.version, step, type(exc).__name__)

    def _write_pins(self) -> None:
        """Record the published version in the pins (after the catalog: never ahead of it)."""
        for i, path in enumerate(self._pins):  # PATH/pin first, unsynced (see _rollback)
            write_pin(path, self.keyring, self.catalog.db_id, self.catalog.version,
                      durable=i > 0, remote=self._remote if i == 0 else None)

    def _writable(self, what: str, *, adds: bool = False, staged: bool = False) -> None:
        """Refuse change ``what`` (in the user's words: ``INSERT INTO t``, ``insert into
        t``, ``rotate keys``) on a closed or read-only connection, and on a database at a
        URL unless it only ``adds`` (CREATE TABLE, INSERT) or publishes ``staged`` parts."""
        self._check_open()
        self._settle()
        if self.read_only:
            raise DatabaseError(f"{what}: the database is open read-only",
                                hint="to change it, connect without read_only=True "
                                "(cryptdisk sql without --read-only); one process at a "
                                "time writes")
        if self._block:
            raise DatabaseError(
                f"{what}: cryptdisk commits each change to its tables as it runs and cannot "
                "roll it back, so a transaction block (BEGIN ... COMMIT) holds queries only",
                hint="COMMIT or ROLLBACK first: each change is a transaction of its own")
        if self._remote is not None:
            if not adds and not staged:
                raise DatabaseError(
                    f"{what}: not available on a database at a URL, whose writers may "
                    "only add (CREATE TABLE, INSERT, cryptdisk.dask.to_table)",
                    hint="do it on a local copy under the lock, then publish it")
            if staged:  # staged for the catalog this writer had
                if catalog_stamp(self.path, self._remote) != self._stamp:
                    raise PublishConflictError(
                        f"{self.path}: another writer committed since these parts were "
                        "staged; nothing was published (the parts are removed by a later "
                        "commit)", hint="run the insert again")
            else:
                self.refresh()  # the newest catalog: the commit is conditional on it
        # the change's files go under the config's current key now, not the one loaded at
        # open (a key promoted in another process since: see _follow_config_keys)
        self._follow_config_keys()

    def refresh(self) -> None:
        """Reload the catalog if another process published a new one."""
        stamp = catalog_stamp(self.path, self._remote)
        if stamp != self._stamp:
            catalog = load_catalog(self.path, self.keyring, self._remote)
            if catalog is not None:
                if catalog.version < self.catalog.version:
                    raise CatalogError(f"{self.path}: the catalog went back from version "
                                       f"{self.catalog.version} to {catalog.version} "
                                       "(rolled back?)")
                self.catalog = catalog
            self._stamp = stamp

    # -- reading -------------------------------------------------------------------

    def _scan(self, meta: TableMeta, columns: list[str] | None,
              filters: list[Any] | None = None, top: Any = None,
              extremes: bool = False, derived: list[Any] | None = None,
              name: str | None = None, where: str | None = None,
              alias: str = "", head: tuple[int, int] | None = None) -> TableScan:
        names = [c for c, _t in meta.columns]
        cols = names if columns is None else [c for c in names if c in columns]
        cache = self._statement_cache if self._statement_cache is not None else self.cache
        return TableScan(self._open_parts, meta, self.arrow_schema(meta), cols, filters or [],
                         cache if self.cache.bound else None, top, extremes,
                         derived, name, where, alias, head)

    def arrow_table(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """The table's rows as Arrow (``columns`` only if given), through the cache.

        On a connection with ``role=``, a table with policies is read through them, as
        ``SELECT columns FROM name`` would be. ``columns=[]``: a table of no columns and
        the table's row count (one column is read to count them)."""
        with self._mutex:
            self._check_open()
            meta = self.table(name)
            names = [c for c, _t in meta.columns]
            cols = names if columns is None else [meta.column_name(c) for c in columns]
            if not cols:
                return self.arrow_table(meta.name, [names[0]]).select([])
            unknown = [c for c in cols if c not in names]
            if unknown:
                raise DatabaseError(f"table {name} has no column(s) {', '.join(unknown)}")
            if role_has_policies(self, meta.name):
                query = (f"SELECT {', '.join(quote(c) for c in cols)} "
                         f"FROM {quote(meta.name)}")
                got = self.execute(query)
                assert got is not None  # a query returns a table
                return got
            table = self._scan(meta, cols).to_table()
            return table.select(cols)

    def scan_plan(self, name: str, filters: Any = ()) -> list[tuple[str, list[int]]]:
        """What a scan of table ``name`` under ``filters`` reads: ``(part, row groups)``.

        ``filters`` is ``[(column, op, value), ...]``, AND-ed (see :meth:`read_part`).
        Parts whose key range and row groups whose statistics rule every row out are
        left out; ``part`` is the id ``system.parts`` shows. One catalog version answers.
        """
        with self._mutex:
            if self.read_only or self._remote is not None:
                self.refresh()
            meta = self.table(name)
            role_check_statement(self, "scan_plan()", meta.name)
            filters = meta.named_filters(filters)
            flt = filters_from_tuples(filters, self.arrow_schema(meta), DatabaseError)
            self._check_filter_values(meta, filters)
            scan = self._scan(meta, None, flt)
            plan = []
            for part in meta.parts:
                if scan._part_may_match(part):
                    groups = scan._row_groups(self._open_parts.get(part))
                    if groups:
                        plan.append((part.id, groups))
            return plan

    def read_part(self, name: str, part: str, columns: list[str] | None = None,
                  filters: Any = (), row_groups: list[int] | None = None) -> pa.Table:
        """The rows of one part of table ``name`` that pass ``filters``, as Arrow.

        ``part`` is its id (``system.parts``, :meth:`scan_plan`); ``columns`` default to
        all; ``filters`` is ``[(column, op, value), ...]`` AND-ed, ``op`` one of ``=``,
        ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in``, ``not in``, compared as DuckDB
        compares (row groups that cannot match are not read); ``row_groups`` limits the
        read to those. A part the catalog no longer names (merged or dropped since it was
        planned) raises :class:`~cryptdisk.errors.CatalogError`.
        """
        with self._mutex:
            meta = self.table(name)
            role_check_statement(self, "read_part()", meta.name)
            found = next((p for p in meta.parts if p.id == part), None)
            if found is None and self.read_only:
                self.refresh()
                meta = self.table(name)
                found = next((p for p in meta.parts if p.id == part), None)
            if found is None:
                raise self._part_gone(name, part)
            cols = meta.pick_columns(columns, "read_part")
            filters = meta.named_filters(filters)
            flt = filters_from_tuples(filters, self.arrow_schema(meta), DatabaseError)
            wanted = set(cols) | {f[0] for f in filters}
            scan = self._scan(meta, [c for c, _t in meta.columns if c in wanted], flt)
            try:
                op = self._open_parts.get(found)
            except CatalogError:
                # This connection's catalog may predate a merge or drop whose cleanup
                # has deleted the file since: if the current catalog no longer names
                # the part, that is the error (not a disk that lost a file).
                if self.read_only:
                    self.refresh()
                    if not any(p.id == part for p in self.table(name).parts):
                        raise self._part_gone(name, part) from None
                raise
            groups = scan._row_groups(op)
            if row_groups is not None:
                bad = [g for g in row_groups if not 0 <= g < op.num_row_groups]
                if bad:
                    raise DatabaseError(f"part {part} has {op.num_row_groups} row groups; "
                                        f"no row group {bad[0]}")
                groups = [g for g in groups if g in set(row_groups)]
            # Row groups whose statistics prove that every row passes every filter (the
            # inner row groups of a range on the sorted key) are read without the filter
            # columns the caller did not ask for, and not filtered row by row.
            schema = self.arrow_schema(meta)
            whole = {g for g in groups if filters and all(
                all_pass(f, schema.field(f[0]).type, op.stats(g, f[0]), op.nulls(g, f[0]))
                for f in filters)}
            plain = self._scan(meta, cols, []) if whole else scan
        # The row groups are read outside the connection's lock: an open part may be read
        # by several threads at once, and decryption and decoding release the GIL, so the
        # threads of one process (a Dask worker's) read parts in parallel.
        pieces = []
        for run, is_whole in _runs(groups, whole):
            if is_whole:
                pieces.append(_read_run(plain, op, run).select(cols))
                continue
            table = pa.Table.from_batches([scan.read_group(op, g) for g in run],
                                          schema=scan.schema)
            if filters:
                with self._mutex:  # the DuckDB connection serves one thread at a time
                    table = self._filter_rows(table, filters, meta)
            pieces.append(table.select(cols))
        if len(pieces) == 1:
            return pieces[0]
        if not pieces:
            return pa.Table.from_batches([], schema=scan.schema).select(cols)
        return pa.concat_tables(pieces)

    def _part_gone(self, name: str, part: str) -> CatalogError:
        return CatalogError(f"table {name} has no part {part!r} in catalog version "
                            f"{self.catalog.version} (merged or dropped since the read was "
                            "planned?)", hint="plan the read again")

    def _filter_rows(self, table: pa.Table, filters: list[Any], meta: TableMeta) -> pa.Table:
        """The rows of ``table`` (of table ``meta``) that pass ``filters``, compared as
        DuckDB compares; a value DuckDB cannot compare with its column raises
        :class:`DatabaseError` naming them."""
        try:
            return self._filter_sql(table, filters)
        except duckdb.Error as exc:
            self._check_filter_values(meta, filters)
            raise DatabaseError(f"filters {filters!r}: {exc}") from None

    def _check_filter_values(self, meta: TableMeta, filters: list[Any]) -> None:
        """Raise :class:`DatabaseError` naming the column, its type and the value for the
        first filter whose value DuckDB cannot compare with the column (a string that is
        no number for a BIGINT column, a number for a VARCHAR column): each filter is
        applied, as :meth:`_filter_rows` applies it, to a row of NULL and a row of a
        value of the column's type (DuckDB casts a value to the column's type, or the
        column to the value's, and casts only what is not NULL)."""
        schema = self.arrow_schema(meta)
        types = dict(meta.columns)
        for item in filters:
            col, op, value = item
            probe = pa.table({col: _probe_values(schema.field(col).type)})
            try:
                self._filter_sql(probe, [item])
            except duckdb.Error as exc:
                values = list(value) if op in ("in", "not in") else [value]
                bad = value if len(values) == 1 else self._bad_value(probe, col, op, values)
                reason = str(exc).splitlines()[0].split(": ", 1)[-1]
                raise DatabaseError(
                    f"filter {item!r}: column {col} is {types.get(col, schema.field(col).type)}"
                    f"; the value {bad!r} does not compare with it ({reason})",
                    hint=f"give a value of the column's type ({type(bad).__name__} given)"
                ) from None

    def _bad_value(self, probe: pa.Table, col: str, op: str, values: list[Any]) -> Any:
        """The first of ``values`` (of an ``in`` / ``not in`` filter) DuckDB refuses alone."""
        for v in values:
            try:
                self._filter_sql(probe, [(col, op, [v])])
            except duckdb.Error:
                return v
        return values

    def _filter_sql(self, table: pa.Table, filters: list[Any]) -> pa.Table:
        conds, params = [], []
        for col, op, value in filters:
            if op in ("in", "not in"):
                values = list(value)
                conds.append(f"{quote(col)} {op.upper()} ({', '.join('?' * len(values))})")
                params += values
            else:
                conds.append(f"{quote(col)} {({'==': '=', '!=': '<>'}).get(op, op)} ?")
                params.append(value)
        view = "__cd_read_part"
        self.con.register(view, table)
        try:
            got = self.con.sql(f"SELECT * FROM {view} WHERE {' AND '.join(conds)}",
                               params=params).to_arrow_table()
        finally:
            self.con.unregister(view)
        return got.cast(table.schema)

    def _scan_functions(self) -> dict[str, Any]:
        """The functions the scan may compute (see ._derived), after a refresh of the
        extensions; cached derived columns go when what they compute changed."""
        binders: dict[str, Any] = {}
        changed = False
        for ext in self._extensions:
            changed = bool(ext.refresh()) or changed
            binders.update(ext.scan_functions)
        if changed:
            self.cache.drop_derived()
        return binders

    def _push(self, tree: Any, names: set[str], binders: dict[str, Any]
              ) -> tuple[Any, list[PushedScan]]:
        """Field functions over stored columns become derived columns of the scan."""
        if tree is None or not binders or not self.push_field_functions:
            return None, []
        tables = {t: {f.name: f.type for f in self.arrow_schema(self.catalog.tables[t])}
                  for t in base_tables(tree, names)}
        if not tables:
            return None, []
        pushed = push_functions(tree, tables, binders,
                                lambda exprs: expression_names(self.con, exprs),
                                lambda exprs: constant_values(self.con, exprs),
                                # a WHERE the scan applies in its own DuckDB connection
                                # compares text as this one does: no default collation
                                self._binary_text)
        if not pushed:
            return None, []
        text = scalar(self.con, "SELECT json_deserialize_sql(?)", [json.dumps(tree)])
        if not isinstance(text, str):
            return None, []
        return text, pushed

    def _parse_tree(self, sql: str, written: bool = True) -> dict[str, Any] | None:
        """DuckDB's parse tree of the SELECT ``sql`` (see :func:`._columns.parse_tree`),
        from the recent statements' when ``sql`` is one of them; with ``written``, of a
        simple statement the tree :func:`._simpletree.simple_tree` writes out, with no
        statement of DuckDB's (also while the statement's part opens on the scan pool: the
        pool's threads started in connect, the open ends before DuckDB's parse would, and
        a cold ``ORDER BY key LIMIT 10`` took 0.8x the wall)."""
        if written:  # (the builder was checked in connect: see _parser_connection)
            simple = simple_tree(sql)
            if simple is not None:
                return simple
        text = self._trees.get(sql)
        if text is not None:
            self._trees.move_to_end(sql)
            return json.loads(text)  # type: ignore[no-any-return]
        found = parse_tree_text(self._parser, sql)
        if found is None:
            return None
        tree, text = found
        self._trees[sql] = text  # (DuckDB's text: the tree written out again cost as much)
        while len(self._trees) > _TREES:
            self._trees.popitem(last=False)
        return tree

    def _names_certain(self) -> bool:
        """Whether no statement that may change how DuckDB names a result's columns or
        which table a name reads ran here (see :attr:`_settings_untouched`): a reader
        asks its own cursor's and the database's."""
        return self._settings_untouched

    def _session_changed(self) -> None:
        """Forget the parse trees and settings read from DuckDB (a statement that is not a
        SELECT may have changed them)."""
        self._settings_untouched = False
        self._trees.clear()
        self._extreme_schemas.clear()

    def _prepare(self, sql: str, push: bool = True, prepared: tuple[str, str] | None = None
                 ) -> str | pa.Table | DistinctCount:
        """Register what ``sql`` reads as streaming Arrow scans; return the SQL DuckDB runs,
        or the answer itself when the catalog holds it (``count(*)`` of a table), or a
        count of distinct values to run (:class:`._distinct.DistinctCount`).

        ``prepared``: ``(query, args)`` when ``sql`` prepares ``query`` and executes it
        with ``args`` (see :meth:`_run_prepared_statement`): what it reads is found from
        the query's tree, its literal arguments bound (:func:`._prepared.bind_literals`);
        DuckDB runs ``sql`` as it is, so nothing is pushed into the text or answered
        without it."""
        if self.read_only or self._remote is not None:  # others commit meanwhile
            self.refresh()
        self._settle()
        self.last_scans = {}
        if self._statement_cache is not None:  # (not released: a retry's second prepare)
            self._statement_cache.end()
        # this statement's view of the cache: what it keeps or uses stays while it runs,
        # whatever other readers' statements start meanwhile (see ._cache)
        self._statement_cache = self.cache.new_statement()
        binders = self._scan_functions() if self._extensions else {}
        sql, wants_system = rewrite_system_tables(sql)
        if wants_system:
            for name, table in system_tables(self).items():
                self._expose(f"__cd_system_{name}", table)
        sql, views = rewrite_catalog_views(sql)
        if views:  # information_schema.tables, duckdb_columns(), ...: with the tables
            try:
                metas = list(self.catalog.tables.values())
                read = {meta.name: self._read_description(meta).column(
                    "column_type").to_pylist() for meta in metas}
                found = catalog_views(self.con, metas, views,
                                      list(self.catalog.views.values()), read)
            except duckdb.Error as exc:
                raise DatabaseError(f"DuckDB's catalog views: {exc}") from None
            for name, table in found.items():
                self._expose(name, table)
        if "(" in sql and ("describe" in sql.lower() or "show" in sql.lower()):
            sql = self._describe_subqueries(sql)
        names = set(self.catalog.tables)
        used = referenced_tables(sql, names)
        if used:
            words = unquoted_words(sql)
            for t in used:  # see _PREOPEN_PARTS
                meta = self.catalog.tables[t]
                parts, numbers = _to_preopen(meta, sql, words)
                if parts:
                    self._open_parts.preopen(parts, meta.key, numbers)
            tree = self._parse_tree(sql) if prepared is None \
                else self._prepared_tree(*prepared)
            share_walks(tree)  # the analyses below walk it once
            wrong = schema_qualified_tables(tree, names) if tree is not None else []
            if wrong and tree is not None:  # an attached database's table (o.t) is DuckDB's
                wrong = schema_qualified_tables(tree, names, self._attached())
            if wrong:
                bare = wrong[0].rsplit(".", 1)[-1]
                raise _TableNotFound(
                    f"Catalog Error: Table with name {wrong[0]} does not exist: cryptdisk's "
                    "tables are not in a DuckDB schema",
                    hint=f"name the table without a schema: {bare}")
            pushed: list[PushedScan] = []
            if tree is not None and push and prepared is None:
                text, pushed = self._push(tree, names, binders)
                if text is not None:
                    sql = text
            if tree is not None:
                used = base_tables(tree, names)
            for p in pushed:
                meta = self.catalog.tables[p.table]
                # its WHERE's conditions on the key and sorted columns skip parts and
                # row groups as they do for a stored table's scan
                filters = (self._text_safe(self.arrow_schema(meta), table_filters(
                    tree, p.view, self.arrow_schema(meta)), None)[0]
                    if p.where is not None else [])
                scan = self._scan(meta, p.columns, filters, derived=p.derived, name=p.view,
                                  where=p.where, alias=p.alias)
                warm = scan.cached_table()
                self._scans.append(scan)
                if warm is None:
                    scan.prefetch()
                self._expose(p.view, scan if warm is None else warm)
            if len(used) == 1 and not pushed and prepared is None:
                (only,) = used
                counted = count_star_only(tree, only, len(self.catalog.tables[only].columns))
                if counted is not None and not self._names_certain() \
                        and any(n != "count_star()" for n in counted):
                    counted = None  # an alias: DuckDB may fold its case (a SET ran)
                if counted is not None:  # the catalog's row counts answer: no part is read,
                    meta = self.catalog.tables[only]  # and DuckDB runs nothing
                    self.last_scans[only] = {"parts_skipped": 0, "row_groups_read": 0,
                                             "row_groups_skipped": 0,
                                             "parts_from_index": len(meta.parts),
                                             "granule_reads": 0}
                    # (from a buffer: pa.array of a Python int imports pandas)
                    count = pa.Array.from_buffers(pa.int64(), 1, [
                        None, pa.py_buffer(array.array("q", [int(meta.rows)]))])
                    return pa.Table.from_arrays([count] * len(counted), names=counted)
                answer = self._key_extremes(tree, only, sql)
                if answer is not None:
                    return answer
                distinct = self._count_distinct(tree, only) if push else None
                if distinct is not None:  # counted by the scan's threads, not DuckDB
                    return distinct
            tables = {t: [c for c, _ in self.catalog.tables[t].columns] for t in used}
            derived_names = {d.name for p in pushed for d in p.derived}
            for t, cols in needed_columns(tree, tables, derived_names).items():
                meta = self.catalog.tables[t]
                schema = self.arrow_schema(meta)
                key = meta.key
                schemas = {u: self.arrow_schema(self.catalog.tables[u]) for u in tables}
                filters, top = self._text_safe(
                    schema, table_filters(tree, t, schema, schemas),
                    top_n(tree, t, schema, self._default_order, self._default_null_order))
                head = self._head(tree, t) if not filters and top is None else None
                scan = self._scan(meta, cols, filters, top,
                                  key_extremes_only(tree, t, schema, key), head=head)
                warm = scan.cached_table()  # all cached: DuckDB scans it on every thread
                self._scans.append(scan)
                if warm is None:
                    scan.prefetch()  # its first row groups decode while DuckDB plans
                self._expose(t, scan if warm is None else warm)
        return self._bind_exposed(sql)

    def _prepared_tree(self, query: str, args: str) -> dict[str, Any] | None:
        """The parse tree of prepared ``query`` as ``EXECUTE`` with ``args`` runs it (see
        :meth:`_prepare`): each parameter an argument gives as a literal bound to it."""
        tree: dict[str, Any] | None = self._parse_tree(rewrite_system_tables(query)[0])
        if tree is not None and args:  # (the tree is a copy of its own: bound in place)
            bind_literals(tree, argument_literals(
                args, lambda text: parse_tree(self._parser, text)))
        return tree

    def _read_description(self, meta: TableMeta) -> pa.Table:
        """DuckDB's ``DESCRIBE`` of table ``meta`` as queries read it (the Arrow schema of
        its scans: a ``HUGEINT`` column is a ``DECIMAL(38,0)``, a ``UUID`` one a
        ``VARCHAR``), every column nullable and without a default."""
        name = "__cd_describe_table"
        self.con.register(name, _empty_table(self.arrow_schema(meta)))
        try:
            return self.con.sql(f"DESCRIBE SELECT * FROM {name}").to_arrow_table()
        finally:
            self.con.unregister(name)

    def _describe_subqueries(self, sql: str) -> str:
        """``sql`` reading each ``(DESCRIBE t)`` or ``(SHOW t)`` of a table of the
        database (``SELECT * FROM (DESCRIBE t)``) from its description as a statement
        ``DESCRIBE t`` gives it, with the ``NOT NULL`` and ``DEFAULT`` the table declares
        (DuckDB describes the Arrow scan the table is read through, which has neither)."""
        found: dict[str, str] = {}

        def sub(m: re.Match[str]) -> str:
            table = m.group("table")
            if table is None:
                return m.group(0)  # (a string, a quoted identifier, a comment)
            meta = self.catalog.tables.get(_sql.unquote(table))
            if meta is None:
                return m.group(0)
            name = found.get(meta.name)
            if name is None:
                name = found[meta.name] = f"__cd_describe_{len(found)}"
                described = self._read_description(meta)
                self._expose(name, _described(self, f"DESCRIBE {table}", described))
            text = f"(SELECT * FROM {name})"
            self._described_texts[text] = m.group(0)  # (DuckDB's errors quote the text)
            return text

        return _DESCRIBE_SUBQUERY.sub(sub, sql)

    def _expose(self, name: str, source: Any) -> None:
        """Have this statement read Arrow ``source`` (a scan, a table) as table ``name``
        (see :meth:`_bind_exposed`)."""
        self._exposed[name] = source

    def _bind_exposed(self, sql: str) -> str:
        """``sql`` reading the statement's exposed sources under their table names.

        A ``SELECT`` or ``FROM`` statement reads each through a source put in the
        connection's registry for this statement alone (``_register_source``: a handle,
        no change to DuckDB's catalog), named by a leading ``WITH name AS NOT
        MATERIALIZED (SELECT * FROM source)``, which DuckDB inlines as it does a view; the
        handles go in :meth:`_release`. Any other statement (a ``WITH`` of its own,
        ``EXPLAIN``, ``DESCRIBE``), one where a table's name follows a dot (a
        column ``x.t``), or a DuckDB without the registry (or ``_submit``, see
        :meth:`_run_prepared`) gets temporary views (``register``), dropped in
        :meth:`_release`. A registration and its drop are two
        catalog changes, about 0.6 ms of CPU per statement, and DuckDB binds a statement
        over a catalog just changed more slowly."""
        exposed, self._exposed = self._exposed, {}
        if not exposed:
            return sql
        register = getattr(self.con, "_register_source", None)
        if register is None or not hasattr(self.con, "_submit") \
                or _sql.first_word(_after_comments(sql)) not in ("SELECT", "FROM") \
                or not _qualified_names(sql).isdisjoint(n.lower() for n in exposed):
            for name, source in exposed.items():
                self.con.register(name, source)
                self._registered.add(name)
            return sql
        ctes = []
        for name, source in exposed.items():
            handle = track(register(source))  # a forked child never drops it (_forksafe)
            self._handles.append(handle)
            ctes.append(f"{quote(name)} AS NOT MATERIALIZED "
                        f"(SELECT * FROM {quote(handle.name)})")
        return "WITH " + ", ".join(ctes) + "\n" + sql  # one line: see _unprefixed

    def _key_extremes(self, tree: Any, name: str, sql: str) -> pa.Table | None:
        """``SELECT min(key), max(key) FROM t`` (see :func:`._pushdown.key_extremes_items`)
        answered from the catalog's key ranges, in the schema DuckDB gives the statement:
        each column named as the parse tree says DuckDB names it
        (:func:`._pushdown.key_extremes_names`, while no statement may have changed how
        DuckDB folds identifiers), of the key's type (min and max of an integer column
        are of its type). Where a name is not certain, DuckDB runs the statement the first
        time (over the key ranges), and its schema is kept for the repeats. None (DuckDB
        runs it) then, or when a part with rows has no range."""
        meta = self.catalog.tables[name]
        key = meta.key
        columns = self.arrow_schema(meta)
        items = key_extremes_items(tree, name, columns, key)
        if items is None:
            return None
        ident = (sql, name, tuple(tuple(c) for c in meta.columns), meta.order_by)
        schema = self._extreme_schemas.get(ident)
        if schema is None and self._names_certain():
            names = key_extremes_names(tree)
            if names is not None and len(names) == len(items):
                typ = columns.field(key).type
                schema = pa.schema([pa.field(n, typ) for n in names])
        if schema is None or len(schema) != len(items):
            self._extremes_pending = ident
            return None
        parts = [p for p in meta.parts if p.rows]
        if any(p.key_min is None or p.key_max is None for p in parts):
            return None
        arrays = []
        for item, field in zip(items, schema, strict=True):
            if not pa.types.is_integer(field.type):
                return None
            if not parts:  # min/max of no rows: NULL
                arrays.append(pa.nulls(1, field.type))
                continue
            value = (min(p.key_min for p in parts) if item == "min"
                     else max(p.key_max for p in parts))
            arrays.append(integer_array(field.type, [int(value)]))
        self.last_scans[name] = {"parts_skipped": 0, "row_groups_read": 0,
                                 "row_groups_skipped": 0, "parts_from_index": len(parts),
                                 "granule_reads": 0}
        return pa.Table.from_arrays(arrays, schema=schema)

    def _count_distinct(self, tree: Any, name: str) -> DistinctCount | None:
        """``SELECT count(DISTINCT col) FROM t`` of a text or binary column
        (:func:`._distinct.count_distinct_item`), to be counted outside DuckDB: its scan,
        made now, is read when :meth:`_run_duckdb_once` runs it (outside a reader's hold
        of the database). None (DuckDB counts) without the C set, while a statement may
        have changed how DuckDB names columns, or, for text, under a collation."""
        if not self._names_certain() or not DistinctCount.available():
            return None
        meta = self.catalog.tables[name]
        schema = self.arrow_schema(meta)
        found = count_distinct_item(tree, name, schema)
        if found is None:
            return None
        column, title = found
        typ = schema.field(column).type
        if (pa.types.is_string(typ) or pa.types.is_large_string(typ)) \
                and not self._binary_text():
            return None
        limit = memory_limit_bytes(self.con)
        threads = scalar(self.con, "SELECT current_setting('threads')")
        if limit is None or not isinstance(threads, int):
            return None
        scan = self._scan(meta, [column])
        self._scans.append(scan)
        return DistinctCount(scan, column, title, threads, limit, meta.rows)

    def _head(self, tree: Any, table: str) -> tuple[int, int] | None:
        """``(rows, blank)`` for ``SELECT cols FROM table LIMIT n [OFFSET m]``
        (:func:`._pushdown.head_rows`): the scan reads its first ``n + m`` rows only, and
        hands the first ``m`` over as NULLs, unread, while DuckDB keeps a scan's order
        (``preserve_insertion_order``, asked of the connection only for an OFFSET: without
        it DuckDB's LIMIT may take any rows, so every row handed over is read)."""
        found = head_rows(tree, table)
        if found is None:
            return None
        limit, offset = found
        if not limit:
            return 0, 0
        blank = offset if offset and self._setting("preserve_insertion_order") is True else 0
        return limit + offset, blank

    def _setting(self, name: str) -> Any:
        """DuckDB's setting ``name`` (one of :data:`_SETTINGS`) as :attr:`con` sees it,
        read with the others by :meth:`_read_settings` and again only after a statement
        that may have changed a setting ran on any connection to the database: DuckDB counts
        those (``_catalog_version``: a ``SET``, ``RESET`` or ``PRAGMA``, on :attr:`con`, a
        reader's cursor or ``db.con`` itself, advances it). A DuckDB without the count is
        asked each time. (A statement costs some 0.3-0.6 ms: a top-N asked one at each run.)
        """
        con = self.con
        version = getattr(con, "_catalog_version", None)
        kept = self._settings
        if version is not None and kept and kept[0] is con and kept[1] == version():
            return kept[2][name]
        return self._read_settings()[name]

    def _read_settings(self) -> dict[str, Any]:
        """Read :data:`_SETTINGS` from :attr:`con` (one statement), kept with DuckDB's count
        of statements that may change them as it was before they were read (see
        :meth:`_setting`). A database reads them as it opens."""
        con = self.con
        version = getattr(con, "_catalog_version", None)
        stamp = version() if version is not None else None
        values = dict(zip(_SETTINGS, current_settings(con, _SETTINGS), strict=True))
        self._settings = (con, stamp, values) if stamp is not None else ()
        return values

    def _binary_text(self) -> bool:
        """Whether DuckDB compares and sorts text byte by byte (no ``default_collation``):
        only then do a text column's statistics (byte order) bound what its WHERE keeps and
        what its ORDER BY puts first (see :meth:`_setting`: a ``SET`` on ``con`` itself is
        seen too)."""
        return self._setting("default_collation") in ("", None)

    def _text_safe(self, schema: pa.Schema, filters: list[Filter], top: TopN | None,
                   ) -> tuple[list[Filter], TopN | None]:
        """``filters`` and ``top`` without those on text columns while DuckDB compares text
        under a collation (``SET default_collation = 'nocase'``): byte-order statistics
        would skip rows it keeps (see :meth:`_binary_text`, asked only if there are any)."""
        def text(column: str) -> bool:
            typ = schema.field(column).type
            return bool(pa.types.is_string(typ) or pa.types.is_large_string(typ))

        if not any(text(f.column) for f in filters) and (top is None or not text(top.column)):
            return filters, top
        if self._binary_text():
            return filters, top
        return ([f for f in filters if not text(f.column)],
                None if top is not None and text(top.column) else top)

    def _default_order(self) -> str:
        """DuckDB's ``default_order`` (an ``ORDER BY`` with no direction sorts so), as
        :meth:`_setting` reads it."""
        value = self._setting("default_order")
        return "ASC" if value is None else str(value)

    def _default_null_order(self) -> str:
        """DuckDB's ``default_null_order`` (where an ``ORDER BY`` without ``NULLS FIRST|LAST``
        puts NULLs), as :meth:`_setting` reads it; ``NULLS_FIRST`` if unknown (the safe
        guess: a top-N then reads every row group holding a NULL)."""
        value = self._setting("default_null_order")
        return "NULLS_FIRST" if value is None else str(value)

    def _release(self) -> None:
        """Drop this statement's Arrow views, so no later statement sees stale parts, and
        end its use of the cache."""
        if self._statement_cache is not None:
            self._statement_cache.end()
            self._statement_cache = None
        self._open_parts.drop_key_reads()
        for scan in self._scans:
            scan.close()
            self.last_scans[scan.name] = scan.stats()
        self._scans.clear()
        self._exposed.clear()
        self._described_texts.clear()
        self._handles.clear()  # (the registry drops a source when its last handle goes)
        for t in self._registered:
            with contextlib.suppress(duckdb.Error):
                self.con.unregister(t)
        self._registered.clear()

    def _scan_error(self) -> BaseException | None:
        """The error a scan raised inside DuckDB (which reports it only as text)."""
        for scan in self._scans:
            if scan.error is not None:
                return scan.error
        return None

    def _lossless_export(self, sql: str) -> None:
        """(A reader's :attr:`Reader.arrow_lossless`; the database's export is DuckDB's
        default.)"""

    def _lossy_export(self) -> None:
        """(See :meth:`_lossless_export`.)"""

    def _run_prepared(self, sql: str, rows: bool = False) -> pa.Table | Rows | None:
        """Run the statement :meth:`_prepare` made. A ``SELECT`` over registry sources
        (see :meth:`_bind_exposed`) goes to DuckDB once (``_submit``: parsed, bound and
        run in one call); through a relation (``con.sql``), DuckDB parses a statement
        three times and binds it twice, about 0.4 ms of CPU. With ``rows``, its result
        is fetched as DuckDB's ``fetchall`` gives it (:meth:`query`): through Arrow,
        DuckDB hands ``HUGEINT`` as a ``DECIMAL(38,0)`` (a ``UHUGEINT`` above 2^127 - 1
        wrapped to a negative number), ``UUID`` as text, ``BIT`` and ``TIMETZ`` without
        their values. The Arrow table has each ``UHUGEINT`` (alone or nested) as its value,
        a ``DECIMAL(39,0)`` (:func:`._rows.exact_table`)."""
        if rows:
            return self._run_prepared_export(sql, rows)
        self._lossless_export(sql)
        try:
            return self._run_prepared_export(sql, rows)
        finally:
            self._lossy_export()

    def _run_prepared_export(self, sql: str, rows: bool) -> pa.Table | Rows | None:
        """:meth:`_run_prepared`, with DuckDB's Arrow export as it is set."""
        with interruptible(self.con):
            if self._handles:
                if rows:
                    got = self.con._submit(sql, None, "rows")
                    return Rows([d[0] for d in got.description or ()], got.fetchall())
                got = self.con._submit(sql, None, "arrow")
                table = got.arrow_table()
                if any(has_wide(f.type) for f in table.schema):
                    table = exact_table(table, [str(d[1]) for d in got.description or ()])
                return table
            rel = self.con.sql(sql)
            if rel is None:
                return None
            if rows:
                return Rows(list(rel.columns), rel.fetchall())
            table = rel.to_arrow_table()
            if any(has_wide(f.type) for f in table.schema):
                table = exact_table(table, [str(t) for t in rel.types])
            return table

    def _run_duckdb(self, sql: str, prepared: tuple[str, str] | None = None,
                    rows: bool = False) -> Any:
        """DuckDB's result of ``sql``: an Arrow table (None for a statement without one),
        with ``rows`` a :class:`Rows` or an Arrow table (see :meth:`_run_prepared`)."""
        try:
            return self._run_duckdb_once(sql, True, prepared, rows)
        except DerivedFailed:  # computed by DuckDB instead: the same answer or error as ever
            return self._run_duckdb_once(sql, False, prepared, rows)

    def _run_duckdb_once(self, sql: str, push: bool,
                         prepared_query: tuple[str, str] | None = None,
                         rows: bool = False) -> Any:
        for attempt in (0, 1):
            try:
                try:
                    self._extremes_pending = None
                    prepared = self._prepare(sql, push, prepared_query)
                    if isinstance(prepared, pa.Table):
                        return prepared
                    if isinstance(prepared, DistinctCount):  # (interrupt stops it)
                        self._counting = prepared
                        try:
                            return prepared.run()
                        finally:
                            self._counting = None
                    result = self._run_prepared(prepared, rows)
                    if self._extremes_pending is not None and isinstance(result, pa.Table):
                        self._extreme_schemas[self._extremes_pending] = result.schema
                        while len(self._extreme_schemas) > _TREES:
                            self._extreme_schemas.popitem(last=False)
                    return result
                except duckdb.OutOfMemoryException as exc:
                    raise out_of_memory("the query", exc, "raise memory_limit (SET "
                                        "memory_limit = '8GB') or query fewer rows") from None
                except duckdb.Error as exc:
                    raise self._query_error(exc, sql) from None
                except RuntimeError as exc:  # (a Ctrl-C)
                    raise ctrl_c(exc) from None
                finally:
                    self._release()
            except (CatalogError, KeyNotFoundError) as exc:
                if attempt or not _retries(self, exc):
                    raise
                self._stamp = None  # the catalog loaded again before the second attempt
        return None  # pragma: no cover

    def _query_error(self, exc: Exception, sql: str) -> BaseException:
        """The error to raise for DuckDB's error ``exc`` running statement ``sql``: the
        one a scan raised inside it (DuckDB reports it only as text), a missing table's,
        or a :class:`DatabaseError` of DuckDB's message (the statement's own text)."""
        cause = self._scan_error()
        if cause is not None:
            return cause
        if isinstance(exc, duckdb.Error):
            missing = _missing_table(exc, sql, self.path, self.catalog.tables,
                                     self.catalog.views)
            if missing is not None:
                return missing
        message = _unprefixed(str(exc)) if self._handles else str(exc)
        for text, written in self._described_texts.items():
            message = message.replace(text, written)
        if role_rewrites(self):  # (DuckDB quotes the role's rewritten text)
            message = quiet_error(message)
        unread = _sql.cryptdisk_read_error(None, message)
        if unread is not None:
            return unread
        copy_to = _copy_to_words(sql)
        if copy_to is not None:  # (DuckDB's IO Error names no statement)
            return DatabaseError(f"{copy_to[0]}: {message}", hint=copy_to[1])
        return DatabaseError(message)

    def sql(self, sql: str, parameters: Any = None) -> pa.Table | None:
        """Run one or more statements; returns the last result as an Arrow table (or None).
        With ``parameters``, ``sql`` is one statement, run as :meth:`execute` runs it."""
        if not isinstance(sql, str):
            raise TypeError(f"Database.sql takes SQL text (str), not {type(sql).__name__}")
        if parameters is not None:
            return self.execute(_one_bound(sql, "Database.sql"), parameters)
        result = None
        for statement in _sql.split_statements(sql):
            result = self.execute(statement)
        return result

    def execute(self, statement: str, parameters: Any = None) -> pa.Table | None:
        """Run one statement (see :mod:`cryptdisk.db._sql` for the ones cryptdisk handles).

        ``parameters`` (a list or tuple for ``?``, ``?N`` and ``$N``; a dict for
        ``$name``) are bound as literals of their values (:mod:`._params`), in every
        statement kind; a wrong count or a value of another type raises
        :class:`~cryptdisk.errors.DatabaseError`."""
        if parameters is not None:
            statement = _bound(statement, parameters, "Database.execute")
        try:
            return self._execute(statement)
        except UnicodeDecodeError:
            raise _undecodable() from None

    def _execute(self, statement: str) -> pa.Table | None:
        with self._mutex:
            rows, self._rows_wanted = self._rows_wanted, False  # (query's, this one only)
            self._check_open()
            if not _one_statement(statement, "Database.execute"):
                return None
            qualifier = _sql.qualified_target(statement)
            if qualifier is not None and qualifier.lower() in self._attached():
                return self._run_attached(statement)
            view = parse_view_statement(statement)
            if view is not None:  # CREATE, DROP, ALTER VIEW (see ._viewdefs)
                return self._view_statement(view)  # type: ignore[func-returns-value]
            statement = self._expand(statement)  # the views it reads written out
            st = _sql.parse(statement)
            if isinstance(st, _sql.Passthrough):
                sql = st.sql
                word = _sql.first_word(sql)
                prepared = parse_prepared(sql) if word in _PREPARED_WORDS else None
                if prepared is not None and self._runs_prepared(prepared):
                    return self._run_prepared_statement(self, prepared, rows)
                if isinstance(prepared, Prepare):  # not a query: DuckDB's, unless on a table
                    self._prepared_queries.pop(prepared.name, None)
                    _refuse_prepare(prepared, set(self.catalog.tables))
                if word == "SHOW":
                    shown = _show(self, sql)
                    if not isinstance(shown, str):
                        return shown
                    sql = shown
                if word not in _QUERIES and not _harmless_set(sql):
                    self._session_changed()
                block = _block_change(sql)
                if block is None:
                    return _described(self, sql, self._run_duckdb(_for_duckdb(self, sql),
                                                                  rows=rows))
                try:  # BEGIN ... COMMIT: DuckDB's, and cryptdisk's writes wait for its end
                    result = self._run_duckdb(_for_duckdb(self, sql), rows=rows)
                except DatabaseError:
                    self._block = self._block and block  # (a failed COMMIT ends it too)
                    raise
                self._block = block
                return result
            if isinstance(st, (_sql.Insert, _sql.CopyFrom, _sql.DropTable, _sql.Truncate,
                               _sql.AlterTable, _sql.Delete, _sql.Update)) and \
                    self._temporary_table(st.name if isinstance(st, (
                        _sql.DropTable, _sql.Truncate, _sql.AlterTable)) else st.table):
                self._session_changed()  # DuckDB's own table (CREATE TEMP TABLE): its own
                return self._run_duckdb(_for_duckdb(self, statement.strip().rstrip(";")))
            # a writer of a database at a URL only adds, each commit on condition that no
            # other commit came first (see _commit)
            self._writable(_statement_words(st),
                           adds=isinstance(st, (_sql.CreateTable, _sql.Insert,
                                                _sql.CopyFrom)))
            if self.role is not None:  # a role may not drop or rewrite a protected table
                self._role_check(st)
            handler = {
                _sql.CreateTable: self._create, _sql.Insert: self._insert_sql,
                _sql.CopyFrom: self._copy_from,
                _sql.DropTable: self._drop, _sql.Truncate: self._truncate,
                _sql.AlterSetting: self._alter, _sql.AlterTable: self._alter_table,
                _sql.Optimize: self._optimize_stmt,
                _sql.SystemCommand: self._system_command,
                _sql.Delete: self._delete_stmt, _sql.Update: self._update_stmt,
            }[type(st)]
            return handler(st)  # type: ignore[operator]

    def _attached(self) -> set[str]:
        """The names (lower case) of the databases ``ATTACH`` gave this connection."""
        try:
            return {str(r[0]).lower() for r in self.con.execute(
                "SELECT database_name FROM duckdb_databases() WHERE NOT internal AND "
                "database_name <> 'memory'").fetchall()}
        except duckdb.Error:
            return set()

    def _run_attached(self, statement: str) -> pa.Table | None:
        """A statement on a table of an attached database (``CREATE TABLE o.x``, ``INSERT
        INTO o.main.x``...): DuckDB's, as written (the tables it reads from the database
        read as in a query; on a ``role=`` connection through the role's policies)."""
        self._session_changed()
        sql = self._expand(statement.strip().rstrip(";"))  # the views it reads written out
        if self.role is not None:
            sql = role_query(self, sql)
        return self._run_duckdb(sql)

    def _temporary_table(self, name: str) -> bool:
        """Whether ``name`` (in any case) is no table of the database's but one of DuckDB's
        on this connection (``CREATE TEMP TABLE``), whose statements are DuckDB's."""
        if name in self.catalog.tables:  # (NameDict: as DuckDB matches names)
            return False
        try:  # (SQL's lower() folds É to é too: DuckDB's names fold ASCII letters only)
            rows = self.con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE lower(table_name) = lower(?) "
                "AND (temporary OR (database_name = current_database() AND "
                "schema_name = current_schema()))", [name]).fetchall()
        except duckdb.Error:
            return False
        return any(fold(str(r[0])) == fold(name) for r in rows)

    def _show_tables(self) -> pa.Table:
        """``SHOW TABLES``: the database's tables and DuckDB's own of this connection
        (temporary tables, views), by name, as DuckDB's column ``name`` lists its own."""
        try:
            own = self.con.sql("SHOW TABLES").to_arrow_table().column("name").to_pylist()
        except duckdb.Error as exc:
            raise DatabaseError(f"SHOW TABLES: {exc}") from None
        names = sorted(set(own) | set(self.catalog.tables) | set(self.catalog.views))
        return pa.table({"name": pa.array(names, pa.string())})

    def _runs_prepared(self, st: Prepare | Execute | Deallocate) -> bool:
        """Whether :meth:`_run_prepared_statement` runs ``st``: a ``PREPARE`` of one query,
        or an ``EXECUTE`` or ``DEALLOCATE`` of a name this connection prepared so."""
        if isinstance(st, Prepare):
            return _prepares_query(st, set(self.catalog.tables))
        return st.name in self._prepared_queries

    def _run_prepared_statement(self, db: Database, st: Prepare | Execute | Deallocate,
                                rows: bool = False) -> Any:
        """``PREPARE`` a query, ``EXECUTE`` or ``DEALLOCATE`` it (see :mod:`._prepared`) on
        this connection (a reader's, of database ``db``): DuckDB prepares the query within
        the statement that executes it, over the tables' sources of that statement."""
        if isinstance(st, Deallocate):
            self._prepared_queries.pop(st.name, None)
            return None
        query = st.query if isinstance(st, Prepare) else self._prepared_queries[st.name]
        with db._mutex:
            if db.role is not None:  # masking and row access policies, as they are now
                query = role_query(db, query)
        text = f"PREPARE {st.written} AS {query}"
        args = ""
        if isinstance(st, Execute):
            text += f"\n;EXECUTE {st.written}{st.args}"
            args = st.args
        try:  # (what it reads: the query's columns and filters, see _prepare)
            result = self._run_duckdb(text, (query, args), rows)
        finally:
            with contextlib.suppress(duckdb.Error):  # its plan names this statement's sources
                self.con.execute(f"DEALLOCATE {st.written}")
        if isinstance(st, Prepare):
            self._prepared_queries[st.name] = st.query
            return None
        return result

    def _role_check(self, st: _sql.Statement) -> None:
        if isinstance(st, _sql.SystemCommand):
            word = "ROTATE KEYS" if st.command == "rotate" else "REENCRYPT"
            role_check_statement(self, f"SYSTEM {word}", None)
            return
        words = {_sql.DropTable: "DROP TABLE", _sql.Truncate: "TRUNCATE",
                 _sql.AlterSetting: "ALTER TABLE ... MODIFY SETTING",
                 _sql.Optimize: "OPTIMIZE TABLE"}
        name = words.get(type(st))
        if name is not None:
            role_check_statement(self, name, st.name)  # type: ignore[union-attr]

    def query(self, sql: str, parameters: Any = None) -> list[tuple[Any, ...]]:
        """Run a query (with ``parameters`` as :meth:`execute` takes them) and return its
        rows as tuples, the Python values DuckDB's ``fetchall`` gives (the last
        statement's, as :meth:`sql` runs them)."""
        if not isinstance(sql, str):
            raise TypeError(f"Database.query takes SQL text (str), not {type(sql).__name__}")
        if parameters is not None:
            sql = _one_bound(sql, "Database.query")
            statements = [_bound(sql, parameters, "Database.query")]
        else:
            statements = _sql.split_statements(sql)
        result: Any = None
        with self._mutex:
            for statement in statements:
                self._rows_wanted = True  # (taken by _execute: this statement's result)
                try:
                    result = self._execute(statement)
                except UnicodeDecodeError:
                    raise _undecodable() from None
                finally:
                    self._rows_wanted = False
            return query_rows(self.con, result)

    def stream(self, sql: str, parameters: Any = None, *,
               batch_rows: int = STREAM_BATCH_ROWS) -> Stream:
        """Run one query (with ``parameters`` as :meth:`execute` takes them) and hand its
        rows over as they are computed: a :class:`~cryptdisk.db.Stream` of Arrow batches
        of up to ``batch_rows`` rows, read like a ``pyarrow.RecordBatchReader``.

        The query runs on a DuckDB cursor of its own, as a :class:`Reader`'s does: this
        connection and its readers go on running statements while the stream is open.
        It reads the tables as the catalog was when it started (whole inserts only); the
        parts it started from stay on disk until it is closed, whatever commits
        meanwhile. Close it (``with db.stream(sql) as s:``) to release them early; it
        closes itself after its last batch and on an error."""
        if not isinstance(sql, str):
            raise TypeError(f"Database.stream takes SQL text (str), not {type(sql).__name__}")
        check_batch_rows(batch_rows)
        self._check_open()
        reader = Reader(self)
        try:
            return reader._stream(sql, parameters, batch_rows, "Database.stream", owned=True)
        except BaseException:
            reader.close()
            raise

    def _fetch(self, statement: str) -> Rows | None:
        """One statement's result as its columns' names and the Python values DuckDB's
        ``fetchall`` gives (as :meth:`query`), None for a statement without one: what
        ``cryptdisk sql`` prints (Arrow hands DuckDB's ``BIT``, ``BIGNUM`` and ``TIMETZ``
        without their values)."""
        with self._mutex:
            self._rows_wanted = True
            try:
                result = self.execute(statement)
            finally:
                self._rows_wanted = False
            if result is None or isinstance(result, Rows):
                return result
            return Rows(list(result.column_names), query_rows(self.con, result))

    def executemany(self, statement: str, seq_of_parameters: Iterable[Any]) -> None:
        """Run ``statement`` with each of ``seq_of_parameters`` (lists, tuples or dicts,
        as :meth:`execute` takes them).

        An ``INSERT ... VALUES (...)`` runs once, as one ``INSERT`` of every set's rows
        (one commit; the parts of one insert, not one part per set), so a failing set
        inserts none. One row whose parameters each hold values of one Arrow type reads
        them from an Arrow table of the sets (:meth:`._params.Template.arrow`), each cast
        as DuckDB casts its own parameter; otherwise the sets' rows are written out as
        literals in one ``VALUES``, whose rows take a common type per column before they
        are cast to the table's. Any other statement runs once per set, each its own
        statement and commit."""
        if not _one_statement(statement, "Database.executemany"):
            return
        sets = _parameter_sets(seq_of_parameters)
        if not sets:
            return
        found = _values_insert(statement)
        if found is not None:
            head, rows, one = found
            template = Template(rows)
            arrow = one and template.placeholders and not _DEFAULT.search(
                _sql._QUOTED.sub("''", rows))  # (DEFAULT is a VALUES word, not a SELECT's)
            table = template.arrow(sets) if arrow else None
            if table is None:
                self.execute(head + "VALUES " + ", ".join(template.fill(p) for p in sets))
                return
            # one row per set: the VALUES row as a SELECT of the sets' Arrow columns
            select = Template(rows.strip()[1:-1]).substitute({
                key: f"{_PARAMETERS}.p{i}" for i, key in enumerate(template.keys)})
            with self._mutex:
                self._check_open()
                self._expose(_PARAMETERS, table)  # (read by the INSERT's query alone)
                try:
                    self.execute(f"{head}SELECT {select} FROM {_PARAMETERS}")
                finally:
                    self._exposed.pop(_PARAMETERS, None)
            return
        for parameters in sets:
            self.execute(statement, parameters)

    # -- DDL -----------------------------------------------------------------------

    def arrow_schema(self, meta: TableMeta) -> pa.Schema:
        """The Arrow schema DuckDB gives the table's columns (scans hand DuckDB this schema).

        Plain types come from :data:`ARROW_TYPES`; a table with any other type asks
        DuckDB once (a statement costs about 2 ms, most of a point query's budget).
        """
        key = tuple(meta.columns)
        schema: pa.Schema | None = self._schemas.get(key)
        if schema is None:
            known = [ARROW_TYPES.get(" ".join(t.upper().split())) for _c, t in meta.columns]
            if all(typ is not None for typ in known):
                schema = pa.schema([pa.field(c, typ) for (c, _t), typ in zip(meta.columns, known,
                                                                                strict=True)])
            else:
                cols = ", ".join(f"CAST(NULL AS {t}) AS {quote(c)}" for c, t in meta.columns)
                schema = self.con.sql(f"SELECT {cols}").to_arrow_table().schema
            self._schemas[key] = schema
        return schema

    def _create(self, st: _sql.CreateTable) -> None:
        if st.name in self.catalog.tables:
            if st.if_not_exists:
                return
            raise DatabaseError(f"table {st.name!r} already exists")
        twin_error(f"CREATE TABLE {st.name}", st.name, self.catalog.tables, self.catalog.views)
        if st.query is not None:  # CREATE TABLE t AS SELECT ... (see ._schema)
            self._create_as(st)
            return
        meta = self._new_table(st)
        self._forget_policies(st.name)  # a dropped table's, left by a crash (see _schema)
        self.catalog.tables[st.name] = meta
        with self._committing(lambda: self.catalog.tables.pop(st.name)):
            self._commit()

    def _new_table(self, st: _sql.CreateTable) -> TableMeta:
        """The catalog entry of the table ``st`` creates, its name, columns, key and
        settings checked (not in the catalog yet)."""
        view = self.catalog.views.name(st.name)
        if view is not None:
            raise DatabaseError(f"CREATE TABLE {st.name}: a view {view} has the name (tables "
                                "and views share their names)",
                                hint=f"DROP VIEW {view} first, or give the table another name")
        if self._temporary_table(st.name):  # (statements naming it would reach DuckDB's)
            raise DatabaseError(f"CREATE TABLE {st.name}: a temporary table {st.name} of "
                                "this connection has the name",
                                hint=f"DROP TABLE {st.name} (the temporary one) first, or "
                                "give the table another name")
        unknown = set(st.settings) - {"storage_policy"}
        if unknown:
            raise DatabaseError(f"unknown table setting(s) {', '.join(sorted(unknown))}; "
                                "the only setting is storage_policy")
        policy = st.settings.get("storage_policy", "default")
        self.policy(policy)
        names = [c for c, _ in st.columns]
        lower = {fold(c): c for c in names}  # (names are found in any case, as in DuckDB)
        if len(lower) != len(names):
            raise DatabaseError(f"CREATE TABLE {st.name}: duplicate column names (in any "
                                "case, a name is one column)")
        for col in st.order_by or []:
            if fold(col) not in lower:
                raise DatabaseError(f"ORDER BY {col}: no such column in {st.name}")
            if "," in col:  # (the catalog keeps the key as its columns joined by commas)
                raise DatabaseError(f"ORDER BY {col}: the name of a key column of "
                                    f"{st.name} cannot hold a comma",
                                    hint="give the column a name without one")
        if st.order_by:
            st.order_by = [lower[fold(c)] for c in st.order_by]
        import uuid

        meta = TableMeta(uuid.uuid4().hex, st.name, st.columns, policy,
                         ",".join(st.order_by) if st.order_by else None,
                         not_null=list(st.not_null), defaults=dict(st.defaults))
        try:
            self._check_types(meta)
        except duckdb.Error as exc:
            raise DatabaseError(f"CREATE TABLE {st.name}: {exc}") from None
        types = dict(st.columns)
        for column, expr in meta.defaults.items():
            check_default(self.con, f"CREATE TABLE {st.name}", column, types[column], expr,
                          column in meta.not_null)
        return meta

    def _check_types(self, meta: TableMeta, what: str | None = None) -> None:
        """Refuse a column type of ``meta`` that a part cannot store as it is (``what``:
        the statement, for the error; default ``CREATE TABLE name``)."""
        what = what or f"CREATE TABLE {meta.name}"
        schema = self.arrow_schema(meta)
        st = meta
        lossy = self._lossy_columns(st.columns)
        for (column, typ), field in zip(st.columns, schema, strict=True):
            if column in lossy:
                raise DatabaseError(
                    f"{what}: column {column} of type {typ} is not supported: "
                    f"a table's columns are stored as Arrow, in which DuckDB's {lossy[column]} "
                    f"loses {_LOSSY[lossy[column]][0]}",
                    hint=_LOSSY[lossy[column]][1])
            if not _parquet_stores(field):
                raise DatabaseError(
                    f"{what}: column {column} of type {typ} is not supported: "
                    "a table's parts are Parquet files, which cannot store it (Arrow type "
                    f"{field.type})",
                    hint="store an interval as BIGINT (e.g. microseconds) or VARCHAR, or "
                    "serve it from SQLite (cryptdisk serve --sqlite)")


    def _lossy_columns(self, columns: list[tuple[str, str]]) -> dict[str, str]:
        """The columns whose type holds one of :data:`_LOSSY` (alone or nested), with it."""
        odd = [(c, t) for c, t in columns if " ".join(t.upper().split()) not in ARROW_TYPES]
        if not odd:
            return {}
        cols = ", ".join(f"CAST(NULL AS {t}) AS {quote(c)}" for c, t in odd)
        found = {}
        for (column, _typ), row in zip(odd, self.con.sql(f"DESCRIBE SELECT {cols}").fetchall(),
                                       strict=True):
            # DuckDB's name of the type, struct field names (quoted) and enum labels out
            words = re.sub(r'"(?:[^"]|"")*"|\'(?:[^\']|\'\')*\'', " ", str(row[1]))
            hit = next((t for t in _LOSSY if re.search(rf"\b{t}\b", words)), None)
            if hit is not None:
                found[column] = hit
        return found


#: DuckDB types that DuckDB hands to Arrow (and so to a part) without part of their value:
#: what is lost, and what to declare instead.
_LOSSY = {
    "TIME WITH TIME ZONE": ("the time zone offset (TIMETZ '12:00:00+05' is read back as "
                            "TIME '12:00:00')",
                            "declare TIMESTAMPTZ, or TIME and the offset in a column of its own"),
    "BIT": ("the bit string (it becomes a BLOB of DuckDB's internal bytes)",
            "store the bits as VARCHAR ('0101') or BLOB"),
    "BIGNUM": ("the number (it becomes a BLOB of DuckDB's internal bytes)",
               "declare DECIMAL(38,0), or VARCHAR for more digits"),
}


#: What a Reader keeps of its own (the rest of its attributes are its database's).
_READER_OWN = frozenset({"con", "_parser", "_scans", "_registered", "_exposed",
                         "_handles", "last_scans", "_prepared_queries",
                         "_statement_cache",
                         "_extremes_pending", "_counting", "_trees", "_extreme_schemas",
                         "_closed", "_settings", "_settings_untouched", "_streaming",
                         "arrow_lossless", "_lossless_set", "_lossless_user"})


#: words of a query's text that can make a ``TIME WITH TIME ZONE`` (a cast or literal,
#: DuckDB's functions returning one), for which a reader with :attr:`Reader.arrow_lossless`
#: turns DuckDB's lossless Arrow export on
_TIMETZ_WORDS = re.compile(r"timetz|time\s+with\s+time\s+zone|current_time|time_tz",
                           re.IGNORECASE)


def _retries(db: Database, exc: CatalogError | KeyNotFoundError) -> bool:
    """Whether a read-only connection's statement that failed with ``exc`` runs once
    more, its catalog loaded again: a part vanished under a stale catalog
    (:class:`CatalogError`), or another process rotated to a key made after this one
    opened (:class:`KeyNotFoundError`, where the connection reads its own key file:
    reloaded here). A writer's, or a second attempt's, error is raised."""
    if not db.read_only:
        return False
    if isinstance(exc, KeyNotFoundError):
        if not db.own_keys:
            return False
        db._reload_own_keys()
    return True


class Reader:
    """Queries of a :class:`Database` (``db.reader()``) that run on their own DuckDB cursor
    of its connection, so that several threads, each with its reader, query at once.

    :meth:`execute` runs one query (``SELECT``, ``WITH``, ``FROM``; any other statement
    is refused: it goes to :meth:`Database.execute`); :meth:`sql` and :meth:`query` run
    queries the same way, on the reader's cursor. Its tables are taken from the
    catalog, and their scans registered on the reader's cursor, under the database's
    lock, which a write holds from its start to its commit: a query sees each insert
    whole or not at all, then runs (DuckDB's work, the decryption and decoding of its
    scans) without the lock, beside other readers' queries and the database's own
    statements. The parts a query started from stay on disk until it ends, even when a
    merge (``OPTIMIZE``), ``DROP`` or ``TRUNCATE`` commits meanwhile. The decoded-column
    cache, the open parts, the connection hooks' functions (``cryptdisk.fields``), the
    ``role=`` policies and DuckDB's settings (``memory_limit``, ``threads``: one budget
    for all the queries running) are the database's.

    One thread at a time uses a reader (each thread its own); :meth:`interrupt` may come
    from any thread. :meth:`close` (or the database's close) releases its cursor.
    """

    # the read path of Database, run with this reader's cursor and statement state
    _run_duckdb = Database._run_duckdb
    _run_duckdb_once = Database._run_duckdb_once
    _run_prepared = Database._run_prepared
    _run_prepared_export = Database._run_prepared_export
    _run_prepared_statement = Database._run_prepared_statement
    _release = Database._release
    _expose = Database._expose
    _describe_subqueries = Database._describe_subqueries
    _read_description = Database._read_description
    _bind_exposed = Database._bind_exposed
    _scan_error = Database._scan_error
    _query_error = Database._query_error
    _key_extremes = Database._key_extremes
    _count_distinct = Database._count_distinct
    _push = Database._push
    _parse_tree = Database._parse_tree
    _prepared_tree = Database._prepared_tree
    _binary_text = Database._binary_text
    _text_safe = Database._text_safe
    _default_order = Database._default_order
    _default_null_order = Database._default_null_order
    _setting = Database._setting
    _read_settings = Database._read_settings
    _head = Database._head
    _scan = Database._scan
    arrow_schema = Database.arrow_schema

    def __init__(self, db: Database) -> None:
        object.__setattr__(self, "_db", db)
        with db._mutex:
            try:
                self.con = db.con.cursor()
                self._parser = parser_cursor(db.con)
                for setup in db._cursor_setups:
                    setup(self.con)
            except duckdb.Error as exc:
                raise DatabaseError(f"cannot open a reader: {exc}") from None
        self._scans: list[TableScan] = []
        self._registered: set[str] = set()
        self._exposed: dict[str, Any] = {}
        self._handles: list[Any] = []
        self._prepared_queries: dict[str, str] = {}  # (see ._prepared)
        self._statement_cache: StatementCache | None = None
        self.last_scans: dict[str, dict[str, int]] = {}
        self._extremes_pending: Any = None
        self._counting: DistinctCount | None = None
        self._rows_wanted = False  # (set by query for the statement it runs)
        self._described_texts: dict[str, str] = {}  # see _describe_subqueries
        self._trees: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._extreme_schemas: collections.OrderedDict[Any, pa.Schema] = \
            collections.OrderedDict()
        self._settings: tuple[Any, ...] = ()  # see Database._setting
        #: whether no SET that may change names ran on this reader's cursor (see
        #: Database._names_certain; the database's own flag counts too)
        self._settings_untouched = True
        self._closed = False
        self._streaming: weakref.ref[Stream] | None = None  # its open stream (see stream)
        #: its queries' results (execute, sql, stream) as DuckDB's lossless Arrow export
        #: gives them (see _lossless_export)
        self.arrow_lossless = False
        #: what turns arrow_lossless_conversion back after a query that set it on its
        #: cursor (see _lossless_export); None: not set
        self._lossless_set: str | None = None
        #: a configure statement named arrow_lossless_conversion (the user's own setting)
        self._lossless_user = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)  # the database's own state and methods

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _READER_OWN:
            object.__setattr__(self, name, value)
        else:  # e.g. the catalog's stamp after a retry: the database's
            setattr(self._db, name, value)

    def _prepare(self, sql: str, push: bool = True, prepared: tuple[str, str] | None = None
                 ) -> str | pa.Table | DistinctCount:
        with self._db._mutex:  # the catalog as its last commit left it
            return Database._prepare(self, sql, push, prepared)  # type: ignore[arg-type]

    def _lossless_export(self, sql: str) -> None:
        """With :attr:`arrow_lossless`, turn DuckDB's ``arrow_lossless_conversion`` on for
        the query ``sql`` (DuckDB's text, its views written out) about to run on this
        reader's cursor (its result's types are taken as it starts), when its text can
        make a ``TIME WITH TIME ZONE`` (:data:`_TIMETZ_WORDS`; a table cannot hold one):
        that comes as ``arrow.opaque`` ``time_tz`` with its offset, a ``UUID`` as
        ``arrow.uuid``, ``HUGEINT``, ``UHUGEINT`` and ``BIT`` as ``arrow.opaque``,
        ``JSON`` as ``arrow.json``. Only such a query's own result: the reader's other
        statements (its scans' schemas, key extremes) and other queries run with it off
        (:meth:`_lossy_export`; the ``SET`` and ``RESET`` cost about 0.2 ms a query). A
        setting of the reader's own (:meth:`configure`) is kept: on, nothing is set; off,
        it is set off again after the query (not reset to DuckDB's default)."""
        if not self.arrow_lossless or self._lossless_set is not None or \
                not _TIMETZ_WORDS.search(sql):
            return
        restore = "RESET SESSION arrow_lossless_conversion"
        try:
            if self._lossless_user:
                if self.con.execute("SELECT current_setting('arrow_lossless_conversion')"
                                    ).fetchall() == [(True,)]:
                    return
                restore = "SET SESSION arrow_lossless_conversion = false"
            self.con.execute("SET SESSION arrow_lossless_conversion = true")
        except duckdb.Error as exc:
            raise DatabaseError(f"cannot set arrow_lossless_conversion: {exc}") from None
        self._lossless_set = restore

    def _lossy_export(self) -> None:
        """DuckDB's default Arrow export again on this reader's cursor (see
        :meth:`_lossless_export`): before each statement, after a query's table."""
        if self._lossless_set is not None:
            restore, self._lossless_set = self._lossless_set, None
            try:
                self.con.execute(restore)
            except duckdb.Error as exc:
                raise DatabaseError(f"cannot reset arrow_lossless_conversion: {exc}") from None

    @staticmethod
    def runs(statement: str) -> bool:
        """Whether ``statement`` is a query a reader runs (else :meth:`Database.execute`)."""
        try:
            st = _sql.parse(statement)
        except DatabaseError:
            return False
        if not isinstance(st, _sql.Passthrough):
            return False
        prepared = parse_prepared(st.sql)
        if isinstance(prepared, Prepare):
            return is_query(prepared.query)
        if prepared is not None:
            return True
        word = _sql.first_word(st.sql)
        if word == "EXPLAIN":  # of a query: EXPLAIN [ANALYZE] [(options)] SELECT ...
            m = _EXPLAINED.match(st.sql)
            word = _sql.first_word(m.group(1)) if m else ""
            return word in _QUERIES or word in _READS
        return word in _QUERIES or word in _READS

    def execute(self, statement: str, parameters: Any = None) -> pa.Table | None:
        """Run one query, or ``PREPARE`` one, ``EXECUTE`` or ``DEALLOCATE`` it (see the
        class): an Arrow table (None for ``PREPARE`` and ``DEALLOCATE``). ``parameters``
        as :meth:`Database.execute` takes them."""
        if parameters is not None:
            statement = _bound(statement, parameters, "Reader.execute")
        try:
            return self._execute(statement)
        except UnicodeDecodeError:
            raise _undecodable() from None

    def _execute(self, statement: str) -> pa.Table | None:
        with kept_signals():  # (its query runs without the database's lock: see ._sigint)
            return self._execute_query(statement)

    def _execute_query(self, statement: str) -> pa.Table | None:
        db = self._db
        if not _one_statement(statement, "Reader.execute"):
            return None
        st = _sql.parse(statement)
        if not isinstance(st, _sql.Passthrough) or not self.runs(st.sql):
            raise DatabaseError("a reader runs queries (SELECT, WITH, FROM; DESCRIBE, "
                                "SHOW, SUMMARIZE and EXPLAIN of a query; PREPARE, EXECUTE "
                                "and DEALLOCATE of a query); run other statements with "
                                "Database.execute")
        self._check_idle()
        self._lossy_export()  # (the last query's result may have had it on)
        db._check_open()  # (its cursor went with the database)
        with db._mutex:  # the views it reads written out (see ._views)
            st = _sql.Passthrough(db._expand(st.sql))
        prepared = parse_prepared(st.sql)
        if prepared is not None:
            with db._mutex:
                runs = Database._runs_prepared(self, prepared)  # type: ignore[arg-type]
            if isinstance(prepared, Prepare) and not runs:  # (WITH ... INSERT INTO)
                _refuse_prepare(prepared, set(db.catalog.tables))
                raise DatabaseError("a reader prepares queries only; run other statements "
                                    "with Database.execute")
            if isinstance(prepared, Execute) and not runs:
                raise DatabaseError(f"prepared statement {prepared.written} does not exist "
                                    "on this reader", hint="PREPARE it on this reader: the "
                                    "database and each reader have their own names")
        sql = st.sql
        rows = self._rows_wanted
        with db._mutex:
            if prepared is None and _sql.first_word(sql) == "SHOW":
                shown = _show(self, sql)  # type: ignore[arg-type]
                if not isinstance(shown, str):
                    return shown
                sql = shown
            if prepared is None:
                sql = _for_duckdb(db, sql)
            db._readers_running += 1
        try:
            if prepared is not None:
                return self._run_prepared_statement(db, prepared, rows)  # type: ignore[misc]
            return _described(db, sql, self._run_duckdb(sql, rows=rows))  # type: ignore[misc]
        finally:
            db._reader_ends()

    def sql(self, sql: str, parameters: Any = None) -> pa.Table | None:
        """Run one or more queries on this reader (each as :meth:`execute` does); returns
        the last one's Arrow table. A statement other than a query raises
        :class:`DatabaseError` before it runs, as :meth:`execute` does. With
        ``parameters``, ``sql`` is one query."""
        if not isinstance(sql, str):
            raise TypeError(f"Reader.sql takes SQL text (str), not {type(sql).__name__}")
        if parameters is not None:
            return self.execute(_one_bound(sql, "Reader.sql"), parameters)
        statements = _sql.split_statements(sql)
        for statement in statements:
            if not self.runs(statement):
                raise DatabaseError("a reader runs queries (SELECT, WITH, FROM; DESCRIBE, "
                                    "SHOW, SUMMARIZE and EXPLAIN of a query); run other "
                                    "statements with Database.execute")
        result = None
        for statement in statements:
            result = self.execute(statement)
        return result

    def query(self, sql: str, parameters: Any = None) -> list[tuple[Any, ...]]:
        """:meth:`sql`'s last result as a list of row tuples, the Python values DuckDB's
        ``fetchall`` gives (see :meth:`Database.query`)."""
        self._rows_wanted = True  # (taken by each query of this call: see _execute_query)
        try:
            result = self.sql(sql, parameters)
        finally:
            self._rows_wanted = False
        return query_rows(self.con, result)

    def stream(self, sql: str, parameters: Any = None, *,
               batch_rows: int = STREAM_BATCH_ROWS) -> Stream:
        """Run one query on this reader's cursor and hand its rows over as they are
        computed (see :meth:`Database.stream`). Until the stream is closed (or ends) the
        reader runs nothing else: its other statements raise :class:`DatabaseError`."""
        if not isinstance(sql, str):
            raise TypeError(f"Reader.stream takes SQL text (str), not {type(sql).__name__}")
        check_batch_rows(batch_rows)
        return self._stream(sql, parameters, batch_rows, "Reader.stream", owned=False)

    def _stream(self, sql: str, parameters: Any, batch_rows: int, method: str,
                owned: bool) -> Stream:
        """:meth:`stream` of ``sql`` (checked to be text), on this reader; ``owned``: the
        stream closes the reader as it ends (a reader made for it)."""
        found = _sql.split_statements(sql)
        if len(found) != 1:
            raise DatabaseError(f"{method} runs one query, and this text holds "
                                f"{len(found)} statements")
        statement = found[0] if parameters is None else _bound(found[0], parameters, method)
        self._check_idle()
        self._lossy_export()  # (the last query's result may have had it on)
        db = self._db
        db._check_open()
        try:
            with kept_signals():
                st = _sql.parse(statement)
                word = _sql.first_word(st.sql) if isinstance(st, _sql.Passthrough) else ""
                if not isinstance(st, _sql.Passthrough) or word in _PREPARED_WORDS \
                        or not self.runs(statement):
                    raise DatabaseError(f"{method} runs a query (SELECT, WITH, FROM; "
                                        "DESCRIBE, SHOW, SUMMARIZE and EXPLAIN of a query)",
                                        hint="run other statements with Database.execute")
                if word not in _QUERIES:  # (DESCRIBE, SHOW...: a few rows, held whole)
                    table = self._execute_query(statement)
                    stream = Stream.of_table(table if table is not None else pa.table({}))
                    if owned:
                        self.close()
                    return stream
                with db._mutex:  # the views it reads written out (see ._views)
                    sql = _for_duckdb(db, db._expand(st.sql))
                    db._readers_running += 1  # its parts stay until it is closed
                try:
                    return self._start_stream(sql, batch_rows, owned)
                except BaseException:
                    db._reader_ends()
                    raise
        except UnicodeDecodeError:
            raise _undecodable() from None

    def _check_idle(self) -> None:
        """Refuse a statement while this reader's stream is open, and on a closed reader."""
        if self._closed:
            raise DatabaseError("this reader is closed")
        stream = self._streaming() if self._streaming is not None else None
        if stream is not None and not stream.closed:
            raise DatabaseError("this reader's stream is open: close it first",
                                hint="db.stream(sql) runs each stream on a cursor of its "
                                "own")

    def _start_stream(self, sql: str, batch_rows: int, owned: bool) -> Stream:
        """Prepare the query ``sql`` (DuckDB's text) and start DuckDB's streaming result
        of it (its scans registered on this reader's cursor until the stream ends)."""
        db = self._db
        for attempt in (0, 1):
            self._lossy_export()  # (a failed first attempt's)
            try:
                try:
                    # (push=False: a field function the scan would compute fails inside
                    # DuckDB's run, after batches went out; DuckDB computes it instead)
                    prepared = self._prepare(sql, False)
                    if isinstance(prepared, DistinctCount):  # (interrupt stops it)
                        self._counting = prepared
                        try:
                            prepared = prepared.run()
                        finally:
                            self._counting = None
                    if isinstance(prepared, pa.Table):
                        self._release()  # type: ignore[misc]
                        db._reader_ends()
                        if owned:
                            self.close()
                        return Stream.of_table(prepared)
                    self._lossless_export(str(prepared))  # (off again before its next statement)
                    with interruptible(self.con):
                        if hasattr(self.con, "_submit"):
                            got = self.con._submit(prepared, None, "stream", batch_rows)
                            kinds = [str(d[1]) for d in got.description or ()]
                            batches = got.arrow_reader()
                        else:  # pragma: no cover - a DuckDB without _submit
                            got = self.con.sql(prepared)
                            kinds = [str(t) for t in got.types]
                            batches = got.to_arrow_reader(batch_rows)
                except duckdb.OutOfMemoryException as exc:
                    self._release()  # type: ignore[misc]
                    raise out_of_memory("the query", exc, "raise memory_limit (SET "
                                        "memory_limit = '8GB') or query fewer rows") from None
                except duckdb.Error as exc:
                    error = self._query_error(exc, sql)  # type: ignore[misc]
                    self._release()  # type: ignore[misc]
                    raise error from None
                except RuntimeError as exc:  # (a Ctrl-C)
                    self._release()  # type: ignore[misc]
                    raise ctrl_c(exc) from None
                except BaseException:
                    self._release()  # type: ignore[misc]
                    raise
            except (CatalogError, KeyNotFoundError) as exc:
                if attempt or not _retries(db, exc):
                    raise
                self._stamp = None  # the catalog loaded again before the second attempt
            else:
                return self._streamed(sql, got, batches, kinds, owned)
        raise AssertionError("unreachable")  # pragma: no cover

    def _streamed(self, sql: str, got: Any, batches: pa.RecordBatchReader,
                  kinds: list[str], owned: bool) -> Stream:
        """The :class:`Stream` of DuckDB's streaming result ``got`` (read as ``batches``)."""
        db = self._db
        schema = batches.schema
        wide = any(has_wide(f.type) for f in schema)
        if wide:  # each UHUGEINT exact, as Database.sql gives it (see _run_prepared)
            schema = exact_table(schema.empty_table(), kinds).schema

        def next_batch() -> pa.RecordBatch | None:
            try:
                with interruptible(self.con):
                    batch = batches.read_next_batch()
            except StopIteration:
                return None
            except duckdb.OutOfMemoryException as exc:
                raise out_of_memory("the query", exc, "raise memory_limit (SET "
                                    "memory_limit = '8GB') or query fewer rows") from None
            except (duckdb.Error, pa.ArrowException, OSError) as exc:  # (Arrow's C stream
                # hands DuckDB's error over as an OSError)
                raise self._query_error(exc, sql) from None  # type: ignore[misc]
            except RuntimeError as exc:  # (a Ctrl-C)
                raise ctrl_c(exc) from None
            if wide:
                table = exact_table(pa.Table.from_batches([batch]), kinds)
                out = table.combine_chunks().to_batches()
                return out[0] if out else pa.RecordBatch.from_pylist([], schema=schema)
            return batch

        def release() -> None:
            try:
                for end in (batches.close, got.close):  # DuckDB's statement ends (its
                    with contextlib.suppress(Exception):  # scans no longer pulled)
                        end()
                self._release()  # type: ignore[misc]
            finally:
                db._reader_ends()
                if owned:
                    self.close()

        stream = Stream(schema, next_batch, release, self.interrupt)
        # (weak: the release holds this reader, and a stream dropped unclosed is collected)
        self._streaming = weakref.ref(stream)
        db._streams.add(stream)
        return stream

    def configure(self, statement: str) -> None:
        """Run ``SET`` or ``RESET`` ``statement`` on this reader's cursor: a DuckDB setting
        local to a connection (``integer_division``, ``search_path``) set with
        :meth:`Database.execute` applies to the database's connection only. A setting that
        may change how columns are named or which table a name reads turns off the fast
        paths relying on those (count(DISTINCT) outside DuckDB, min/max of the sort key
        from the catalog) for this reader, or for every connection if it is global."""
        parts = _sql.split_statements(statement)
        if len(parts) != 1 or _sql.first_word(parts[0].lstrip()) not in ("SET", "RESET"):
            raise DatabaseError("Reader.configure runs one SET or RESET statement")
        self._check_idle()
        self._lossy_export()  # (the last query's result may have had it on)
        self._db._check_open()
        if "arrow_lossless_conversion" in parts[0].lower():
            self._lossless_user = True  # (kept by _lossless_export)
        harmless = _harmless_set(parts[0])
        if not harmless:  # (before it runs: a failed SET may have changed it too)
            self._settings_untouched = False
            self._extreme_schemas.clear()
        try:
            self.con.execute(parts[0])
        except duckdb.Error as exc:
            raise DatabaseError(str(exc)) from None
        finally:
            if not harmless and not self._own_setting(parts[0]):
                self._db._session_changed()  # a global setting: every connection's

    def _names_certain(self) -> bool:
        return self._settings_untouched and self._db._settings_untouched

    def _own_setting(self, statement: str) -> bool:
        """Whether SET ``statement`` (run) changed this reader's cursor's setting only:
        not GLOBAL, and a setting DuckDB keeps for each connection."""
        m = _SET_NAME.match(statement)
        if m is None or m[1] or m[2].upper() in ("ALL", "VARIABLE"):
            return False
        name = m[2].strip('"').lower()
        with contextlib.suppress(duckdb.Error):
            rows = self.con.execute("SELECT scope FROM duckdb_settings() "
                                    "WHERE lower(name) = ?", [name]).fetchall()
            return bool(rows) and rows[0][0] == "LOCAL"
        return False

    def interrupt(self) -> None:
        """Stop the query this reader is running (DuckDB's interrupt of its cursor, or a
        count of distinct values between two of its batches)."""
        counting = self._counting
        if counting is not None:
            counting.stop()
        with contextlib.suppress(duckdb.Error):
            self.con.interrupt()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            stream = self._streaming() if self._streaming is not None else None
            if stream is not None:
                stream.close()
            for c in (self._parser, self.con):
                with contextlib.suppress(Exception):
                    c.close()

    def __repr__(self) -> str:
        return f"<cryptdisk.Reader of {self._db!r}{' closed' if self._closed else ''}>"

    def __reduce__(self) -> Any:
        raise TypeError("a Reader cannot be pickled")


def _show(db: Database, sql: str) -> pa.Table | str:
    """``SHOW TABLES`` of ``db``'s connection or of one of its readers (``db``), answered
    here; ``SHOW t`` of a table as ``DESCRIBE t`` (DuckDB's same statement, which reads
    the table as a query does); any other ``SHOW`` as it is."""
    if _SHOW_TABLES.fullmatch(sql):
        return Database._show_tables(db)  # (a reader's: on its cursor)
    if _SHOW_ALL_TABLES.fullmatch(sql):  # DuckDB's, over duckdb_columns() (with the tables)
        return _ALL_TABLES
    m = _SHOW_NAME.fullmatch(sql)
    if m is not None:
        name = fold(_sql.unquote(m.group(1)))
        if any(name == fold(t) for t in db.catalog.tables):
            return f"DESCRIBE {m.group(1)}"
    return sql


_SHOW_ALL_TABLES = re.compile(r"(?is)\s*SHOW\s+ALL\s+TABLES\s*;?\s*")
#: ``SHOW ALL TABLES`` as DuckDB answers it, from ``duckdb_columns()``, which lists the
#: database's tables and views with DuckDB's own (see ._infoschema)
_ALL_TABLES = ('SELECT database_name AS "database", schema_name AS "schema", table_name AS '
               '"name", list(column_name ORDER BY column_index) AS column_names, '
               'list(data_type ORDER BY column_index) AS column_types, '
               "bool_or(database_name = 'temp') AS \"temporary\" FROM duckdb_columns() "
               "WHERE NOT internal GROUP BY database_name, schema_name, table_name "
               "ORDER BY 1, 2, 3")
_DESCRIBE = re.compile(rf"(?is)DESCRIBE\s+(?:TABLE\s+)?({_sql._IDENT})\s*")
#: what is left as it is (a string: E'...', '...' or $tag$...$tag$; a quoted identifier; a
#: comment), or a ``(DESCRIBE t)`` or ``(SHOW t)`` subquery (group ``table``)
_DESCRIBE_SUBQUERY = re.compile(
    r"(?s)(?<![\w$])[eE]'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\""
    r"|\$(?P<tag>(?:[A-Za-z_]\w*)?)\$.*?\$(?P=tag)\$|--[^\n]*|/\*.*?\*/"
    rf"|\(\s*(?i:DESCRIBE\s+(?:TABLE\s+)?|SHOW\s+)(?P<table>{_sql._IDENT})\s*\)")


def _described(db: Database, sql: str, result: Any) -> Any:
    """``result`` of ``sql``, and for ``DESCRIBE t`` of a table (DuckDB's description of
    the view it reads the table through), its ``null`` and ``default`` as the table
    declares them."""
    m = _DESCRIBE.fullmatch(sql) if result is not None and sql[:1] in "dD" else None
    meta = db.catalog.tables.get(_sql.unquote(m.group(1))) if m is not None else None
    if meta is None or result is None or not (meta.not_null or meta.defaults):
        return result
    if isinstance(result, Rows):  # (Database.query's)
        if not {"column_name", "null", "default"} <= set(result.names):
            return result
        at = {n: result.names.index(n) for n in ("column_name", "null", "default")}
        out = []
        for row in result.rows:
            name, values = meta.column_name(row[at["column_name"]]), list(row)
            values[at["null"]] = "NO" if name in meta.not_null else "YES"
            values[at["default"]] = meta.defaults.get(name)
            out.append(tuple(values))
        return Rows(result.names, out)
    if not {"column_name", "null", "default"} <= set(result.column_names):
        return result
    names = [meta.column_name(c) for c in result.column("column_name").to_pylist()]
    for column, values in (("null", ["NO" if c in meta.not_null else "YES" for c in names]),
                           ("default", [meta.defaults.get(c) for c in names])):
        i = result.column_names.index(column)
        result = result.set_column(i, column, pa.array(values, result.schema.field(i).type))
    return result


def _for_duckdb(db: Database, sql: str) -> str:
    """The text DuckDB runs for statement ``sql`` of ``db``'s connection or of one of its
    readers: on a ``role=`` connection read through the role's masking and row access
    policies (:mod:`._policies`); refused if it would act on a table's per-statement view
    (:func:`._sql.check_passthrough`: ``WITH ... INSERT INTO t``, ``COPY t FROM``...)."""
    if db.role is not None:
        sql = role_query(db, sql)
    if _sql.first_word(sql) not in ("SELECT", "FROM"):  # (WITH ... INSERT INTO t, too)
        _sql.check_passthrough(sql, set(db.catalog.tables))
    return sql


#: (device, inode) of the LOCK files this process's writers hold (a second connection's
#: flock fails as another process's would; its error says which). A forked child holds
#: none of them as its own.
_LOCKS_HERE: set[tuple[int, int]] = set()
os.register_at_fork(after_in_child=_LOCKS_HERE.clear)  # (and _flocks closes the LOCKs)


def _unlock(fd: int, lock: tuple[int, int], pid: int) -> None:
    if pid != os.getpid():  # a forked child closed its copy as it started: that number
        return  # may be another file's now, even another LOCK of the child's own
    _LOCKS_HERE.discard(lock)
    let_go(fd)
    os.close(fd)  # closing the descriptor drops the flock


def _one_statement(statement: Any, method: str) -> bool:
    """Whether ``statement`` holds a statement (False: only blanks or comments); refuse text
    holding more than one (DuckDB would run each, past cryptdisk's checks of the first:
    ``SELECT 1; SET temp_directory = ...``) and anything but text."""
    if not isinstance(statement, str):
        raise TypeError(f"{method} takes the text of a statement (str), not "
                        f"{type(statement).__name__}")
    found = len(_sql.split_statements(statement))
    if found > 1:
        raise DatabaseError(f"{method} runs one statement, and this text holds {found}",
                            hint="run several with .sql(text), each on its own")
    return found == 1


def _undecodable() -> DatabaseError:
    """The error of a statement whose DuckDB error message is not valid UTF-8 (DuckDB's
    Python module then raises UnicodeDecodeError): it quotes a value that is not text."""
    return DatabaseError("the statement failed, and DuckDB's message about it is not valid "
                         "UTF-8: it quotes a value that is not text, such as bytes cast to "
                         "VARCHAR or UUID", hint="cast bytes to text with decode(b) only when "
                         "they are UTF-8; compare them as BLOB")


def _one_bound(sql: str, method: str) -> str:
    """The one statement ``sql`` holds, for ``method`` with parameters (which bind to one
    statement)."""
    found = _sql.split_statements(sql)
    if len(found) > 1:
        raise DatabaseError(f"{method} with parameters runs one statement, and this text "
                            f"holds {len(found)}", hint="run each with .execute(statement, "
                            "parameters)")
    return sql


def _bound(statement: Any, parameters: Any, method: str) -> str:
    """``statement`` (one statement) with ``parameters`` bound (see :mod:`._params`)."""
    if not _one_statement(statement, method):
        return statement  # type: ignore[no-any-return]
    return bind(statement, parameters)


def _parameter_sets(seq_of_parameters: Any) -> list[Any]:
    """``executemany``'s parameter sets, each a sequence or a mapping."""
    if isinstance(seq_of_parameters, str | bytes | bytearray | Mapping) \
            or not isinstance(seq_of_parameters, Iterable):
        raise DatabaseError("executemany takes a list (or another iterable) of parameter "
                            f"sets, not {type(seq_of_parameters).__name__}",
                            hint="db.executemany(sql, [(1, 'a'), (2, 'b')])")
    sets = list(seq_of_parameters)
    for parameters in sets:
        if not isinstance(parameters, Mapping):
            check_parameters(parameters)
    return sets


_VALUES_WORD = re.compile(r"(?is)VALUES\b\s*")


#: The Arrow table of executemany's parameter sets, as its INSERT's query reads it
_PARAMETERS = "__cd_parameters"
_DEFAULT = re.compile(r"(?i)(?<![\w$])DEFAULT(?![\w$])")


def _values_insert(statement: str) -> tuple[str, str, bool] | None:
    """``(head, rows, one)`` of ``INSERT INTO t [(cols)] VALUES (...)[, (...)]``: the text
    up to ``VALUES``, the rows after it and whether they are one row (see
    :meth:`Database.executemany`); None for another statement."""
    (text,) = _sql.split_statements(statement)  # (its comments dropped)
    text = text.rstrip(";").strip()
    if _sql.first_word(text) != "INSERT":
        return None
    st = _sql.parse(text)
    if not isinstance(st, _sql.Insert) or _sql.first_word(st.query) != "VALUES":
        return None
    head = text[:len(text) - len(st.query)]
    rows = st.query[_VALUES_WORD.match(st.query).end():]  # type: ignore[union-attr]
    at, count = 0, 0
    while True:  # only parenthesised rows, separated by commas
        if not rows.startswith("(", at):
            return None
        try:
            at = _sql._matching_paren(rows, at) + 1
        except DatabaseError:  # (run once per set: DuckDB says what is wrong)
            return None
        count += 1
        rest = rows[at:].lstrip()
        if not rest:
            break
        if not rest.startswith(","):
            return None
        at = len(rows) - len(rest[1:].lstrip())
    return head, rows, count == 1


def _remove_made(made: list[str]) -> None:
    """Remove what a failed connect made for a new database (see Database.__init__): its
    directory (nothing but this connect wrote there: it held the lock) and its key file
    (no file outside that directory is encrypted under it)."""
    import shutil

    for path in made:
        with contextlib.suppress(OSError):
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)


def _block_change(sql: str) -> bool | None:
    """True for a statement that opens a transaction block (``BEGIN``, ``START
    TRANSACTION``), False for one that ends it (``COMMIT``, ``END``, ``ROLLBACK``,
    ``ABORT``; not ``ROLLBACK TO`` a savepoint), None for any other."""
    words = sql.split(None, 2)
    head = words[0].upper().rstrip(";") if words else ""
    if head in ("BEGIN", "START"):
        return True
    if head in ("COMMIT", "END", "ROLLBACK", "ABORT") and not (
            len(words) > 1 and words[1].upper() == "TO"):
        return False
    return None


_SHOW_TABLES = re.compile(r"(?is)SHOW\s+TABLES")
#: ``SHOW t`` (``t`` or ``main.t``, one of the database's tables or not)
_SHOW_NAME = re.compile(rf"(?is)SHOW\s+(?:main\s*\.\s*)?({_sql._IDENT})\s*")
#: What a reader runs besides queries: statements that read tables as a query does
_READS = frozenset({"DESCRIBE", "SHOW", "SUMMARIZE"})
#: The statement an ``EXPLAIN [ANALYZE] [(options)]`` explains
_EXPLAINED = re.compile(r"(?is)EXPLAIN\s+(?:ANALY[SZ]E\s+)?(?:\([^)]*\)\s*)?(.*)")
_NO_TABLE = re.compile(r"Catalog Error: Table with name (.+?) does not exist!")


def _ascii_lower(name: str) -> str:
    """``name`` with its ASCII letters in lower case, as DuckDB compares names."""
    return name.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _missing_table(exc: duckdb.Error, sql: str, path: str, tables: Any, views: Any = ()
                   ) -> DatabaseError | None:
    """DuckDB's "Table with name x does not exist!" (whose "Did you mean" names DuckDB's
    own catalog tables) said in cryptdisk's words: the database's tables, or its system
    tables for ``system.x``; None for any other error."""
    m = _NO_TABLE.match(str(exc)) if isinstance(exc, duckdb.CatalogException) else None
    if m is None:
        return None
    name = m.group(1)
    if re.search(r"(?i)\bsystem\s*\.\s*\"?" + re.escape(name) + r"\b", sql):
        server = name.lower() in ("users", "roles", "grants")
        return _TableNotFound(
            f"no system table system.{name} (system tables: "
            + ", ".join(f"system.{t}" for t in SYSTEM_TABLES) + ")",
            hint=f"system.{name.lower()} is the server's: users, roles and grants exist in "
            "cryptdisk serve, which answers queries over them" if server else None)
    known = sorted(tables)
    view = next((v for v in views if fold(v) == fold(name)), None)
    if view is not None:  # (in a statement whose queries are not written out: ._views)
        return DatabaseError(
            f"{view!r} is a view: DuckDB reads it only in a query, EXPLAIN, COPY (query) TO, "
            "DESCRIBE, SUMMARIZE, INSERT ... SELECT, CREATE TABLE ... AS, and the WHERE and "
            "SET of DELETE and UPDATE",
            hint=f"read it in a query: SELECT * FROM {view}")
    spelled = next((t for t in [*known, *views] if t.lower() == name.lower()
                    and _ascii_lower(t) != _ascii_lower(name)), None)
    if spelled is not None:  # (DuckDB folds the case of ASCII letters only)
        kind = "table" if spelled in known else "view"
        return _TableNotFound(  # (its start as the one below: the server says no more)
            f"no table {name!r} in {path} (tables: {', '.join(known) or 'none'}): DuckDB "
            f"matches a name's ASCII letters in any case, its other letters as written; the "
            f"{kind} is {spelled!r}", hint=f"write the name as the {kind} has it: "
            f"{quote(spelled)}")
    if name.lower() in (t.lower() for t in known):  # (named in a string: pragma_table_info)
        return DatabaseError(
            f"table {name!r} is a cryptdisk table: DuckDB reads it only where a statement "
            "names it as a table (FROM t), not in DuckDB's catalog or by a name in a string",
            hint=f"DESCRIBE {name}; SELECT * FROM system.tables lists the tables")
    close = difflib.get_close_matches(name.lower(), [t.lower() for t in known], n=1)
    hint = None
    if close:
        hint = "did you mean " + next(t for t in known if t.lower() == close[0]) + "?"
    elif not known:
        hint = "CREATE TABLE it first (SELECT name FROM system.tables lists the tables)"
    # DuckDB's own connection reads a Python variable (a DataFrame) by its name; the
    # database's SQL reads its tables only
    python = (f"; a Python variable is not read by its name: db.insert(table, {name}) "
              "inserts a DataFrame's or Arrow table's rows") if name.isidentifier() else ""
    return _TableNotFound(f"no table {name!r} in {path} (tables: "
                          f"{', '.join(known) or 'none'}){python}", hint=hint)


def _statement_words(st: _sql.Statement) -> str:
    """How the user wrote cryptdisk's statement ``st`` (for its errors): ``INSERT INTO t``."""
    if isinstance(st, _sql.SystemCommand):
        return "SYSTEM ROTATE KEYS" if st.command == "rotate" else "SYSTEM REENCRYPT"
    if isinstance(st, _sql.Insert):
        return f"INSERT INTO {st.table}"
    if isinstance(st, _sql.CopyFrom):
        return f"COPY {st.table} FROM"
    if isinstance(st, _sql.Delete):
        return f"DELETE FROM {st.table}"
    if isinstance(st, _sql.Update):
        return f"UPDATE {st.table}"
    words = {_sql.CreateTable: "CREATE TABLE", _sql.DropTable: "DROP TABLE",
             _sql.Truncate: "TRUNCATE", _sql.AlterSetting: "ALTER TABLE",
             _sql.AlterTable: "ALTER TABLE", _sql.Optimize: "OPTIMIZE TABLE"}[type(st)]
    tail = " MODIFY SETTING" if isinstance(st, _sql.AlterSetting) else ""
    return f"{words} {st.name}{tail}"  # type: ignore[union-attr]


#: The DuckDB settings a statement's reads depend on (see Database._setting).
_SETTINGS = ("default_order", "default_null_order", "default_collation",
             "preserve_insertion_order")
#: ``SET [SESSION|LOCAL|GLOBAL] name`` / ``RESET [...] name``: its scope, the name
_SET_NAME = re.compile(r"\s*(?:SET|RESET)\s+(?:(GLOBAL)\s+|(?:SESSION|LOCAL)\s+)?"
                       r"(\"[^\"]+\"|[A-Za-z_][A-Za-z0-9_]*)", re.I)
#: DuckDB settings that change neither how a result's columns are named nor which table
#: a name reads, nor what count(*), count(DISTINCT) and min/max of a column answer: a SET
#: of one leaves the fast paths that rely on those on (see Database._names_certain;
#: count(DISTINCT) reads the collation, threads and memory limit it runs with itself).
_HARMLESS_SETTINGS = frozenset({
    "integer_division", "timezone", "calendar", "threads", "worker_threads",
    "memory_limit", "max_memory", "default_order", "default_null_order",
    "preserve_insertion_order", "enable_progress_bar", "default_collation"})


def _harmless_set(statement: str) -> bool:
    """Whether ``statement`` is a SET or RESET of one of :data:`_HARMLESS_SETTINGS`, or of
    a variable (``SET VARIABLE x = ...``): a value ``getvariable('x')`` reads, kept for
    each connection, which names no column and no table and is read by DuckDB in the
    queries that use it, never by a fast path."""
    m = _SET_NAME.match(statement)
    if m is None:
        return False
    if m[2].upper() == "VARIABLE":  # (unquoted: the statement, not a setting's name)
        return not m[1]
    return m[2].strip('"').lower() in _HARMLESS_SETTINGS


#: Parse trees kept (see Database._parse_tree).
_TREES = 64
#: The first words of statements that only read (see Database._session_changed).
_QUERIES = frozenset({"SELECT", "WITH", "FROM"})
#: The first words of the statements of prepared queries (see ._prepared).
_PREPARED_WORDS = frozenset({"PREPARE", "EXECUTE", "DEALLOCATE"})


def _prepares_query(st: Prepare, tables: set[str]) -> bool:
    """Whether ``st`` prepares one query (a ``WITH`` that inserts or deletes is not one)."""
    if not is_query(st.query) or len(_sql.split_statements(st.query)) != 1:
        return False
    try:
        _sql.check_passthrough(st.query, tables)
    except DatabaseError:
        return False
    return True


def _refuse_prepare(st: Prepare, tables: set[str]) -> None:
    """Refuse a ``PREPARE`` of a statement other than a query that names a cryptdisk table
    (DuckDB's view of it would be its target, and cryptdisk runs its ``INSERT`` itself)."""
    used = referenced_tables(st.query, tables)
    if used:
        raise DatabaseError(
            f"PREPARE {st.written}: only a query (SELECT, WITH, FROM) can be prepared over "
            f"cryptdisk table(s) {', '.join(sorted(used))}",
            hint="run INSERT INTO t VALUES (...) with its values; parameters of a query: "
            "PREPARE p AS SELECT ... WHERE k = $1, then EXECUTE p(1)")


def _after_comments(sql: str) -> str:
    """``sql`` from its first word on: leading blanks and comments (``-- ...`` to the end
    of the line, ``/* ... */``) skipped; from a comment that holds another ``/*`` (one
    that may nest) on, as is."""
    s = sql.lstrip()
    while True:
        if s.startswith("--"):
            end = s.find("\n")
            if end < 0:
                return ""
            s = s[end + 1:].lstrip()
        elif s.startswith("/*"):
            end = s.find("*/", 2)
            if end < 0 or "/*" in s[2:end]:
                return s
            s = s[end + 2:].lstrip()
        else:
            return s


#: An identifier after a dot (``schema.t``, ``x.col``, ``"s"."t"``).
_LINE = re.compile(r"LINE (\d+): ")


def _copy_to_words(sql: str) -> tuple[str, str | None] | None:
    """For a ``COPY ... TO 'file'`` statement, how its errors name it (``COPY t TO
    'file'``, ``COPY (query) TO 'file'``) and a hint when the file's directory is
    missing; None for any other statement."""
    found = _sql.copy_to_target(sql)
    if found is None:
        return None
    source, target = found
    if target is None:
        return None
    directory = os.path.dirname(target)
    hint = (f"the directory {directory} does not exist: create it first"
            if directory and "://" not in target and not os.path.isdir(directory) else None)
    return f"COPY {source} TO '{target}'", hint


def _unprefixed(message: str) -> str:
    """DuckDB's ``message`` about a statement run behind the one-line ``WITH`` of
    :meth:`Database._bind_exposed`, its ``LINE n:`` numbers (and the caret under each)
    as in the statement the user wrote."""
    lines = message.split("\n")
    for i, line in enumerate(lines):
        m = _LINE.match(line)
        if m is None or int(m.group(1)) < 2:
            continue
        label = f"LINE {int(m.group(1)) - 1}: "
        lines[i] = label + line[m.end():]
        cut = m.end() - len(label)
        if cut and i + 1 < len(lines) and lines[i + 1].startswith(" " * cut):
            lines[i + 1] = lines[i + 1][cut:]
    return "\n".join(lines)


_AFTER_DOT = re.compile(r'\.\s*("(?:[^"]|"")*"|[^\W\d]\w*)')


def _qualified_names(sql: str) -> set[str]:
    """The identifiers that follow a dot in ``sql`` (lower case, unquoted): a superset of
    the table names written with a schema (it holds qualified column names too)."""
    if "." not in sql:
        return set()
    out = set()
    for m in _AFTER_DOT.finditer(sql):
        name = m.group(1)
        if name.startswith('"'):
            name = name[1:-1].replace('""', '"')
        out.add(name.lower())
    return out


def _empty_table(schema: pa.Schema) -> pa.Table:
    """An empty table of ``schema`` (``Schema.empty_table`` imports pandas: most of a second
    in a fresh process)."""
    return pa.Table.from_batches([], schema=schema)


def _parquet_stores(field: pa.Field) -> bool:
    """A Parquet file can hold a column of ``field``'s type (not Arrow's intervals, alone
    or inside a list, struct or map): an empty one is written to memory to find out."""
    import io

    import pyarrow.parquet as pq

    try:
        pq.write_table(_empty_table(pa.schema([field])), io.BytesIO())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return False
    return True


def _parser_connection(con: Any) -> Any:
    """The cursor of ``con`` that parses for cryptdisk (:func:`._columns.parser_cursor`:
    a tree depends on the text alone, so kept trees and policy rewrites never go stale
    when ``SET`` runs on ``con``), after DuckDB's first JSON function ran on it.

    The first JSON function a DuckDB instance runs costs about 5 ms of CPU (later ones
    0.5 ms), and every statement that reads a table starts with one
    (``json_serialize_sql``): paid in connect, the first query does not pay it. On the
    calling thread: connect starts no thread (a thread left running would make connect's
    time depend on the machine's load, and a fork while it runs would free its cursor in
    the child). That first JSON function is the tree of :func:`._simpletree.probe_text`,
    which decides (once a process) whether simple statements' trees are written out by
    :mod:`._simpletree`, so that a process's first simple statement does not pay for the
    check (about 1.2 ms)."""
    parser = parser_cursor(con)
    text = None
    with contextlib.suppress(duckdb.Error):
        row = parser.execute("SELECT json_serialize_sql(?)", [probe_text()]).fetchone()
        text = row[0] if row else None
    agrees(text)
    return parser


def _wipe_unwrap_caches(config: Any) -> None:
    """Zero the data keys that provider-held keys cached for this database's files."""
    keys = getattr(config, "cryptdisk_keys", None)
    for key in keys() if callable(keys) else ():
        if isinstance(key, ProviderKey):
            key.cache.clear()


def _close_config_keys(config: Any) -> None:
    """Close the keys of a config the database loaded itself: a provider-held key's PKCS#11
    session or KMIP connection (and its unwrap cache) is let go now, not when collected."""
    keys = getattr(config, "cryptdisk_keys", None)
    for key in keys() if callable(keys) else ():
        close = getattr(key, "close", None)
        if close is not None:
            with contextlib.suppress(CryptdiskError):
                close()


def connect(path: str | os.PathLike[str], config: Any = None, **options: Any) -> Database:
    """Open (or create) the embedded database in directory ``path``.

    A new database is created only at a path that does not exist (in an
    existing directory) or in an empty directory; a file or a non-empty
    directory that is not a database raises :class:`~cryptdisk.errors.DatabaseError`.

    ``config`` is ``None`` (encrypt everything: a key is generated on first use
    into ``PATH.key`` beside the directory, mode 0600, and a warning says where;
    **losing that file loses the data**), a cryptdisk TOML config path, or a
    config object with ``keyring``, ``disks`` and ``policies``.

    Options: ``cache_bytes`` (bound of the decrypted cache, default 768 MiB),
    ``read_only`` (no write lock; sees other processes' commits),
    ``memory_limit`` (DuckDB's, e.g. ``"4GB"``), ``threads``, ``insert_block_bytes``
    (an insert sorts and writes its rows in blocks of about this much, default 32 MiB;
    its memory is a few blocks, see docs/database.md), ``pin`` (a file
    outside the directory that records the catalog's version after every
    commit, so a rollback of the whole directory is refused; ``True`` means
    ``PATH.pin`` beside ``PATH.key``; created by the first writer that uses it),
    ``role`` (a role name: the queries read tables through the masking and row
    access policies of ``cryptdisk serve`` for that role, kept in ``policies``,
    default ``PATH.policies``; their bodies call ``cryptdisk.fields``' functions,
    so import it first; the caller still holds the keys, so this applies policies,
    it does not confine the caller), ``storage_options`` (for a database at a URL:
    fsspec options such as ``endpoint_url``, never credentials).

    ``path`` may be an fsspec URL (``s3://bucket/db``): such a database opens
    ``read_only=True`` with a config (see :mod:`._remote` and docs/database-object-store.md);
    :func:`cryptdisk.db.publish` puts a database there.
    A second process opening the same database for writing gets
    :class:`~cryptdisk.errors.DatabaseLockedError`.
    """
    return Database(path, config, **options)


def _probe_values(typ: pa.DataType) -> pa.Array:
    """NULL and, where Arrow casts 0 or ``""`` to ``typ``, a value of ``typ``."""
    for seed in (pa.array([None, 0], pa.int32()), pa.array([None, 0], pa.int64()),
                 pa.array([None, ""]), pa.array([None, decimal.Decimal(0)])):
        try:
            return seed.cast(typ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return pa.nulls(1, typ)


def _runs(groups: list[int], whole: set[int]) -> list[tuple[list[int], bool]]:
    """``groups`` cut into runs of consecutive entries all in ``whole`` or all not:
    ``[(row groups, in whole), ...]`` in order."""
    out: list[tuple[list[int], bool]] = []
    for g in groups:
        w = g in whole
        if out and out[-1][1] == w and (not w or out[-1][0][-1] + 1 == g):
            out[-1][0].append(g)
        else:
            out.append(([g], w))
    return out


def _read_run(scan: TableScan, op: Any, groups: list[int]) -> pa.Table:
    """Row groups ``groups`` (consecutive) of open part ``op``, the scan's columns, all
    rows: with one decryption pass and one Parquet reader when nothing of them is cached,
    else a row group at a time through the cache."""
    if scan._cache is None or all(scan.uncached(op, g) for g in groups):
        batches = scan.read_groups(op, groups)
    else:
        batches = [scan.read_group(op, g) for g in groups]
    return pa.Table.from_batches(batches, schema=scan.schema)
