"""Non-admin users: every table a statement reads or writes needs a grant; each denied path."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

DENIED = psycopg.errors.InsufficientPrivilege


def admin_and_bob(srv, setup: list[str]):
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE USER bob PASSWORD 'bob pw'")
        for st in setup:
            c.execute(st)
    return psycopg.connect(**{**srv.dsn, "user": "bob", "password": "bob pw"}, autocommit=True)


SQLITE_SETUP = [
    "CREATE TABLE open_t (a INTEGER)", "CREATE TABLE secret (s TEXT)",
    "INSERT INTO open_t VALUES (1)", "INSERT INTO secret VALUES ('hidden')",
    "CREATE VIEW v_secret AS SELECT s FROM secret",
    "CREATE TABLE audit (x)",
    "CREATE TRIGGER t_ins AFTER INSERT ON open_t BEGIN INSERT INTO audit VALUES (new.a); END",
]


@pytest.mark.parametrize("sql", [
    "SELECT * FROM secret",
    "SELECT * FROM v_secret",                                            # through a view
    "WITH x AS (SELECT s FROM secret) SELECT * FROM x",                  # through a CTE
    "SELECT a FROM open_t WHERE a IN (SELECT length(s) FROM secret)",   # a subquery
    "SELECT (SELECT s FROM secret) FROM open_t",
    "UPDATE open_t SET a = 2",                                           # no UPDATE grant
    "DELETE FROM open_t",
    "INSERT INTO secret VALUES ('x')",
    "CREATE TABLE mine (a)", "DROP TABLE secret", "PRAGMA table_info(secret)",
    "ATTACH DATABASE ':memory:' AS m",
    "INSERT INTO open_t VALUES (5)",                                     # its trigger writes audit
    "SELECT name FROM sqlite_master",            # every table's name: the catalogs filter them
    "SELECT sql FROM sqlite_schema WHERE name = 'secret'",
    "SELECT a FROM open_t WHERE EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'secret')",
])
def test_sqlite_denied_paths(start_server, sqlite_engine, sql) -> None:
    srv = start_server(sqlite_engine)
    with admin_and_bob(srv, [*SQLITE_SETUP, "GRANT SELECT, INSERT ON open_t TO bob"]) as bob:
        with pytest.raises(DENIED):
            bob.execute(sql)


def test_sqlite_granted_paths_and_revoke(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with admin_and_bob(srv, [*SQLITE_SETUP, "GRANT SELECT ON open_t, v_secret TO bob",
                                            "GRANT ALL ON audit TO bob"]) as bob:
        assert bob.execute("SELECT a FROM open_t").fetchall() == [(1,)]
        assert bob.execute("WITH x AS (SELECT a FROM open_t) SELECT * FROM x").fetchall() \
            == [(1,)]
        with pytest.raises(DENIED):  # SELECT on the view alone does not open its base table
            bob.execute("SELECT * FROM v_secret")
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            admin.execute("GRANT INSERT ON open_t TO bob")
            assert ("bob", "open_t", "INSERT", None, None) in \
                admin.execute("SELECT * FROM system.grants").fetchall()
        bob.execute("INSERT INTO open_t VALUES (2)")  # takes effect at once; trigger allowed
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            admin.execute("REVOKE SELECT ON open_t FROM bob")
        with pytest.raises(DENIED):
            bob.execute("SELECT a FROM open_t")
        with pytest.raises(DENIED):
            bob.execute("GRANT SELECT ON secret TO bob")  # only admins grant


ANALYTICAL_SETUP = ["CREATE TABLE open_t (a BIGINT)", "CREATE TABLE secret (s VARCHAR)",
                    "INSERT INTO open_t VALUES (1)", "INSERT INTO secret VALUES ('hidden')"]


@pytest.mark.parametrize("sql", [
    "SELECT * FROM secret",
    "SELECT * FROM main.secret",
    "WITH x AS (SELECT s FROM secret) SELECT * FROM x",
    "SELECT * FROM (WITH secret AS (SELECT 1) SELECT * FROM secret) a, secret",  # CTE scope
    "WITH secret AS (SELECT * FROM secret) SELECT * FROM secret",  # a CTE's body: the table
    "WITH a AS (SELECT 1), secret AS (SELECT s FROM secret) SELECT * FROM secret",
    "SELECT (SELECT max(s) FROM secret)",
    "SELECT * FROM open_t WHERE a IN (SELECT length(s) FROM secret)",
    "SELECT * FROM read_csv('/etc/passwd')",                             # table functions
    "SELECT * FROM read_parquet('x.parquet')",
    "SELECT * FROM '/etc/hostname'",                                     # a path as a table
    "SELECT * FROM system.parts",
    "SELECT * FROM system.columns",
    "INSERT INTO open_t VALUES (2)",                                     # writes: admins only
    "CREATE TABLE mine (a INTEGER)",
    "COPY open_t TO '/tmp/x.csv'",
    "ATTACH ':memory:' AS m",
    "SET memory_limit = '1GB'",
    "SHOW secret",                                # DuckDB's DESCRIBE: the columns' names
    'SHOW "secret"',
    "SHOW main.secret",
])
def test_analytical_denied_paths(start_server, analytical, sql) -> None:
    srv = start_server(analytical)
    with admin_and_bob(srv, [*ANALYTICAL_SETUP, "GRANT SELECT ON open_t TO bob"]) as bob:
        with pytest.raises(DENIED):
            bob.execute(sql)


def test_analytical_show_of_a_granted_table_and_of_duckdbs_tables(start_server,
                                                                   analytical) -> None:
    srv = start_server(analytical)
    with admin_and_bob(srv, [*ANALYTICAL_SETUP, "GRANT SELECT ON open_t TO bob"]) as bob:
        assert [r[0] for r in bob.execute("SHOW open_t").fetchall()] == ["a"]
        assert bob.execute("SHOW TABLES").fetchall() == [("open_t",)]
        for sql in ("SHOW ALL TABLES", "SELECT * FROM (SHOW ALL TABLES)",
                    "SELECT name FROM (show all tables) WHERE name = 'open_t'"):
            # every table with its columns and types (secret's too): admin users only
            with pytest.raises(DENIED, match="SHOW ALL TABLES"):
                bob.execute(sql)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        names = [r[2] for r in admin.execute("SHOW ALL TABLES").fetchall()]
        assert "open_t" in names and "secret" in names


def test_analytical_granted_queries(start_server, analytical) -> None:
    srv = start_server(analytical)
    with admin_and_bob(srv, [*ANALYTICAL_SETUP, "GRANT SELECT ON open_t TO bob"]) as bob:
        assert bob.execute("SELECT a FROM open_t").fetchall() == [(1,)]
        assert bob.execute("WITH secret AS (SELECT a FROM open_t) SELECT * FROM secret"
                           ).fetchall() == [(1,)]  # a CTE may take any name
        assert bob.execute("SELECT count(*) FROM range(3)").fetchall() == [(3,)]
        assert bob.execute("SELECT a FROM open_t WHERE a = %s", (1,)).fetchall() == [(1,)]


def test_analytical_a_granted_name_no_table_has_reveals_no_other_table(
        start_server, analytical) -> None:
    """A grant on a name before its table exists lets its holder ask for it: the answer
    is PostgreSQL's, not the embedded message naming the server's path and every table
    (secret among them, which bob may not read)."""
    srv = start_server(analytical)
    with admin_and_bob(srv, [*ANALYTICAL_SETUP, "GRANT SELECT ON open_t, ghost TO bob"]) \
            as bob:
        for sql in ("SELECT * FROM ghost", "SELECT a FROM open_t JOIN ghost USING (a)"):
            with pytest.raises(psycopg.errors.UndefinedTable) as info:
                bob.execute(sql)
            assert info.value.diag.message_primary == 'relation "ghost" does not exist'
            assert info.value.diag.message_hint is None


@pytest.mark.parametrize("sql", [
    "INSERT INTO open_t VALUES (2)",                                 # no INSERT on open_t
    "INSERT INTO sink SELECT length(s) FROM secret",                 # source not granted
    "INSERT INTO sink (a) SELECT length(s) FROM secret",
    "INSERT INTO sink WITH x AS (SELECT length(s) AS a FROM secret) SELECT a FROM x",
    "INSERT INTO sink BY NAME SELECT length(s) AS a FROM secret",
    "INSERT INTO open_t BY NAME SELECT 2 AS a",                      # no INSERT on open_t
    "INSERT INTO sink SELECT * FROM read_csv('/etc/passwd')",
    "INSERT INTO main.secret VALUES ('x')",
    "INSERT INTO open_t DEFAULT VALUES",                             # no INSERT on open_t
])
def test_analytical_insert_denied_paths(start_server, analytical, sql) -> None:
    srv = start_server(analytical)
    setup = [*ANALYTICAL_SETUP, "CREATE TABLE sink (a BIGINT)", "GRANT SELECT ON open_t TO bob",
             "GRANT INSERT ON sink TO bob"]
    with admin_and_bob(srv, setup) as bob:
        with pytest.raises((DENIED, psycopg.errors.SyntaxError)):
            bob.execute(sql)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM sink").fetchone() == (0,)
        assert admin.execute("SELECT count(*) FROM secret").fetchone() == (1,)


def test_analytical_insert_and_copy_with_grants(start_server, analytical) -> None:
    srv = start_server(analytical)
    setup = [*ANALYTICAL_SETUP, "CREATE TABLE sink (a BIGINT)", "CREATE ROLE loaders",
             "GRANT INSERT ON sink TO loaders", "GRANT loaders TO bob",
             "GRANT SELECT ON open_t TO bob"]
    with admin_and_bob(srv, setup) as bob:
        bob.execute("INSERT INTO sink VALUES (10), (11)")
        bob.execute("INSERT INTO sink (a) SELECT a FROM open_t")
        bob.execute('INSERT INTO "sink" SELECT %s', (12,))
        bob.execute("INSERT INTO sink BY NAME SELECT a + 20 AS a FROM open_t")
        bob.execute("INSERT INTO sink BY POSITION SELECT 21")
        bob.execute("INSERT INTO sink DEFAULT VALUES")  # (a NULL row: reads nothing)
        with bob.cursor().copy("COPY sink FROM STDIN") as copy:
            copy.write_row((13,))
        with pytest.raises(DENIED):  # INSERT, not SELECT, on sink
            bob.execute("SELECT * FROM sink")
        with pytest.raises(DENIED):
            with bob.cursor().copy("COPY open_t FROM STDIN") as copy:
                copy.write_row((5,))
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            assert admin.execute("SELECT a FROM sink ORDER BY a").fetchall() == \
                [(1,), (10,), (11,), (12,), (13,), (21,), (21,), (None,)]
            admin.execute("REVOKE loaders FROM bob")
        with pytest.raises(DENIED):
            bob.execute("INSERT INTO sink VALUES (14)")


def test_analytical_grants_on_a_table_named_in_mixed_case(start_server, analytical) -> None:
    """A table keeps the name it is created with (T3) and is found in any case, quoted or
    not: grants given in one spelling hold for statements written in any other."""
    srv = start_server(analytical)
    setup = ['CREATE TABLE "T3" (a BIGINT)', "CREATE TABLE Sink (a BIGINT)",
             "INSERT INTO t3 VALUES (1)", "GRANT SELECT ON t3 TO bob",
             'GRANT INSERT ON "Sink" TO bob']
    with admin_and_bob(srv, setup) as bob:
        for name in ("t3", "T3", '"T3"', '"t3"'):
            assert bob.execute(f"SELECT a FROM {name}").fetchall() == [(1,)], name
        bob.execute("INSERT INTO sink SELECT a FROM T3")
        bob.execute('INSERT INTO "SINK" VALUES (2)')
        with pytest.raises(DENIED):
            bob.execute("SELECT a FROM SINK")
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            assert admin.execute("SELECT a FROM sink ORDER BY a").fetchall() == [(1,), (2,)]
            assert sorted(admin.execute("SELECT name FROM system.tables").fetchall()) == [
                ("Sink",), ("T3",)]
            admin.execute('REVOKE SELECT ON "T3" FROM bob')
            admin.execute("REVOKE INSERT ON SINK FROM bob")
        with pytest.raises(DENIED):
            bob.execute("SELECT a FROM t3")
        with pytest.raises(DENIED):
            bob.execute("INSERT INTO Sink VALUES (3)")


def test_analytical_alter_table_is_for_admins_and_a_renamed_table_keeps_its_grants(
        start_server, analytical) -> None:
    srv = start_server(analytical)
    setup = [*ANALYTICAL_SETUP, "GRANT SELECT, INSERT ON open_t TO bob"]
    with admin_and_bob(srv, setup) as bob:
        for sql in ("ALTER TABLE open_t RENAME TO mine", "ALTER TABLE open_t ADD COLUMN x INT",
                    "ALTER TABLE open_t DROP COLUMN a",
                    "CREATE TABLE copy AS SELECT * FROM open_t"):
            with pytest.raises(DENIED):
                bob.execute(sql)
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            admin.execute("ALTER TABLE open_t RENAME TO Opened")
            admin.execute("ALTER TABLE opened ADD COLUMN note VARCHAR")
            rows = admin.execute("SELECT \"user\", \"table\", privilege FROM system.grants "
                                 "WHERE privilege <> 'MEMBER' ORDER BY 1, 2, 3").fetchall()
            assert rows == [("bob", "Opened", "INSERT"), ("bob", "Opened", "SELECT")]
            admin.execute("CREATE TABLE open_t (a BIGINT)")  # the old name: no grant
        assert bob.execute("SELECT a, note FROM opened").fetchall() == [(1, None)]
        bob.execute("INSERT INTO opened VALUES (2, 'n')")
        with pytest.raises(DENIED):
            bob.execute("SELECT * FROM open_t")


@pytest.mark.parametrize("recreate", [
    ["CREATE TABLE open_t (a BIGINT)", "INSERT INTO open_t VALUES (2)"],
    ["CREATE TABLE open_t AS SELECT 2::BIGINT AS a"],
    ["CREATE TABLE other (a BIGINT)", "INSERT INTO other VALUES (2)",
     "ALTER TABLE other RENAME TO open_t"],
])
def test_analytical_a_dropped_tables_grants_do_not_pass_to_a_new_table_of_its_name(
        start_server, analytical, recreate) -> None:
    """DROP TABLE left its grants under the name: a table created later with it gave bob
    SELECT and INSERT on data he was never granted. They go with the table."""
    srv = start_server(analytical)
    setup = [*ANALYTICAL_SETUP, "CREATE ROLE readers", "GRANT readers TO bob",
             "GRANT SELECT, INSERT ON open_t TO bob", "GRANT SELECT ON open_t TO readers"]
    with admin_and_bob(srv, setup) as bob:
        assert bob.execute("SELECT a FROM open_t").fetchall() == [(1,)]
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            admin.execute("DROP TABLE open_t")
            admin.execute("DROP TABLE IF EXISTS open_t")  # missing: nothing to do
            grants = "SELECT \"table\" FROM system.grants WHERE privilege <> 'MEMBER'"
            assert admin.execute(grants).fetchall() == []
            for sql in recreate:
                admin.execute(sql)
            assert admin.execute(grants).fetchall() == []
        for sql in ("SELECT a FROM open_t", "INSERT INTO open_t VALUES (3)"):
            with pytest.raises(DENIED):
                bob.execute(sql)


def test_analytical_a_drop_killed_before_its_commit_leaves_no_grant_to_pass_on(
        tmp_path, monkeypatch) -> None:
    """kill -9 in a server's DROP TABLE after its grants are removed, before the catalog's
    commit: the table is still there, without its grants (an admin grants them again),
    and a table of its name made after a drop gets none."""
    import signal
    import subprocess
    import sys

    from cryptdisk.server import AnalyticalEngine, Privileges, UserStore
    from tests.db.test_db_crash import env
    from tests.fields.conftest import CONFIG

    monkeypatch.setenv("CRYPTDISK_TEST_EMAILS_KEY", "ab" * 32)
    config, path, users = tmp_path / "c.toml", tmp_path / "db", tmp_path / "users"
    config.write_text(CONFIG)
    engine = AnalyticalEngine(path, config)
    store = UserStore(users, engine.keyring, iterations=4096)
    store.set_user("admin", "pw", admin=True, create=True)
    store.set_user("bob", "pw", create=True)
    store.change_grants(["bob"], ["t"], ["SELECT"], grant=True)
    engine.db.sql("CREATE TABLE t (a BIGINT)")
    engine.close()
    child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("drop_child.py")),
                              str(path), str(config), str(users), "t"],
                             stdout=subprocess.PIPE, text=True, env=env())
    try:
        assert child.stdout.readline().strip() == "open"
        assert child.stdout.readline().strip() == "paused"
    finally:
        child.send_signal(signal.SIGKILL)
        child.stdout.close()
        child.wait()
    engine = AnalyticalEngine(path, config)
    try:
        store = UserStore(users, engine.keyring, iterations=4096)
        assert "t" in engine.db.catalog.tables  # not dropped, and not granted
        assert not Privileges(store, "bob").allowed("t", "SELECT")
        engine.db.sql("DROP TABLE t")  # (embedded: no grant to remove)
        engine.db.sql("CREATE TABLE t (a BIGINT)")
        assert not Privileges(store, "bob").allowed("t", "SELECT")
    finally:
        engine.close()


def test_analytical_grants_of_tables_dropped_while_stopped_go_when_it_starts(
        start_server, analytical, tmp_path) -> None:
    """A table dropped by an embedded connection while the server was stopped keeps its
    grants in the server's user file; the server removes grants on names no table has
    when it starts, before a table of the name can be made."""
    import warnings

    import cryptdisk
    from cryptdisk.server import AnalyticalEngine, ScramAuthenticator

    srv = start_server(analytical)
    with admin_and_bob(srv, [*ANALYTICAL_SETUP, "GRANT SELECT ON open_t, secret TO bob",
                             "GRANT SELECT ON system.parts TO bob"]) as bob:
        assert bob.execute("SELECT a FROM open_t").fetchall() == [(1,)]
    store = srv.server.authenticator.store
    srv.stop()  # (closes the engine)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated-key warning
        with cryptdisk.connect(tmp_path / "a.db") as db:
            db.sql("DROP TABLE open_t")  # embedded, the server stopped: it sees nothing
        engine = AnalyticalEngine(tmp_path / "a.db")
    assert "open_t" in store.grants("bob")
    srv = start_server(engine, authenticator=ScramAuthenticator(store, delay=0.01,
                                                                max_delay=0.05))
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        rows = admin.execute("SELECT \"table\" FROM system.grants WHERE \"user\" = 'bob' "
                             "ORDER BY 1").fetchall()
        assert rows == [("secret",), ("system.parts",)]
        admin.execute("CREATE TABLE open_t (a BIGINT)")
    with psycopg.connect(**{**srv.dsn, "user": "bob", "password": "bob pw"},
                         autocommit=True) as bob:
        with pytest.raises(DENIED):
            bob.execute("SELECT a FROM open_t")
        assert bob.execute("SELECT s FROM secret").fetchall() == [("hidden",)]


def test_analytical_a_drop_that_fails_keeps_its_grants(analytical, tmp_path) -> None:
    """The grants are removed before the catalog's commit: a DROP TABLE that fails (here
    on a read-only database) gives them back."""
    import warnings

    from cryptdisk.server import AnalyticalEngine, Privileges, UserStore
    from cryptdisk.server._engines import StatementError

    analytical.db.sql("CREATE TABLE t (a BIGINT)")
    analytical.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated-key warning
        engine = AnalyticalEngine(tmp_path / "a.db", read_only=True)
    store = UserStore(tmp_path / "users", engine.keyring, iterations=4096)
    store.set_user("admin", "pw", admin=True, create=True)
    store.set_user("bob", "pw", create=True)
    store.change_grants(["bob"], ["t"], ["INSERT", "SELECT"], grant=True)
    session = engine.open_session()
    session.set_privileges(Privileges(store, "admin"))
    try:
        with pytest.raises(StatementError):
            session.run("DROP TABLE t", [])
        assert "t" in engine.db.catalog.tables
        assert store.grants("bob") == {"t": ["INSERT", "SELECT"]}
    finally:
        session.close()
        engine.close()


@pytest.mark.parametrize("recreate", [
    ["DROP TABLE open_t", "CREATE TABLE open_t (a INTEGER)"],
    ["DROP TABLE IF EXISTS open_t", "DROP TABLE IF EXISTS open_t",
     "CREATE TABLE open_t AS SELECT 2 AS a"],
    ["DROP TABLE open_t", "CREATE TABLE other (a INTEGER)",
     "ALTER TABLE other RENAME TO Open_T"],
    ["ALTER TABLE open_t RENAME TO moved", "CREATE TABLE open_t (a INTEGER)"],
])
def test_sqlite_a_dropped_tables_grants_do_not_pass_to_a_new_table_of_its_name(
        start_server, sqlite_engine, recreate) -> None:
    """DROP TABLE (and a rename away) left the table's grants under its name in the user
    file: a table created later with it gave bob SELECT and INSERT he was never granted.
    A drop removes them; a rename moves them to the new name, as in PostgreSQL."""
    srv = start_server(sqlite_engine)
    setup = [*SQLITE_SETUP, "CREATE ROLE readers", "GRANT readers TO bob",
             "GRANT SELECT, INSERT ON open_t TO bob", "GRANT SELECT ON open_t TO readers"]
    with admin_and_bob(srv, setup) as bob:
        assert bob.execute("SELECT a FROM open_t").fetchall() == [(1,)]
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            for sql in recreate:
                admin.execute(sql)
            admin.execute("INSERT INTO open_t VALUES (3)")
            grants = admin.execute("SELECT \"user\", \"table\", privilege FROM system.grants "
                                   "WHERE privilege <> 'MEMBER' ORDER BY 1, 2, 3").fetchall()
        moved = recreate[0].startswith("ALTER")
        assert grants == ([("bob", "moved", "INSERT"), ("bob", "moved", "SELECT"),
                           ("readers", "moved", "SELECT")] if moved else [])
        for sql in ("SELECT a FROM open_t", "INSERT INTO open_t VALUES (3)"):
            with pytest.raises(DENIED):
                bob.execute(sql)
        if moved:
            assert bob.execute("SELECT a FROM moved").fetchall() == [(1,)]


@pytest.mark.parametrize("rollback", [
    ["BEGIN", "DROP TABLE open_t", "ROLLBACK"],
    ["BEGIN", "SAVEPOINT s", "DROP TABLE open_t", "ROLLBACK TO s", "COMMIT"],
    ["BEGIN", "ALTER TABLE open_t RENAME TO moved", "ROLLBACK"],
    ["DROP TABLE open_t; DROP TABLE no_such_table"],  # one implicit transaction: it fails
])
def test_sqlite_a_drop_rolled_back_keeps_its_grants(start_server, sqlite_engine,
                                                    rollback) -> None:
    srv = start_server(sqlite_engine)
    with admin_and_bob(srv, [*SQLITE_SETUP, "GRANT SELECT ON open_t TO bob"]) as bob:
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            for sql in rollback:
                try:
                    admin.execute(sql)
                except psycopg.errors.UndefinedTable:
                    pass
            assert admin.execute("SELECT \"table\" FROM system.grants WHERE \"user\" = "
                                 "'bob'").fetchall() == [("open_t",)]
        assert bob.execute("SELECT a FROM open_t").fetchall() == [(1,)]
    assert srv.server.authenticator.store.grants("bob") == {"open_t": ["SELECT"]}


def test_sqlite_a_drop_in_a_transaction_commits_with_it(start_server, sqlite_engine) -> None:
    """The grants go at the COMMIT, with the database's record of user changes (both or
    neither after a crash), and not before: the transaction still sees them."""
    from cryptdisk.server._engines import USERS_JOURNAL

    srv = start_server(sqlite_engine)
    store = srv.server.authenticator.store
    with admin_and_bob(srv, [*SQLITE_SETUP, "GRANT SELECT ON open_t, secret TO bob"]):
        with psycopg.connect(**srv.dsn) as admin:
            admin.execute("DROP TABLE open_t")
            assert "open_t" in store.grants("bob")  # not committed yet
            admin.commit()
    assert store.grants("bob") == {"secret": ["SELECT"]}
    session = sqlite_engine.open_session()
    try:
        session._internal = True  # (the server's own table)
        ((serial, text),) = session.run(f"SELECT serial, users FROM {USERS_JOURNAL}",
                                        []).rows
    finally:
        session.close()
    assert serial == store.serial
    assert b"open_t" not in text and b"secret" in text


def test_sqlite_grants_of_tables_dropped_while_stopped_go_when_it_starts(
        start_server, sqlite_engine, keyring, tmp_path) -> None:
    """A table dropped (or renamed) by an embedded connection while the server was stopped,
    or by a server killed before it saved the user file without a journal to recover
    from, keeps its grants in the user file; the server removes grants on names no table
    or view has when it starts, before a table of the name can be made."""
    from cryptdisk.server import ScramAuthenticator, SQLiteEngine
    from cryptdisk.sqlite import connect

    srv = start_server(sqlite_engine)
    with admin_and_bob(srv, [*SQLITE_SETUP, "GRANT SELECT ON open_t, secret, v_secret TO bob",
                             "GRANT SELECT ON audit TO bob",
                             "GRANT SELECT ON system.parts TO bob"]) as bob:
        assert bob.execute("SELECT a FROM open_t").fetchall() == [(1,)]
    store = srv.server.authenticator.store
    srv.stop()
    sqlite_engine.close()
    conn = connect(tmp_path / "s.db", keyring=keyring)
    conn.execute("DROP TABLE open_t")  # embedded, the server stopped: it sees nothing
    conn.execute("ALTER TABLE audit RENAME TO audit2")
    conn.close()
    assert "open_t" in store.grants("bob")
    engine = SQLiteEngine(tmp_path / "s.db", keyring)
    srv = start_server(engine, authenticator=ScramAuthenticator(store, delay=0.01,
                                                                max_delay=0.05))
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        rows = admin.execute("SELECT \"table\" FROM system.grants WHERE \"user\" = 'bob' "
                             "ORDER BY 1").fetchall()
        assert rows == [("secret",), ("system.parts",), ("v_secret",)]
        admin.execute("CREATE TABLE open_t (a INTEGER)")
        admin.execute("CREATE TABLE audit (x)")
    with psycopg.connect(**{**srv.dsn, "user": "bob", "password": "bob pw"},
                         autocommit=True) as bob:
        for sql in ("SELECT a FROM open_t", "SELECT x FROM audit"):
            with pytest.raises(DENIED):
                bob.execute(sql)
        assert bob.execute("SELECT s FROM secret").fetchall() == [("hidden",)]
    srv.stop()
    before = store.serial
    srv = start_server(SQLiteEngine(tmp_path / "s.db", keyring),
                       authenticator=ScramAuthenticator(store, delay=0.01, max_delay=0.05))
    assert store.serial == before  # nothing to remove: the user file is not written


def test_analytical_copy_from_a_server_file_is_for_admins(start_server, analytical, tmp_path
                                                           ) -> None:
    """COPY t FROM 'file' reads a file of the server's machine, as read_csv does: an admin
    loads it into the table, a user with INSERT on the table is refused."""
    data = tmp_path / "rows.csv"
    data.write_text("a\n5\n6\n")
    srv = start_server(analytical)
    setup = [*ANALYTICAL_SETUP, "CREATE TABLE sink (a BIGINT)", "GRANT INSERT ON sink TO bob"]
    with admin_and_bob(srv, setup) as bob:
        with pytest.raises(DENIED):
            bob.execute(f"COPY sink FROM '{data}' (HEADER)")
        with pytest.raises(DENIED):
            bob.execute(f"COPY sink (a) FROM '{data}'")
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM sink").fetchone() == (0,)
        admin.execute(f"COPY sink FROM '{data}' (HEADER)")
        assert admin.execute("SELECT a FROM sink ORDER BY a").fetchall() == [(5,), (6,)]


def test_analytical_non_admin_sets_its_own_session(start_server, analytical) -> None:
    """A user without grants SETs and RESETs its own session's settings (TimeZone, ...,
    search_path to public) as any PostgreSQL 15 user may: its SHOW, its ParameterStatus
    and its timestamptz text follow; another session's zone does not move."""
    srv = start_server(analytical)
    with admin_and_bob(srv, ANALYTICAL_SETUP) as bob, \
            psycopg.connect(**srv.dsn, autocommit=True) as admin:
        for sql in ("SET TimeZone = 'Asia/Tokyo'", "SET SESSION TimeZone TO 'Asia/Tokyo'"):
            bob.execute(sql)
            assert bob.execute("SHOW TimeZone").fetchone() == ("Asia/Tokyo",)
            assert bob.info.parameter_status("TimeZone") == "Asia/Tokyo"
            assert bob.execute("SELECT '2024-07-01 00:00:00+00'::TIMESTAMPTZ::VARCHAR"
                               ).fetchone() == ("2024-07-01 09:00:00+09",)
            assert admin.execute("SHOW TimeZone").fetchone() == ("UTC",)
            assert admin.execute("SELECT '2024-07-01 00:00:00+00'::TIMESTAMPTZ::VARCHAR"
                                 ).fetchone() == ("2024-07-01 00:00:00+00",)
            bob.execute("RESET TimeZone")
            assert bob.execute("SHOW TimeZone").fetchone() == ("UTC",)
        bob.execute("SET TIME ZONE 'Europe/Paris'")
        assert bob.execute("SELECT current_setting('TimeZone')").fetchone() == \
            ("Europe/Paris",)
        for sql, shown in [("SET application_name = 'bobs'", ("application_name", "bobs")),
                           ("SET statement_timeout = '5s'", ("statement_timeout", "5s")),
                           ("SET client_min_messages = warning",
                            ("client_min_messages", "warning")),
                           ("SET extra_float_digits = 0", ("extra_float_digits", "0")),
                           ("SET search_path = public", ("search_path", "public"))]:
            bob.execute(sql)
            assert bob.execute(f"SHOW {shown[0]}").fetchone() == (shown[1],), sql
        bob.execute("RESET ALL")
        assert bob.execute("SHOW TimeZone").fetchone() == ("UTC",)
        assert bob.execute("SHOW search_path").fetchone() == ('"$user", public',)
        bob.execute("SET TimeZone TO 'Asia/Kolkata'")
        bob.execute("RESET search_path")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="Nowhere/X"):
            bob.execute("SET TimeZone = 'Nowhere/X'")
        assert bob.execute("SHOW TimeZone").fetchone() == ("Asia/Kolkata",)


@pytest.mark.parametrize("sql", [
    "SET threads = 1", "SET threads TO 1", "RESET threads", "SET GLOBAL threads = 1",
    "SET memory_limit = '1GB'", "SET SESSION memory_limit = '1GB'",
    "SET arrow_lossless_conversion = true", "SET GLOBAL arrow_lossless_conversion = true",
    "SET GLOBAL search_path = 'main'",
    "SET search_path = other", "SET search_path = 'system.main'", "PRAGMA threads = 1",
    "SET TimeZone = 'UTC' || ''", "SET TimeZone = current_setting('threads')",
])
def test_analytical_non_admin_set_of_the_databases_settings_is_refused(
        start_server, analytical, sql) -> None:
    """A SET that changes the database (DuckDB's global settings) or takes the session to
    tables the grants do not name (another search_path) stays an admin's, and changes
    nothing: not the other sessions' settings, not the user's own."""
    srv = start_server(analytical)
    show = ("SELECT current_setting('threads'), current_setting('memory_limit'), "
            "current_setting('arrow_lossless_conversion'), current_setting('search_path')")
    with admin_and_bob(srv, ANALYTICAL_SETUP) as bob, \
            psycopg.connect(**srv.dsn, autocommit=True) as admin:
        before = admin.execute(show).fetchone()
        bob_before = bob.execute("SELECT current_setting('arrow_lossless_conversion')"
                                 ).fetchone()
        with pytest.raises(DENIED):
            bob.execute(sql)
        assert admin.execute(show).fetchone() == before
        assert bob.execute("SELECT current_setting('arrow_lossless_conversion')"
                           ).fetchone() == bob_before
        assert bob.execute("SHOW TimeZone").fetchone() == ("UTC",)
