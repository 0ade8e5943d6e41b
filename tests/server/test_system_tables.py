"""system.users, system.roles and system.grants read as tables by any query: column lists,
WHERE, ORDER BY, joins between them and parameters, on both engines, through psycopg
(simple and extended protocol), asyncpg, pg8000 and a query of several statements."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import asyncpg
import pg8000.native
import psycopg
import pytest

ENGINES = ["analytical", "sqlite_engine"]


def connect(srv: Any, user: str | None = None, password: str | None = None) -> Any:
    dsn = dict(srv.dsn)
    if user is not None:
        dsn.update(user=user, password=password)
    return psycopg.connect(**dsn, autocommit=True)


def setup(srv: Any) -> None:
    with connect(srv) as admin:
        for st in ["CREATE TABLE Sales (a INTEGER)", "CREATE TABLE hr (s TEXT)",
                   "CREATE USER bob PASSWORD 'bob pw'", "CREATE ROLE readers",
                   "GRANT SELECT ON sales TO readers", "GRANT readers TO bob"]:
            admin.execute(st)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_column_lists_where_order_by(start_server, request, engine_name) -> None:
    srv = start_server(request.getfixturevalue(engine_name))
    setup(srv)
    with connect(srv, "bob", "bob pw") as bob:
        assert bob.execute("SELECT name FROM system.users ORDER BY name").fetchall() == \
            [("bob",), ("u",)]
        assert bob.execute("SELECT name, is_admin FROM system.users WHERE is_admin")\
            .fetchall() == [("u", True)]
        cur = bob.execute("SELECT name, iterations FROM system.users WHERE name = %s",
                          ["bob"], prepare=True)  # extended protocol, a parameter
        assert cur.fetchall() == [("bob", 4096)]
        assert [(d.name, d.type_code) for d in cur.description] == \
            [("name", 25), ("iterations", 20)]
        assert bob.execute("SELECT members FROM system.roles WHERE role = 'readers'")\
            .fetchall() == [("bob",)]
        assert bob.execute('SELECT "table", privilege FROM system.grants '
                           "WHERE privilege <> 'MEMBER' ORDER BY 1").fetchall() == \
            [("Sales", "SELECT")]  # the declared name, as SELECT * shows it
        assert bob.execute("SELECT count(*) FROM system.users u JOIN system.grants g "
                           "ON g.user = u.name WHERE g.role = 'readers'").fetchall() == [(1,)]
        assert bob.execute("WITH a AS (SELECT name FROM system.users WHERE is_admin) "
                           "SELECT * FROM a").fetchall() == [("u",)]
        # a query of several statements (checked whole before it runs)
        cur = bob.execute("SELECT 1; SELECT upper(name) FROM SYSTEM.Users WHERE NOT is_admin")
        assert cur.fetchall() == [(1,)]
        assert cur.nextset()
        assert cur.fetchall() == [("BOB",)]
        # no verifier, salt or key behind the four columns
        assert [d.name for d in bob.execute("SELECT * FROM system.users u").description] \
            == ["name", "is_admin", "auth", "iterations"]
        # the engine's tables are not there: no way around the grants (hr is not granted)
        with pytest.raises(psycopg.errors.UndefinedTable):
            bob.execute("SELECT s, name FROM hr, system.users")
        # a statement that is not a query is still refused, not run on a copy
        with pytest.raises(psycopg.Error):
            bob.execute("DELETE FROM system.users")
    with connect(srv, "bob", "bob pw") as bob:
        assert bob.execute("SELECT count(*) FROM system.users").fetchall() == [(2,)]


@pytest.mark.parametrize("engine_name", ENGINES)
def test_asyncpg_and_pg8000(start_server, request, engine_name) -> None:
    srv = start_server(request.getfixturevalue(engine_name))
    setup(srv)

    async def go() -> Any:
        conn = await asyncpg.connect(
            host="localhost", port=srv.port, user="bob", password="bob pw", database="db",
            ssl=ssl.create_default_context(cafile=str(srv.dsn["sslrootcert"])))
        try:
            return await conn.fetch("SELECT name, iterations FROM system.users "
                                    "WHERE iterations >= $1 ORDER BY name DESC", 4096)
        finally:
            await conn.close()

    assert [tuple(r) for r in asyncio.run(go())] == [("u", 4096), ("bob", 4096)]
    conn = pg8000.native.Connection(
        "bob", host="localhost", port=srv.port, password="bob pw", database="db",
        ssl_context=ssl.create_default_context(cafile=str(srv.dsn["sslrootcert"])))
    try:
        assert conn.run("SELECT role FROM system.roles WHERE members LIKE :m", m="%bob%") \
            == [["readers"]]
    finally:
        conn.close()


def test_in_a_sqlite_transaction_sees_its_own_grants(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    setup(srv)
    with connect(srv) as admin:
        admin.execute("BEGIN")
        admin.execute("CREATE ROLE writers")
        assert admin.execute("SELECT role FROM system.roles ORDER BY role").fetchall() == \
            [("readers",), ("writers",)]
        admin.execute("ROLLBACK")
        assert admin.execute("SELECT role FROM system.roles").fetchall() == [("readers",)]
