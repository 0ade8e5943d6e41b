"""Users, roles and grants are transactional on --sqlite, as in PostgreSQL: undone with the
simple query, explicit transaction or pipeline they ran in when it fails or rolls back."""

from __future__ import annotations

import json

import psycopg
import pytest

from cryptdisk.server import AccessLog
from tests.server.rawclient import Raw, cstr, msg, sqlstate

#: run the SQLite tests with a rollback journal and in WAL mode
SQLITE_JOURNALS = ("delete", "wal")

BOB = ("bob", "bob pw")


def connect(srv, user: str | None = None, password: str | None = None):
    dsn = dict(srv.dsn)
    if user is not None:
        dsn.update(user=user, password=password)
    return psycopg.connect(**dsn, autocommit=True)


@pytest.fixture
def srv(start_server, sqlite_engine):
    srv = start_server(sqlite_engine)
    with connect(srv) as admin:
        for st in ["CREATE TABLE t (a INTEGER)", "INSERT INTO t VALUES (1)",
                   "CREATE TABLE p (id INTEGER PRIMARY KEY)",
                   "CREATE TABLE c (pid INTEGER REFERENCES p(id) DEFERRABLE INITIALLY DEFERRED)",
                   "CREATE USER bob PASSWORD 'bob pw'", "CREATE ROLE readers",
                   "GRANT SELECT ON t TO readers"]:
            admin.execute(st)
    return srv


def users_and_grants(srv) -> tuple[set[tuple], set[str], list[tuple]]:
    with connect(srv) as admin:
        users = set(admin.execute("SELECT * FROM system.users").fetchall())
        roles = {r[0] for r in admin.execute("SELECT * FROM system.roles").fetchall()}
        grants = sorted(admin.execute("SELECT * FROM system.grants").fetchall(), key=str)
    return users, roles, grants


def bob_reads(srv) -> bool:
    with connect(srv, *BOB) as bob:
        try:
            bob.execute("SELECT a FROM t").fetchall()
        except psycopg.errors.InsufficientPrivilege:
            return False
        return True


CHANGES = ["CREATE USER carol PASSWORD 'carol pw'", "CREATE ROLE writers",
           "GRANT readers TO bob", "GRANT INSERT ON t TO bob", "ALTER USER bob ADMIN",
           "DROP ROLE readers"]


@pytest.mark.parametrize("change", CHANGES)
def test_a_failing_simple_query_undoes_them(srv, change) -> None:
    before = users_and_grants(srv)
    with connect(srv) as admin:
        with pytest.raises(psycopg.errors.UndefinedTable):
            admin.execute(f"INSERT INTO t VALUES (2); {change}; SELECT * FROM missing")
        assert admin.execute("SELECT count(*) FROM t").fetchone() == (1,)
    assert users_and_grants(srv) == before


@pytest.mark.parametrize("change", CHANGES)
def test_rollback_undoes_them(srv, change) -> None:
    before = users_and_grants(srv)
    with connect(srv) as admin:
        admin.execute("BEGIN")
        admin.execute(change)
        admin.execute("ROLLBACK")
    assert users_and_grants(srv) == before
    with connect(srv) as admin:  # and after an error in the transaction
        admin.execute("BEGIN")
        admin.execute(change)
        with pytest.raises(psycopg.errors.UndefinedTable):
            admin.execute("SELECT * FROM missing")
        admin.execute("COMMIT")  # of a failed transaction: rolls back
    assert users_and_grants(srv) == before


def test_a_grant_counts_inside_its_transaction_only(srv) -> None:
    with connect(srv) as admin:
        admin.execute("BEGIN")
        admin.execute("GRANT readers TO bob")
        assert ("bob", None, "MEMBER", "readers", False) in \
            admin.execute("SELECT * FROM system.grants").fetchall()
        admin.execute("SET ROLE bob")
        assert admin.execute("SELECT a FROM t").fetchall() == [(1,)]
        assert not bob_reads(srv)  # another session does not see it yet
        admin.execute("ROLLBACK")
        assert admin.execute("SELECT current_user").fetchone() == ("u",)  # SET ROLE undone
    assert not bob_reads(srv)


def test_a_query_in_the_transaction_is_checked_against_its_grants(srv) -> None:
    with connect(srv) as admin:
        admin.execute("BEGIN")
        admin.execute("GRANT readers TO bob")
        # several statements: checked whole before they run, with the transaction's grants
        admin.execute("SET ROLE bob; SELECT a FROM t")
        admin.execute("RESET ROLE; REVOKE readers FROM bob")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            admin.execute("SET ROLE bob; SELECT a FROM t")
        admin.execute("ROLLBACK")
        assert admin.execute("SELECT current_user").fetchone() == ("u",)
    assert not bob_reads(srv)


def test_a_revoke_rolled_back_leaves_the_grant(srv) -> None:
    with connect(srv) as admin:
        admin.execute("GRANT readers TO bob")
        admin.execute("BEGIN")
        admin.execute("REVOKE readers FROM bob")
        admin.execute("SET ROLE bob")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            admin.execute("SELECT a FROM t")
        admin.execute("ROLLBACK")
    assert bob_reads(srv)


def test_commit_applies_them_with_the_data(srv) -> None:
    with connect(srv) as admin:
        admin.execute("BEGIN")
        admin.execute("CREATE USER carol PASSWORD 'carol pw'")
        admin.execute("GRANT readers TO carol")
        admin.execute("INSERT INTO t VALUES (2)")
        admin.execute("COMMIT")
    with connect(srv, "carol", "carol pw") as carol:
        assert carol.execute("SELECT a FROM t ORDER BY a").fetchall() == [(1,), (2,)]


def test_a_transaction_of_user_statements_only(srv) -> None:
    with connect(srv) as admin:
        admin.execute("BEGIN")
        admin.execute("GRANT readers TO bob")
        admin.execute("COMMIT")
    assert bob_reads(srv)
    with connect(srv) as admin:
        admin.execute("REVOKE readers FROM bob; GRANT INSERT ON t TO bob")
    assert not bob_reads(srv)


def test_a_failing_commit_undoes_them(srv) -> None:
    before = users_and_grants(srv)
    with connect(srv) as admin:
        admin.execute("PRAGMA foreign_keys = ON")
        admin.execute("BEGIN")
        admin.execute("GRANT readers TO bob")
        admin.execute("INSERT INTO c VALUES (99)")  # no p 99: the deferred check fails
        with pytest.raises(psycopg.errors.IntegrityError):
            admin.execute("COMMIT")
        assert admin.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert admin.execute("SELECT count(*) FROM c").fetchone() == (0,)
    assert users_and_grants(srv) == before
    assert not bob_reads(srv)


def test_a_commit_whose_user_changes_no_longer_apply_fails_whole(srv) -> None:
    with connect(srv) as a, connect(srv) as b:
        a.execute("BEGIN")
        a.execute("CREATE USER dave PASSWORD 'a pw'")
        # committed at once (a holds no write lock yet: b's change, a write, would wait)
        b.execute("CREATE USER dave PASSWORD 'b pw'")
        a.execute("INSERT INTO t VALUES (2)")
        with pytest.raises(psycopg.errors.DuplicateObject):
            a.execute("COMMIT")
        assert a.execute("SELECT count(*) FROM t").fetchone() == (1,)
    with connect(srv, "dave", "b pw") as dave:
        assert dave.execute("SELECT current_user").fetchone() == ("dave",)


def test_a_failing_pipeline_undoes_them(srv) -> None:
    before = users_and_grants(srv)
    with connect(srv) as admin:
        with pytest.raises(psycopg.errors.UndefinedTable):
            with admin.pipeline():
                admin.execute("INSERT INTO t VALUES (%s)", (2,))
                admin.execute("GRANT readers TO bob")
                admin.execute("CREATE ROLE writers")
                admin.execute("SELECT * FROM missing WHERE a = %s", (1,))
        assert admin.execute("SELECT count(*) FROM t").fetchone() == (1,)
    assert users_and_grants(srv) == before
    with connect(srv) as admin:
        with admin.pipeline():
            admin.execute("INSERT INTO t VALUES (%s)", (2,))
            admin.execute("GRANT readers TO bob")
    assert bob_reads(srv)


def test_a_savepoint_rolled_back_to_undoes_what_followed_it(srv) -> None:
    with connect(srv) as admin:
        admin.execute("BEGIN")
        admin.execute("CREATE ROLE writers")
        admin.execute("SAVEPOINT s")
        admin.execute("GRANT readers TO bob")
        admin.execute("ROLLBACK TO SAVEPOINT s")
        admin.execute("COMMIT")
    _, roles, _ = users_and_grants(srv)
    assert "writers" in roles
    assert not bob_reads(srv)


def test_every_statement_of_a_transaction_has_a_log_line(start_server, sqlite_engine,
                                                          tmp_path) -> None:
    path = tmp_path / "access.log"
    srv = start_server(sqlite_engine, access_log=AccessLog(path))
    with connect(srv) as admin:
        admin.execute("CREATE TABLE p (id INTEGER PRIMARY KEY)")
        admin.execute("CREATE TABLE c (pid INTEGER REFERENCES p(id) DEFERRABLE INITIALLY "
                      "DEFERRED)")
        admin.execute("PRAGMA foreign_keys = ON")
        admin.execute("BEGIN")
        admin.execute("INSERT INTO c VALUES (99)")
        with pytest.raises(psycopg.errors.IntegrityError):
            admin.execute("COMMIT")
        admin.execute("BEGIN")
        with pytest.raises(psycopg.errors.UndefinedTable):
            admin.execute("SELECT * FROM missing")
        admin.execute("COMMIT")
        admin.execute("ROLLBACK")  # none in progress: a warning, and a line
        admin.execute("BEGIN")
        with pytest.raises(psycopg.errors.InvalidSavepointSpecification):
            admin.execute("ROLLBACK TO SAVEPOINT nope")
        admin.execute("ROLLBACK")
        # an implicit transaction whose COMMIT fails: a line for that COMMIT
        with pytest.raises(psycopg.errors.IntegrityError):
            admin.execute("INSERT INTO c VALUES (99); SELECT 1")
        assert admin.execute("SELECT count(*) FROM c").fetchone() == (0,)
    srv.stop()
    log = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["kind"], e.get("sqlstate")) for e in log] == [
        ("CREATE", None), ("CREATE", None), ("PRAGMA", None), ("BEGIN", None),
        ("INSERT", None), ("COMMIT", "23503"), ("BEGIN", None), ("SELECT", "42P01"),
        ("COMMIT", None), ("ROLLBACK", None), ("BEGIN", None), ("ROLLBACK", "3B001"),
        ("ROLLBACK", None), ("INSERT", None), ("SELECT", None),
        ("COMMIT", "23503"), ("SELECT", None)]


def test_a_pipeline_whose_commit_fails_has_a_line_for_it(start_server, sqlite_engine,
                                                          tmp_path) -> None:
    path = tmp_path / "access.log"
    srv = start_server(sqlite_engine, secure=False, access_log=AccessLog(path))
    r = Raw(srv.port)
    try:
        r.startup()
        r.send(msg(b"Q", cstr("CREATE TABLE p (id INTEGER PRIMARY KEY); CREATE TABLE c (pid "
                              "INTEGER REFERENCES p(id) DEFERRABLE INITIALLY DEFERRED)")))
        r.until(b"Z")
        r.send(msg(b"Q", cstr("PRAGMA foreign_keys = ON")))
        r.until(b"Z")
        insert = cstr("") + cstr("INSERT INTO c VALUES (99)") + b"\0\0"
        execute = msg(b"B", cstr("") + cstr("") + b"\0\0\0\0\0\0") + \
            msg(b"E", cstr("") + b"\0\0\0\0")
        r.send(msg(b"P", insert) + execute + execute + msg(b"S"))
        got = r.until(b"Z")
        errors = [sqlstate(body) for kind, body in got if kind == b"E"]
        assert errors == ["23503"] and got[-1] == (b"Z", b"I")
    finally:
        r.close()
    srv.stop()
    log = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["kind"], e.get("sqlstate")) for e in log][-3:] == [
        ("INSERT", None), ("INSERT", None), ("COMMIT", "23503")]
