"""The listening server: accepts connections, runs a :class:`Session` for each, drains on stop."""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import signal
import ssl
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import ServerError
from . import _infoschema, _openfiles, _pgsession, _pgtables, _sqltext, _systables
from ._accesslog import AccessLog
from ._conn import Connection, Listener
from ._engines import TRANSACTION_WORDS, Engine, Result
from ._session import IDENTITY_WORDS, LIFTABLE, Session, is_loopback

__all__ = ["DEFAULT_MAX_MESSAGE_SIZE", "Authenticator", "Server", "new_event_loop"]

log = logging.getLogger("cryptdisk.server")

_UNPLANNED: Any = object()

DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024
#: seconds a client accepted on the spare descriptor has to send its startup message
SPARE_LOGIN_TIMEOUT = 5.0


def _table_id(engine: Any, name: str) -> str | None:
    """The catalog id of the analytical engine's table ``name`` (any case) names now."""
    meta = engine.db.catalog.tables.get(name)
    return None if meta is None else str(meta.id)


def _nothing() -> None:
    pass


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop for a :class:`Server`: uvloop's when uvloop is installed (libuv, with
    its loop machinery compiled: a query costs fewer instructions), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class Authenticator(Protocol):
    """Checks a client's credentials during startup (SCRAM: :class:`._auth.ScramAuthenticator`).

    ``login`` talks to the client through the session (``session.send``,
    ``session.read_password_message``) and raises :class:`cryptdisk.LoginError`
    on failure, with one message whatever the cause.
    """

    async def login(self, session: Session, user: str) -> None: ...

    def is_admin(self, user: str) -> bool: ...

    def handles(self, sql: str) -> bool: ...

    def handle(self, session: Session, sql: str) -> Result | None: ...

    def privileges(self, user: str) -> Any:
        """What ``user`` may do (:class:`._grants.Privileges`), given to its engine session."""

    def dry_run(self) -> Authenticator:
        """An authenticator whose ``handle`` applies statements to a scratch copy of its
        users (the check of a query's statements before any runs); its ``store`` is that
        copy."""

    def transaction(self) -> Authenticator:
        """An authenticator whose ``handle`` applies statements to a view of its users for
        one transaction (saving nothing); its ``store.ops`` are what the COMMIT applies with
        ``store.parent.apply``."""


class Server:
    """Serve ``engine`` over the PostgreSQL v3 protocol.

    ``ssl_context`` (a server-side :class:`ssl.SSLContext`) enables TLS; without
    one, ``plaintext_loopback=True`` must be given and only loopback clients are
    served. ``authenticator`` checks logins (None: no authentication, refused
    unless the server listens on loopback only). Timeouts are in seconds, 0 for
    none: ``login_timeout`` from connect to logged in, ``idle_timeout`` between
    statements (the session is closed, 57P05), ``statement_timeout`` per
    statement (it is interrupted, 57014). ``access_log`` gets a line per statement.
    """

    def __init__(self, engine: Engine, *, host: str = "127.0.0.1", port: int = 5432,
                 ssl_context: ssl.SSLContext | None = None, plaintext_loopback: bool = False,
                 authenticator: Authenticator | None = None,
                 max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                 max_connections: int = 100, login_timeout: float = 60.0,
                 idle_timeout: float = 0, statement_timeout: float = 0,
                 access_log: AccessLog | None = None,
                 max_copy_size: int = 1 << 30) -> None:
        if ssl_context is None and not plaintext_loopback:
            raise ServerError("no TLS certificate configured and plaintext is not allowed",
                              hint="give --cert/--key (or [server] cert/key), or "
                              "--self-signed for a quick start")
        if authenticator is None and not is_loopback(host):
            raise ServerError("a server without users may listen on loopback only")
        if max_message_size < 1024:
            raise ServerError("max_message_size must be at least 1024 bytes")
        self.engine = engine
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.plaintext_loopback = plaintext_loopback
        self.authenticator = authenticator
        self.max_message_size = max_message_size
        self.max_connections = max_connections
        self.login_timeout = login_timeout
        self.idle_timeout = idle_timeout or None          # 0: no limit
        self.statement_timeout = statement_timeout or None
        self.access_log = access_log
        self.max_copy_size = max_copy_size
        self.draining = False
        self.sessions: set[Session] = set()
        self._by_pid: dict[int, Session] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._listener: Listener | None = None
        self.address: tuple[str, int] | None = None
        #: in a worker process (:func:`._workers.run_workers`): what the workers share, and
        #: the listening sockets the supervisor bound
        self.workers: Any = None
        self.sockets: list[Any] | None = None
        #: what SIGHUP reloads the TLS certificate with: a new context and its
        #: tls-server-end-point hash (``cryptdisk serve`` sets it from its settings)
        self.reload_tls: Callable[[], tuple[ssl.SSLContext, bytes | None]] | None = None
        #: called before each message a session reads: picks up changes other processes
        #: made to the users (and grants, roles)
        self.refresh: Callable[[], None] = getattr(authenticator, "refresh", None) or _nothing
        #: the engine takes integer literals as parameters (SQLite: a statement's shape is
        #: prepared once, :func:`._sqltext.lift_literals`)
        self.engine_lifts_literals = bool(getattr(engine, "lifts_literals", False))
        self._engine_statements: dict[str, bool] = {}
        self._query_plans: dict[bytes, _sqltext.QueryPlan | None] = {}

    # -- hooks the session calls ----------------------------------------------------------------

    def new_pid(self) -> int:
        """A process id for a new session's BackendKeyData (its cancel requests name it)."""
        if self.workers is not None:
            pid: int = self.workers.new_pid(self._by_pid)
            return pid
        return secrets.randbits(31)

    def register(self, session: Session) -> None:
        self.sessions.add(session)
        self._by_pid[session.pid] = session

    def unregister(self, session: Session) -> None:
        self.sessions.discard(session)
        if self._by_pid.get(session.pid) is session:
            del self._by_pid[session.pid]

    def cancel(self, pid: int, key: int) -> None:
        workers = self.workers
        if workers is not None and workers.owner(pid) != workers.slot:
            workers.forward_cancel(pid, key)  # another worker's session
            return
        session = self._by_pid.get(pid)
        if session is not None and session.cancel_key == key and session.engine is not None:
            session.engine.interrupt()

    def is_admin(self, user: str) -> bool:
        return self.authenticator is None or self.authenticator.is_admin(user)

    def _policies(self, sql: str) -> Any:
        """The engine's policy store if it runs ``sql`` (masking and row access policies)."""
        policies = getattr(self.engine, "policies", None)
        return policies if policies is not None and policies.handles(sql) else None

    def handles(self, sql: str) -> bool:
        return self._policies(sql) is not None or (
            self.authenticator is not None and self.authenticator.handles(sql))

    def engine_statement(self, shape: str) -> bool:
        """Whether a statement of this shape (a SELECT, UPDATE, DELETE or INSERT with its
        integer literals lifted) goes to the engine as it is: no catalog, information_schema,
        user, role, grant or policy statement the server answers, no ``current_user`` to
        write in. Depends on the text alone, so it is asked once per shape."""
        known = self._engine_statements.get(shape)
        if known is None:
            known = ("pg_cursors" not in shape and "pg_catalog." not in shape
                     and not self.handles(shape) and not _infoschema.handles(shape)
                     and not _systables.handles(shape)
                     and not _pgsession.answers(shape) and not _pgtables.handles(shape)
                     and IDENTITY_WORDS.search(shape) is None)
            if len(self._engine_statements) >= 4096:
                self._engine_statements.clear()
            self._engine_statements[shape] = known
        return known

    def query_plan(self, sql: str) -> _sqltext.QueryPlan | None:
        """A simple query's :class:`._sqltext.QueryPlan`, worked out once per
        :func:`._sqltext.digit_key` (the text alone decides it): its one statement, and
        that statement's shape when the engine runs it with its integers lifted
        (:meth:`engine_statement`); None for a query the session splits itself."""
        key = _sqltext.digit_key(sql)
        known = self._query_plans.get(key, _UNPLANNED)
        if known is not _UNPLANNED:
            return known  # type: ignore[no-any-return]
        plan = _sqltext.query_plan(sql)
        if plan is not None and plan.shape is not None and not (
                self.engine_lifts_literals and plan.head in LIFTABLE
                and self.engine_statement(plan.shape)):
            plan = plan._replace(shape=None, spans=())
        if plan is not None and plan.shape is None and plan.head in TRANSACTION_WORDS \
                and self.engine.transactions \
                and not self.handles(sql[plan.start:plan.end]):
            plan = plan._replace(transaction=True)
        if len(self._query_plans) >= 4096:
            self._query_plans.clear()
        self._query_plans[key] = plan
        return plan

    async def handle_statement(self, session: Session, sql: str,
                               params: list[Any]) -> Result | None:
        policies = self._policies(sql)
        if policies is not None:
            # under the session's statement timeout: it or a CancelRequest ends the
            # statement's wait for the engine (57014), as any statement's
            return await session.bounded(policies.handle, session, sql)
        if self.authenticator is None or not self.authenticator.handles(sql):
            return None
        return await asyncio.to_thread(self.authenticator.handle, session, sql)

    # -- running ----------------------------------------------------------------------------------

    async def _client(self, conn: Connection) -> None:
        task = asyncio.current_task()
        log.debug("connection from %s", conn.get_extra_info("peername"))
        assert task is not None
        self._tasks.add(task)
        try:
            connections = len(self._tasks) if self.workers is None else self.workers.total()
            session = Session(self, conn)
            if conn.spare:  # accepted on the listener's spare descriptor: none is left
                session.refuse = (_openfiles.SQLSTATE,
                                  _openfiles.message("for a new connection"))
                session.refuse_hint = _openfiles.HINT
                # (the spare is back once this client is gone: a silent one holds it briefly)
                session.login_timeout = min(self.login_timeout, SPARE_LOGIN_TIMEOUT)
            elif self.draining or connections > self.max_connections:
                session.refuse = (("57P03", "the server is shutting down") if self.draining
                                  else ("53300", "sorry, too many clients already"))
                if connections > 2 * self.max_connections:
                    # as many again wait for their startup message (up to login_timeout)
                    # to be refused; beyond that at once, as PostgreSQL does past its
                    # limit of children: a flood of idle sockets holds no descriptors
                    await self._refuse_now(conn, *session.refuse)
                    return
            await session.run()
        except Exception:
            log.exception("session failed")
            conn.abort()  # never left open with nobody reading it
        finally:
            self._tasks.discard(task)

    async def _refuse_now(self, conn: Connection, code: str, text: str) -> None:
        """Send the FATAL error before any TLS (the client may not read it) and close."""
        from . import _protocol as P

        conn.write(P.error_response(code, text, severity="FATAL"))
        try:
            await asyncio.wait_for(conn.drain(), 5)
        finally:
            conn.close()

    def _forget_dropped(self, store: Any) -> None:
        """Remove the grants (and on the analytical engine the policy attachments) of names
        no table has (tables dropped while this server did not run, by an embedded
        connection), so a table created later with the name gets none of them."""
        if getattr(self.engine, "name", None) == "sqlite":
            if store is not None and hasattr(store, "forget_table_grants"):
                session = self.engine.open_session()
                try:
                    gone = session.forget_table_grants(store)  # type: ignore[attr-defined]
                finally:
                    session.close()
                for name in gone:
                    log.info("grants on %s removed: no table has the name", name)
            return
        db = getattr(self.engine, "db", None)
        if db is None:
            return
        if store is not None and hasattr(store, "forget_table_grants"):
            # a grant whose table id is not the table's under its name now is never applied
            store.table_id = functools.partial(_table_id, self.engine)
        if getattr(db, "read_only", False):
            return
        ids = {t.lower(): meta.id for t, meta in db.catalog.tables.items()}
        # (a view with its owner's rights takes grants: reading it needs SELECT on it)
        tables = set(ids) | {v.lower() for v, meta in db.catalog.views.items()
                             if not meta.security_invoker}
        if store is not None and hasattr(store, "forget_table_grants"):
            for name in store.forget_table_grants(tables, ids):
                log.info("grants on %s removed: no table has the name, or another table "
                         "has it than the one granted on", name)
        policies = getattr(self.engine, "policies", None)
        if policies is not None:
            for name in policies.forget_dropped():
                log.info("policy attachments of %s removed: no table has the name", name)

    async def start(self) -> tuple[str, int]:
        store = getattr(self.authenticator, "store", None)
        if store is not None and getattr(store, "journal", None) is not None:
            store.recover()  # user changes committed with the data, not saved: save them
        self._forget_dropped(store)
        self._listener = Listener(asyncio.get_running_loop(), self._client, self.workers)
        if self.sockets is not None:
            self._listener.adopt(self.sockets)
        else:
            try:
                await self._listener.listen(self.host, self.port)
            except OSError as exc:  # (as the supervisor of workers says it)
                raise ServerError(f"cannot listen on {self.host}:{self.port}: "
                                  f"{exc.strerror or exc}") from None
        sock = self._listener.sockets[0].getsockname()
        self.address = (sock[0], sock[1])
        log.info("listening on %s:%d", *self.address)
        return self.address

    async def drain(self, timeout: float = 30.0) -> None:
        """Stop accepting; let in-flight statements finish; close idle sessions; wait."""
        self.draining = True
        if self._listener is not None:
            self._listener.close()
        busy = {s.task for s in self.sessions if s.busy}
        for task in set(self._tasks) - busy:
            task.cancel()  # idle, or still logging in: told 57P01 and closed
        log.debug("draining: %d connections, %d busy", len(self._tasks), len(busy))
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            log.debug("drained: %d left", len(pending))
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)

    def reload(self) -> None:
        """SIGHUP: load the TLS certificate and key (and client CA) again from their files,
        for the connections made from now on, and reopen a plain access log (after
        logrotate moved it). What fails to load is logged, and what was loaded stays."""
        if self.reload_tls is not None:
            try:
                ctx, binding = self.reload_tls()
            except (ServerError, OSError, ValueError) as exc:
                log.error("reload: %s; the certificate loaded before stays in use", exc)
            else:
                self.ssl_context = ctx
                if self.authenticator is not None and hasattr(self.authenticator,
                                                              "channel_binding"):
                    self.authenticator.channel_binding = binding
                log.info("reload: TLS certificate loaded")
        reopen = getattr(self.access_log, "reopen", None)
        if reopen is not None:
            try:
                reopen()
            except OSError as exc:
                log.error("reload: cannot reopen the access log: %s; writing to the old one",
                          exc)
            else:
                log.info("reload: access log reopened")

    def run(self, ready: Callable[[tuple[str, int]], None] | None = None) -> None:
        """:meth:`serve` on a loop of its own (:func:`new_event_loop`) until SIGTERM or
        SIGINT, then drain; returns when every session is closed."""
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            runner.run(self.serve(ready=ready))

    async def serve(self, stop: asyncio.Event | None = None,
                    ready: Callable[[tuple[str, int]], None] | None = None) -> None:
        """Serve until ``stop`` is set (or SIGTERM/SIGINT in the main thread), then drain."""
        address = await self.start()
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        installed = []
        for sig, handler in ((signal.SIGTERM, stop.set), (signal.SIGINT, stop.set),
                             (signal.SIGHUP, self.reload)):
            try:
                loop.add_signal_handler(sig, handler)
                installed.append(sig)
            except (RuntimeError, ValueError):  # not the main thread
                break
        if installed:  # a worker is forked with them blocked until now (see ._workers)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, installed)
        if self.workers is not None:
            self.workers.attach(loop, self, stop.set)
        if ready is not None:
            ready(address)
        try:
            await stop.wait()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self.drain()
            self.engine.close()
            if self.access_log is not None:
                self.access_log.close()
