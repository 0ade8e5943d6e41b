"""pg_catalog.pg_roles and pg_user (JDBC's and BI tools' role lookups) list the server's
users and roles to every user, as PostgreSQL's do, with a masked password, never a
verifier; on both engines."""

from __future__ import annotations

import psycopg
import pytest

from tests.server.conftest import PASSWORD, USER


@pytest.fixture(params=["analytical", "sqlite"])
def srv(request, start_server):
    return start_server(request.getfixturevalue(
        "analytical" if request.param == "analytical" else "sqlite_engine"))


def test_pg_roles_lists_users_and_roles_without_verifiers(srv) -> None:
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        for st in ["CREATE USER bob PASSWORD 'bob pw'", "CREATE ROLE readers",
                   "GRANT readers TO bob"]:
            admin.execute(st)
    dsn = {**srv.dsn, "user": "bob", "password": "bob pw"}
    with psycopg.connect(**dsn, autocommit=True) as bob:  # not an admin: sees them all
        rows = bob.execute("SELECT rolname, rolsuper, rolcanlogin, rolpassword "
                           "FROM pg_catalog.pg_roles ORDER BY rolname").fetchall()
        assert rows == [("bob", False, True, "********"), ("readers", False, False, None),
                        (USER, True, True, "********")]
        everything = bob.execute("SELECT * FROM pg_roles").fetchall()
        assert len(everything) == 3
        text = repr(everything)
        assert "SCRAM" not in text and "bob pw" not in text and PASSWORD not in text
        me = bob.execute("SELECT r.rolname, r.oid > 0 FROM pg_roles r "
                         "WHERE r.rolname = current_user").fetchall()
        assert me == [("bob", True)]
        users = bob.execute("SELECT usename, usesuper FROM pg_user ORDER BY 1").fetchall()
        assert users == [("bob", False), (USER, True)]
