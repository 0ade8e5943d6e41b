"""Roles: CREATE/DROP ROLE, GRANT role TO user, privileges through roles, SET ROLE, persistence."""

from __future__ import annotations

import psycopg
import pytest

from cryptdisk.server import Privileges, UserStore

DENIED = psycopg.errors.InsufficientPrivilege


def connect(srv, user: str | None = None, password: str | None = None):
    dsn = dict(srv.dsn)
    if user is not None:
        dsn.update(user=user, password=password)
    return psycopg.connect(**dsn, autocommit=True)


def setup_roles(srv, statements: list[str]) -> None:
    with connect(srv) as admin:
        admin.execute("CREATE USER bob PASSWORD 'bob pw'")
        for st in statements:
            admin.execute(st)


SQLITE_TABLES = ["CREATE TABLE sales (a INTEGER)", "CREATE TABLE hr (s TEXT)",
                 "INSERT INTO sales VALUES (1)", "INSERT INTO hr VALUES ('pay')"]


@pytest.mark.parametrize("engine_name", ["sqlite_engine", "analytical"])
def test_privileges_through_roles_nested_and_revoked(start_server, request, engine_name) -> None:
    srv = start_server(request.getfixturevalue(engine_name))
    setup_roles(srv, [*SQLITE_TABLES, "CREATE ROLE readers", "CREATE ROLE analysts",
                      "GRANT SELECT ON sales TO readers", "GRANT readers TO analysts",
                      "GRANT analysts TO bob"])
    with connect(srv, "bob", "bob pw") as bob:
        assert bob.execute("SELECT a FROM sales").fetchall() == [(1,)]  # bob < analysts < readers
        with pytest.raises(DENIED):
            bob.execute("SELECT s FROM hr")
        with connect(srv) as admin:
            assert ("readers", "sales", "SELECT", None, None) in \
                admin.execute("SELECT * FROM system.grants").fetchall()
            assert ("bob", None, "MEMBER", "analysts", False) in \
                admin.execute("SELECT * FROM system.grants").fetchall()
            assert admin.execute("SELECT * FROM system.roles").fetchall() == \
                [("analysts", "bob"), ("readers", "analysts")]
            admin.execute("REVOKE readers FROM analysts")
        with pytest.raises(DENIED):  # at once, on the open session
            bob.execute("SELECT a FROM sales")
        with connect(srv) as admin:
            admin.execute("GRANT readers TO bob")
        assert bob.execute("SELECT a FROM sales").fetchall() == [(1,)]
        with connect(srv) as admin:
            admin.execute("DROP ROLE readers")  # its memberships and grants go with it
            assert admin.execute("SELECT * FROM system.roles").fetchall() == \
                [("analysts", "bob")]
            assert [g for g in admin.execute("SELECT * FROM system.grants").fetchall()
                    if g[0] == "readers"] == []
        with pytest.raises(DENIED):
            bob.execute("SELECT a FROM sales")


def test_set_role_current_user_session_user(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    setup_roles(srv, [*SQLITE_TABLES, "CREATE ROLE readers", "CREATE ROLE hr_staff",
                      "GRANT SELECT ON sales TO readers", "GRANT SELECT ON hr TO hr_staff",
                      "GRANT readers, hr_staff TO bob"])
    with connect(srv, "bob", "bob pw") as bob:
        cur = bob.execute("SELECT current_user, session_user, 'current_user' AS q")
        assert cur.fetchall() == [("bob", "bob", "current_user")]
        assert [d.name for d in cur.description] == ["current_user", "session_user", "q"]
        assert bob.execute("SELECT s FROM hr").fetchall() == [("pay",)]
        bob.execute("SET ROLE readers")  # only readers' privileges now
        assert bob.execute("SELECT current_user, current_role, session_user").fetchall() \
            == [("readers", "readers", "bob")]
        assert bob.execute("SELECT a FROM sales").fetchall() == [(1,)]
        with pytest.raises(DENIED):
            bob.execute("SELECT s FROM hr")
        # prepared (extended protocol) statements see the role too
        assert bob.execute("SELECT current_user WHERE 1 = %s", (1,)).fetchall() == [("readers",)]
        bob.execute("RESET ROLE")
        assert bob.execute("SELECT current_user").fetchall() == [("bob",)]
        assert bob.execute("SELECT s FROM hr").fetchall() == [("pay",)]
        with pytest.raises(DENIED):  # not a member
            with connect(srv) as admin:
                admin.execute("CREATE ROLE other")
            bob.execute("SET ROLE other")
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            bob.execute("SET ROLE nobody")
        bob.execute("SET ROLE NONE")
        assert bob.execute("SELECT current_user").fetchall() == [("bob",)]


@pytest.mark.parametrize("engine_name", ["sqlite_engine", "analytical"])
def test_identity_functions_with_parentheses(start_server, request, engine_name) -> None:
    """``current_role()`` (as fields-policies.md writes it in a policy's body, and as
    Snowflake's users write it) is the same as ``current_role`` in a user's own query:
    neither a refusal nor a syntax error showing the name written in."""
    srv = start_server(request.getfixturevalue(engine_name))
    setup_roles(srv, ["CREATE ROLE readers", "GRANT readers TO bob"])
    with connect(srv, "bob", "bob pw") as bob:
        bob.execute("SET ROLE readers")
        cur = bob.execute("SELECT current_role(), current_user ( ), session_user(), "
                          "'current_role()' AS q")
        assert cur.fetchall() == [("readers", "readers", "bob", "current_role()")]
        assert [d.name for d in cur.description] == \
            ["current_role", "current_user", "session_user", "q"]
        assert bob.execute("SELECT 1 WHERE current_role() = %s", ("readers",)).fetchall() \
            == [(1,)]


def test_admin_set_role_drops_admin_rights(start_server, analytical) -> None:
    srv = start_server(analytical)
    setup_roles(srv, ["CREATE TABLE t (a BIGINT)", "CREATE TABLE s (a BIGINT)",
                      "CREATE ROLE viewer", "GRANT SELECT ON t TO viewer"])
    with connect(srv) as admin:
        admin.execute("SET ROLE viewer")
        assert admin.execute("SELECT count(*) FROM t").fetchall() == [(0,)]
        with pytest.raises(DENIED):
            admin.execute("SELECT * FROM s")
        with pytest.raises(DENIED):
            admin.execute("CREATE ROLE x")
        admin.execute("RESET ROLE")  # always allowed
        assert admin.execute("SELECT count(*) FROM s").fetchall() == [(0,)]


@pytest.mark.parametrize("sql, error", [
    ("CREATE ROLE bob", psycopg.errors.DuplicateObject),          # users and roles: one namespace
    ("CREATE USER readers PASSWORD 'x'", psycopg.errors.DuplicateObject),
    ("GRANT bob TO readers", psycopg.errors.InvalidGrantOperation),      # only roles are granted
    ("GRANT nosuch TO bob", psycopg.errors.UndefinedObject),
    ("GRANT readers TO nosuch", psycopg.errors.UndefinedObject),
    ("GRANT readers TO readers", psycopg.errors.InvalidGrantOperation),
    ("GRANT bob_role TO readers", psycopg.errors.InvalidGrantOperation),  # a cycle
    ("CREATE ROLE r2 PASSWORD 'x'", psycopg.errors.SyntaxError),   # roles do not log in
    ("ALTER ROLE readers PASSWORD 'x'", psycopg.errors.WrongObjectType),
    ("DROP ROLE nosuch", psycopg.errors.UndefinedObject),
])
def test_role_errors(start_server, sqlite_engine, sql, error) -> None:
    srv = start_server(sqlite_engine)
    setup_roles(srv, ["CREATE ROLE readers", "CREATE ROLE bob_role", "GRANT readers TO bob_role"])
    with connect(srv) as admin:
        with pytest.raises(error):
            admin.execute(sql)
        admin.execute("DROP ROLE IF EXISTS nosuch")


@pytest.mark.parametrize("sql", ["CREATE ROLE r", "DROP ROLE readers", "GRANT readers TO bob",
                                 "REVOKE readers FROM bob"])
def test_only_admins_manage_roles(start_server, sqlite_engine, sql) -> None:
    srv = start_server(sqlite_engine)
    setup_roles(srv, ["CREATE ROLE readers"])
    with connect(srv, "bob", "bob pw") as bob:
        with pytest.raises(DENIED):
            bob.execute(sql)


def test_roles_persist_in_the_sealed_user_file(tmp_path, keyring) -> None:
    path = tmp_path / "db.users"
    store = UserStore(path, keyring, iterations=4096)
    store.set_user("alice", "pw", create=True)
    store.create_role("readers")
    store.create_role("staff")
    store.grant_roles(["readers"], ["staff"], grant=True)
    store.grant_roles(["staff"], ["alice"], grant=True, admin_option=True)
    store.change_grants(["readers"], ["sales"], ["SELECT"], grant=True)
    assert b"readers" not in path.read_bytes()  # sealed: no names in the clear

    again = UserStore(path, keyring)
    assert again.member_of("alice") == {"staff", "readers"}
    assert again.admin_of({"alice"}) == {"staff"} and again.admin_of({"staff"}) == set()
    p = Privileges(again, "alice")
    assert p.roles == {"alice", "staff", "readers"} and p.has_role("readers")
    assert p.allowed("SALES", "SELECT") and not p.allowed("sales", "INSERT")
    p.set_role("staff")
    assert (p.current_user, p.session_user) == ("staff", "alice")
    assert p.roles == {"staff", "readers"}
    assert "staff" in repr(again) or "roles=2" in repr(again)


ADMIN_OPTION_SETUP = [*SQLITE_TABLES, "CREATE USER carol PASSWORD 'carol pw'",
                      "CREATE USER dave PASSWORD 'dave pw'", "CREATE ROLE analysts",
                      "CREATE ROLE hr_readers", "CREATE ROLE leads",
                      "GRANT SELECT ON sales TO analysts", "GRANT SELECT ON hr TO hr_readers",
                      "GRANT analysts TO bob WITH ADMIN OPTION"]


@pytest.mark.parametrize("engine_name", ["sqlite_engine", "analytical"])
def test_admin_option_lets_a_user_grant_and_revoke_that_role(start_server, request,
                                                             engine_name) -> None:
    srv = start_server(request.getfixturevalue(engine_name))
    setup_roles(srv, ADMIN_OPTION_SETUP)
    with connect(srv, "bob", "bob pw") as bob, connect(srv, "carol", "carol pw") as carol:
        with pytest.raises(DENIED):
            carol.execute("SELECT a FROM sales")
        bob.execute("GRANT analysts TO carol")
        assert carol.execute("SELECT a FROM sales").fetchall() == [(1,)]
        with connect(srv) as admin:
            grants = [g for g in admin.execute("SELECT * FROM system.grants").fetchall()
                      if g[2] == "MEMBER"]
            assert sorted(grants) == [("bob", None, "MEMBER", "analysts", True),
                                      ("carol", None, "MEMBER", "analysts", False)]
        bob.execute("REVOKE analysts FROM carol")
        with pytest.raises(DENIED):
            carol.execute("SELECT a FROM sales")
        bob.execute("GRANT analysts TO carol WITH ADMIN OPTION")  # passed on
        carol.execute("GRANT analysts TO dave")
        with connect(srv) as admin:
            admin.execute("REVOKE ADMIN OPTION FOR analysts FROM carol")
            assert ("carol", None, "MEMBER", "analysts", False) in \
                admin.execute("SELECT * FROM system.grants").fetchall()
        assert carol.execute("SELECT a FROM sales").fetchall() == [(1,)]  # still a member
        with pytest.raises(DENIED):
            carol.execute("REVOKE analysts FROM dave")


@pytest.mark.parametrize("sql", [
    "GRANT hr_readers TO bob",                       # no admin option on that role
    "GRANT analysts, hr_readers TO carol",           # one of two
    "REVOKE hr_readers FROM dave",
    "GRANT SELECT ON hr TO bob",                     # table privileges: admins only
    "GRANT SELECT ON sales TO carol",
    "CREATE ROLE mine", "DROP ROLE analysts", "ALTER USER carol NOADMIN",
    "GRANT analysts TO carol; SELECT s FROM hr",     # a query refused whole
])
def test_admin_option_denied_paths(start_server, sqlite_engine, sql) -> None:
    srv = start_server(sqlite_engine)
    setup_roles(srv, [*ADMIN_OPTION_SETUP, "GRANT hr_readers TO dave"])
    with connect(srv, "bob", "bob pw") as bob:
        with pytest.raises(DENIED):
            bob.execute(sql)
    with connect(srv) as admin:
        members = sorted(g for g in admin.execute("SELECT * FROM system.grants").fetchall()
                         if g[2] == "MEMBER")
        assert members == [("bob", None, "MEMBER", "analysts", True),
                           ("dave", None, "MEMBER", "hr_readers", False)]
        assert ("bob", "hr", "SELECT", None, None) not in \
            admin.execute("SELECT * FROM system.grants").fetchall()


def test_a_member_without_the_option_and_set_role(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    setup_roles(srv, [*ADMIN_OPTION_SETUP, "GRANT analysts TO carol",
                      "GRANT hr_readers TO leads WITH ADMIN OPTION", "GRANT leads TO bob"])
    with connect(srv, "carol", "carol pw") as carol:
        with pytest.raises(DENIED):  # a member, but without the admin option
            carol.execute("GRANT analysts TO dave")
    with connect(srv, "bob", "bob pw") as bob:
        bob.execute("GRANT hr_readers TO dave")  # through leads, which holds the option
        bob.execute("SET ROLE analysts")         # acting as analysts: no option on hr_readers
        with pytest.raises(DENIED):
            bob.execute("REVOKE hr_readers FROM dave")
        bob.execute("RESET ROLE")
        bob.execute("REVOKE hr_readers FROM dave")
        # revoking its own membership: the SELECT after it is checked without it, so the
        # query is refused whole and bob stays a member
        with pytest.raises(DENIED):
            bob.execute("REVOKE analysts FROM bob; SELECT a FROM sales")
        assert bob.execute("SELECT a FROM sales").fetchall() == [(1,)]
    with connect(srv) as admin:
        admin.execute("DROP ROLE hr_readers")
        assert [g for g in admin.execute("SELECT * FROM system.grants").fetchall()
                if g[3] == "hr_readers"] == []


def test_granted_by_the_current_user_is_accepted_any_other_refused(start_server,
                                                                   sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    setup_roles(srv, [*SQLITE_TABLES, "CREATE ROLE readers", "CREATE USER carol PASSWORD 'c'",
                      "GRANT readers TO carol WITH ADMIN OPTION"])
    with connect(srv) as admin:
        admin.execute("GRANT SELECT ON sales TO readers GRANTED BY CURRENT_USER")
        admin.execute("GRANT readers TO bob GRANTED BY u")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="grantor"):
            admin.execute("GRANT SELECT ON hr TO bob GRANTED BY carol")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="grantor"):
            admin.execute('REVOKE readers FROM bob GRANTED BY "carol"')
        grants = admin.execute("SELECT * FROM system.grants").fetchall()
    assert ("readers", "sales", "SELECT", None, None) in grants
    assert ("bob", None, "MEMBER", "readers", False) in grants
    assert not any(g[0] == "bob" and g[1] == "hr" for g in grants)
    with connect(srv, "bob", "bob pw") as bob:
        assert bob.execute("SELECT a FROM sales").fetchall() == [(1,)]
    with connect(srv, "carol", "c") as carol:  # the admin option, granting as itself
        carol.execute("REVOKE readers FROM bob GRANTED BY carol")
        carol.execute("SET ROLE readers")
        with pytest.raises(psycopg.errors.FeatureNotSupported):  # now acting as readers
            carol.execute("GRANT readers TO bob GRANTED BY SESSION_USER")


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_system_grants_shows_the_declared_table_name(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with connect(srv) as admin:
        admin.execute("CREATE TABLE SalesEU (a INTEGER)")
        admin.execute('CREATE TABLE "HR" (s TEXT)')
        admin.execute("CREATE ROLE readers")
        admin.execute("GRANT SELECT ON saleseu TO readers")
        admin.execute('GRANT INSERT ON "HR", gone_later TO readers')
        rows = admin.execute("SELECT * FROM system.grants").fetchall()
        assert sorted(r[1] for r in rows if r[0] == "readers") == \
            ["HR", "SalesEU", "gone_later"]
        admin.execute("CREATE USER bob PASSWORD 'bob pw'")
        with connect(srv, "bob", "bob pw") as bob:  # the name is the table's, whoever asks
            assert ("readers", "SalesEU", "SELECT", None, None) in \
                bob.execute("SELECT * FROM system.grants").fetchall()
