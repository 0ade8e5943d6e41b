"""``cryptdisk serve``: the databases over the PostgreSQL v3 protocol, with TLS and SCRAM logins.

::

    from cryptdisk.server import AnalyticalEngine, ScramAuthenticator, Server, UserStore
    from cryptdisk.server import server_context

    engine = AnalyticalEngine("sales.db")
    users = ScramAuthenticator(UserStore("sales.db.users", engine.keyring))
    server = Server(engine, ssl_context=server_context("cert.pem", "key.pem"),
                    authenticator=users)
    server.run()  # until SIGTERM; or: await server.serve() on a loop of yours

The server runs on uvloop's event loop when uvloop is installed (``new_event_loop``).
``run_workers(server, n)`` serves with ``n`` forked worker processes instead (``cryptdisk
serve --workers``; encrypted SQLite only), each running ``server`` on its own loop.

Each session's identity and roles: ``session.privileges`` (also
``engine_session.privileges``), a :class:`Privileges` with ``session_user``,
``current_user`` (after ``SET ROLE``), ``roles`` (current_user and every role
it belongs to, transitively), ``has_role(name)`` and ``admin``; None on a
server without users. ``UserStore.member_of(name)`` answers the same for any
user or role.

Masking and row access policies (``CREATE MASKING POLICY``, ...) of the analytical
engine: ``engine.policies = PolicyStore("sales.db.policies", engine.keyring, engine,
audit=AuditLog("sales.db.audit", engine.keyring))`` (the audit log of decryptions).

See ``docs/server.md`` for how to connect, ``docs/server-protocol.md`` for the protocol
and catalogs, ``docs/server-types.md`` for types, and ``docs/server-operations.md`` for workers,
the access log, transactions and what is not implemented.
"""

from ._accesslog import AccessLog
from ._audit import AuditLog
from ._engines import AnalyticalEngine, Engine, EngineSession, Result, SQLiteEngine
from ._grants import Privileges
from ._policies import PolicyStore
from ._scram import DEFAULT_ITERATIONS, ScramServer, Verifier, make_verifier
from ._server import DEFAULT_MAX_MESSAGE_SIZE, Authenticator, Server, new_event_loop
from ._tls import (
    certificate_fingerprint,
    end_point_hash,
    ensure_self_signed,
    load_tls,
    self_signed,
    server_context,
)
from ._users import ScramAuthenticator, UserStore
from ._workers import MAX_WORKERS, default_workers, run_workers

__all__ = [
    "DEFAULT_ITERATIONS",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "MAX_WORKERS",
    "AccessLog",
    "AnalyticalEngine",
    "AuditLog",
    "Authenticator",
    "Engine",
    "EngineSession",
    "PolicyStore",
    "Privileges",
    "Result",
    "SQLiteEngine",
    "ScramAuthenticator",
    "ScramServer",
    "Server",
    "UserStore",
    "Verifier",
    "certificate_fingerprint",
    "default_workers",
    "end_point_hash",
    "ensure_self_signed",
    "load_tls",
    "make_verifier",
    "new_event_loop",
    "run_workers",
    "self_signed",
    "server_context",
]
