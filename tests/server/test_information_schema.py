"""information_schema.tables, .columns and .schemata with psycopg, pg8000 and psql: filtered by
the user's grants, isolated from everything else."""

from __future__ import annotations

import os
import ssl
import subprocess

import pg8000.native
import psycopg
import pytest

from tests.server.conftest import PASSWORD, USER, cancel_running

SETUP = {
    "analytical": ["CREATE TABLE open_t (a BIGINT, price DECIMAL(10,2), at TIMESTAMP)",
                   "CREATE TABLE secret (s VARCHAR, n INTEGER)", "CREATE TABLE sink (a BIGINT)"],
    "sqlite_engine": ["CREATE TABLE open_t (a INTEGER NOT NULL DEFAULT 7, price NUMERIC(10,2), "
                      "at TIMESTAMP)", "CREATE TABLE secret (s TEXT, n INTEGER)",
                      "CREATE TABLE sink (a INTEGER)",
                      "CREATE VIEW v_open AS SELECT a FROM open_t"],
}
USERS = ["CREATE USER bob PASSWORD 'bob pw'", "CREATE ROLE readers",
         "GRANT SELECT ON open_t TO readers", "GRANT readers TO bob",
         "GRANT INSERT ON sink TO bob"]
TABLES = "SELECT table_schema, table_name, table_type FROM information_schema.tables " \
    "WHERE table_schema = 'public' ORDER BY table_name"
COLUMNS = "SELECT column_name, ordinal_position, data_type, is_nullable, numeric_precision, " \
    "numeric_scale FROM information_schema.columns WHERE table_name = %s " \
    "ORDER BY ordinal_position"


def connect(srv, user: str | None = None, password: str | None = None):
    dsn = dict(srv.dsn)
    if user is not None:
        dsn.update(user=user, password=password)
    return psycopg.connect(**dsn, autocommit=True)


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_admin_sees_every_table_and_its_columns(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with connect(srv) as c:
        for st in SETUP[engine]:
            c.execute(st)
        expected = [("public", "open_t", "BASE TABLE"), ("public", "secret", "BASE TABLE"),
                    ("public", "sink", "BASE TABLE")]
        if engine == "sqlite_engine":
            expected.append(("public", "v_open", "VIEW"))
        assert c.execute(TABLES).fetchall() == expected
        columns = c.execute(COLUMNS, ("open_t",)).fetchall()
        assert [r[:3] for r in columns] == [("a", 1, "bigint"), ("price", 2, "numeric"),
                                            ("at", 3, "timestamp without time zone")]
        assert columns[1][4:] == (10, 2)
        if engine == "sqlite_engine":
            assert columns[0][3] == "NO"
            assert c.execute("SELECT column_default FROM information_schema.columns WHERE "
                             "table_name = 'open_t' AND column_name = 'a'").fetchone() == ("7",)
        # the types match what the server reports for the columns in a result
        cur = c.execute("SELECT a FROM open_t")
        assert cur.description[0].type_code == 20  # int8
        assert ("public",) in c.execute("SELECT schema_name FROM information_schema.schemata"
                                        ).fetchall()
        for _ in range(3):  # a prepared statement: Describe of the statement, then Execute
            assert c.execute(COLUMNS, ("secret",), prepare=True).fetchall()[0][:3] == \
                ("s", 1, "text")
        assert c.execute("SELECT count(*) FROM information_schema.tables t JOIN "
                         "information_schema.columns c USING (table_name) WHERE "
                         "t.table_name = 'secret'").fetchone() == (2,)


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_a_user_sees_only_the_tables_it_may_read(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with connect(srv) as c:
        for st in [*SETUP[engine], *USERS]:
            c.execute(st)
    with connect(srv, "bob", "bob pw") as bob:
        # open_t through the role; not secret, not sink (INSERT only), not the view
        assert bob.execute(TABLES).fetchall() == [("public", "open_t", "BASE TABLE")]
        assert bob.execute(COLUMNS, ("secret",)).fetchall() == []
        assert {r[0] for r in bob.execute("SELECT DISTINCT table_name FROM "
                                          "information_schema.columns").fetchall()} == {"open_t"}
        cur = bob.execute("SELECT table_name FROM information_schema.tables; "
                          "INSERT INTO sink VALUES (5)")  # several statements: checked whole
        assert cur.fetchall() == [("open_t",)]
        with connect(srv) as admin:
            admin.execute("REVOKE readers FROM bob")
        assert bob.execute(TABLES).fetchall() == []  # at once


@pytest.mark.parametrize("sql, error", [
    ("SELECT * FROM information_schema.tables, read_csv('/etc/hostname')",
     psycopg.errors.InsufficientPrivilege),
    ("SELECT table_name FROM information_schema.tables UNION ALL SELECT s FROM secret",
     psycopg.errors.UndefinedTable),
    ("SELECT * FROM information_schema.tables, glob('/etc/*')",
     psycopg.errors.InsufficientPrivilege),
])
def test_the_query_sees_nothing_but_the_information_schema(start_server, analytical, sql,
                                                            error) -> None:
    srv = start_server(analytical)
    with connect(srv) as c:
        for st in [*SETUP["analytical"], *USERS, "INSERT INTO secret VALUES ('hidden', 1)"]:
            c.execute(st)
    for user, password in ((USER, PASSWORD), ("bob", "bob pw")):
        with connect(srv, user, password) as who:
            with pytest.raises(error):
                who.execute(sql)


def test_the_query_can_neither_spill_nor_take_the_servers_memory(start_server,
                                                                 analytical) -> None:
    srv = start_server(analytical)
    with connect(srv) as c:
        row = c.execute("SELECT current_setting('temp_directory'), "
                        "current_setting('memory_limit') "
                        "FROM information_schema.schemata LIMIT 1").fetchall()
    assert row[0][0] == ""
    assert row[0][1].endswith(("MiB", "MB")) and float(row[0][1].split()[0]) <= 256


def test_information_schema_with_psql_and_pg8000(start_server, sqlite_engine, certs) -> None:
    srv = start_server(sqlite_engine)
    with connect(srv) as c:
        for st in [*SETUP["sqlite_engine"], *USERS]:
            c.execute(st)
    conninfo = (f"host=localhost port={srv.port} user=bob dbname=db sslmode=verify-full "
                f"sslrootcert={certs[0]}")
    out = subprocess.run(["psql", conninfo, "-X", "-At", "-c",
                          "SELECT table_name, column_name FROM information_schema.columns "
                          "ORDER BY table_name, ordinal_position"],
                         env={**os.environ, "PGPASSWORD": "bob pw"}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["open_t|a", "open_t|price", "open_t|at"]
    con = pg8000.native.Connection("bob", host="localhost", port=srv.port, password="bob pw",
                                   database="db",
                                   ssl_context=ssl.create_default_context(cafile=str(certs[0])))
    try:
        assert con.run("SELECT column_name FROM information_schema.columns WHERE table_name = "
                       ":t AND ordinal_position > :n", t="open_t", n=1) == [["price"], ["at"]]
    finally:
        con.close()


HUGE = "SELECT count(*) FROM information_schema.tables, range(1000000000000)"


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_a_long_query_is_stopped_by_the_statement_timeout(start_server, request,
                                                          engine) -> None:
    """A statement timeout or a CancelRequest ends an information_schema query with
    PostgreSQL's 57014 and its message, not DuckDB's."""
    eng = request.getfixturevalue(engine)
    srv = start_server(eng, statement_timeout=0.5)
    with connect(srv) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
        with pytest.raises(psycopg.errors.QueryCanceled) as e:
            c.execute(HUGE)
        assert e.value.diag.message_primary == "canceling statement due to statement timeout"
        assert c.execute("SELECT table_name FROM information_schema.tables").fetchall() == \
            [("t",)]
    untimed = start_server(eng)
    with connect(untimed) as c:
        errors = cancel_running(untimed, c, HUGE)
        assert len(errors) == 1 and isinstance(errors[0], psycopg.errors.QueryCanceled)
        assert errors[0].diag.message_primary == "canceling statement due to user request"
        assert c.execute("SELECT count(*) FROM information_schema.tables").fetchone() == (1,)


GRANTS_OF_BOB = ("SELECT grantee, table_name, privilege_type, is_grantable "
                 "FROM information_schema.role_table_grants WHERE grantee = current_user OR "
                 "grantee IN (SELECT role_name FROM information_schema.enabled_roles) "
                 "ORDER BY grantee, table_name, privilege_type")


def test_views_privileges_and_roles_show_only_what_the_user_may_know(start_server,
                                                                      sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with connect(srv) as c:
        for st in [*SETUP["sqlite_engine"], "CREATE VIEW v_secret AS SELECT s FROM secret",
                   *USERS, "GRANT SELECT ON v_open TO readers",
                   "CREATE USER carol PASSWORD 'c'", "GRANT SELECT ON secret TO carol",
                   "GRANT SELECT ON v_secret TO carol"]:
            c.execute(st)
        admin_views = c.execute("SELECT table_name, view_definition FROM "
                                "information_schema.views ORDER BY table_name").fetchall()
        assert [n for n, _ in admin_views] == ["v_open", "v_secret"]
        assert admin_views[0][1] == "CREATE VIEW v_open AS SELECT a FROM open_t"
        admin_rows = c.execute("SELECT grantee, table_name, privilege_type FROM "
                               "information_schema.table_privileges WHERE table_name = %s",
                               ("secret",)).fetchall()
        assert sorted(admin_rows) == [("u", "secret", a)  # an admin, as an owner
                                      for a in ("DELETE", "INSERT", "SELECT", "UPDATE")]
    with connect(srv, "bob", "bob pw") as bob:
        assert bob.execute("SELECT table_schema, table_name, view_definition, check_option "
                           "FROM information_schema.views").fetchall() == \
            [("public", "v_open", None, "NONE")]
        assert bob.execute(GRANTS_OF_BOB).fetchall() == [
            ("bob", "sink", "INSERT", "NO"), ("readers", "open_t", "SELECT", "NO"),
            ("readers", "v_open", "SELECT", "NO")]
        assert bob.execute("SELECT * FROM information_schema.table_privileges WHERE "
                           "table_name IN ('secret', 'v_secret')").fetchall() == []
        assert bob.execute("SELECT role_name FROM information_schema.enabled_roles ORDER BY 1"
                           ).fetchall() == [("bob",), ("readers",)]
        assert bob.execute("SELECT * FROM information_schema.applicable_roles").fetchall() == \
            [("bob", "readers", "NO")]
        bob.execute("SET ROLE readers")
        assert bob.execute("SELECT role_name FROM information_schema.enabled_roles"
                           ).fetchall() == [("readers",)]
        assert [r[0] for r in bob.execute(GRANTS_OF_BOB).fetchall()] == ["readers", "readers"]


def test_table_privileges_on_the_analytical_engine(start_server, analytical) -> None:
    srv = start_server(analytical)
    with connect(srv) as c:
        for st in [*SETUP["analytical"], *USERS]:
            c.execute(st)
    with connect(srv, "bob", "bob pw") as bob:  # the columns an ORM's introspection reads
        cur = bob.execute("SELECT tp.table_name, tp.privilege_type, t.table_type FROM "
                          "information_schema.table_privileges tp LEFT JOIN "
                          "information_schema.tables t USING (table_schema, table_name) "
                          "WHERE tp.table_schema = %s ORDER BY 1, 2", ("public",))
        assert cur.fetchall() == [("open_t", "SELECT", "BASE TABLE"), ("sink", "INSERT", None)]
