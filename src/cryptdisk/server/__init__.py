"""``cryptdisk serve``: the databases over the PostgreSQL v3 protocol, with TLS and SCRAM logins.

::

    from cryptdisk.server import AnalyticalEngine, Server

    server = Server(AnalyticalEngine("sales.db"), ssl_context=ctx, authenticator=users)
    asyncio.run(server.serve())

See ``docs/server.md`` for what is implemented and how to connect.
"""

from ._engines import AnalyticalEngine, Engine, EngineSession, Result, SQLiteEngine
from ._server import DEFAULT_MAX_MESSAGE_SIZE, Authenticator, Server

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "AnalyticalEngine",
    "Authenticator",
    "Engine",
    "EngineSession",
    "Result",
    "SQLiteEngine",
    "Server",
]
