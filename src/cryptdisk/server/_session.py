"""One client connection: startup, TLS, login, then simple and extended query."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ipaddress
import logging
import operator
import queue
import re
import secrets
import ssl
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .. import __version__
from ..errors import LoginError, ProtocolError, ServerError
from . import (
    _infoschema,
    _paramtypes,
    _pgcatalog,
    _pgsession,
    _pgtables,
    _sqltext,
    _systables,
    _types,
)
from . import _protocol as P
from ._conn import Connection
from ._engines import (
    TRANSACTION_WORDS,
    EngineSession,
    Result,
    StatementError,
    read_only_error,
    statement_error,
)

if TYPE_CHECKING:
    from ._server import Server

log = logging.getLogger("cryptdisk.server")

__all__ = ["Session"]

T = TypeVar("T")
_LENGTH = struct.Struct("!i")


def _zoned(data: bytes | None) -> bool:
    return data is not None and len(data) < 48 and _types.zoned(
        data.decode("ascii", "replace"))


@dataclass
class _Statement:
    sql: str
    param_types: tuple[int, ...]
    nparams: int
    columns: list[tuple[str, int]] | None = None
    described: bool = False
    type_names: tuple[str, ...] = ()  # SQL PREPARE's declared parameter types
    typed: bool = False  # its untyped parameters have been given their context's types
    #: a Describe told the client its parameters' types (TEXT for the untyped ones)
    told: bool = False


@dataclass
class _Portal:
    statement: _Statement
    params: list[Any]
    result_formats: tuple[int, ...]
    result: Result | None = None
    sent: int = 0
    described_columns: list[tuple[str, int]] | None = field(default=None)
    tables: set[str] = field(default_factory=set)  # a cursor's: what its FETCHes read
    #: its access-log line, held until its rows are sent (binary results can fail to encode)
    log_entry: dict[str, Any] | None = None
    #: the rows an Execute streamed before a FETCH or MOVE named it (they are not held)
    streamed: int = 0
    #: a DECLAREd cursor that moves forward only (:meth:`Session._fetch_forward`)
    forward_only: bool = False


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _quote_name(name: str) -> str:
    return ".".join(_quote(p) for p in name.split("."))


_READS = {"SELECT", "VALUES", "EXPLAIN", "TABLE", "SHOW"}
_CURSOR_QUERIES = {"SELECT", "VALUES", "WITH", "TABLE", "FROM"}
#: statements tried with :meth:`EngineSession.run_quick` (they only read)
_QUICK = {"SELECT", "VALUES"}
#: statements whose rows the engine may stream (:meth:`EngineSession.run_stream`)
_STREAMED = frozenset({"SELECT", "WITH", "FROM", "TABLE", "VALUES"})
#: writes tried with :meth:`EngineSession.run_write_quick` (in a transaction holding the lock)
_QUICK_WRITES = {"UPDATE", "INSERT", "DELETE"}
#: statements whose string literals may be bytea by their context (``INSERT INTO t
#: VALUES ('\\x0102')``): :meth:`._engines.EngineSession.bytea_context`
_BYTEA_CONTEXTS = frozenset({"INSERT", "UPDATE", "DELETE", "SELECT", "WITH"})
#: statements whose result columns are named as PostgreSQL names them (:func:`_parameter_names`)
_NAMED = frozenset({"SELECT", "WITH"})
#: statements whose integer literals may run as parameters (:func:`._sqltext.lift_literals`)
LIFTABLE = {"SELECT", "UPDATE", "DELETE", "INSERT"}
#: the statements a failed transaction block still runs (25P02 for any other)
_BLOCK_ENDS = ("ROLLBACK", "ABORT", "COMMIT", "END")
#: the statements a READ ONLY transaction runs (any other fails with 25006, as a write)
_READ_ONLY_RUNS = frozenset({
    "SELECT", "VALUES", "TABLE", "WITH", "FROM", "SHOW", "SET", "RESET", "EXPLAIN",
    "DESCRIBE", "SUMMARIZE", "DECLARE", "FETCH", "MOVE", "CLOSE", "PREPARE", "EXECUTE",
    "DEALLOCATE", "LISTEN", "UNLISTEN", "NOTIFY", "DISCARD", *TRANSACTION_WORDS})
#: a session's settings a rollback restores: application_name, the others SET (by name),
#: statement_timeout, default_transaction_read_only
_Settings = tuple[str, dict[str, str], float, bool]
#: COMMIT / ROLLBACK AND CHAIN (not AND NO CHAIN)
_AND_CHAIN = re.compile(r"\bAND\s+CHAIN\b", re.I)
#: BEGIN / START TRANSACTION's access mode
_ACCESS_MODE = re.compile(r"\bREAD\s+(ONLY|WRITE)\b", re.I)


def _begin_read_only(sql: str) -> bool | None:
    """BEGIN's READ ONLY (True) or READ WRITE (False); None: neither."""
    m = _ACCESS_MODE.search(_sqltext.strip_strings(sql))
    return None if m is None else m[1].upper() == "ONLY"


def _copy_out(sql: str) -> bool:
    """``COPY ... TO``: a COPY that reads."""
    from ._copy import parse_copy

    try:
        return parse_copy(sql).direction == "out"
    except Exception:
        return False


#: ``ALTER TABLE t RENAME TO u`` (not RENAME COLUMN)
_RENAME_TO = re.compile(r"\bRENAME\s+TO\b", re.I)
IDENTITY_WORDS = re.compile(r"current_user|current_role|session_user", re.I)


def _common_name(cert: Any) -> str | None:
    """The subject CN of a client certificate the TLS handshake verified (None: none sent)."""
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def _close_quietly(engine: EngineSession) -> None:
    try:
        engine.close()
    except Exception:
        log.exception("closing an engine session")


def _tag_count(tag: str) -> int | None:
    last = tag.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else None


def _rename(columns: list[tuple[str, int]],
            renames: dict[str, list[str]]) -> list[tuple[str, int]]:
    """Columns named by a literal :meth:`Session._identity` wrote in get the word back."""
    left = {k: list(v) for k, v in renames.items()}
    out = []
    for name, oid in columns:
        words = left.get(name)
        out.append((words.pop(0) if words else name, oid))
    return out


def _parameter_names(sql: str, columns: list[tuple[str, int]],
                     renames: dict[str, list[str]] | None = None) -> list[tuple[str, int]]:
    """``columns`` of ``sql`` with an expression of its select list without an alias named
    as PostgreSQL names it (:func:`._paramtypes.parameter_columns`: ``$1``, ``1`` and
    ``a + 1`` are ``?column?``, ``1::int`` is ``int4``, ``upper(x)`` is ``upper``), not
    after the text the engine read; a column named by a literal ``renames`` maps back
    (:meth:`Session._identity`) is left for :func:`_rename`."""
    named = _paramtypes.parameter_columns(sql)
    if not named:
        return columns
    out = list(columns)
    for place, name in named:
        if place < len(out) and not (renames and out[place][0] in renames):
            out[place] = (name, out[place][1])
    return out


@functools.lru_cache(maxsize=256)
def _row_description(columns: tuple[tuple[str, int], ...], fmts: tuple[int, ...]) -> bytes:
    """A result's RowDescription, built once per shape of result."""
    return P.row_description([(n, o, f) for (n, o), f in zip(columns, fmts, strict=True)])


def _encoding_error(exc: ProtocolError) -> StatementError:
    """The statement's error for a result value that its type cannot be sent as (a
    result held whole, not streamed): 2202E for a list of lists that is no array, else
    22000; the connection goes on."""
    return StatementError(str(exc), "2202E" if str(exc) == _types.RAGGED else "22000")


#: DuckDB's error for a SET TimeZone to a zone it does not know
_UNKNOWN_ZONE = re.compile(r"Unknown TimeZone '(.*)'!")


def _copy_columns(table: str, columns: list[str],
                  types: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The (name, OID) of each column a COPY's column list names, in its order, from its
    table's ``types``; a column the table lacks fails with 42703 and one named twice with
    42701, the first in the list first, as PostgreSQL checks them."""
    by_name = {n.lower(): (n, o) for n, o in types}
    seen: set[str] = set()
    for c in columns:
        if c.lower() not in by_name:
            raise StatementError(f'column "{c}" of relation "{table}" does not exist', "42703")
        if c.lower() in seen:
            raise StatementError(f'column "{c}" specified more than once', "42701")
        seen.add(c.lower())
    return [by_name[c.lower()] for c in columns]


def _copy_response(kind: bytes, columns: int, binary: bool) -> bytes:
    """CopyInResponse (G) or CopyOutResponse (H): every column in text, or in binary."""
    fmt = 1 if binary else 0
    return P.message(kind, struct.pack("!bh", fmt, columns) + struct.pack("!h", fmt) * columns)


_STDIO = re.compile(r"\b(STDIN|STDOUT)\b", re.I)


def _is_copy(sql: str) -> bool:
    """COPY ... FROM STDIN / TO STDOUT (the server runs those itself)."""
    return _STDIO.search(sql) is not None and \
        (_sqltext.first_words(sql, 1) or [""])[0] == "COPY"


def _failure_sqlstate(exc: BaseException) -> str:
    """The SQLSTATE an access-log line gives a statement that ended with ``exc``."""
    if isinstance(exc, StatementError):
        return exc.sqlstate
    if isinstance(exc, ProtocolError):
        return "08P01"
    if isinstance(exc, (asyncio.IncompleteReadError, ConnectionError)):
        return "08006"  # the client went away
    if isinstance(exc, asyncio.CancelledError):
        return "57P01"  # the session was ended
    return "XX000"


def _begin_and_run(engine: EngineSession, sql: str, params: list[Any]) -> Result:
    engine.run("BEGIN IMMEDIATE", [])
    return engine.run(sql, params)


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if not future.cancelled():
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


#: after the statement timeout has passed, the engine is interrupted again this often
#: (seconds) until the statement ends: an interrupt that lands between two of the
#: statement's steps (a wait ended, the next not yet begun) would otherwise be lost
_REINTERRUPT = 0.05


class _StatementTimer:
    """The statement timeout of one statement (``seconds``; None: no timeout), armed while
    it lives: the engine session is interrupted when it passes (a statement waiting for
    its turn or a lock stops waiting, one running stops), and every :data:`_REINTERRUPT`
    seconds after that until :meth:`cancel`."""

    def __init__(self, engine: EngineSession, seconds: float | None) -> None:
        self.fired = False
        self.deadline: float | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._engine = engine
        if seconds:
            self.deadline = time.monotonic() + seconds
            self._loop = asyncio.get_running_loop()
            self._handle = self._loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        self.fired = True
        self._handle = self._loop.call_later(_REINTERRUPT, self._expire)
        self._engine.interrupt()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def error(self, exc: BaseException) -> BaseException:
        """``exc``, a cancel (57014) the timeout caused saying so, as PostgreSQL does."""
        if isinstance(exc, StatementError) and exc.sqlstate == "57014" and (
                self.fired or (self.deadline is not None
                               and time.monotonic() >= self.deadline)):
            return StatementError("canceling statement due to statement timeout", "57014")
        return exc


class _ClientWatch:
    """While a session's engine call runs: when its client is found gone (the connection
    read the end of its stream, or failed), the engine session is interrupted, and every
    :data:`_REINTERRUPT` seconds after that until :meth:`cancel`, so that the statement
    of a client that went away stops (57014) and its session ends, as PostgreSQL stops a
    query whose client it finds gone."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._handle: asyncio.TimerHandle | None = None
        self._done = False

    def lost(self) -> None:
        if self._done:
            return
        engine = self._session.engine
        if engine is None:
            return
        if self._handle is None:
            log.info("the client %s went away during a statement: cancelling it",
                     self._session.peer_host)
        self._handle = asyncio.get_running_loop().call_later(_REINTERRUPT, self.lost)
        engine.interrupt()

    def cancel(self) -> None:
        self._done = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class _SessionThread:
    """One session's thread: runs its blocking calls one after the other, in order.

    A queue and one ``call_soon_threadsafe`` per call: the hop from the event loop and back
    costs less than ``run_in_executor`` on a one-thread pool."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...],
                                           asyncio.Future[Any] | None] | None] = \
            queue.SimpleQueue()
        threading.Thread(target=self._work, name="cryptdisk-session").start()

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, args, future = job
            try:
                value, ok = fn(*args), True
            except BaseException as exc:  # handed to the caller, as run_in_executor does
                value, ok = exc, False
            del fn, args
            if future is not None:
                try:
                    self.loop.call_soon_threadsafe(_settle, future, ok, value)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    pass
            elif not ok:
                log.error("a session's background call failed", exc_info=value)

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        future: asyncio.Future[T] = self.loop.create_future()
        self.jobs.put((fn, args, future))
        return future

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` after the calls queued so far; nobody waits for it."""
        self.jobs.put((fn, args, None))

    def shutdown(self) -> None:
        """End the thread once the calls queued so far have run."""
        self.jobs.put(None)


#: COPY FROM STDIN: how often (seconds) the insert waiting for the client's data looks
#: for a cancel or the timeout
_COPY_WAIT = 0.05


class _CopyStopped(Exception):
    """A cancel or the statement timeout ended the wait for a COPY's data."""


#: COPY FROM STDIN: the client's data read at a time (bytes), and rows inserted at a time
_COPY_CHUNK = 1 << 20
_COPY_BATCH = 1 << 14


@dataclass
class _CopyState:
    done: bool = False  # the client's CopyDone or CopyFail was read
    error: BaseException | None = None  # reading the client's data failed
    stopped: bool = False  # the statement ended: the engine's thread reads no more
    reading: concurrent.futures.Future[bytes | None] | None = None  # its read, if any
    cancelled: bool = False  # a CancelRequest came (while its data was read too)


class _Closing(Exception):
    """End the session after sending what has been queued."""


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


class Session:
    def __init__(self, server: Server, conn: Connection) -> None:
        self.server = server
        self.conn = conn
        peer = conn.get_extra_info("peername")
        self.peer_host: str | None = peer[0] if isinstance(peer, tuple) else None
        self.tls = False
        self.channel_binding: bytes | None = None  # tls-server-end-point, for SCRAM-PLUS
        #: (SQLSTATE, message) to refuse the client with once its startup message is read
        #: (too many connections, shutting down): after TLS, as PostgreSQL does, so the
        #: client shows the message, and a CancelRequest is still taken
        self.refuse: tuple[str, str] | None = None
        self.refuse_hint: str | None = None
        #: seconds from connect to logged in (or refused)
        self.login_timeout = server.login_timeout
        self.client_cert_name: str | None = None  # CN of a verified client certificate
        self.user = ""
        self.database = self.application_name = ""
        #: the session's values of the settings a client may SET to any value and SHOW
        #: (``extra_float_digits``, ``client_min_messages``; :mod:`._pgsession`)
        self.settings: dict[str, str] = {}
        #: the session's TimeZone (on the analytical engine DuckDB's, which SET changes)
        self.time_zone = "UTC"
        #: (application_name, settings, session_timeout) before the transaction's first
        #: SET (:meth:`keep_settings`)
        self.tx_settings: _Settings | None = None
        #: the settings before the transaction's first SET LOCAL, and the names it set
        self.local_before: _Settings | None = None
        self.local_names: set[str] = set()
        #: the simple query running holds several statements
        self.several = False
        #: the session's statement_timeout (seconds; 0: the server's): SET, or at startup
        self.session_timeout = 0.0
        #: the TimeZone the startup packet gave (analytical engine): RESET goes back to it
        self.startup_zone: str | None = None
        #: (application_name, settings, session_timeout) as the startup packet set them
        self.startup_settings: tuple[str, dict[str, str], float] = ("", {}, 0.0)
        #: what this session may do and who it acts as (None: a server without users)
        self.privileges: Any = None
        self.engine: EngineSession | None = None
        self.statements: dict[str, _Statement] = {}
        self.portals: dict[str, _Portal] = {}
        self.cursors: dict[str, bool] = {}  # DECLAREd cursor names (portals too): WITH HOLD
        self.failed = False          # inside a transaction that has had an error
        self.pending_begin = False   # BEGIN seen; SQLite's BEGIN waits for the 1st statement
        #: SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY (default_transaction_read_only)
        self.read_only_default = False
        #: the transaction block's BEGIN / SET TRANSACTION READ ONLY or READ WRITE (None: the
        #: session's default)
        self.block_read_only: bool | None = None
        self.skip_to_sync = False    # extended query: an error discards until Sync
        #: extended query: the statements until the next Sync run as one implicit transaction
        self.pipeline_tx = False
        #: simple query of several statements (SQLite): they run in PostgreSQL's implicit
        #: transaction block, from each statement run outside a block on (a COMMIT or
        #: ROLLBACK among them ends it, a BEGIN makes it an explicit one)
        self.query_tx = False
        #: in a transaction (SQLite): the authenticator whose store holds its changes to
        #: users, roles and grants until COMMIT (None: none made, or SET ROLE, yet)
        self.user_tx: Any = None
        self.tx_role: str | None = None  # the role the transaction started as
        #: the transaction's savepoints: (name, changes to users made before it, role,
        #: the settings then: :meth:`_settings_now`)
        self.savepoints: list[tuple[str, int, str | None, _Settings]] = []
        self.busy = False
        self.pid = server.new_pid()
        self.cancel_key = secrets.randbits(31)
        self.out: list[bytes] = []
        self.out_size = 0  # bytes in self.out
        self.task = asyncio.current_task()
        self.executor: _SessionThread | None = None

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking engine call on this session's own thread: a session waiting for a
        lock never holds a thread another session needs to release that lock."""
        if self.executor is None:
            self.executor = _SessionThread(asyncio.get_running_loop())
        conn = self.conn
        if conn.on_lost is not None or conn.lost:
            return await self.executor.call(fn, *args)
        watch = _ClientWatch(self)
        conn.on_lost = watch.lost
        try:
            return await self.executor.call(fn, *args)
        finally:
            conn.on_lost = None
            watch.cancel()

    # -- I/O -------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.out.append(data)
        self.out_size += len(data)

    def warn(self, text: str, code: str) -> None:
        """A WARNING for the client (PostgreSQL's: ``code``), unless its
        client_min_messages is ``error``."""
        if self.settings.get("client_min_messages") != "error":
            self.send(P.notice_response(text, "WARNING", code))

    async def flush(self) -> None:
        if self.out:
            self.conn.write(b"".join(self.out))
            self.out.clear()
            self.out_size = 0
        if self.conn.backed_up:
            await self.conn.drain()

    async def _read_startup(self) -> P.StartupMessage | P.SSLRequest | P.CancelRequest:
        head = await self.conn.readexactly(4)
        (length,) = struct.unpack("!i", head)
        if length < 8 or length > P.MAX_STARTUP_LENGTH:
            raise ProtocolError(f"invalid startup packet length {length}")
        return P.parse_startup(await self.conn.readexactly(length - 4))

    async def _read_raw(self) -> tuple[bytes, bytes]:
        buf = self.conn.buffer
        if len(buf) < 5:  # wait for the client (its message comes whole, mostly)
            await self.conn.fill(5)
        if len(buf) >= 5:  # the common case: the whole message is buffered already
            (length,) = _LENGTH.unpack_from(buf, 1)
            if 4 <= length <= self.server.max_message_size + 4 and len(buf) > length:
                data = self.conn.take(length + 1)
                return data[:1], data[5:]
        head = await self.conn.readexactly(5)
        kind, length = head[:1], struct.unpack("!i", head[1:])[0]
        if length < 4:
            raise ProtocolError(f"invalid message length {length}")
        if length - 4 > self.server.max_message_size:
            raise ProtocolError(f"message of {length - 4} bytes exceeds the server's "
                                f"max_message_size ({self.server.max_message_size} bytes)")
        return kind, await self.conn.readexactly(length - 4) if length > 4 else b""

    async def _read(self) -> P.Message:
        kind, body = await self._read_raw()
        return P.parse_frontend(kind, body)

    def _fatal(self, code: str, text: str, hint: str | None = None) -> None:
        self.send(P.error_response(code, text, severity="FATAL", hint=hint))

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            try:
                await asyncio.wait_for(self._startup(), self.login_timeout)
            except TimeoutError:
                self._fatal("08006", "login timed out")
                raise _Closing() from None
            self.server.register(self)
            await self._loop()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        except ssl.SSLError as exc:  # a client that does not trust the certificate, ...
            log.info("TLS with %s failed: %s", self.peer_host, exc.reason or exc)
        except ProtocolError as exc:
            log.info("protocol violation from %s: %s", self.peer_host, exc)
            self._fatal("08P01", str(exc))
        except _Closing:
            pass
        except asyncio.CancelledError:
            self._fatal("57P01", "terminating connection due to administrator command")
        finally:
            self.server.unregister(self)
            try:
                await asyncio.wait_for(self.flush(), 5)
            except (Exception, asyncio.CancelledError):  # noqa: S110
                pass
            if self.engine is not None:
                engine, self.engine = self.engine, None
                if self.executor is not None:  # after a statement still running, in its thread
                    self.executor.submit(_close_quietly, engine)
                else:
                    _close_quietly(engine)
            log.debug("closing the session of %s", self.peer_host)
            if self.executor is not None:
                self.executor.shutdown()
            for portal in self.portals.values():  # lines still held: their rows were sent
                if portal.log_entry is not None and self.server.access_log is not None:
                    self.server.access_log.write(**portal.log_entry)
                stream = portal.result.stream if portal.result is not None else None
                if stream is not None and stream.log_entry is not None \
                        and self.server.access_log is not None:  # (closed with the engine)
                    entry, stream.log_entry = stream.log_entry, None
                    entry["duration_ms"] = round(
                        (time.monotonic() - entry["duration_ms"]) * 1000, 3)
                    self.server.access_log.write(**{**entry, "rows": stream.sent})
            self.conn.close()
            try:  # what is still queued, then TLS's close_notify, but never wait long
                await asyncio.wait_for(self.conn.wait_closed(), 2)
            except (Exception, asyncio.CancelledError) as exc:
                log.debug("aborting the connection of %s (%r)", self.peer_host, exc)
                self.conn.abort()

    async def _startup(self) -> None:
        while True:
            msg = await self._read_startup()
            if isinstance(msg, P.SSLRequest):
                ctx = self.server.ssl_context
                # the hash of this context's certificate (SIGHUP may load another meanwhile)
                self.channel_binding = getattr(self.server.authenticator, "channel_binding",
                                               None)
                if msg.gss or ctx is None or self.tls:
                    self.conn.write(b"N")
                    await self.conn.drain()
                    continue
                self.conn.write(b"S")
                await self.conn.drain()
                if self.conn.buffer:
                    # bytes sent before the handshake could be injected in the clear
                    raise ProtocolError("unencrypted data after an SSLRequest")
                await self.conn.start_tls(ctx)
                self.tls = True
                self.client_cert_name = _common_name(self.conn.get_extra_info("peercert"))
                continue
            if isinstance(msg, P.CancelRequest):
                self.server.cancel(msg.process_id, msg.secret_key)
                raise _Closing()
            break
        if self.refuse is not None:
            self._fatal(*self.refuse, hint=self.refuse_hint)
            raise _Closing()
        if not self.tls and not (self.server.plaintext_loopback and is_loopback(self.peer_host)):
            self._fatal("28000", "this server accepts TLS connections only",
                        hint="connect with sslmode=require or stricter")
            raise _Closing()
        self.user = msg.parameters.get("user", "")
        #: the database the client named (one server serves one: only current_database())
        self.database = msg.parameters.get("database") or self.user
        # application_name, statement_timeout (node-postgres's), extra_float_digits (JDBC's)
        # and client_min_messages as startup parameters or in options (libpq's and JDBC's
        # options=-c statement_timeout=...): each value checked, a startup parameter
        # counting after options' -c, as PostgreSQL takes them
        names = ("application_name", "statement_timeout", "extra_float_digits",
                 "client_min_messages")
        values = [(m[1].lower(), m[2]) for m in re.finditer(
            r"(?:-c\s*|--)(application_name|statement_timeout|extra_float_digits|"
            r"client_min_messages)=(\S+)", msg.parameters.get("options", ""), re.I)]
        values += [(name, msg.parameters[name]) for name in names
                   if msg.parameters.get(name) is not None]
        given: dict[str, str | None] = {name: None for name in names}
        given.update(values)
        self.application_name = (given["application_name"] or "")[:63]  # (NAMEDATALEN - 1)
        # TimeZone (JDBC sends the JVM's, libpq PGTZ's): the session starts in it, on the
        # analytical engine (SQLite's is UTC only: ignored there, as JDBC always sends one);
        # a startup parameter before options' -c, as PostgreSQL takes them
        zones = [m[1] for m in re.finditer(r"(?:-c\s*|--)timezone=(\S+)",
                                           msg.parameters.get("options", ""), re.I)]
        zones += [v for k, v in msg.parameters.items() if k.lower() == "timezone"]
        self.startup_zone = zones[-1] if zones and not self.server.engine.transactions \
            else None
        parse: dict[str, Callable[[str], Any]] = {
            "statement_timeout": _pgsession.parse_timeout,
            "extra_float_digits": _pgsession.parse_extra_float_digits,
            "client_min_messages": _pgsession.parse_message_level}
        try:
            for name, value in values:  # (one PostgreSQL refuses fails the connection)
                if name in parse:
                    parse[name](value)
            timeout, digits = given["statement_timeout"], given["extra_float_digits"]
            if timeout is not None:
                self.session_timeout = _pgsession.parse_timeout(timeout)
            if digits is not None:
                self.settings["extra_float_digits"] = str(
                    _pgsession.parse_extra_float_digits(digits))
            if given["client_min_messages"] is not None:
                self.settings["client_min_messages"] = _pgsession.parse_message_level(
                    given["client_min_messages"])
        except StatementError as exc:
            self._fatal(exc.sqlstate, str(exc))
            raise _Closing() from None
        # what RESET, SET ... TO DEFAULT, RESET ALL and DISCARD ALL restore (PostgreSQL's
        # session defaults: the startup packet's values)
        self.startup_settings = (self.application_name, dict(self.settings),
                                 self.session_timeout)
        if not self.user:
            self._fatal("28000", "no user name in the startup message")
            raise _Closing()
        await self._login(msg.parameters)
        try:
            self.engine = await self.call(self.server.engine.open_session)
            if self.startup_zone is not None:
                await self._set_start_zone()
                self.time_zone = await self._engine_zone()
            auth = self.server.authenticator
            if auth is not None:
                self.privileges = auth.privileges(self.user)
                self.engine.set_privileges(self.privileges)
            if self.server.access_log is not None:
                self.engine.record_tables()
        except StatementError as exc:
            self._fatal(exc.sqlstate, str(exc), exc.hint)
            raise _Closing() from None
        except Exception as exc:
            err = statement_error(exc)
            self._fatal(err.sqlstate, str(err), err.hint)
            raise _Closing() from None
        self.send(P.auth_ok())
        params = {
            "server_version": "15.0", "server_encoding": "UTF8", "client_encoding": "UTF8",
            "DateStyle": "ISO, MDY", "integer_datetimes": "on", "IntervalStyle": "postgres",
            "standard_conforming_strings": "on", "TimeZone": self.time_zone,
            "is_superuser": "on" if self.server.is_admin(self.user) else "off",
            "session_authorization": self.user,
            "application_name": self.application_name,
            "cryptdisk_version": __version__,
        }
        for name, value in params.items():
            self.send(P.parameter_status(name, value))
        self.send(P.backend_key_data(self.pid, self.cancel_key))
        self.send(P.READY_FOR_QUERY[self._status()])
        await self.flush()

    async def _login(self, params: dict[str, str]) -> None:
        auth = self.server.authenticator
        if auth is None:
            return
        try:
            await auth.login(self, self.user)
        except LoginError as exc:
            self._fatal("28P01", str(exc))
            raise _Closing() from None

    async def read_password_message(self) -> bytes:
        """The body of the next 'p' message (SASL exchanges); anything else is a violation."""
        await self.flush()
        msg = await self._read()
        if not isinstance(msg, P.Password):
            raise ProtocolError("expected a password message during authentication")
        return msg.data

    def _status(self) -> str:
        if self.failed:
            return "E"
        in_tx = self.pending_begin or (self.engine is not None and self.engine.in_transaction)
        return "T" if in_tx else "I"

    async def _loop(self) -> None:
        while True:
            if self.server.draining:
                self._fatal("57P01", "terminating connection due to administrator command")
                raise _Closing()
            self.busy = False
            try:
                if self.server.idle_timeout is None:
                    msg = await self._read()
                else:
                    msg = await asyncio.wait_for(self._read(), self.server.idle_timeout)
            except TimeoutError:
                self._fatal("57P05", "terminating connection due to idle-session timeout")
                raise _Closing() from None
            self.busy = True
            self.server.refresh()  # users, roles, grants another worker changed
            if isinstance(msg, P.Terminate):
                raise _Closing()
            if isinstance(msg, P.Sync):
                errored, self.skip_to_sync = self.skip_to_sync, False
                await self._drop_portal(self.portals.pop("", None))
                if self.pipeline_tx:
                    await self._end_pipeline(errored)
                self.send(P.READY_FOR_QUERY[self._status()])
                await self.flush()
                continue
            if self.skip_to_sync:
                continue
            if isinstance(msg, P.Flush):
                await self.flush()
                continue
            if isinstance(msg, P.Query):
                await self._simple_query(msg.sql)
                if self.several and self._status() == "I":  # its implicit block's cursors
                    await self._end_transaction_cursors()
                self.several = False
                if self.pipeline_tx:  # a Query ends the implicit transaction it ran in
                    await self._end_pipeline(False)
                self.send(P.READY_FOR_QUERY[self._status()])
                await self.flush()
                continue
            if isinstance(msg, P.Password):
                raise ProtocolError("unexpected password message")
            try:
                await self._extended(msg)
            except StatementError as exc:
                self._error(exc)
                self.skip_to_sync = True
                # sent at once, as PostgreSQL does: a client that sent Flush (not Sync) waits
                # for it (asyncpg's prepare), and the Flush it sent next is skipped
                await self.flush()
            if self.out_size > 1 << 16:
                await self.flush()

    def _pipeline_continues(self, portal: str) -> bool:
        """Whether the client has sent (or may still send) another statement to run before
        its next Sync: what the read buffer holds after the current message is scanned up
        to the Sync. A Bind, a Query, or an Execute or Describe of another portal means yes;
        no Sync in the buffer yet means maybe (so yes)."""
        buf = self.conn.buffer
        pos = 0
        while pos + 5 <= len(buf):
            kind = bytes(buf[pos:pos + 1])
            (length,) = struct.unpack_from("!i", buf, pos + 1)
            if length < 4 or pos + 1 + length > len(buf):
                return True
            body = bytes(buf[pos + 5:pos + 1 + length])
            if kind == b"S":
                return False
            if kind in (b"B", b"Q"):
                return True
            if kind == b"E" and body.split(b"\0", 1)[0] != portal.encode():
                return True
            if kind == b"D" and body[:1] == b"P" and \
                    body[1:].split(b"\0", 1)[0] != portal.encode():
                return True
            pos += 1 + length
        return True

    def _open_pipeline(self, sql: str, portal: str) -> None:
        """Before an Execute (or a portal's Describe) runs ``sql`` outside a transaction:
        when more statements follow before the next Sync, start the implicit transaction
        PostgreSQL runs them in (SQLite); that Sync commits it, an error rolls it back. A
        lone statement before its Sync runs on its own, as it would in it."""
        if self.pipeline_tx or not self.server.engine.transactions or self._status() != "I":
            return
        head = (_sqltext.first_words(sql, 1) or [""])[0]
        if head in TRANSACTION_WORDS or head in ("DECLARE", "FETCH", "MOVE", "CLOSE"):
            return
        if self._pipeline_continues(portal):
            self.pipeline_tx = True
            self.pending_begin = True

    async def _end_pipeline(self, errored: bool) -> None:
        """At Sync (or after a Query): commit the implicit transaction of the statements
        since the last Sync, or roll it back when one of them failed."""
        self.pipeline_tx = False
        if errored or self.failed:
            await self._rollback_implicit()
            return
        await self._commit_implicit()

    async def _commit_implicit(self) -> None:
        """COMMIT the implicit transaction of a query's or a pipeline's statements; when
        that fails (a deferred constraint), everything is rolled back, and the failure gets
        an access-log line of its own (kind COMMIT): the statements' lines say they ran."""
        try:
            await self._end_implicit("COMMIT")
        except StatementError as exc:
            await self._log_failure("COMMIT", exc)
            self._error(exc)
            await self._rollback_implicit()

    def _error(self, exc: StatementError) -> None:
        # (in a block whose engine transaction has not started yet too: BEGIN, then a
        # statement the server answers itself fails)
        if self.pending_begin or (self.engine is not None and self.engine.in_transaction):
            self.failed = True
        self.send(P.error_response(exc.sqlstate, str(exc), hint=exc.hint))

    # -- running statements ------------------------------------------------------------------

    async def _execute(self, sql: str, params: list[Any],
                       lifted: tuple[str, str | None, list[Any]] | None = None) -> Result:
        """Run one statement and write its access-log line. ``lifted``: what
        :meth:`_run_one` would run it as, known from the query's plan: its first word,
        shape and integers, or (first word, None, []) for a transaction statement."""
        if self.server.access_log is None:
            return await self._run_statement(sql, params, lifted, stream=True)
        return await self._logged(sql, functools.partial(self._run_statement, sql, params,
                                                         lifted, stream=True))

    async def _logged(self, sql: str, run: Callable[[], Awaitable[Result]],
                      portal: _Portal | None = None) -> Result:
        """``run()`` (one statement, ``sql``) and its access-log line, whatever the outcome:
        ``rows`` when it ran, ``sqlstate`` when it failed, the client gone or the session
        ended (08006, 08P01, 57P01) included. ``portal`` with binary results: the line of a
        statement that ran is held on it until its rows are sent (:meth:`_write_portal_log`),
        since a value can fail to encode."""
        log_ = self.server.access_log
        if log_ is None:
            return await run()
        start = time.monotonic()
        entry: dict[str, Any] = {"user": self.user, "source": self.peer_host,
                                 "kind": (_sqltext.first_words(sql, 1) or [""])[0]}
        if self.privileges is not None and self.privileges.current_user != self.user:
            entry["role"] = self.privileges.current_user  # acting as it after SET ROLE
        if self.engine is not None:
            self.engine.last_tables = set()
        try:
            result = await run()
        except BaseException as exc:
            entry["sqlstate"] = _failure_sqlstate(exc)
            entry["rows"] = 0
            raise
        else:
            entry["rows"] = len(result.rows) if result.columns is not None else \
                _tag_count(result.tag)
            return result
        finally:
            entry["tables"] = sorted(self.engine.last_tables) if self.engine else []
            entry["duration_ms"] = round((time.monotonic() - start) * 1000, 3)
            stream = getattr(result, "stream", None) if "sqlstate" not in entry else None
            if stream is not None:  # written as it ends (_end_stream), with its count
                entry["duration_ms"] = start
                stream.log_entry = entry
            elif portal is not None and "sqlstate" not in entry and any(portal.result_formats):
                portal.log_entry = entry
            elif entry.get("sqlstate") in ("57P01", "XX000"):  # the loop may be going away
                log_.write(**entry)
            else:
                await asyncio.to_thread(log_.write, **entry)

    async def _write_portal_log(self, portal: _Portal,
                                error: StatementError | None = None) -> None:
        """Write the access-log line held on ``portal``: its rows were sent, it was dropped,
        or sending them failed with ``error``."""
        entry, portal.log_entry = portal.log_entry, None
        if entry is None or self.server.access_log is None:
            return
        if error is not None:
            entry.update(sqlstate=error.sqlstate, rows=0)
        await asyncio.to_thread(self.server.access_log.write, **entry)

    async def _log_failure(self, sql: str, err: StatementError) -> None:
        """The access-log line of a statement refused or failed before it could run."""
        async def fail() -> Result:
            raise err

        try:
            await self._logged(sql, fail)
        except StatementError:
            pass

    async def _run_statement(self, sql: str, params: list[Any],
                             lifted: tuple[str, str | None, list[Any]] | None = None,
                             *, stream: bool = False) -> Result:
        """Run one statement: server-handled ones first, then the engine. A statement that
        fails in a transaction block leaves it failed (25P02 until ROLLBACK), also when
        the engine rolled the whole transaction back itself (SQLite does on an interrupt,
        a statement timeout, a full disk), as in PostgreSQL: the statements after it must
        not run on their own, outside the transaction the client believes it is in."""
        in_block = self.pending_begin or (self.engine is not None
                                          and self.engine.in_transaction)
        zone = lifted is None and _pgsession.names_time_zone(sql)
        try:
            if lifted is None and not self.server.engine.transactions and \
                    _pgsession.sets_global_time_zone(sql):
                raise StatementError(
                    "SET GLOBAL TimeZone is not supported: it would change the zone of "
                    "every session that set none, while each reports its own", "0A000",
                    hint="SET TimeZone = 'zone' sets this session's zone")
            try:
                result = await self._run_one(sql, params, lifted, stream=stream)
            except StatementError as exc:
                unknown = _UNKNOWN_ZONE.search(str(exc)) if zone else None
                if unknown is None:
                    raise
                raise StatementError(f'invalid value for parameter "TimeZone": '
                                     f'"{unknown[1]}"', "22023") from None
            if zone:
                if _pgsession.resets_time_zone(sql):
                    await self._set_start_zone()
                await self._follow_time_zone()
            return result
        except Exception:
            if in_block and self.engine is not None and not self.engine.in_transaction \
                    and not self.pending_begin and not _ends_transaction(sql):
                self.failed = True  # (a failed COMMIT ends the block, as in PostgreSQL)
            raise

    async def _run_one(self, sql: str, params: list[Any],
                       lifted: tuple[str, str | None, list[Any]] | None = None,
                       *, stream: bool = False) -> Result:
        """Run one statement; ``stream``: a query's rows may come as a stream (the caller
        sends them with :meth:`_send_rows`)."""
        if self.engine is not None:
            self.engine.last_tables = set()
            # (the engine refuses what writes after all: a CTE's INSERT, a SELECT INTO)
            self.engine.read_only = self.read_only()
        if lifted is not None:  # the engine's own statement, lifted already (a SELECT,
            head, shape, values = lifted  # UPDATE, DELETE or INSERT), or a transaction
            if self.failed and (shape is not None or head not in _BLOCK_ENDS):  # statement
                raise StatementError("current transaction is aborted, commands ignored "
                                     "until end of transaction block", "25P02")
            if shape is None:
                return await self._run_timed(head, sql, params, {}, self._transaction)
            if head != "SELECT" and self.read_only():
                raise read_only_error(sql)
            return await self._run_timed(head, shape, values, {}, stream=stream)
        words = _sqltext.first_words(sql, 2)
        head = words[0] if words else ""
        if self.failed and head not in _BLOCK_ENDS:
            raise StatementError("current transaction is aborted, commands ignored until end "
                                 "of transaction block", "25P02")
        if head not in _READ_ONLY_RUNS and self.read_only() and \
                not (head == "COPY" and _copy_out(sql)):
            raise read_only_error(sql)
        if ("\\" in sql or "||" in sql) and head in _BYTEA_CONTEXTS and \
                self.engine is not None:
            sql = await self._timed(self.engine.bytea_context, sql, self._visible())
        if head in _BYTEA_CONTEXTS and self.engine is not None and "'" in sql:
            sql = await self._timed(self.engine.interval_strings, sql, self._visible())
        if head in _BYTEA_CONTEXTS and self.engine is not None and \
                _sqltext.long_number(sql):  # '123456789012345.12345' for a NUMERIC column
            await self._timed(self.engine.check_numeric_strings, sql, self._visible())
            sql = await self._timed(self.engine.float_literals, sql, self._visible())
        if head in LIFTABLE and not params and self.server.engine_lifts_literals:
            shaped = _sqltext.lift_literals(sql)
            if shaped is not None and self.server.engine_statement(shaped[0]):
                # the engine's own statement: its shape, prepared once, checked as SQLite
                # prepares it under the session's privileges (their version in its text)
                return await self._run_timed(head, shaped[0], list(shaped[1]), {},
                                             stream=stream)
        if head in ("DECLARE", "FETCH", "MOVE", "CLOSE"):
            return await self._cursor(head, sql, params)
        if head == "DEALLOCATE":
            return self._deallocate(sql)
        if head == "DISCARD":
            return await self._discard(sql)
        if head in ("LISTEN", "NOTIFY", "UNLISTEN"):
            if head == "UNLISTEN":  # (asyncpg's pool sends UNLISTEN *): none to stop
                return Result(None, [], "UNLISTEN")
            raise StatementError(f"{head} is not supported: the server has no notifications",
                                 "0A000")
        if head == "PREPARE" and len(words) > 1 and words[1] != "TRANSACTION":
            return self._prepare(sql)
        if head == "EXECUTE":
            return await self._run_one(self._execute_text(sql), params)
        if head == "COPY" and _is_copy(sql):
            raise StatementError("COPY FROM STDIN / TO STDOUT cannot run here (a cursor's "
                                 "query)", "0A000")
        if head == "SELECT" and "pg_cursors" in sql and \
                re.search(r"pg_catalog\.pg_cursors\b", sql):
            m = re.search(r"\bname\s*=\s*'((?:[^']|'')*)'", sql)
            rows = [(1,)] if m and m[1].replace("''", "'") in self.cursors else []
            return Result([("?column?", _types.INT4)], rows, f"SELECT {len(rows)}")
        if head == "SELECT" and self.engine is not None and "pg_catalog." in sql:
            from ._pgcatalog import catalog_query

            listed = await self._timed(catalog_query, sql, self.engine, self.privileges,
                                       self.user)
            if listed is not None:
                return listed
        if head in ("SELECT", "SHOW", "SET", "RESET"):
            if head != "SELECT" and not self.server.engine.transactions and \
                    self.engine is not None:
                for text in _pgsession.engine_resets(sql):  # (DuckDB's, then the server's)
                    self.engine.read_only = False  # (a setting: no write)
                    await self._run_timed("RESET", text, [], {})
            answered = _pgsession.answer(sql, self)
            if answered is not None:
                return answered
        if head in ("SELECT", "WITH") and self.engine is not None and _pgtables.handles(sql):
            text, renames = self._identity(sql)
            return await self._run_timed(head, text, params, renames, _pgtables.query)
        if self.server.authenticator is not None and self.server.authenticator.handles(sql):
            if self.read_only_block() and head not in ("SELECT", "SHOW", "SET", "RESET"):
                self.failed = True  # as a refused write fails the block: 25P02 until ROLLBACK
                raise StatementError(
                    f"{' '.join(words)} cannot run in a transaction block on the analytical "
                    "engine: the block is read-only (transaction_read_only is on)", "0A000",
                    hint="COMMIT or ROLLBACK first, and change users, roles and grants in "
                    "autocommit mode (psycopg: autocommit=True; SQLAlchemy: "
                    "isolation_level=\"AUTOCOMMIT\")")
            if self._in_transaction():
                return await self._user_statement(sql)
            if getattr(self.engine, "commit_users", None) is not None:
                return await self._user_statement_alone(sql)
        if head in ("SELECT", "WITH") and self.server.authenticator is not None \
                and _systables.handles(sql):
            text, renames = self._identity(sql)
            return await self._run_timed(head, text, params, renames, _systables.query)
        handled = await self.server.handle_statement(self, sql, params)
        if handled is not None:
            return handled
        assert self.engine is not None
        if head in ("SELECT", "WITH") and _infoschema.handles(sql):
            text, renames = self._identity(sql)  # current_user: the session's, not DuckDB's
            return await self._run_timed(head, text, params, renames, _infoschema.query)
        if head in TRANSACTION_WORDS:  # (the analytical engine: blocks of queries only)
            return await self._run_timed(head, sql, params, {}, self._transaction)
        sql, renames = self._identity(sql)
        if head in ("DROP", "ALTER", "CREATE") and words[1:] in (["TABLE"], ["VIEW"]) \
                and self.server.authenticator is not None \
                and getattr(self.engine, "commit_users", None) is not None \
                and (head != "ALTER" or _RENAME_TO.search(sql) is not None):
            return await self._table_statement(head, sql, params, renames)
        return await self._run_timed(head, sql, params, renames, stream=stream)

    async def _table_statement(self, head: str, sql: str, params: list[Any],
                               renames: dict[str, list[str]]) -> Result:
        """SQLite: ``DROP TABLE`` / ``DROP VIEW`` removes the grants on what it drops,
        ``ALTER TABLE t RENAME TO u`` moves ``t``'s grants to ``u``, and ``CREATE TABLE`` /
        ``CREATE VIEW`` gives the new name none (:meth:`_carry_grants`), as in PostgreSQL, as
        changes to the users of the statement's transaction (outside one: a transaction
        of its own): they commit with it, in the database's record of user changes too
        (:meth:`_commit`), so a crash leaves both or neither, and a ROLLBACK keeps the
        grants. What the statement dropped or renamed is what left the catalog, read
        before and after it with the write lock held."""
        assert self.engine is not None
        engine: Any = self.engine
        alone = not self._in_transaction()
        if alone:
            self.pending_begin = True
        try:
            await self._begin(engine, "IMMEDIATE")
            before = await self.call(engine.table_names)
            result = await self._run_timed(head, sql, params, renames)
            after = await self.call(engine.table_names)
            await asyncio.to_thread(self._carry_grants, head, before - after, after - before)
        except BaseException:
            if alone:
                await self._rollback_implicit()
            raise
        if alone:
            await self._end_implicit("COMMIT")
        return result

    def _carry_grants(self, head: str, gone: set[str], made: set[str]) -> None:
        """Record in the transaction's view of the users the removal of the grants on the
        names ``gone`` (a rename: their move to the one name ``made``), and of those on
        the names ``made``: a new table gets no grants, not those a table of its name
        left where this server could not remove them (dropped by another connection,
        while a start found the database locked or read-only: ``forget_table_grants``)."""
        if not gone and not made:
            return
        store = self._user_store()
        granted = {t for entry in [*store.users.values(), *store.roles.values()]
                   for t in entry.get("grants", {})}
        if not (gone | made) & granted:
            return  # (no change to the users: the commit stays a plain one)
        tx = self._users_transaction()
        for name in sorted(made & granted):
            tx.drop_table_grants(name)
        if head == "ALTER" and len(gone) == 1 and len(made) == 1:
            if gone & granted:
                tx.rename_table_grants(next(iter(gone)), next(iter(made)))
            return
        for name in sorted(gone & granted):
            tx.drop_table_grants(name)

    def _users_transaction(self) -> Any:
        """The transaction's view of the users (:meth:`._users.UserStore.transaction`),
        made at its first change; the session's privileges read it until it ends."""
        if self.user_tx is None:
            assert self.server.authenticator is not None
            self.user_tx = self.server.authenticator.transaction()
            if self.privileges is not None:
                self.tx_role = self.privileges.current_user
                self.privileges.store = self.user_tx.store
        return self.user_tx.store

    async def _run_timed(self, head: str, sql: str, params: list[Any],
                         renames: dict[str, list[str]], special: Any = None,
                         *, stream: bool = False) -> Result:
        """Run ``sql`` in the engine under the statement timeout; ``special``: the
        information_schema's query or :meth:`_transaction` instead; ``stream``: a query's
        rows as a stream where the engine streams them (its start under the timeout)."""
        assert self.engine is not None
        engine = self.engine
        timer = _StatementTimer(engine, self.statement_timeout())
        deadline = timer.deadline
        result: Result
        try:
            if special is _infoschema.query:
                result = await self.call(special, sql, params, engine, self.privileges)
            elif special is _systables.query:
                result = await self.call(special, sql, params, engine, self._user_store())
            elif special is _pgtables.query:
                result = await self.call(special, sql, params, engine, self.privileges,
                                         self.database)
            elif special is not None:
                return await special(engine, head, sql)  # type: ignore[no-any-return]
            elif self.pending_begin and head not in _READS:
                self.pending_begin = False
                if await engine.begin_write():  # waited for the write lock here, and began
                    quick = engine.run_write_quick(sql, params, deadline) \
                        if head in _QUICK_WRITES else None
                    result = quick if quick is not None else await self.call(engine.run, sql,
                                                                             params)
                else:  # SQLite's BEGIN (IMMEDIATE) and the first write, in one hop
                    result = await self.call(_begin_and_run, engine, sql, params)
            else:
                if self.pending_begin:
                    await self._begin(engine, "DEFERRED" if head in _READS else "IMMEDIATE")
                # a read that finishes at once runs here, without the hop to the thread
                quick = await self.call(engine.run_stream, sql, params) \
                    if stream and engine.streams and head in _STREAMED else \
                    engine.run_quick(sql, params) if head in _QUICK else \
                    engine.run_write_quick(sql, params, deadline) if head in _QUICK_WRITES \
                    else None
                result = quick if quick is not None else await self.call(engine.run, sql,
                                                                         params)
            if head in _NAMED and result.columns:
                result.columns = _parameter_names(sql, result.columns, renames)
            if renames and result.columns is not None:
                result.columns = _rename(result.columns, renames)
            return result
        except Exception as exc:
            raise timer.error(statement_error(exc)) from None
        finally:
            timer.cancel()

    async def bounded(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the session's thread under its statement timeout, the timeout
        said as PostgreSQL says it (a statement the server runs itself: a policy
        statement); ``fn`` ends its waits when the session's engine is interrupted."""
        if self.engine is None:
            return await asyncio.to_thread(fn, *args)
        return await self._timed(fn, *args)

    async def _timed(self, fn: Callable[..., T], *args: Any) -> T:
        """``self.call(fn, *args)`` under the statement timeout (an engine call that is not a
        statement's run: Describe, the catalogs, COPY's parts)."""
        assert self.engine is not None
        timer = _StatementTimer(self.engine, self.statement_timeout())
        try:
            return await self.call(fn, *args)
        except Exception as exc:
            raise timer.error(statement_error(exc)) from None
        finally:
            timer.cancel()

    async def _call_timed(self, timer: _StatementTimer, fn: Callable[..., T], *args: Any) -> T:
        """``self.call(fn, *args)`` under a statement's ``timer`` (COPY FROM's, which counts
        from the COPY's start)."""
        try:
            return await self.call(fn, *args)
        except Exception as exc:
            raise timer.error(statement_error(exc)) from None

    def _deallocate(self, sql: str) -> Result:
        """``DEALLOCATE [PREPARE] name | ALL``: drop prepared statements, as a Close message
        does (psycopg sends it when its cache of prepared statements is full)."""
        m = re.fullmatch(r'\s*DEALLOCATE\s+(?:PREPARE\s+)?("(?:[^"]|"")+"|[A-Za-z_]\w*)\s*;?\s*',
                         sql, re.I)
        if m is None:
            raise StatementError("syntax: DEALLOCATE [PREPARE] name | ALL", "42601")
        if m[1].upper() == "ALL":
            self.statements = {k: v for k, v in self.statements.items() if not k}
            return Result(None, [], "DEALLOCATE ALL")
        name = m[1][1:-1].replace('""', '"') if m[1].startswith('"') else m[1].lower()
        if not name or self.statements.pop(name, None) is None:
            raise StatementError(f'prepared statement "{name}" does not exist', "26000")
        return Result(None, [], "DEALLOCATE")

    async def _follow_time_zone(self) -> None:
        """After a SET or RESET of ``TimeZone`` (or ``RESET ALL``) on the analytical
        engine, whose DuckDB takes it: the zone DuckDB now writes timestamps with time zone
        in is the session's ``TimeZone`` (``SHOW``, ``current_setting``), and a change is
        reported to the client in a ParameterStatus, as PostgreSQL reports it (psycopg
        reads timestamptz values in it)."""
        if self.server.engine.transactions or self.engine is None:
            return
        zone = await self._engine_zone()
        if zone != self.time_zone:
            self.time_zone = zone
            self.send(P.parameter_status("TimeZone", zone))

    async def _engine_zone(self) -> str:
        """The zone DuckDB writes timestamps with time zone in (analytical engine)."""
        assert self.engine is not None
        result = await self._timed(self.engine.run, "SELECT current_setting('TimeZone')", [])
        return str(result.rows[0][0]) if result.rows and result.rows[0][0] else "UTC"

    async def _set_start_zone(self) -> None:
        """DuckDB's TimeZone set to the one the startup packet gave, if it gave one: the
        session's default, which RESET (and RESET ALL, DISCARD ALL) goes back to, as in
        PostgreSQL. A zone DuckDB does not know fails with PostgreSQL's 22023."""
        if self.startup_zone is None or self.engine is None:
            return
        zone = self.startup_zone
        try:
            await self._timed(self.engine.run,
                              "SET TimeZone = '" + zone.replace("'", "''") + "'", [])
        except StatementError as exc:
            if _UNKNOWN_ZONE.search(str(exc)) is None:
                raise
            raise StatementError(f'invalid value for parameter "TimeZone": "{zone}"',
                                 "22023") from None

    async def _discard(self, sql: str) -> Result:
        """``DISCARD ALL`` (what connection poolers send between clients: PgBouncer's
        ``server_reset_query``): every cursor closed, every prepared statement deallocated,
        the settings and the role reset, as in PostgreSQL; not in a transaction (25001).
        ``DISCARD PLANS``, ``SEQUENCES`` and ``TEMP`` have nothing to drop."""
        m = re.fullmatch(r"\s*DISCARD\s+(ALL|PLANS|SEQUENCES|TEMP|TEMPORARY)\s*;?\s*", sql,
                         re.I)
        if m is None:
            raise StatementError("syntax: DISCARD ALL | PLANS | SEQUENCES | TEMP", "42601")
        what = m[1].upper().replace("TEMPORARY", "TEMP")
        if what != "ALL":
            return Result(None, [], f"DISCARD {what}")
        if self._in_transaction() or self._status() != "I" or self.several:
            raise StatementError("DISCARD ALL cannot run inside a transaction block", "25001")
        for name in list(self.cursors):
            self.cursors.pop(name, None)
            await self._drop_portal(self.portals.pop(name, None))
        self._deallocate("DEALLOCATE ALL")
        await self._run_one("RESET ALL", [])
        await self._set_start_zone()
        await self._follow_time_zone()
        if self.privileges is not None:
            self._restore_role(self.privileges.session_user)
        return Result(None, [], "DISCARD ALL")

    def _prepare(self, sql: str) -> Result:
        """``PREPARE name [(type, ...)] AS statement`` (:mod:`._prepared`)."""
        from ._prepared import parse_prepare
        from ._types import type_oid

        name, types, body = parse_prepare(sql)
        if name in self.statements:
            raise StatementError(f'prepared statement "{name}" already exists', "42P05")
        self.statements[name] = _Statement(
            body, tuple(type_oid(t) for t in types),
            max(_sqltext.placeholders(body), len(types)), type_names=tuple(types))
        return Result(None, [], "PREPARE")

    def _execute_text(self, sql: str) -> str:
        """The statement ``EXECUTE name [(value, ...)]`` runs (:mod:`._prepared`)."""
        from ._prepared import execute_text, parse_execute

        name, args = parse_execute(sql)
        st = self._statement(name)
        return execute_text(name, st.sql, st.nparams, st.type_names, args,
                            self.server.engine.name == "sqlite")

    def _identity(self, sql: str, privileges: Any = None) -> tuple[str, dict[str, list[str]]]:
        """``sql`` with ``current_user``, ``current_role`` and ``session_user`` written in as
        string literals, and the column names those literals get mapped back to the words
        (in the order they appear). ``privileges``: others than the session's own."""
        upper = sql.upper()  # a word is replaced when its upper() is one of the three
        if ("CURRENT_USER" not in upper and "CURRENT_ROLE" not in upper
                and "SESSION_USER" not in upper) or IDENTITY_WORDS.search(sql) is None:
            return sql, {}
        privileges = privileges if privileges is not None else self.privileges
        current = privileges.current_user if privileges is not None else self.user
        values = {"CURRENT_USER": current, "CURRENT_ROLE": current, "SESSION_USER": self.user}
        renames: dict[str, list[str]] = {}

        def replace(word: str) -> str | None:
            value = values.get(word.upper())
            if value is None:
                return None
            literal = "'" + value.replace("'", "''") + "'"
            renames.setdefault(literal, []).append(word.lower())
            return literal

        try:
            return _sqltext.replace_words(sql, replace, empty_call=True), renames
        except ServerError:
            return sql, {}

    async def _cursor(self, head: str, sql: str, params: list[Any]) -> Result:
        """DECLARE / FETCH / MOVE / CLOSE of a server-side cursor."""
        from ._cursors import move, parse_close, parse_declare, parse_fetch

        if head == "DECLARE":
            st = parse_declare(sql)
            if not st.name:
                raise StatementError("a cursor needs a name", "42601")
            if st.name in self.portals:
                raise StatementError(f'cursor "{st.name}" already exists', "42P03")
            in_tx = (self.pending_begin or (self.engine is not None
                                            and self.engine.in_transaction)) \
                and not self.pipeline_tx  # an implicit transaction is no transaction block
            # (a query's statements are one implicit transaction block, as in PostgreSQL,
            # on the analytical engine too: the cursor lasts until the query's end)
            if not st.hold and not in_tx and not self.several:
                raise StatementError("DECLARE CURSOR can only be used in transaction blocks",
                                     "25P01", hint="declare it WITH HOLD (psycopg: "
                                     "withhold=True) in autocommit mode")
            if (_sqltext.first_words(st.query, 1) or [""])[0] not in _CURSOR_QUERIES:
                raise StatementError("DECLARE CURSOR needs a query (SELECT, VALUES, WITH, "
                                     "TABLE)", "42P11")
            # neither SCROLL nor WITH HOLD, on an engine that streams: FETCH reads the rows
            # from the query's stream as it asks for them, forward only
            forward = not st.scroll and not st.hold and self.engine is not None and \
                self.engine.streams
            result = await self._run_statement(st.query, params, stream=forward)
            if result.columns is None:
                raise StatementError("DECLARE CURSOR needs a query that returns rows",
                                     "42P11")
            portal = _Portal(_Statement(st.query, (), 0), params, (), forward_only=forward)
            portal.result = result
            if self.engine is not None:
                portal.tables = set(self.engine.last_tables)
            self.portals[st.name] = portal
            self.cursors[st.name] = st.hold
            return Result(None, [], "DECLARE CURSOR")
        if head == "CLOSE":
            name = parse_close(sql)
            names = list(self.cursors) if name is None else [name]
            if name is not None and name not in self.cursors:
                raise StatementError(f'cursor "{name}" does not exist', "34000")
            for n in names:
                self.cursors.pop(n, None)
                await self._drop_portal(self.portals.pop(n, None))
            return Result(None, [], "CLOSE CURSOR")
        fetch = parse_fetch(sql)
        # a named portal of the extended protocol is a cursor too, as in PostgreSQL (asyncpg
        # moves its cursors' portals with MOVE FORWARD n name)
        if fetch.name not in self.cursors and not (fetch.name and fetch.name in self.portals):
            raise StatementError(f'cursor "{fetch.name}" does not exist', "34000")
        portal = self.portals[fetch.name]
        if portal.result is None:
            portal.result = await self._run_statement(portal.statement.sql, portal.params)
            if self.engine is not None:
                portal.tables = set(self.engine.last_tables)
        if portal.forward_only:
            return await self._fetch_forward(fetch.name, portal, fetch)
        if portal.result.stream is not None:
            await self._hold_rest(portal)
        rows = portal.result.rows
        picked, sent = move(portal.sent, len(rows), fetch)
        if picked and min(picked) < portal.streamed:
            raise StatementError("cursor can only scan forward", "55000",
                                 hint="its rows before were streamed by Execute")
        portal.sent = sent
        if self.engine is not None:
            self.engine.last_tables = set(portal.tables)
        if fetch.move:
            return Result(None, [], f"MOVE {len(picked)}")
        return Result(portal.result.columns, [rows[i] for i in picked], f"FETCH {len(picked)}")

    async def _fetch_forward(self, name: str, portal: _Portal, fetch: Any) -> Result:
        """FETCH / MOVE of a cursor that moves forward only (DECLAREd neither SCROLL nor
        WITH HOLD on the analytical engine): the rows it reaches are read from the query's
        stream, those after them stay unread, those before are let go. A move back
        (``BACKWARD``, ``PRIOR``, the current row again, a position before it) fails with
        55000, as in PostgreSQL's NO SCROLL cursor (a MOVE of 0 rows does not: it only says
        whether the cursor is on a row); a failure reading the stream (a cancel, the
        timeout) closes the cursor."""
        from ._cursors import move

        assert portal.result is not None
        result, pos = portal.result, portal.sent
        stream = result.stream
        # a count of 0 (FORWARD, BACKWARD, RELATIVE) stays on the current row: a MOVE only
        # says whether there is one, a FETCH reads it again (a move back) only on a row
        zero = fetch.count == 0 and fetch.kind != "absolute"
        if fetch.kind == "backward" and not zero:
            raise _scan_forward()
        count = fetch.count
        # the rows after the position the fetch reaches (None: all, to find the last)
        need = None if count is None or (fetch.kind == "absolute" and count < 0) else \
            max(count - pos, 0) if fetch.kind == "absolute" else max(count, 0)
        # the rows to keep as they are read, the others let go batch by batch (a MOVE
        # holds none it passes): from index ``first`` on, or the last ``last`` rows
        first: int | None = None
        last: int | None = None
        if count is None:  # ALL: a FETCH sends them, a MOVE keeps none
            first, last = (None, 0) if fetch.move else (pos, None)
        elif fetch.kind == "absolute" and count < 0:  # LAST, ABSOLUTE -n
            last = -count
        elif fetch.kind in ("absolute", "relative") and count > 0:
            first = (count if fetch.kind == "absolute" else pos + count) - (0 if fetch.move
                                                                            else 1)
        elif fetch.kind == "forward":
            first = pos + count if fetch.move else pos
        if stream is None:  # (a result of at most two batches, held whole)
            rows, offset = result.rows, 0
        else:  # its rows from ``offset`` on
            rows, offset = stream.pending, stream.count - len(stream.pending)
            stream.pending = []
            timer = _StatementTimer(self.engine, self.statement_timeout()) \
                if self.engine is not None else None
            try:
                while True:
                    drop = len(rows) - last if last is not None else \
                        min(len(rows), first - offset) if first is not None else 0
                    if drop > 0:
                        rows, offset = rows[drop:], offset + drop
                    if stream.closed or (need is not None and offset + len(rows) >= pos + need):
                        break
                    got = await self.call(stream.next_rows)
                    if got is None:
                        break
                    rows += got
            except BaseException as exc:
                self.cursors.pop(name, None)
                self.portals.pop(name, None)
                assert timer is not None
                err = await self._stream_failed(stream, exc, timer)
                if err is exc:
                    raise
                raise err from None
            finally:
                if timer is not None:
                    timer.cancel()
        ended = stream is None or stream.closed
        total = offset + len(rows) + (0 if ended else 1)  # (unended: past the rows it asks)
        picked, moved = move(pos, total, fetch)
        if moved < pos or (not (zero and fetch.move) and any(i < pos for i in picked)):
            if stream is not None:
                stream.pending = rows
            raise _scan_forward()
        out = [] if fetch.move else [rows[i - offset] for i in picked]
        if stream is not None:
            stream.pending = rows[moved - offset:]
        portal.sent = moved
        if self.engine is not None:
            self.engine.last_tables = set(portal.tables)
        if fetch.move:
            return Result(None, [], f"MOVE {len(picked)}")
        return Result(result.columns, out, f"FETCH {len(picked)}")

    async def _hold_rest(self, portal: _Portal) -> None:
        """A portal streamed by Execute that FETCH or MOVE names: the rest of its rows held
        (as a cursor's are), those streamed before not."""
        assert portal.result is not None
        stream = portal.result.stream
        rest = list(stream.pending)
        stream.pending = []
        try:
            while (got := await self._timed(stream.next_rows)) is not None:
                rest += got
        except StatementError as exc:
            await self._end_stream(stream, exc)
            raise
        await self._end_stream(stream)
        portal.streamed = portal.sent
        portal.result = Result(portal.result.columns, [()] * portal.sent + rest, stream.tag)

    async def _end_transaction_cursors(self) -> None:
        """A transaction's end closes its cursors declared WITHOUT HOLD (and their streams)."""
        for name, hold in list(self.cursors.items()):
            if not hold:
                del self.cursors[name]
                await self._drop_portal(self.portals.pop(name, None))

    async def _transaction(self, engine: EngineSession, head: str, sql: str) -> Result:
        """BEGIN / START TRANSACTION, COMMIT / END, ROLLBACK / ABORT (``AND CHAIN``: a new
        block with the same access mode at once), SAVEPOINT, RELEASE and ROLLBACK TO, with
        PostgreSQL's tags and errors: a savepoint outside a transaction block (a query's or
        a pipeline's implicit transaction is none) is 25P01, one never set 3B001."""
        words = _sqltext.first_words(sql, 3)
        if head in ("BEGIN", "START"):
            if self.query_tx:  # the query's implicit block becomes the explicit one
                self.query_tx = False
                self.block_read_only = _begin_read_only(sql)
            elif self.pipeline_tx:  # the statements before it join the explicit transaction
                self.pipeline_tx = False
                self.pending_begin = self.pending_begin or not engine.in_transaction
            elif engine.in_transaction or self.pending_begin:
                self.warn("there is already a transaction in progress", "25001")
            else:
                self.pending_begin = True
                self.block_read_only = _begin_read_only(sql)
            return Result(None, [], "START TRANSACTION" if head == "START" else "BEGIN")
        explicit = self._status() != "I" and not self.pipeline_tx and not self.query_tx
        if head in ("COMMIT", "END", "ROLLBACK", "ABORT") and "TO" not in words[1:]:
            chain = _AND_CHAIN.search(_sqltext.strip_strings(sql)) is not None
            if chain and not explicit:
                raise StatementError(f"{'COMMIT' if head in ('COMMIT', 'END') else 'ROLLBACK'}"
                                     " AND CHAIN can only be used in transaction blocks",
                                     "25P01")
            read_only = self.block_read_only
            result = await self._end_block(engine, head)
            if chain:  # (PostgreSQL's COMMIT AND CHAIN: the next block begins now)
                self.pending_begin = True
                self.block_read_only = read_only
            return result
        if not explicit:
            what = {"SAVEPOINT": "SAVEPOINT", "RELEASE": "RELEASE SAVEPOINT"}.get(
                head, "ROLLBACK TO SAVEPOINT")
            raise StatementError(f"{what} can only be used in transaction blocks", "25P01")
        await self._begin(engine, "IMMEDIATE")
        if head != "SAVEPOINT":  # (SQLite's names ignore case, PostgreSQL's quoted ones not)
            name = _savepoint_name(sql)
            if name not in [mark[0] for mark in self.savepoints]:
                raise StatementError(f'savepoint "{name}" does not exist', "3B001")
        result = await self.call(engine.run, sql, [])
        if head in ("ROLLBACK", "ABORT"):
            self.failed = False
        self._savepoint(head, sql)
        return result

    async def _end_block(self, engine: EngineSession, head: str) -> Result:
        """COMMIT or ROLLBACK the transaction block (a failed one: ROLLBACK, its tag too)."""
        tag = "COMMIT" if head in ("COMMIT", "END") else "ROLLBACK"
        if self.pipeline_tx or self.query_tx:  # ends the implicit one, as PostgreSQL does
            self.pipeline_tx = self.query_tx = False
            self.warn("there is no transaction in progress", "25P01")
        await self._end_transaction_cursors()
        pending, self.pending_begin = self.pending_begin, False
        failed, self.failed = self.failed, False
        self.block_read_only = None
        self.savepoints.clear()
        if failed:
            tag = "ROLLBACK"
        self.end_settings(keep=tag == "COMMIT")
        if not engine.in_transaction and self.user_tx is None:
            if not pending and not failed:  # failed: the engine rolled it back already
                self.warn("there is no transaction in progress", "25P01")
            return Result(None, [], tag)
        if tag == "COMMIT":
            await self._commit(engine)
        else:
            self._end_users(keep_role=False)
            if engine.in_transaction:
                await self.call(engine.run, tag, [])
        return Result(None, [], tag)

    def read_only_block(self) -> bool:
        """In a transaction block of the analytical engine, which holds queries only: it
        cannot undo a write, so the block is read-only (``SHOW transaction_read_only``)."""
        return not self.server.engine.transactions and (self.pending_begin or (
            self.engine is not None and self.engine.in_transaction))

    def read_only(self) -> bool:
        """Whether the session's transaction is READ ONLY: its writes fail (25006)."""
        if self.block_read_only is not None and not self._status() == "I":
            return self.block_read_only
        self.block_read_only = None  # (its block ended)
        return self.read_only_default

    def in_block(self) -> bool:
        """In a transaction block (BEGIN ... COMMIT)."""
        return self._status() != "I"

    def _in_transaction(self) -> bool:
        """In a transaction block, or the implicit transaction of a query's or a pipeline's
        statements (SQLite)."""
        return self.pending_begin or self.pipeline_tx or self.user_tx is not None or (
            self.engine is not None and self.engine.in_transaction)

    def _user_store(self) -> Any:
        """The users, roles and grants as this session sees them (in a transaction: with
        its changes)."""
        if self.privileges is not None:
            return self.privileges.store
        assert self.server.authenticator is not None
        return self.server.authenticator.store  # type: ignore[attr-defined]

    async def _user_statement(self, sql: str) -> Result:
        """A user, role or grant statement, or SET ROLE, in a transaction: applied to the
        transaction's view of the users (:meth:`._users.UserStore.transaction`), which the
        session's privileges read until the transaction ends; COMMIT saves it."""
        self._users_transaction()
        assert self.user_tx is not None
        result: Result | None = await asyncio.to_thread(self.user_tx.handle, self, sql)
        assert result is not None
        return result

    async def _user_statement_alone(self, sql: str) -> Result:
        """A user, role or grant statement outside a transaction (SQLite): a transaction of
        its own, committed as every change to the users is (:meth:`_commit`), so the
        database's record of user changes and the user file never part."""
        try:
            result = await self._user_statement(sql)
        except BaseException:
            self._end_users(keep_role=False)
            raise
        assert self.engine is not None
        await self._commit(self.engine)
        return result

    def _end_users(self, *, keep_role: bool) -> None:
        """End the transaction's view of the users: its changes are committed or dropped;
        ``keep_role=False`` (a rollback) restores the role the transaction started as."""
        tx, self.user_tx = self.user_tx, None
        self.savepoints.clear()
        self.end_settings(keep=keep_role)
        if tx is None or self.privileges is None:
            return
        self.privileges.store = tx.store.parent
        if not keep_role:
            self._restore_role(self.tx_role)

    @property
    def extra_float_digits(self) -> int:
        """How floats are written in text (PostgreSQL's setting: :mod:`._textout`)."""
        return int(self.settings.get("extra_float_digits", 1))

    def keep_settings(self) -> None:
        """Before a SET in a transaction: the session's settings as the transaction found
        them, for a rollback to restore (PostgreSQL's SET is undone with its transaction)."""
        if self.tx_settings is None and self._in_transaction():
            self.tx_settings = self._settings_now()

    def keep_local(self, name: str) -> None:
        """Before a ``SET LOCAL name`` in a transaction: its value then, which the
        transaction's end restores, a commit too."""
        if self.local_before is None:
            self.local_before = self._settings_now()
        self.local_names.add(name)

    def drop_local(self, name: str) -> None:
        """A ``SET`` or ``RESET`` of ``name`` (``all``) for the session: kept after the
        transaction, as in PostgreSQL, though a ``SET LOCAL`` of it came before."""
        if name == "all":
            self.local_names.clear()
        self.local_names.discard(name)

    def end_settings(self, *, keep: bool) -> None:
        """The transaction ends: its SETs kept (a commit; not its SET LOCALs), or undone."""
        saved, self.tx_settings = self.tx_settings, None
        before, names = self.local_before, self.local_names
        self.local_before, self.local_names = None, set()
        if saved is not None and not keep:
            self._apply_settings(saved)
        elif before is not None and names:
            app, settings, timeout, read_only = self._settings_now()
            for name in names:
                if name in before[1]:
                    settings[name] = before[1][name]
                else:
                    settings.pop(name, None)
            self._apply_settings((
                before[0] if "application_name" in names else app, settings,
                before[2] if "statement_timeout" in names else timeout,
                before[3] if "default_transaction_read_only" in names else read_only))

    def _settings_now(self) -> _Settings:
        return (self.application_name, dict(self.settings), self.session_timeout,
                self.read_only_default)

    def _apply_settings(self, saved: _Settings) -> None:
        name, settings, self.session_timeout, self.read_only_default = saved
        self.settings = dict(settings)
        if name != self.application_name:
            self.application_name = name
            self.send(P.parameter_status("application_name", name))

    def _restore_role(self, role: str | None) -> None:
        if self.privileges is not None and role is not None:
            self.privileges.set_role(None if role == self.privileges.session_user else role)

    async def _commit(self, engine: EngineSession) -> None:
        """COMMIT the transaction: its data and its changes to users, roles and grants
        together. The changes are tried on the users as they are now first (one that no
        longer applies fails the COMMIT); a COMMIT that fails rolls everything back, as in
        PostgreSQL. On SQLite the changes commit in two phases with the user file held
        throughout (:meth:`._engines._SQLiteSession.commit_users`): a crash leaves both or
        neither."""
        tx = self.user_tx
        ops = tx.store.ops if tx is not None else []
        two_phase = getattr(engine, "commit_users", None) if ops else None
        try:
            if two_phase is not None:
                await self.call(two_phase, tx.store.parent, ops)
                ops = []
            elif ops:
                await self.call(tx.store.parent.replay, ops)
            if engine.in_transaction:
                if not ops and engine.commit_quick():  # the write lock released here
                    await self.call(engine.finish_commit)  # the sync, on the thread
                else:
                    await self.call(engine.run, "COMMIT", [])
        except Exception as exc:
            self._end_users(keep_role=False)
            self.failed = False
            if engine.in_transaction:
                try:
                    await self.call(engine.run, "ROLLBACK", [])
                except Exception as again:
                    log.warning("rolling back after a failed COMMIT failed: %s", again)
            raise statement_error(exc) from None
        if ops:
            try:
                await self.call(tx.store.parent.apply, ops)
            except Exception as exc:
                self._end_users(keep_role=False)
                err = statement_error(exc)
                raise StatementError("the transaction's data was committed, but its changes "
                                     f"to users, roles and grants were not: {err}",
                                     err.sqlstate) from None
        self._end_users(keep_role=True)

    def _savepoint(self, head: str, sql: str) -> None:
        """Track SAVEPOINT / RELEASE / ROLLBACK TO for the changes to users and the SET
        ROLE made after a savepoint (and on the analytical engine, which has none of its
        own, for the names set)."""
        name = _savepoint_name(sql)
        if name is None:
            return
        marks = [i for i, mark in enumerate(self.savepoints) if mark[0] == name]
        if head == "SAVEPOINT":
            ops = len(self.user_tx.store.ops) if self.user_tx is not None else 0
            role = self.privileges.current_user if self.privileges is not None else None
            self.savepoints.append((name, ops, role, self._settings_now()))
        elif marks and head == "RELEASE":
            del self.savepoints[marks[-1]:]
        elif marks and head == "ROLLBACK":
            del self.savepoints[marks[-1] + 1:]
            _, ops, role, settings = self.savepoints[-1]
            self._apply_settings(settings)  # (a SET after the savepoint is undone)
            if self.user_tx is not None:
                self.user_tx.store.rollback_to(ops)
            self._restore_role(role)

    async def _begin(self, engine: EngineSession, mode: str) -> None:
        """Start SQLite's transaction for a pending BEGIN: DEFERRED when the first statement
        reads, IMMEDIATE (the write lock now) when it writes, so two writers never deadlock
        upgrading their read locks."""
        if self.pending_begin:
            self.pending_begin = False
            await self.call(engine.run, f"BEGIN {mode}", [])

    async def _simple_query(self, sql: str) -> None:
        plan = self.server.query_plan(sql)
        if plan is not None:  # one statement: split, and lifted, as its text's key says
            lifted = (plan.head, plan.shape, [int(sql[a:b]) for a, b in plan.spans]) \
                if plan.shape is not None else (plan.head, None, []) if plan.transaction \
                else None
            try:
                result = await self._execute(sql[plan.start:plan.end], [], lifted)
            except StatementError as exc:
                self._error(exc)
                return
            try:
                await self._send_rows(result, (), 0, None)
            except StatementError as exc:  # (after the rows sent: as PostgreSQL does)
                self._error(exc)
            except ProtocolError as exc:  # a value its type cannot be sent as
                self._error(_encoding_error(exc))
            return
        try:
            statements = _sqltext.split_statements(sql)
        except ServerError as exc:
            err = StatementError(str(exc), "42601")
            await self._log_failure(sql, err)
            self._error(err)
            return
        if not statements:
            self.send(P.EMPTY_QUERY)
            return
        self.several = len(statements) > 1  # (PostgreSQL's implicit transaction block)
        if len(statements) > 1:
            refused = await self._authorize_all(statements)
            if refused is not None:
                index, refusal = refused
                self._error(refusal)
                await self._log_failure(statements[index], refusal)  # never run
                return
        implicit = len(statements) > 1 and bool(self.server.engine.transactions)
        for st in statements:
            # PostgreSQL's implicit transaction block: from a statement run outside a block
            # on, until a COMMIT or ROLLBACK among them (or the end of the query) ends it
            # (a BEGIN makes it the explicit block; SAVEPOINT fails in it: 25P01)
            if implicit and not self.query_tx and self._status() == "I" \
                    and not self.pipeline_tx:
                self.query_tx = self.pending_begin = True
            try:
                if _is_copy(st):
                    result = await self._copy(st)
                else:
                    result = await self._execute(st, [])
                try:
                    await self._send_rows(result, (), 0, None)
                except ProtocolError as exc:  # a value its type cannot be sent as
                    raise _encoding_error(exc) from None
            except StatementError as exc:
                self._error(exc)
                if self.query_tx:
                    self.query_tx = False
                    await self._rollback_implicit()
                return
            if self.out_size > 1 << 16:  # else sent with ReadyForQuery: one write per query
                await self.flush()
        if self.query_tx:
            self.query_tx = False
            await self._commit_implicit()

    async def _rollback_implicit(self) -> None:
        try:
            await self._end_implicit("ROLLBACK")
        except StatementError as exc:  # nothing more to tell the client than the first error
            log.warning("rolling back a query's statements failed: %s", exc)

    async def _authorize_all(self, statements: list[str]) -> tuple[int, StatementError] | None:
        """The first of ``statements`` that would be refused and its error, checked before
        any of them runs (:mod:`._precheck`)."""
        if self.privileges is None or self.engine is None:
            return None
        from ._precheck import authorize_statements

        try:  # under the statement timeout: a policy rewrite reads the catalog in a turn
            return await self._timed(functools.partial(
                authorize_statements, statements, privileges=self.privileges, user=self.user,
                engine=self.engine, authenticator=self.user_tx or self.server.authenticator,
                policies=getattr(self.server.engine, "policies", None),
                prepared=lambda name: st.sql if (st := self.statements.get(name)) else None,
                identity=lambda sql, p: self._identity(sql, p)[0]))
        except Exception as exc:
            return 0, statement_error(exc)

    async def _end_implicit(self, verb: str) -> None:
        """End the implicit transaction of a simple query's statements (SQLite)."""
        self.pending_begin = False
        await self._end_transaction_cursors()
        assert self.engine is not None
        if verb == "COMMIT":
            await self._commit(self.engine)
            return
        self._end_users(keep_role=False)
        self.failed = False
        if self.engine.in_transaction:
            try:
                await self.call(self.engine.run, verb, [])
            except Exception as exc:
                raise statement_error(exc) from None

    async def _copy(self, sql: str) -> Result:
        """COPY ... FROM STDIN / TO STDOUT, in a simple query or an Execute, and its
        access-log line (a COPY that fails or loses its client: its SQLSTATE, 0 rows)."""
        return await self._logged(sql, functools.partial(self._run_copy, sql))

    async def _run_copy(self, sql: str) -> Result:
        from ._copy import parse_copy

        if self.failed:
            raise StatementError("current transaction is aborted, commands ignored until end "
                                 "of transaction block", "25P02")
        st = parse_copy(sql)
        assert self.engine is not None
        engine = self.engine
        engine.read_only = self.read_only()
        if st.direction != "out" and engine.read_only:
            raise read_only_error(sql)
        if st.direction == "out":
            # the statement timeout runs from here, over sending the rows too
            timer = _StatementTimer(engine, self.statement_timeout())
            try:
                return await self._copy_out(st, timer)
            finally:
                timer.cancel()
        # the statement timeout runs from here, over the client's data too, as PostgreSQL's
        timer = _StatementTimer(engine, self.statement_timeout())
        try:
            return await self._copy_in(st, engine, timer)
        finally:
            timer.cancel()

    async def _copy_out(self, st: Any, timer: _StatementTimer) -> Result:
        """COPY ... TO STDOUT: its query runs (as a stream where the engine streams it:
        :meth:`EngineSession.run_stream`), then CopyOutResponse, a CopyData per row and
        CopyDone. A stream's rows are encoded and sent a batch at a time, each batch before
        the next is read, waiting while the client has not taken what was sent, as
        :meth:`_send_rows` sends a streamed query's. A failure after CopyOutResponse (a
        part that fails authentication, a cancel, the timeout, a value the binary format
        cannot carry) ends the stream and raises: its ErrorResponse follows the data sent."""
        from ._copy import encode_binary, encode_rows

        if st.columns and st.table and self._visible()(st.table):
            # (the query would name DuckDB's missing column)
            assert self.engine is not None
            types = await self._call_timed(timer, self.engine.column_types, st.table)
            if types:  # (none: the query's 42P01)
                _copy_columns(st.table, st.columns, types)
        cols = ", ".join(_quote(c) for c in st.columns) if st.columns else "*"
        query = st.query or f"SELECT {cols} FROM {_quote_name(st.table or '')}"  # noqa: S608
        result = await self._run_statement(query, [], stream=True)
        names = [n for n, _ in result.columns or []]
        oids = [o for _, o in result.columns or []]
        stream = result.stream
        self.send(_copy_response(b"H", len(names), st.binary))

        async def send(rows: list[tuple[Any, ...]], first: bool, last: bool) -> None:
            for chunk in encode_binary(oids, rows, first=first, last=last) if st.binary \
                    else encode_rows(st, names, rows, first=first, oids=oids,
                                     extra_float_digits=self.extra_float_digits):
                self.send(P.message(b"d", chunk))
                if self.out_size > 1 << 16:
                    await self.flush()  # (waits while the client has not taken 64 KiB)

        try:
            if stream is None:
                await send(result.rows, True, True)
                count = len(result.rows)
            else:
                rows: list[tuple[Any, ...]] | None = stream.pending
                stream.pending = []
                first = True
                while rows is not None:
                    if rows:
                        await send(rows, first, False)
                        stream.sent += len(rows)
                        first = False
                    if self.conn.lost:
                        raise ConnectionError("the client went away")
                    rows = await self.call(stream.next_rows)
                await send([], first, True)
                count = stream.sent
                await self._end_stream(stream)
        except BaseException as exc:
            if stream is not None:
                err = await self._stream_failed(stream, exc, timer)
            else:  # a value the binary format cannot carry
                err = StatementError(str(exc), "22000") if isinstance(exc, ProtocolError) \
                    else exc
            if err is exc:
                raise
            raise err from None
        self.send(P.COPY_DONE)
        return Result(None, [], f"COPY {count}")

    async def _copy_in(self, st: Any, engine: EngineSession, timer: _StatementTimer) -> Result:
        """COPY ... FROM STDIN, streamed: CopyInResponse, then the engine's insert runs on
        the session's thread while the client sends; it reads the CopyData as it needs them
        (:meth:`_copy_chunk`, at most :data:`_COPY_CHUNK` bytes at a time), decodes them
        there (:mod:`._copyin`) and inserts the rows a batch of :data:`_COPY_BATCH` at a
        time, all or none. A failure before the client's CopyDone (a malformed line, a
        cancel, the timeout) reads and drops the rest of its data, then is sent, as
        PostgreSQL does."""
        timed = functools.partial(self._call_timed, timer)
        types: list[tuple[str, int]] = []
        table_types: list[tuple[str, int]] = []
        if st.binary or st.header_match or st.force_null or st.force_not_null or st.columns:
            # binary fields are read by the types of the columns they go to; HEADER MATCH
            # and FORCE_(NOT_)NULL name columns; a column list is checked as PostgreSQL does
            if not self._visible()(st.table or ""):  # (as the insert refuses it: its
                # columns, or whether it exists, are not the user's to learn)
                raise StatementError(f"permission denied: INSERT on table {st.table}",
                                     "42501")
            types = table_types = await timed(engine.column_types, st.table or "")
            if not types:
                raise StatementError(f'relation "{st.table}" does not exist', "42P01")
            if st.columns:
                types = _copy_columns(st.table or "", st.columns, types)
        names = [n for n, _ in types]
        forced: dict[str, list[int]] = {}
        at = {n.lower(): i for i, n in enumerate(names)}
        all_columns = {n.lower() for n, _ in table_types}
        for option in ("force_not_null", "force_null"):
            given = getattr(st, option) or []
            for c in given:
                if c.lower() not in all_columns:
                    raise StatementError(f'column "{c}" of relation "{st.table}" does not '
                                         "exist", "42703")
                if c.lower() not in at:
                    raise StatementError(f'{option.upper()} column "{c}" not referenced by '
                                         "COPY", "42P10")
            forced[option] = [at[c.lower()] for c in given]
        state = _CopyState()
        # a CancelRequest interrupts the engine, which may be waiting for the client's data
        # (or not called yet): the COPY remembers it, and fails at its next chunk
        previous = engine.interrupt_also

        def cancelled() -> None:
            state.cancelled = True
            if previous is not None:
                previous()

        engine.interrupt_also = cancelled
        try:
            return await self._copy_stream(st, engine, timer, types, names, forced, state)
        finally:
            engine.interrupt_also = previous

    async def _copy_stream(self, st: Any, engine: EngineSession, timer: _StatementTimer,
                           types: list[tuple[str, int]], names: list[str],
                           forced: dict[str, list[int]], state: _CopyState) -> Result:
        """:meth:`_copy_in` from its CopyInResponse on."""
        from ._copyin import decoder

        self.send(_copy_response(b"G", len(types or st.columns or []), st.binary))
        await self.flush()
        dec = decoder(st, self.server.max_copy_size, name=st.table or "",
                      oids=[o for _, o in types] if st.binary else None, names=names,
                      force_not_null=forced.get("force_not_null", []),
                      force_null=forced.get("force_null", []))
        # a COPY whose data fits a chunk is read before the transaction starts (SQLite's
        # write lock is not held while a client is slow to send it)
        first = await self._copy_chunk(state, whole=True)
        if timer.fired or state.cancelled:  # none of the rows are written
            await self._copy_drain(state)
            raise timer.error(StatementError("canceling statement due to user request",
                                             "57014"))
        loop = asyncio.get_running_loop()

        def batches() -> Iterator[list[list[Any]]]:
            """The rows, a batch at a time, on the engine's thread: it waits for the
            client's data on the event loop, and decodes it here."""
            rows: list[list[Any]] = []
            chunk: bytes | None = first
            while True:
                if state.cancelled and not timer.fired:
                    raise StatementError("canceling statement due to user request", "57014")
                if chunk is None:
                    rows += dec.finish()
                    break
                rows += dec.feed(chunk)
                if len(rows) >= _COPY_BATCH:
                    yield rows
                    rows = []
                if timer.fired:
                    raise StatementError("canceling statement due to statement timeout",
                                         "57014")
                try:
                    if state.stopped:
                        raise ConnectionError("the COPY ended")
                    state.reading = reading = asyncio.run_coroutine_threadsafe(
                        self._copy_chunk(state), loop)
                    # a cancel or the timeout ends the wait for a client slow to send (the
                    # insert's transaction, SQLite's write lock, is let go now, not when
                    # the client sends again); the read goes on, and the drain awaits it
                    while True:
                        try:
                            chunk = reading.result(timeout=_COPY_WAIT)
                            break
                        except concurrent.futures.TimeoutError:
                            if state.cancelled:
                                raise _CopyStopped() from None
                except _CopyStopped:
                    raise StatementError("canceling statement due to user request",
                                         "57014") from None
                except BaseException as exc:  # (raised as it is, not as the engine's error)
                    state.error = exc
                    raise
            yield rows

        try:
            try:
                await self._begin(engine, "IMMEDIATE")
            except Exception as exc:
                raise timer.error(statement_error(exc)) from None
            count = await self._call_timed(timer, functools.partial(
                engine.copy_in, st.table or "", names or st.columns, batches(),
                oids=[o for _, o in types] if st.binary else None))
        except BaseException as exc:
            state.stopped = True  # (the session ends, or its engine call failed)
            reading = state.reading
            if isinstance(exc, StatementError) and not self.conn.lost:
                if reading is not None and not reading.done():  # (a read cut short would
                    try:  # lose the message's place)
                        await asyncio.wrap_future(reading)
                    except Exception:  # noqa: S110 - (its CopyFail, say: the drain sees it)
                        pass
                await self._copy_drain(state)
            elif reading is not None:
                reading.cancel()
            if state.error is not None and state.error is not exc:
                raise timer.error(state.error) from None
            raise
        return Result(None, [], f"COPY {count}")

    async def _copy_chunk(self, state: _CopyState, whole: bool = False) -> bytes | None:
        """The client's next CopyData bodies, up to about :data:`_COPY_CHUNK` bytes joined
        (None: its CopyDone came), those it has sent (``whole``: waiting for that many or its
        CopyDone); its CopyFail raises (57014)."""
        if state.done:
            return None
        data: list[bytes] = []
        size = 0
        while size < _COPY_CHUNK:
            if data and not whole and len(self.conn.buffer) < 5:  # none waits: take these
                break
            kind, body = P.parse_copy_message(*await self._read_raw())
            if kind == "data":
                data.append(body)
                size += len(body)
            elif kind == "fail":
                state.done = True
                raise StatementError(f"COPY from stdin failed: {body.decode()}", "57014")
            elif kind == "done":
                state.done = True
                break
        if not data:
            return None
        return data[0] if len(data) == 1 else b"".join(data)

    async def _copy_drain(self, state: _CopyState) -> None:
        """Read and drop the client's COPY data up to its CopyDone or CopyFail."""
        while not state.done:
            try:
                if await self._copy_chunk(state) is None:
                    return
            except StatementError:
                return

    async def _send_rows(self, result: Result, formats: tuple[int, ...], max_rows: int,
                         portal: _Portal | None, *, describe: bool = True) -> bool:
        """:meth:`_send_result`, of a streamed result too: its rows are read a batch at a
        time and each batch sent before the next is read (waiting while the client has not
        taken what was sent), up to ``max_rows`` (0: all); True when all were sent. A
        failure ends the stream and raises (its ErrorResponse follows the rows sent)."""
        stream = result.stream
        if stream is None:
            return self._send_result(result, formats, max_rows, portal, describe=describe)
        assert self.engine is not None
        timer = _StatementTimer(self.engine, self.statement_timeout())
        sent = 0
        described = portal.described_columns if portal is not None else None
        columns = described if described is not None else result.columns
        try:
            if describe:
                self._send_result(Result(columns, [], ""), formats, 0, None, complete=False)
            while not max_rows or sent < max_rows:
                rows = stream.pending
                if not rows:
                    if self.conn.lost:
                        raise ConnectionError("the client went away")
                    got = await self.call(stream.next_rows)
                    if got is None:
                        break
                    rows = got
                take = len(rows) if not max_rows else min(len(rows), max_rows - sent)
                stream.pending = rows[take:]
                part = Result(result.columns, rows[:take], "")
                if described is not None:
                    _conform(part, described)
                part.columns = columns
                self._send_result(part, formats, 0, None, describe=False, complete=False)
                sent += take
                stream.sent += take
                if self.out_size > 1 << 16:
                    await self.flush()
                    await self.conn.drain()
        except BaseException as exc:
            err = await self._stream_failed(stream, exc, timer)
            if err is exc:
                raise
            raise err from None
        finally:
            timer.cancel()
        if portal is not None:
            portal.sent += sent
        if stream.pending or not stream.closed:
            self.send(P.PORTAL_SUSPENDED)
            return False
        await self._end_stream(stream)
        self.send(P.command_complete(stream.tag))
        return True

    async def _stream_failed(self, stream: Any, exc: BaseException,
                             timer: _StatementTimer) -> BaseException:
        """End ``stream``, which failed with ``exc`` while its rows were being sent; what to
        raise: ``exc`` when the client went away or the session is ending, else the
        StatementError the client is told (a value the binary format cannot carry: 22000;
        a cancel the statement timeout caused says so)."""
        if isinstance(exc, ConnectionError) or not isinstance(exc, Exception):
            await self._end_stream(stream, StatementError("the client went away", "08006"))
            return exc
        said = StatementError(str(exc), "22000") if isinstance(exc, ProtocolError) \
            else timer.error(statement_error(exc))
        err = said if isinstance(said, StatementError) else statement_error(exc)
        await self._end_stream(stream, err)
        return err

    async def _end_stream(self, stream: Any, error: StatementError | None = None) -> None:
        """Close ``stream`` (on the session's thread, after its batch) and write its
        access-log line: the rows it sent, or ``error``."""
        if not stream.closed:
            if self.executor is not None:
                try:
                    await self.executor.call(stream.close)
                except Exception as exc:  # (its error was said already)
                    log.debug("closing a stream failed: %s", exc)
            else:
                stream.close()
        entry, stream.log_entry = stream.log_entry, None
        if entry is None or self.server.access_log is None:
            return
        entry["duration_ms"] = round((time.monotonic() - entry["duration_ms"]) * 1000, 3)
        entry["rows"] = stream.sent
        if error is not None:
            entry.update(sqlstate=error.sqlstate, rows=0)
        await asyncio.to_thread(self.server.access_log.write, **entry)

    async def _drop_portal(self, portal: _Portal | None) -> None:
        """A portal closed (Close, Sync, a Bind in its place, the transaction's end): its
        stream ends, its held access-log line is written."""
        if portal is None:
            return
        if portal.result is not None and portal.result.stream is not None:
            await self._end_stream(portal.result.stream)
        if portal.log_entry is not None:
            await self._write_portal_log(portal)

    def _send_result(self, result: Result, formats: tuple[int, ...], max_rows: int,
                     portal: _Portal | None, *, describe: bool = True,
                     complete: bool = True) -> bool:
        """Send rows (and the RowDescription when ``describe``); True when all were sent.
        ``complete``: CommandComplete (or PortalSuspended) after them."""
        columns = result.columns
        if portal is not None and portal.described_columns is not None:
            columns = portal.described_columns
        fmts = [P.result_format(formats, i) for i in range(len(columns or []))] if formats \
            else [0] * len(columns or [])
        if describe and columns is not None:
            self.send(_row_description(tuple(columns), tuple(fmts)))
        start = portal.sent if portal else 0
        end = len(result.rows) if not max_rows else min(len(result.rows), start + max_rows)
        if columns is not None:
            rows = result.rows if start == 0 and end == len(result.rows) else \
                result.rows[start:end]
            oids = [o for _, o in columns]
            if not any(fmts):  # text: each column's values as PostgreSQL writes its type
                encoders = _types.text_encoders(oids, self.extra_float_digits)
                for i, write in _types.real_writers(oids, rows, self.extra_float_digits,
                                                    encoded=True).items():
                    encoders[i] = write  # (a real column's texts: a column at a time)
                for row in rows:
                    if len(row) != len(encoders):  # as zip(..., strict=True) below
                        raise ValueError(f"a row of {len(row)} values for {len(fmts)} columns")
                    self.send(P.data_row(list(map(operator.call, encoders, row))))
            else:
                digits = self.extra_float_digits
                for row in rows:
                    self.send(P.data_row([_types.encode_value(o, v, f, digits)
                                          for o, v, f in zip(oids, row, fmts, strict=True)]))
        if not complete:
            return True
        if portal is not None:
            portal.sent = end
            if end < len(result.rows):
                self.send(P.PORTAL_SUSPENDED)
                return False
        self.send(P.command_complete(result.tag))
        return True

    # -- extended query --------------------------------------------------------------------

    async def _extended(self, msg: P.Message) -> None:
        if isinstance(msg, P.Parse):
            if msg.name and msg.name in self.statements:
                raise StatementError(f'prepared statement "{msg.name}" already exists', "42P05")
            try:
                parts = _sqltext.split_statements(msg.sql)
                nparams = _sqltext.placeholders(msg.sql)
            except ServerError as exc:
                raise StatementError(str(exc), "42601") from None
            if len(parts) > 1:
                raise StatementError("cannot insert multiple commands into a prepared "
                                     "statement", "42601")
            if nparams > P.MAX_PARAMETERS:
                raise StatementError("too many parameters", "54000")
            arrays = [i + 1 for i, oid in enumerate(msg.param_types) if oid in _types.ARRAY_TYPES]
            if arrays:
                raise StatementError(
                    f"array parameters are not supported (${arrays[0]} is an array)", "0A000",
                    hint="one parameter per value: IN ($1, $2, ...) (SQLAlchemy's in_() "
                    "sends them so)")
            self.statements[msg.name] = _Statement(parts[0] if parts else "", msg.param_types,
                                                   max(nparams, len(msg.param_types)))
            self.send(P.PARSE_COMPLETE)
        elif isinstance(msg, P.Bind):
            st = self._statement(msg.statement)
            if msg.portal and msg.portal in self.portals:
                raise StatementError(f'portal "{msg.portal}" already exists', "42P03")
            if len(msg.params) != st.nparams:
                raise StatementError(f"bind message supplies {len(msg.params)} parameters, "
                                     f"but the statement requires {st.nparams}", "08P01")
            formats = [P.result_format(msg.param_formats, i) for i in range(len(msg.params))]
            untyped = [v is not None and not (i < len(st.param_types) and st.param_types[i])
                       for i, v in enumerate(msg.params)]
            if not st.typed and any(
                    u and (formats[i] == 1 or _zoned(msg.params[i]))
                    for i, u in enumerate(untyped)):
                # binary data of no type (node-postgres sends a Buffer so), or a date or
                # timestamp with a zone (JDBC's setDate, setTimestamp): read it as the type
                # its place gives, as PostgreSQL does
                await self._infer_parameters(st)
            try:
                values = [self._bind_value(st, i, v, formats[i], untyped[i])
                          for i, v in enumerate(msg.params)]
            except ProtocolError as exc:  # (a date's field out of range: 22008, ...)
                raise StatementError(str(exc), getattr(exc, "sqlstate", "22P02")) from None
            await self._drop_portal(self.portals.get(msg.portal))
            self.portals[msg.portal] = _Portal(st, values, msg.result_formats)
            self.send(P.BIND_COMPLETE)
        elif isinstance(msg, P.Describe):
            if msg.kind == "S":
                st = self._statement(msg.name)
                if not st.described:
                    assert self.engine is not None
                    head = (_sqltext.first_words(st.sql, 1) or [""])[0]
                    if _is_copy(st.sql):
                        st.columns = None  # its rows travel in CopyData, not DataRows
                    elif _pgsession.answers(st.sql, self.server.engine.transactions):
                        st.columns = _pgsession.columns(st.sql, self)
                    elif self.server.authenticator is not None and \
                            _systables.handles(st.sql) and \
                            not self.server.authenticator.handles(st.sql):
                        st.columns = (await self._timed(
                            _systables.query, st.sql, [None] * st.nparams, self.engine,
                            self._user_store())).columns
                    elif _infoschema.handles(st.sql) or (
                            _pgtables.handles(st.sql) and not _pgcatalog.answers(st.sql)):
                        query = _infoschema.query if _infoschema.handles(st.sql) \
                            else _pgtables.query
                        st.columns = (await self._timed(
                            query, st.sql, [None] * st.nparams, self.engine,
                            self.privileges)).columns
                    elif head in ("DECLARE", "FETCH", "MOVE", "CLOSE"):
                        st.columns = None
                        if head == "FETCH":
                            from ._cursors import parse_fetch

                            cursor = self.portals.get(parse_fetch(st.sql).name)
                            if cursor is not None and cursor.result is not None:
                                st.columns = cursor.result.columns
                    elif _sqltext.first_words(st.sql, 1) and self.server.handles(st.sql):
                        st.columns = None
                        if _sqltext.first_words(st.sql, 1)[0] in ("SELECT", "SHOW"):
                            listed = await self.server.handle_statement(self, st.sql, [])
                            st.columns = listed.columns if listed is not None else None
                    else:
                        text, renames = self._identity(
                            self._execute_text(st.sql) if head == "EXECUTE" else st.sql)
                        st.columns = await self._timed(self.engine.describe, text)
                        if head in _NAMED and st.columns:
                            st.columns = _parameter_names(text, st.columns, renames)
                        if renames and st.columns is not None:
                            st.columns = _rename(st.columns, renames)
                    st.described = True
                if not st.typed:
                    await self._infer_parameters(st)
                st.told = True
                self.send(P.parameter_description(
                    [st.param_types[i] if i < len(st.param_types) and st.param_types[i]
                     else _types.TEXT for i in range(st.nparams)]))
                self.send(P.row_description([(n, o, 0) for n, o in st.columns])
                          if st.columns is not None else P.NO_DATA)
            else:
                portal = self._portal(msg.name)
                if portal.result is None and _is_copy(portal.statement.sql):
                    self.send(P.NO_DATA)  # COPY runs at Execute
                    return
                if portal.result is None:
                    self._open_pipeline(portal.statement.sql, msg.name)
                    portal.result = await self._logged(portal.statement.sql, functools.partial(
                        self._run_statement, portal.statement.sql, portal.params, stream=True),
                        portal)
                columns = portal.result.columns
                if portal.statement.described and portal.statement.columns is not None \
                        and columns is not None \
                        and len(portal.statement.columns) == len(columns):
                    _conform(portal.result, portal.statement.columns)
                    portal.described_columns = columns = portal.statement.columns
                if columns is None:
                    self.send(P.NO_DATA)
                else:
                    self.send(P.row_description(
                        [(n, o, P.result_format(portal.result_formats, i))
                         for i, (n, o) in enumerate(columns)]))
        elif isinstance(msg, P.Execute):
            portal = self._portal(msg.portal)
            if not portal.statement.sql:
                self.send(P.EMPTY_QUERY)
                return
            if portal.result is not None and portal.result.stream is not None:
                new_statement = getattr(self.engine, "new_statement", None)
                if new_statement is not None:  # a cancel sent while it was suspended is
                    new_statement()  # not for this Execute
            if portal.result is None:
                self._open_pipeline(portal.statement.sql, msg.portal)
            if portal.result is None and _is_copy(portal.statement.sql):
                portal.result = await self._copy(portal.statement.sql)
            elif portal.result is None:
                portal.result = await self._logged(portal.statement.sql, functools.partial(
                    self._run_statement, portal.statement.sql, portal.params, stream=True),
                        portal)
                st = portal.statement
                if st.described and st.columns is not None and portal.result.columns is not None \
                        and len(st.columns) == len(portal.result.columns):
                    _conform(portal.result, st.columns)
                    portal.described_columns = st.columns
            try:
                done = await self._send_rows(portal.result, portal.result_formats,
                                             msg.max_rows, portal, describe=False)
            except StatementError:
                self.portals.pop(msg.portal, None)  # (its stream ended with the error)
                raise
            except ProtocolError as exc:
                err = _encoding_error(exc)
                await self._write_portal_log(portal, err)
                raise err from None
            if done and portal.log_entry is not None:
                await self._write_portal_log(portal)
        elif isinstance(msg, P.Close):
            if msg.kind == "S":
                self.statements.pop(msg.name, None)
            else:
                dropped = self.portals.pop(msg.name, None)
                self.cursors.pop(msg.name, None)
                await self._drop_portal(dropped)
            self.send(P.CLOSE_COMPLETE)

    @staticmethod
    def _bind_value(st: _Statement, i: int, data: bytes | None, fmt: int,
                    untyped: bool) -> Any:
        """Bind's parameter ``i`` as a value, by its type (the client's, or the one its
        place gives it: :meth:`_infer_parameters`). Binary data of no type
        the context settles is bytea (what node-postgres sends binary: a Buffer), unless a
        Describe told the client it is text (asyncpg sends text so)."""
        oid = st.param_types[i] if i < len(st.param_types) else 0
        if untyped and fmt == 1 and not oid and not st.told:
            oid = _types.BYTEA
        return _types.decode_param(oid, data, fmt)

    def statement_timeout(self) -> float | None:
        """The statement timeout of this session's statements (None: none): the one the
        session set, or the server's, whichever is shorter (a session cannot lift the
        server's limit)."""
        limits = [t for t in (self.session_timeout, self.server.statement_timeout) if t]
        return min(limits) if limits else None

    async def _infer_parameters(self, st: _Statement) -> None:
        """Give the parameters the client left untyped the type their context gives (as
        PostgreSQL does at Parse; here at the first Describe, which clients that encode
        parameters by type send): the Describe says it, and later Binds read values by it."""
        st.typed = True
        given = list(st.param_types) + [0] * (st.nparams - len(st.param_types))
        if all(given) or self.engine is None:
            return
        if self.server.authenticator is not None and _systables.handles(st.sql):
            inferred = _systables.parameter_types(st.sql, st.nparams)
        else:
            inferred = await self._timed(self.engine.parameter_types, st.sql, st.nparams,
                                         self._visible())
        st.param_types = tuple(g or i for g, i in zip(given, inferred, strict=True))

    def _visible(self) -> Callable[[str], bool]:
        """Whether the session's user may see a table (has any grant on it): the tables
        a statement's parameters and literals are typed by."""
        privileges = self.privileges

        def visible(table: str) -> bool:
            return privileges is None or any(privileges.allowed(table, action) for action in
                                             ("SELECT", "INSERT", "UPDATE", "DELETE"))

        return visible

    def _statement(self, name: str) -> _Statement:
        try:
            return self.statements[name]
        except KeyError:
            raise StatementError(f'prepared statement "{name}" does not exist', "26000") \
                from None

    def _portal(self, name: str) -> _Portal:
        try:
            return self.portals[name]
        except KeyError:
            raise StatementError(f'portal "{name}" does not exist', "34000") from None


def _conform(result: Result, described: list[tuple[str, int]]) -> None:
    """``result``'s rows as the Describe typed them before the statement ran, where it gave
    a column another type than the rows have (SQLite's computed columns: :mod:`._exprtypes`),
    so the rows are sent as described; a value the type cannot hold fails the statement."""
    assert result.columns is not None
    change = [(i, oid) for i, ((_, oid), (_, had)) in
              enumerate(zip(described, result.columns, strict=True)) if oid != had]
    if not change or not result.rows:
        return
    rows = []
    for row in result.rows:
        values = list(row)
        for i, oid in change:
            try:
                values[i] = _types.conform(oid, values[i])
            except ValueError as exc:
                raise StatementError(*exc.args) from None
        rows.append(tuple(values))
    result.rows = rows


def _scan_forward() -> StatementError:
    return StatementError("cursor can only scan forward", "55000",
                          hint="declare it with SCROLL to move backward (psycopg: "
                          "scrollable=True); a cursor without SCROLL reads its rows as "
                          "FETCH asks for them")


def _savepoint_name(sql: str) -> str | None:
    """The savepoint SAVEPOINT, RELEASE or ROLLBACK TO names (folded as PostgreSQL folds a
    name: lower case unless quoted)."""
    m = re.search(r'(?:SAVEPOINT\s+)?("(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)\s*;?\s*$', sql)
    if m is None:
        return None
    token = m[1]
    return token[1:-1].replace('""', '"') if token.startswith('"') else token.lower()


def _ends_transaction(sql: str) -> bool:
    """``COMMIT``, ``END``, ``ROLLBACK`` or ``ABORT`` (not ``ROLLBACK TO``)."""
    words = _sqltext.first_words(sql, 3)
    return bool(words) and words[0] in ("COMMIT", "END", "ROLLBACK", "ABORT") \
        and "TO" not in words[1:]
