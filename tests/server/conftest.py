"""A server running in a background thread's event loop, for real clients in the test."""

from __future__ import annotations

import os

# psycopg's binary wheel bundles its own OpenSSL, whose symbols mix with the system
# OpenSSL that Python's ssl module (the server side, in this same process) has loaded:
# freeing a TLS context then corrupts the heap. The pure-Python psycopg uses the system
# libpq (Debian's libpq5, with postgresql-client), linked to the same OpenSSL as Python.
os.environ["PSYCOPG_IMPL"] = "python"

import asyncio
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from cryptdisk.keys import Key, Keyring
from cryptdisk.server import (
    AnalyticalEngine,
    ScramAuthenticator,
    Server,
    SQLiteEngine,
    UserStore,
    end_point_hash,
    new_event_loop,
    server_context,
)
from tests.server.certs import der, make_ca_and_server

#: The admin user every secure test server has (SCRAM, 4096 iterations to keep tests fast).
USER, PASSWORD = "u", "pw"


class ServerThread:
    def __init__(self, server: Server, plain_asyncio: bool = False) -> None:
        self.server = server
        # uvloop's where installed, as cryptdisk serve's; plain_asyncio: asyncio's own
        self.loop = asyncio.new_event_loop() if plain_asyncio else new_event_loop()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.stop_event = asyncio.Event()
        try:
            self.loop.run_until_complete(
                self.server.serve(self.stop_event, ready=lambda a: self.ready.set()))
        except BaseException as exc:
            self.error = exc
            self.ready.set()
        finally:
            self.loop.close()

    def start(self) -> ServerThread:
        self.thread.start()
        self.ready.wait(60)
        if self.error:
            raise self.error
        return self

    dsn: dict[str, Any]

    @property
    def port(self) -> int:
        assert self.server.address is not None
        return self.server.address[1]

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stop_event.set)
            self.thread.join(60)


@pytest.fixture
def keyring() -> Keyring:
    return Keyring([Key(1, bytes(range(32)))])


@pytest.fixture
def analytical(tmp_path: Any) -> AnalyticalEngine:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated-key warning
        return AnalyticalEngine(tmp_path / "a.db")


def pytest_generate_tests(metafunc: Any) -> None:
    """``sqlite_engine`` in each journal mode a module lists in ``SQLITE_JOURNALS`` (default:
    SQLite's own, a rollback journal); WAL mode takes the server's other paths (group commit,
    writes and COMMIT on the event loop)."""
    journals = getattr(metafunc.module, "SQLITE_JOURNALS", None)
    if journals and "sqlite_journal" in metafunc.fixturenames:
        metafunc.parametrize("sqlite_journal", journals)


@pytest.fixture
def sqlite_journal() -> str:
    return "delete"


@pytest.fixture
def sqlite_engine(tmp_path: Any, keyring: Keyring, sqlite_journal: str) -> SQLiteEngine:
    engine = SQLiteEngine(tmp_path / "s.db", keyring)
    if sqlite_journal != "delete":
        session = engine.open_session()
        session.run(f"PRAGMA journal_mode={sqlite_journal}", [])
        session.close()
    return engine


@pytest.fixture
def certs(tmp_path: Any) -> tuple[Any, Any, Any]:
    """(ca.pem, server.pem, server.key): a CA the tests make and a localhost certificate."""
    (tmp_path / "tls").mkdir()
    return make_ca_and_server(tmp_path / "tls")


@pytest.fixture
def start_server(certs: tuple[Any, Any, Any], tmp_path: Any) -> Iterator[Any]:
    """start(engine, secure=True, plain_asyncio=False, **Server options): TLS with the test
    CA and SCRAM logins for USER/PASSWORD; secure=False: plaintext on loopback, no
    authentication; plain_asyncio: on asyncio's own event loop even where uvloop is installed."""
    started: list[ServerThread] = []
    stores: list[UserStore] = []
    ca, cert, key = certs

    def start(engine: Any, secure: bool = True, plain_asyncio: bool = False,
              **options: Any) -> ServerThread:
        options.setdefault("port", 0)
        if secure:
            store = UserStore(tmp_path / f"users{len(started)}", engine.keyring,
                              iterations=4096)
            stores.append(store)
            store.set_user(USER, PASSWORD, admin=True, create=True)
            options.setdefault("ssl_context", server_context(cert, key))
            options.setdefault("authenticator", ScramAuthenticator(
                store, channel_binding=end_point_hash(der(cert)), delay=0.01, max_delay=0.05))
        else:
            options.setdefault("plaintext_loopback", True)
        t = ServerThread(Server(engine, **options), plain_asyncio).start()
        t.dsn = {"host": "localhost", "port": t.port, "user": USER, "password": PASSWORD,
                 "dbname": "db", "sslmode": "verify-full", "sslrootcert": str(ca)}
        started.append(t)
        return t

    yield start
    for t in started:
        t.stop()
    for store in stores:  # (their lock file: two descriptors each, kept open until closed)
        store.close()


#: A statement that runs until it is cancelled or times out.
ENDLESS = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) "
           "SELECT count(*) FROM n")


def cancel_running(srv: ServerThread, conn: Any, sql: str = ENDLESS) -> list[BaseException]:
    """Run ``sql`` on the psycopg connection ``conn`` in a thread, send CancelRequests once
    the server has it running until the statement ends, and return what it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            conn.execute(sql)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    while not any(s.busy for s in list(srv.server.sessions)):  # the statement is running
        worker.join(0.01)
    for _ in range(120):  # a cancel that lands before the engine starts is a no-op: repeat
        conn.cancel_safe()
        worker.join(1)
        if not worker.is_alive():
            break
    assert not worker.is_alive()
    return errors


def masked_reader(srv: ServerThread, table: str, column: str) -> dict[str, Any]:
    """Make user ``bob`` (password ``bob pw``) a reader of ``table`` whose VARCHAR
    ``column`` is masked to ``***`` (the engine has a PolicyStore); the connection
    arguments to log in as bob."""
    import psycopg

    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        for st in ["CREATE USER bob PASSWORD 'bob pw'", f"GRANT SELECT ON {table} TO bob",
                   "GRANT APPLY POLICY TO u",
                   "CREATE MASKING POLICY m AS (v VARCHAR) RETURNS VARCHAR -> '***'",
                   f"ALTER TABLE {table} ALTER {column} SET MASKING POLICY m"]:
            c.execute(st)
    return {**srv.dsn, "user": "bob", "password": "bob pw"}
