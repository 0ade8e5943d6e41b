"""A simple Query with several statements: every one is authorised before any of them runs,
and on SQLite they run as one implicit transaction, as in PostgreSQL."""

from __future__ import annotations

import os
import subprocess

import psycopg
import pytest

from tests.server.rawclient import Raw, cstr, msg, sqlstate

#: run the SQLite tests with a rollback journal and in WAL mode
SQLITE_JOURNALS = ("delete", "wal")

DENIED = psycopg.errors.InsufficientPrivilege

TABLES = ["CREATE TABLE sink (a BIGINT)", "CREATE TABLE open_t (a BIGINT)",
          "CREATE TABLE secret (s VARCHAR)", "INSERT INTO open_t VALUES (1)",
          "INSERT INTO secret VALUES ('hidden')"]
GRANTS = ["CREATE USER bob PASSWORD 'bob pw'", "CREATE ROLE loaders",
          "GRANT INSERT ON sink TO loaders", "GRANT loaders TO bob",
          "GRANT SELECT ON open_t TO bob"]


def connect(srv, user: str | None = None, password: str | None = None):
    dsn = dict(srv.dsn)
    if user is not None:
        dsn.update(user=user, password=password)
    return psycopg.connect(**dsn, autocommit=True)


def setup(srv, extra: list[str] = ()) -> None:  # type: ignore[assignment]
    with connect(srv) as admin:
        for st in [*TABLES, *GRANTS, *extra]:
            admin.execute(st)


def psql(srv, certs, user: str, password: str, sql: str) -> subprocess.CompletedProcess[str]:
    conninfo = (f"host=localhost port={srv.port} user={user} dbname=db sslmode=verify-full "
                f"sslrootcert={certs[0]}")
    return subprocess.run(["psql", conninfo, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql],
                          env={**os.environ, "PGPASSWORD": password}, capture_output=True,
                          text=True, timeout=60)


def sink_and_secret(srv) -> tuple[list[tuple[int]], list[tuple[str]]]:
    with connect(srv) as admin:
        return (admin.execute("SELECT a FROM sink ORDER BY a").fetchall(),
                admin.execute("SELECT s FROM secret ORDER BY s").fetchall())


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
@pytest.mark.parametrize("sql", [
    "INSERT INTO sink VALUES (1); SELECT * FROM secret",
    "INSERT INTO sink VALUES (1); INSERT INTO sink VALUES (2); SELECT s FROM secret",
    "INSERT INTO sink VALUES (1); INSERT INTO secret VALUES ('x')",
    "INSERT INTO sink VALUES (1); GRANT SELECT ON secret TO bob",
    "INSERT INTO sink VALUES (1); CREATE TABLE mine (a BIGINT)",
    "INSERT INTO sink VALUES (1); COPY (SELECT * FROM secret) TO STDOUT",
    "INSERT INTO sink VALUES (1); REVOKE loaders FROM bob; INSERT INTO sink VALUES (2)",
    "INSERT INTO sink VALUES (1); SET ROLE loaders; SELECT * FROM open_t",
])
def test_a_denied_statement_stops_the_whole_query(start_server, request, certs, engine,
                                                  sql) -> None:
    srv = start_server(request.getfixturevalue(engine))
    setup(srv)
    out = psql(srv, certs, "bob", "bob pw", sql)
    assert out.returncode != 0
    assert "permission denied" in out.stderr
    assert sink_and_secret(srv) == ([], [("hidden",)])
    with connect(srv, "bob", "bob pw") as bob:  # the same through psycopg
        with pytest.raises(DENIED):
            bob.execute(sql)
        assert bob.execute("SELECT current_user").fetchone() == ("bob",)  # no SET ROLE left
    assert sink_and_secret(srv) == ([], [("hidden",)])


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_allowed_statements_run_in_order(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    setup(srv)
    with connect(srv, "bob", "bob pw") as bob:
        cur = bob.execute("SELECT a FROM open_t; INSERT INTO sink VALUES (1); "
                          "INSERT INTO sink SELECT a + 1 FROM open_t")
        assert cur.fetchall() == [(1,)]  # psycopg's cursor starts at the first result
    assert sink_and_secret(srv)[0] == [(1,), (2,)]


def test_an_admin_after_set_role_is_checked_as_the_role(start_server, analytical) -> None:
    srv = start_server(analytical)
    setup(srv)
    with connect(srv) as admin:
        with pytest.raises(DENIED):  # loaders may insert into sink, not read secret
            admin.execute("SET ROLE loaders; INSERT INTO sink VALUES (1); SELECT * FROM secret")
        assert admin.execute("SELECT current_user").fetchone() == ("u",)
    assert sink_and_secret(srv) == ([], [("hidden",)])


def test_a_role_granted_earlier_in_the_query_counts(start_server, sqlite_engine) -> None:
    """Statements are tried in order on a copy of the users and grants: an admin's setup
    script that creates a role, grants it and then acts as it runs."""
    srv = start_server(sqlite_engine)
    setup(srv)
    with connect(srv) as admin:
        admin.execute("CREATE ROLE readers; GRANT SELECT ON secret TO readers; "
                      "SET ROLE readers; SELECT * FROM secret")
        assert admin.execute("SELECT current_user").fetchone() == ("readers",)
        admin.execute("RESET ROLE")


def test_sqlite_a_failing_statement_rolls_back_the_earlier_ones(start_server, sqlite_engine,
                                                                certs) -> None:
    srv = start_server(sqlite_engine)
    setup(srv, ["CREATE TABLE k (a INTEGER PRIMARY KEY)", "INSERT INTO k VALUES (1)"])
    for sql in ["INSERT INTO sink VALUES (1); INSERT INTO nosuch VALUES (2)",
                "INSERT INTO sink VALUES (1); INSERT INTO k VALUES (1)",    # unique violation
                "INSERT INTO sink VALUES (1); SELEC 1"]:
        out = psql(srv, certs, "u", "pw", sql)
        assert out.returncode != 0, sql
        assert sink_and_secret(srv)[0] == [], sql
    with connect(srv) as admin:
        with pytest.raises(psycopg.errors.UniqueViolation):
            admin.execute("INSERT INTO sink VALUES (1); INSERT INTO k VALUES (1)")
        assert admin.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        admin.execute("INSERT INTO sink VALUES (3); INSERT INTO k VALUES (3)")
        # an explicit transaction in the query is the client's: it stays open after an error
        with pytest.raises(psycopg.errors.UniqueViolation):
            admin.execute("BEGIN; INSERT INTO sink VALUES (4); INSERT INTO k VALUES (1)")
        assert admin.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        admin.execute("ROLLBACK")
    assert sink_and_secret(srv)[0] == [(3,)]


@pytest.fixture
def with_policies(analytical, tmp_path):
    from cryptdisk.server import PolicyStore

    analytical.policies = PolicyStore(tmp_path / "a.policies", analytical.keyring, analytical)
    return analytical


@pytest.mark.parametrize("sql", [
    "INSERT INTO sink VALUES (1); CREATE MASKING POLICY m AS (v VARCHAR) RETURNS VARCHAR -> "
    "'***'",                                                          # needs APPLY POLICY
    "INSERT INTO sink VALUES (1); SELECT * FROM system.audit",        # needs AUDIT
    "INSERT INTO sink VALUES (1); GRANT APPLY POLICY TO bob",         # admins only
])
def test_policy_statements_are_checked_before_the_query_runs(start_server, with_policies,
                                                             sql) -> None:
    srv = start_server(with_policies)
    setup(srv)
    with connect(srv, "bob", "bob pw") as bob:
        with pytest.raises(DENIED):
            bob.execute(sql)
    assert sink_and_secret(srv)[0] == []


def test_apply_policy_granted_earlier_in_the_query_counts(start_server, with_policies) -> None:
    srv = start_server(with_policies)
    setup(srv)
    with connect(srv) as admin:
        admin.execute("GRANT APPLY POLICY TO u; CREATE MASKING POLICY m AS (v VARCHAR) "
                      "RETURNS VARCHAR -> '***'")
        assert [r[0] for r in admin.execute("SELECT * FROM system.policies").fetchall()] == ["m"]


def test_sqlite_a_failed_copy_rolls_back_the_statements_before_it(start_server,
                                                                  sqlite_engine) -> None:
    srv = start_server(sqlite_engine, secure=False)
    r = Raw(srv.port)
    r.startup()
    r.send(msg(b"Q", cstr("CREATE TABLE k (a INTEGER PRIMARY KEY); INSERT INTO k VALUES (1)")))
    assert r.until(b"Z")[-1] == (b"Z", b"I")
    r.send(msg(b"Q", cstr("INSERT INTO k VALUES (2); COPY k FROM STDIN")))
    got = r.until(b"G")
    assert [k for k, _ in got] == [b"C", b"G"]
    r.send(msg(b"d", b"3\n1\n") + msg(b"c"))  # 1 is there already: a unique violation
    got = r.until(b"Z")
    assert [k for k, _ in got] == [b"E", b"Z"] and sqlstate(got[0][1]) == "23505"
    assert got[-1] == (b"Z", b"I")  # rolled back: no transaction left open
    r.send(msg(b"Q", cstr("SELECT count(*) FROM k")))
    assert (b"D", b"\x00\x01\x00\x00\x00\x011") in r.until(b"Z")  # only the first row
    r.close()
