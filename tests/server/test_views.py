"""Views of the analytical engine through cryptdisk serve: invoker rights.

A view has the rights of the user who reads it: the grant check and the masking and row
access policies see the tables its query reads (the statement is checked with its views
written out), so a view opens nothing its reader could not read; GRANT on a view is
refused, saying so. psql's catalog lists the views (``\\dv``, ``\\d v``).
"""

from __future__ import annotations

import os

os.environ["PSYCOPG_IMPL"] = "python"  # as tests/server/conftest.py explains

import psycopg
import pytest

from .test_grants import ANALYTICAL_SETUP, admin_and_bob
from .test_mutate_server import PANS, _cards, _connect, engine  # noqa: F401 (a fixture)

DENIED = psycopg.errors.InsufficientPrivilege
VIEWS = ["CREATE VIEW v_secret AS SELECT s FROM secret",
         "CREATE VIEW v_open AS SELECT a FROM open_t",
         "CREATE VIEW v_both AS SELECT a, s FROM open_t, secret",
         "CREATE VIEW v_over AS SELECT * FROM v_secret"]


@pytest.mark.parametrize("sql", [
    "SELECT * FROM v_secret",
    "SELECT * FROM v_over",                                               # a view over it
    "SELECT a FROM v_both",                                               # a join inside
    "SELECT * FROM open_t WHERE a IN (SELECT length(s) FROM v_secret)",   # a subquery
    "WITH x AS (SELECT * FROM v_secret) SELECT * FROM x",                 # a CTE
    "SELECT a::VARCHAR FROM v_open UNION ALL SELECT s FROM v_over",       # a UNION
    "SELECT * FROM public.v_secret",
    "SELECT * FROM \"V_SECRET\"",
    "INSERT INTO sink SELECT length(s) FROM v_secret",
    "DELETE FROM open_t WHERE a IN (SELECT length(s) FROM v_secret)",
    "COPY (SELECT * FROM v_secret) TO '/tmp/x.csv'",
    "EXPLAIN SELECT * FROM v_secret",
    "CREATE VIEW mine AS SELECT a FROM open_t",                          # admins only
    "DROP VIEW v_open",
])
def test_a_view_opens_no_table_its_reader_may_not_read(start_server, analytical, sql) -> None:
    srv = start_server(analytical)
    setup = [*ANALYTICAL_SETUP, "CREATE TABLE sink (a BIGINT)", *VIEWS,
             "GRANT SELECT, DELETE ON open_t TO bob", "GRANT INSERT ON sink TO bob"]
    with admin_and_bob(srv, setup) as bob:
        with pytest.raises(DENIED):
            bob.execute(sql)
        # the same through the extended protocol (a parameter: a prepared statement)
        if "%" not in sql and sql.startswith("SELECT"):
            with pytest.raises(DENIED):
                bob.execute(sql + " LIMIT %s", (5,))
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM sink").fetchone() == (0,)
        assert admin.execute("SELECT a FROM v_open").fetchall() == [(1,)]


def test_a_view_reads_what_its_tables_grant(start_server, analytical) -> None:
    srv = start_server(analytical)
    setup = [*ANALYTICAL_SETUP, *VIEWS, "GRANT SELECT ON open_t TO bob"]
    with admin_and_bob(srv, setup) as bob:
        assert bob.execute("SELECT * FROM v_open").fetchall() == [(1,)]
        assert bob.execute("SELECT a FROM v_open WHERE a = %s", (1,)).fetchall() == [(1,)]
        with pytest.raises(DENIED):
            bob.execute("SELECT * FROM v_both")
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            admin.execute("GRANT SELECT ON secret TO bob")
        assert bob.execute("SELECT * FROM v_over").fetchall() == [("hidden",)]
        assert bob.execute("SELECT a, s FROM v_both").fetchall() == [(1, "hidden")]


def test_grant_on_a_view_is_refused_saying_why(start_server, analytical) -> None:
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        for sql in [*ANALYTICAL_SETUP, *VIEWS]:
            admin.execute(sql)
        admin.execute("CREATE USER bob PASSWORD 'bob pw'")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="invoker rights") as e:
            admin.execute("GRANT SELECT ON v_secret TO bob")
        assert "GRANT SELECT ON the tables it reads" in e.value.diag.message_hint
        with pytest.raises(psycopg.errors.FeatureNotSupported, match=r"(V_Over|v_over) is a view"):
            admin.execute("GRANT SELECT ON open_t, V_Over TO bob")
        assert admin.execute("SELECT * FROM system.grants WHERE \"user\" = 'bob'"
                             ).fetchall() == []
        admin.execute("REVOKE SELECT ON v_secret FROM bob")  # (nothing to revoke: no error)


def test_a_view_reads_through_the_readers_policies(start_server, engine) -> None:  # noqa: F811
    srv = start_server(engine)
    _cards(srv)
    with _connect(srv) as admin:
        admin.execute("CREATE VIEW card_view AS SELECT pan, region, n FROM cards")
        admin.execute("CREATE VIEW card_over (p, r) AS SELECT pan, region FROM card_view")
        admin.execute("CREATE VIEW card_join AS SELECT a.pan, b.n FROM cards a JOIN cards b "
                      "USING (n)")
    masked = ["************1111", "***********0009"]
    with _connect(srv, "bob") as bob:  # the analyst: masked numbers, no EU row
        for sql in ["SELECT pan FROM card_view ORDER BY n",
                    "SELECT p FROM card_over ORDER BY p DESC",
                    "SELECT pan FROM card_join ORDER BY n",
                    "SELECT pan FROM (SELECT * FROM card_view) x ORDER BY n",
                    "WITH c AS (SELECT pan, n FROM card_view) SELECT pan FROM c ORDER BY n",
                    "SELECT pan FROM card_view WHERE n = 0 UNION ALL "
                    "SELECT p FROM card_over WHERE r = 'US' AND p LIKE '%0009'"]:
            assert sorted(r[0] for r in bob.execute(sql).fetchall()) == masked, sql
        assert bob.execute("SELECT count(*) FROM card_view WHERE region = 'EU'"
                           ).fetchone() == (0,)
        assert bob.execute("SELECT count(*) FROM card_view WHERE pan = %s",
                           (PANS[0],)).fetchone() == (0,)  # no probe of clear values
        with pytest.raises(DENIED):
            bob.execute("COPY (SELECT * FROM card_view) TO '/tmp/cards.csv'")
    with _connect(srv, "alice") as alice:
        alice.execute("SET ROLE auditor")
        assert sorted(r[0] for r in alice.execute("SELECT p FROM card_over").fetchall()) \
            == sorted(PANS)


def test_psql_catalog_lists_views(start_server, analytical) -> None:
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        for sql in [*ANALYTICAL_SETUP, *VIEWS]:
            c.execute(sql)
        views = c.execute("SELECT c.relname FROM pg_catalog.pg_class c WHERE c.relkind = 'v' "
                          "ORDER BY 1").fetchall()
        assert views == [("v_both",), ("v_open",), ("v_over",), ("v_secret",)]
        assert c.execute("SELECT definition FROM pg_catalog.pg_views WHERE viewname = "
                         "'v_both'").fetchall() == [("SELECT a, s FROM open_t, secret",)]
        cols = c.execute("SELECT column_name, data_type FROM information_schema.columns "
                         "WHERE table_name = 'v_both' ORDER BY ordinal_position").fetchall()
        assert cols == [("a", "bigint"), ("s", "text")]


def test_real_psql_dv_and_d_of_a_view(start_server, analytical, certs) -> None:
    from .test_psql_catalog import psql

    srv = start_server(analytical)
    out = psql(srv, certs, *ANALYTICAL_SETUP, "CREATE VIEW v_pair (n, secret_text) AS "
               "SELECT a, s FROM open_t, secret", "\\dv", "\\d v_pair", unaligned=False)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "v_pair" in text and "view" in text  # \dv: the view's row, of type view
    assert 'View "public.v_pair"' in text
    rows = [[c.strip() for c in line.split("|")][:2] for line in text.splitlines()
            if line.count("|") == 4 and "Column" not in line]
    assert rows == [["n", "bigint"], ["secret_text", "text"]]


def test_show_tables_lists_a_user_only_what_it_may_read(start_server, analytical) -> None:
    """SHOW TABLES of a user that is not an admin lists the tables and views it may read,
    as its information_schema.tables does, not every table and view of the database: a
    view (which takes no grant) when it may read every table under it."""
    srv = start_server(analytical)
    setup = [*ANALYTICAL_SETUP, *VIEWS, "GRANT SELECT ON open_t TO bob"]
    with admin_and_bob(srv, setup) as bob:
        listed = bob.execute("SELECT table_name FROM information_schema.tables").fetchall()
        assert bob.execute("SHOW TABLES").fetchall() == listed == [("open_t",), ("v_open",)]
        assert bob.execute(" show tables ;").fetchall() == [("open_t",), ("v_open",)]
        assert bob.execute("SELECT table_name FROM information_schema.views").fetchall() \
            == [("v_open",)]
        assert bob.execute("SELECT relname FROM pg_class WHERE relkind = 'v'").fetchall() \
            == [("v_open",)]
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        names = [r[0] for r in admin.execute("SHOW TABLES").fetchall()]
        assert names == sorted(["open_t", "secret", "v_secret", "v_open", "v_both", "v_over"])


def test_view_errors_have_their_sqlstates(start_server, analytical) -> None:
    """A statement a view makes wrong fails with PostgreSQL's code for it, not XX000."""
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        for sql in [*ANALYTICAL_SETUP, *VIEWS, "CREATE TABLE gone (a BIGINT)",
                    "CREATE VIEW v_gone AS SELECT a FROM gone", "DROP TABLE gone"]:
            admin.execute(sql)
        with pytest.raises(psycopg.errors.DuplicateAlias, match="CTE named open_t"):
            admin.execute("WITH open_t AS (SELECT 5 AS a) SELECT * FROM v_open")
        with pytest.raises(psycopg.errors.WrongObjectType, match="is a view"):
            admin.execute("INSERT INTO v_open VALUES (1)")
        with pytest.raises(psycopg.errors.UndefinedTable, match="reads gone"):
            admin.execute("SELECT * FROM v_gone")

