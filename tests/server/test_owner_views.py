"""Views with their owner's rights through cryptdisk serve (``WITH (security_invoker =
false)``): reading one needs SELECT on the view alone, the tables it reads are its
owner's (an admin, checked again at each read) to read, and the masking and row access
policies still apply by the reader's role. Views without the option keep invoker rights
(tests/server/test_views.py)."""

from __future__ import annotations

import os

os.environ["PSYCOPG_IMPL"] = "python"  # as tests/server/conftest.py explains

import psycopg
import pytest

from .test_grants import ANALYTICAL_SETUP, admin_and_bob
from .test_mutate_server import PANS, _cards, _connect, engine  # noqa: F401 (a fixture)

DENIED = psycopg.errors.InsufficientPrivilege
OWNER_VIEWS = [
    "CREATE VIEW v_pub WITH (security_invoker = false) AS SELECT length(s) AS n FROM secret",
    "CREATE VIEW v_inv AS SELECT s FROM secret",                       # invoker rights
    "CREATE VIEW v_nest WITH (security_invoker = false) AS SELECT * FROM v_inv",
    "CREATE VIEW v_over_pub AS SELECT n FROM v_pub",                   # invoker over owner's
    "GRANT SELECT ON v_pub, v_nest TO bob", "GRANT SELECT ON open_t TO bob",
]


@pytest.mark.parametrize(("sql", "rows"), [
    ("SELECT * FROM v_pub", [(6,)]),
    ("SELECT n FROM v_pub WHERE n = %s", [(6,)]),                       # a parameter
    ("SELECT * FROM v_nest", [("hidden",)]),            # an invoker view in an owner's view
    ("SELECT * FROM v_over_pub", [(6,)]),               # an owner's view in an invoker view
    ("SELECT * FROM (SELECT n + 1 AS m FROM v_pub) x", [(7,)]),
    ("WITH x AS (SELECT n FROM v_pub) SELECT * FROM x", [(6,)]),
    ("SELECT a FROM open_t UNION ALL SELECT n FROM v_pub ORDER BY 1", [(1,), (6,)]),
    ("SELECT a, n FROM open_t, v_pub", [(1, 6)]),
    ("SELECT * FROM open_t WHERE a < (SELECT n FROM v_pub)", [(1,)]),
    ("SELECT * FROM public.v_pub", [(6,)]),
])
def test_an_owner_view_needs_select_on_itself_only(start_server, analytical, sql, rows) -> None:
    srv = start_server(analytical)
    with admin_and_bob(srv, [*ANALYTICAL_SETUP, *OWNER_VIEWS]) as bob:
        params = (6,) if "%s" in sql else None
        assert bob.execute(sql, params).fetchall() == rows
        with pytest.raises(DENIED):
            bob.execute("SELECT * FROM secret")  # the table itself stays closed


@pytest.mark.parametrize("sql", [
    "SELECT * FROM v_inv",                                     # invoker rights: the table's
    "SELECT n, s FROM v_pub, secret",                          # a join with a closed table
    "SELECT n FROM v_pub UNION ALL SELECT length(s) FROM secret",
    "WITH v_pub AS (SELECT s FROM secret) SELECT * FROM v_pub",  # a CTE named as the view
    "SELECT * FROM v_hidden",                                  # an owner's view not granted
    "INSERT INTO v_pub VALUES (1)",                            # writes stay refused
    "DELETE FROM v_pub",
    "UPDATE v_pub SET n = 1",
    "CREATE VIEW mine WITH (security_invoker = false) AS SELECT * FROM secret",
    "ALTER VIEW v_pub SET (security_invoker = true)",
    "DROP VIEW v_pub",
    "GRANT SELECT ON v_pub TO bob",
    "SELECT * FROM system.views",
])
def test_an_owner_view_opens_nothing_else(start_server, analytical, sql) -> None:
    srv = start_server(analytical)
    setup = [*ANALYTICAL_SETUP, *OWNER_VIEWS,
             "CREATE VIEW v_hidden WITH (security_invoker = false) AS SELECT s FROM secret"]
    with admin_and_bob(srv, setup) as bob:
        with pytest.raises(psycopg.Error) as e:
            bob.execute(sql)
        assert e.value.sqlstate in ("42501", "42809"), (sql, e.value)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM secret").fetchone() == (1,)
        me = srv.dsn["user"]  # (the admin who made them)
        assert admin.execute("SELECT name, security_invoker, owner FROM system.views "
                             "ORDER BY name").fetchall() == [
            ("v_hidden", False, me), ("v_inv", True, None), ("v_nest", False, me),
            ("v_over_pub", True, None), ("v_pub", False, me)]


def test_a_demoted_or_dropped_owner_makes_the_view_refuse(start_server, analytical) -> None:
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute("CREATE USER root2 SUPERUSER PASSWORD 'root2 pw'")
    with admin_and_bob(srv, ANALYTICAL_SETUP) as bob:
        with psycopg.connect(**{**srv.dsn, "user": "root2", "password": "root2 pw"},
                             autocommit=True) as root2:
            root2.execute("CREATE VIEW v_pub AS SELECT length(s) AS n FROM secret")
            root2.execute("ALTER VIEW v_pub SET (security_invoker = false)")
            root2.execute("GRANT SELECT ON v_pub TO bob")
        assert bob.execute("SELECT * FROM v_pub").fetchall() == [(6,)]
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            admin.execute("ALTER USER root2 NOSUPERUSER")
            with pytest.raises(DENIED, match="owner root2 is not an admin"):
                bob.execute("SELECT * FROM v_pub")
            admin.execute("ALTER USER root2 SUPERUSER")
            assert bob.execute("SELECT * FROM v_pub").fetchall() == [(6,)]
            admin.execute("DROP USER root2")
            with pytest.raises(DENIED, match="owner root2 is not an admin"):
                bob.execute("SELECT * FROM v_pub")
            admin.execute("CREATE OR REPLACE VIEW v_pub WITH (security_invoker = false) AS "
                          "SELECT length(s) AS n FROM secret")  # now the admin's, grant kept
            assert bob.execute("SELECT * FROM v_pub").fetchall() == [(6,)]
            admin.execute("ALTER VIEW v_pub RENAME TO v_pub2")  # the grant follows
            assert bob.execute("SELECT * FROM v_pub2").fetchall() == [(6,)]
            admin.execute("ALTER VIEW v_pub2 SET (security_invoker = true)")  # back: its
            with pytest.raises(DENIED):  # tables' grants again, and its own grant is gone
                bob.execute("SELECT * FROM v_pub2")
            assert admin.execute("SELECT count(*) FROM system.grants WHERE \"user\" = 'bob'"
                                 " AND \"table\" = 'v_pub2'").fetchone() == (0,)


def test_the_default_stays_invoker_rights(start_server, analytical) -> None:
    srv = start_server(analytical)
    with admin_and_bob(srv, [*ANALYTICAL_SETUP, "CREATE VIEW v AS SELECT s FROM secret",
                             "CREATE VIEW w WITH (security_invoker = true) AS SELECT s "
                             "FROM secret"]) as bob:
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            for name in ("v", "w"):
                with pytest.raises(psycopg.errors.FeatureNotSupported, match="invoker"):
                    admin.execute(f"GRANT SELECT ON {name} TO bob")
            admin.execute("GRANT SELECT ON secret TO bob")
        assert bob.execute("SELECT * FROM v").fetchall() == [("hidden",)]
        assert bob.execute("SELECT * FROM w").fetchall() == [("hidden",)]


@pytest.mark.parametrize(("sql", "message"), [
    ("CREATE VIEW x WITH (security_definer = true) AS SELECT 1", "unknown view option"),
    ("CREATE VIEW x WITH (check_option = local) AS SELECT 1", "unknown view option"),
    ("CREATE VIEW x WITH (security_invoker = maybe) AS SELECT 1", "true or false"),
    ("ALTER VIEW v_pub SET (security_barrier)", "unknown view option"),
    ("ALTER VIEW v_pub RESET (check_option)", "unknown view option"),
])
def test_unknown_view_options_are_refused(start_server, analytical, sql, message) -> None:
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        for st in [*ANALYTICAL_SETUP, OWNER_VIEWS[0]]:
            admin.execute(st)
        with pytest.raises(psycopg.Error, match=message):
            admin.execute(sql)
        assert admin.execute("SELECT count(*) FROM system.views").fetchone() == (1,)


def test_an_owner_view_applies_the_readers_policies(start_server, engine) -> None:  # noqa: F811
    """The masking and row access policies of the tables an owner's view reads apply by
    the reader's role: the view never unmasks what its reader may not see."""
    srv = start_server(engine)
    _cards(srv)
    with _connect(srv) as admin:
        admin.execute("CREATE VIEW card_pub WITH (security_invoker = false) AS "
                      "SELECT pan, region, n FROM cards")
        admin.execute("CREATE USER carol PASSWORD 'carol pw'")  # no role, no grant on cards
        admin.execute("CREATE USER dave PASSWORD 'dave pw'")
        admin.execute("GRANT auditor TO dave")
        admin.execute("REVOKE SELECT ON cards FROM auditor")  # the auditor: the view only
        admin.execute("GRANT SELECT ON card_pub TO carol, auditor")
    masked = ["************1111", "***********0009"]
    with _connect(srv, "carol") as carol:
        with pytest.raises(DENIED):
            carol.execute("SELECT pan FROM cards")
        for sql in ["SELECT pan FROM card_pub",
                    "SELECT pan FROM (SELECT * FROM card_pub) x",
                    "WITH c AS (SELECT pan FROM card_pub) SELECT pan FROM c",
                    "SELECT pan FROM card_pub WHERE n >= 0 UNION ALL "
                    "SELECT pan FROM card_pub WHERE false"]:
            assert sorted(r[0] for r in carol.execute(sql).fetchall()) == masked, sql
        assert carol.execute("SELECT count(*) FROM card_pub WHERE region = 'EU'"
                             ).fetchone() == (0,)
        assert carol.execute("SELECT count(*) FROM card_pub WHERE pan = %s",
                             (PANS[0],)).fetchone() == (0,)  # no probe of clear values
        with pytest.raises(DENIED):  # a field function in the reader's own query
            carol.execute("SELECT fpe_decrypt(pan, 'cards') FROM card_pub")
    with _connect(srv, "dave") as dave:
        dave.execute("SET ROLE auditor")
        assert sorted(r[0] for r in dave.execute("SELECT pan FROM card_pub").fetchall()) \
            == sorted(PANS)


def test_a_reader_sees_the_view_not_its_definition(start_server, analytical) -> None:
    srv = start_server(analytical)
    with admin_and_bob(srv, [*ANALYTICAL_SETUP, *OWNER_VIEWS]) as bob:
        names = [r[0] for r in bob.execute("SHOW TABLES").fetchall()]
        assert "v_pub" in names and "secret" not in names and "v_inv" not in names
        assert bob.execute("SELECT table_name FROM information_schema.views "
                           "WHERE table_name = 'v_pub'").fetchall() == [("v_pub",)]
        defs = bob.execute("SELECT definition FROM pg_catalog.pg_views "
                           "WHERE viewname = 'v_pub'").fetchall()
        assert all("secret" not in str(d) for d in defs)
        cols = bob.execute("SELECT column_name FROM information_schema.columns "
                           "WHERE table_name = 'v_pub'").fetchall()
        assert cols == [("n",)]


def test_copy_to_stdout_and_explain_of_an_owner_view(start_server, analytical) -> None:
    srv = start_server(analytical)
    with admin_and_bob(srv, [*ANALYTICAL_SETUP, *OWNER_VIEWS]) as bob:
        with bob.cursor() as cur:
            with cur.copy("COPY (SELECT n FROM v_pub) TO STDOUT") as copy:
                data = b"".join(bytes(b) for b in copy)
        assert data == b"6\n"
        with bob.cursor() as cur, pytest.raises(DENIED):
            with cur.copy("COPY (SELECT n, s FROM v_pub, secret) TO STDOUT") as copy:
                b"".join(bytes(b) for b in copy)
        with pytest.raises(DENIED):  # EXPLAIN is for admins (its plan names the tables)
            bob.execute("EXPLAIN SELECT * FROM v_pub")


@pytest.mark.parametrize("make", [
    "CREATE VIEW v_pub WITH (security_invoker = false) AS SELECT s FROM secret",
    "CREATE VIEW v_pub AS SELECT s FROM secret; "
    "ALTER VIEW v_pub SET (security_invoker = false)",
    "CREATE VIEW v0 WITH (security_invoker = false) AS SELECT s FROM secret; "
    "ALTER VIEW v0 RENAME TO v_pub",
    "CREATE TABLE v_pub (s VARCHAR)",
    "CREATE TABLE v0 (s VARCHAR); ALTER TABLE v0 RENAME TO v_pub",
    "CREATE TABLE v_pub AS SELECT s FROM secret",
])
def test_a_new_object_never_inherits_grants_left_on_its_name(start_server, analytical,
                                                              make) -> None:
    """Grants on a name no table or owner-rights view has (what a server killed between a
    drop's catalog commit and the removal of its grants leaves, until it starts again;
    here a GRANT on a name nothing has) are removed before a statement gives the name to
    a new table or view: its reader gets nothing the admin did not grant on it."""
    srv = start_server(analytical)
    with admin_and_bob(srv, [*ANALYTICAL_SETUP, "GRANT SELECT ON v_pub TO bob"]) as bob:
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            for st in make.split("; "):
                admin.execute(st)
            assert admin.execute("SELECT count(*) FROM system.grants WHERE \"table\" = "
                                 "'v_pub'").fetchone() == (0,)
        with pytest.raises(DENIED):
            bob.execute("SELECT * FROM v_pub")


def test_a_renamed_view_or_table_keeps_its_grants_only_under_its_new_name(
        start_server, analytical) -> None:
    srv = start_server(analytical)
    setup = [*ANALYTICAL_SETUP, OWNER_VIEWS[0], "GRANT SELECT ON v_pub, open_t TO bob",
             "ALTER VIEW v_pub RENAME TO v_two", "ALTER TABLE open_t RENAME TO open_two"]
    with admin_and_bob(srv, setup) as bob:
        assert bob.execute("SELECT * FROM v_two").fetchall() == [(6,)]
        assert bob.execute("SELECT * FROM open_two").fetchall() == [(1,)]
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            assert admin.execute("SELECT \"table\" FROM system.grants WHERE \"user\" = 'bob' "
                                 "AND \"table\" IS NOT NULL ORDER BY 1").fetchall() == [
                ("open_two",), ("v_two",)]
            with pytest.raises(psycopg.Error):  # a rename that fails moves nothing
                admin.execute("ALTER VIEW v_two RENAME TO open_two")
            assert admin.execute("SELECT \"table\" FROM system.grants WHERE \"user\" = 'bob' "
                                 "AND \"table\" IS NOT NULL ORDER BY 1").fetchall() == [
                ("open_two",), ("v_two",)]


def test_an_owner_view_made_through_the_python_api_reads_as_an_admins(
        start_server, analytical) -> None:
    """A view made ``WITH (security_invoker = false)`` by the Python API has no owner (its
    maker holds the database's key): through the server it reads as an admin's view,
    needing SELECT on the view alone; one of invoker rights keeps its tables' grants."""
    srv = start_server(analytical)
    with admin_and_bob(srv, ANALYTICAL_SETUP) as bob:
        analytical.db.sql("CREATE VIEW v_py WITH (security_invoker = false) AS "
                          "SELECT length(s) AS n FROM secret")
        analytical.db.sql("CREATE VIEW v_py_closed WITH (security_invoker = false) AS "
                          "SELECT s FROM secret")
        analytical.db.sql("CREATE VIEW v_py_inv AS SELECT s FROM secret")
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            admin.execute("GRANT SELECT ON v_py TO bob")
            assert admin.execute("SELECT owner FROM system.views WHERE name = 'v_py'"
                                 ).fetchall() == [(None,)]
        assert bob.execute("SELECT * FROM v_py").fetchall() == [(6,)]
        for sql in ("SELECT * FROM v_py_closed", "SELECT * FROM v_py_inv",
                    "SELECT n, s FROM v_py, secret"):
            with pytest.raises(DENIED):
                bob.execute(sql)
