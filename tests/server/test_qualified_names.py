"""``public.t`` and ``main.t`` name table ``t`` through the server, as PostgreSQL clients and
ORMs write them (psycopg's ``sql.Identifier("public", "t")``, SQLAlchemy, pandas), on both
engines; the grant checks see the table, whatever way its name is written."""

from __future__ import annotations

import pg8000.native
import psycopg
import pytest
from psycopg import sql

from cryptdisk.server._sqltext import unqualify
from tests.server.test_grants import admin_and_bob

DENIED = psycopg.errors.InsufficientPrivilege
ENGINES = ["analytical", "sqlite_engine"]
SETUP = ["CREATE TABLE open_t (a BIGINT, b VARCHAR)", "CREATE TABLE secret (s VARCHAR)",
         "CREATE TABLE sink (a BIGINT)", "INSERT INTO open_t VALUES (1, 'x'), (2, 'y')",
         "INSERT INTO secret VALUES ('hidden')"]


@pytest.mark.parametrize(("text", "expected"), [
    ("SELECT * FROM public.t", "SELECT * FROM t"),
    ("SELECT * FROM main . t", "SELECT * FROM t"),
    ('SELECT * FROM "public"."T"', 'SELECT * FROM "T"'),
    ("SELECT PUBLIC.t.a FROM Public.t", "SELECT t.a FROM t"),
    ('SELECT * FROM "PUBLIC".t', 'SELECT * FROM "PUBLIC".t'),  # quoted: that exact schema
    ("SELECT * FROM db.public.t", "SELECT * FROM db.public.t"),  # a catalog's schema
    ("SELECT 'public.t', s.public.t FROM other.t -- public.t", "SELECT 'public.t', "
     "s.public.t FROM other.t -- public.t"),
    ("SELECT * FROM public.u", "SELECT * FROM public.u"),  # not a table of the database
    ("SELECT main.x FROM t", "SELECT main.x FROM t"),  # a column main (a struct) stays
])
def test_unqualify(text: str, expected: str) -> None:
    assert unqualify(text, lambda: ["t", "T"]) == expected


@pytest.mark.parametrize("engine", ENGINES)
def test_schema_qualified_names_reach_the_table(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        for st in SETUP:
            c.execute(st)
        for name in ["public.open_t", "main.open_t", '"public"."open_t"', "PUBLIC.OPEN_T",
                     "public . open_t"]:
            assert c.execute(f"SELECT a, b FROM {name} ORDER BY a").fetchall() == \
                [(1, "x"), (2, "y")], name
        ident = sql.Identifier("public", "open_t")
        assert c.execute(sql.SQL("SELECT {}.a FROM {} WHERE a > %s").format(ident, ident),
                         (1,)).fetchall() == [(2,)]
        assert c.execute("SELECT public.open_t.a FROM public.open_t JOIN main.sink "
                         "ON sink.a = open_t.a").fetchall() == []
        c.execute("INSERT INTO public.sink VALUES (7)")
        c.execute(sql.SQL("INSERT INTO {} (a) VALUES (%s)").format(
            sql.Identifier("public", "sink")), (8,))
        with c.cursor().copy('COPY "public"."sink" (a) FROM STDIN') as copy:
            copy.write_row((9,))
        with c.cursor().copy("COPY public.sink TO STDOUT") as copy:
            assert sorted(int(r[0]) for r in copy.rows()) == [7, 8, 9]
        # a schema that is not the default one names no table (quoted: that exact name)
        with pytest.raises(psycopg.errors.UndefinedTable):
            c.execute('SELECT * FROM "PUBLIC".open_t')
    con = pg8000.native.Connection(srv.dsn["user"], host="localhost", port=srv.port,
                                   password=srv.dsn["password"],
                                   ssl_context=_ssl_context(srv))
    try:
        assert con.run("SELECT a FROM public.sink WHERE a >= :n ORDER BY a", n=8) == [[8], [9]]
    finally:
        con.close()


def _ssl_context(srv):
    import ssl

    return ssl.create_default_context(cafile=srv.dsn["sslrootcert"])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("statement", [
    "SELECT * FROM public.secret",
    "SELECT * FROM main.secret",
    'SELECT * FROM "public"."secret"',
    "SELECT * FROM PUBLIC.SECRET",
    "SELECT * FROM open_t WHERE b IN (SELECT s FROM public.secret)",
    "WITH x AS (SELECT s FROM public.secret) SELECT * FROM x",
    "SELECT * FROM public.open_t, public.secret",
    "INSERT INTO public.open_t VALUES (3, 'z')",
    'INSERT INTO "public".sink SELECT length(s) FROM public.secret',
    "COPY public.secret TO STDOUT",
])
def test_qualified_names_do_not_bypass_grants(start_server, request, engine,
                                              statement) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with admin_and_bob(srv, [*SETUP, "GRANT SELECT ON open_t TO bob",
                             "GRANT INSERT ON sink TO bob"]) as bob:
        assert bob.execute("SELECT count(*) FROM public.open_t").fetchone() == (2,)
        with pytest.raises(DENIED):
            bob.execute(statement)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM sink").fetchone() == (0,)
        assert admin.execute("SELECT count(*) FROM open_t").fetchone() == (2,)


@pytest.mark.parametrize("engine", ENGINES)
def test_copy_in_and_grants_on_qualified_names(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with admin_and_bob(srv, [*SETUP, "GRANT SELECT ON public.open_t TO bob",
                             'GRANT INSERT ON "public"."sink" TO bob']) as bob:
        # a grant on public.t is a grant on t
        assert bob.execute("SELECT count(*) FROM open_t").fetchone() == (2,)
        with bob.cursor().copy("COPY public.sink FROM STDIN") as copy:
            copy.write_row((5,))
        with pytest.raises(DENIED):
            with bob.cursor().copy("COPY public.secret FROM STDIN") as copy:
                copy.write_row(("x",))
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        grants = admin.execute("SELECT * FROM system.grants").fetchall()
        assert sorted(g[1:3] for g in grants if g[0] == "bob") == [("open_t", "SELECT"),
                                                                   ("sink", "INSERT")]
        assert admin.execute("SELECT a FROM sink").fetchall() == [(5,)]
        assert admin.execute("SELECT count(*) FROM secret").fetchone() == (1,)
