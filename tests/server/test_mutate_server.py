"""DELETE and UPDATE through cryptdisk serve on the analytical engine: the command tag and
psycopg's rowcount, the DELETE and UPDATE grants, and a role's statement read through the
table's masking and row access policies."""

from __future__ import annotations

import os

os.environ["PSYCOPG_IMPL"] = "python"  # as tests/server/conftest.py explains

import psycopg
import pytest

import cryptdisk.fields  # noqa: F401  (what cryptdisk serve imports: the SQL functions)
from cryptdisk.server import AnalyticalEngine, AuditLog, PolicyStore
from tests.fields.conftest import CONFIG

from .test_grants import ANALYTICAL_SETUP, admin_and_bob

DENIED = psycopg.errors.InsufficientPrivilege
PANS = ["4111111111111111", "5500005555555559", "340000000000009"]
MASK = "CASE WHEN current_role() IN ('auditor') THEN fpe_decrypt(v, 'cards') " \
    "ELSE mask_last4(fpe_decrypt(v, 'cards')) END"


def test_the_tag_and_rowcount_say_the_rows_changed(start_server, analytical) -> None:
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id BIGINT, s VARCHAR, x DOUBLE) ORDER BY id")
        c.execute("INSERT INTO t SELECT i, 'v' || i, i FROM range(100) r(i)")
        cur = c.execute("DELETE FROM t WHERE id %% 10 = %s", (3,))
        assert cur.rowcount == 10 and cur.statusmessage == "DELETE 10"
        cur = c.execute("UPDATE t SET s = %s WHERE id < %s", ("low", 5))
        assert cur.rowcount == 4 and cur.statusmessage == "UPDATE 4"  # (3 was deleted)
        cur = c.execute("DELETE FROM t WHERE id > 1000")
        assert cur.rowcount == 0 and cur.statusmessage == "DELETE 0"
        assert c.execute("SELECT count(*), count(*) FILTER (WHERE s = 'low') FROM t"
                         ).fetchone() == (90, 4)
        with pytest.raises(psycopg.Error, match="Could not convert string 'abc' to DOUBLE"):
            c.execute("UPDATE t SET x = 'abc'")
        with pytest.raises(psycopg.Error, match="ORDER BY key"):
            c.execute("UPDATE t SET id = 1")
        c.execute("BEGIN")
        with pytest.raises(psycopg.Error, match="transaction block"):
            c.execute("DELETE FROM t")
        c.execute("ROLLBACK")
        assert c.execute("DELETE FROM t").rowcount == 90
        assert c.execute("SELECT count(*) FROM t").fetchone() == (0,)


@pytest.mark.parametrize("grants, sql", [
    ("SELECT", "DELETE FROM open_t WHERE a = 1"),                  # no DELETE
    ("SELECT", "UPDATE open_t SET a = 2"),                         # no UPDATE
    ("DELETE", "DELETE FROM open_t WHERE a = 1"),                  # its WHERE reads: SELECT
    ("UPDATE", "UPDATE open_t SET a = a + 1"),                     # SET from a column
    ("SELECT, DELETE", "DELETE FROM open_t WHERE a IN (SELECT length(s) FROM secret)"),
    ("SELECT, UPDATE", "UPDATE open_t SET a = (SELECT length(s) FROM secret)"),
    ("SELECT, DELETE", "DELETE FROM open_t WHERE a IN (SELECT 1 FROM read_csv('/etc/passwd'))"),
    ("SELECT, DELETE", "DELETE FROM secret"),
])
def test_analytical_delete_and_update_denied_paths(start_server, analytical, grants, sql) -> None:
    srv = start_server(analytical)
    with admin_and_bob(srv, [*ANALYTICAL_SETUP, f"GRANT {grants} ON open_t TO bob"]) as bob:
        with pytest.raises(DENIED):
            bob.execute(sql)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        assert admin.execute("SELECT a FROM open_t").fetchall() == [(1,)]
        assert admin.execute("SELECT count(*) FROM secret").fetchone() == (1,)


def test_analytical_delete_and_update_with_grants(start_server, analytical) -> None:
    srv = start_server(analytical)
    setup = [*ANALYTICAL_SETUP, "INSERT INTO open_t VALUES (2), (3)",
             "GRANT UPDATE, DELETE ON open_t TO bob"]
    with admin_and_bob(srv, setup) as bob:
        assert bob.execute("UPDATE open_t SET a = 7").rowcount == 3  # reads no column
        with pytest.raises(DENIED):
            bob.execute("SELECT a FROM open_t")
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute("INSERT INTO open_t VALUES (1)")
        admin.execute("GRANT SELECT ON open_t TO bob")
    with psycopg.connect(**{**srv.dsn, "user": "bob", "password": "bob pw"},
                         autocommit=True) as bob:
        assert bob.execute("UPDATE open_t SET a = a * 2 WHERE a = 1").rowcount == 1
        assert bob.execute("DELETE FROM open_t WHERE a = 7").rowcount == 3
        assert bob.execute("SELECT a FROM open_t").fetchall() == [(2,)]
        assert bob.execute("DELETE FROM open_t").rowcount == 1


@pytest.fixture
def engine(tmp_path, monkeypatch):
    monkeypatch.setenv("CRYPTDISK_TEST_EMAILS_KEY", "ab" * 32)
    config = tmp_path / "cryptdisk.toml"
    config.write_text(CONFIG)
    eng = AnalyticalEngine(tmp_path / "db", config)
    eng.policies = PolicyStore(tmp_path / "db.policies", eng.keyring, eng,
                               audit=AuditLog(tmp_path / "db.audit", eng.keyring))
    return eng


def _connect(srv, user: str | None = None) -> psycopg.Connection:
    dsn = dict(srv.dsn)
    if user is not None:
        dsn.update(user=user, password=f"{user} pw")
    return psycopg.connect(**dsn, autocommit=True)


def _cards(srv) -> None:
    with _connect(srv) as admin:
        admin.execute("CREATE TABLE cards (pan VARCHAR, region VARCHAR, n INTEGER)")
        for i, pan in enumerate(PANS):
            admin.execute(f"INSERT INTO cards SELECT fpe_encrypt('{pan}', 'cards'), "
                          f"'{['US', 'EU', 'US'][i]}', {i}")
        for role in ("auditor", "analyst", "officers"):
            admin.execute(f"CREATE ROLE {role}")
        for user, role in (("alice", "auditor"), ("bob", "analyst"), ("olga", "officers")):
            admin.execute(f"CREATE USER {user} PASSWORD '{user} pw'")
            admin.execute(f"GRANT {role} TO {user}")
        admin.execute("GRANT SELECT, UPDATE, DELETE ON cards TO auditor, analyst")
        admin.execute("GRANT APPLY POLICY TO officers")
    with _connect(srv, "olga") as officer:
        officer.execute(f"CREATE MASKING POLICY pan_mask AS (v VARCHAR) RETURNS VARCHAR -> "
                        f"{MASK}")
        officer.execute("ALTER TABLE cards ALTER COLUMN pan SET MASKING POLICY pan_mask")
        officer.execute("CREATE ROW ACCESS POLICY no_eu AS (r VARCHAR) RETURNS BOOLEAN -> "
                        "is_role_in_session('auditor') OR r <> 'EU'")
        officer.execute("ALTER TABLE cards ADD ROW ACCESS POLICY no_eu ON (region)")


def test_a_role_changes_only_what_its_policies_let_it_see(start_server, engine) -> None:
    srv = start_server(engine)
    _cards(srv)
    with _connect(srv, "bob") as bob:
        # refused in effect: the EU row is not the analyst's to see
        assert bob.execute("DELETE FROM cards WHERE region = 'EU'").rowcount == 0
        # a WHERE on the masked column compares what a SELECT shows: no probe of clear values
        assert bob.execute("DELETE FROM cards WHERE pan = %s", (PANS[0],)).rowcount == 0
        assert bob.execute("UPDATE cards SET n = 10 WHERE pan = '************1111'"
                           ).rowcount == 1
        # permitted: the rows it sees
        assert bob.execute("DELETE FROM cards WHERE n = 2").rowcount == 1
        with pytest.raises(DENIED, match="masking policy"):
            bob.execute("UPDATE cards SET pan = 'x' WHERE n = 10")
        assert bob.execute("SELECT pan, n FROM cards").fetchall() == [("************1111", 10)]
    with _connect(srv, "alice") as alice:  # the stored numbers were kept, the EU row too
        alice.execute("SET ROLE auditor")
        assert alice.execute("SELECT pan, region, n FROM cards ORDER BY n").fetchall() == [
            (PANS[1], "EU", 1), (PANS[0], "US", 10)]
        with pytest.raises(DENIED, match="masking policy"):
            alice.execute("UPDATE cards SET pan = '4000000000000002'")
        assert alice.execute("DELETE FROM cards WHERE pan = %s", (PANS[1],)).rowcount == 1
    with _connect(srv) as admin:  # an admin sets stored values
        assert admin.execute("UPDATE cards SET pan = fpe_encrypt('4000000000000002', 'cards')"
                             ).rowcount == 1
    with _connect(srv, "alice") as alice:
        alice.execute("SET ROLE auditor")
        assert alice.execute("SELECT pan FROM cards").fetchall() == [("4000000000000002",)]


def test_a_role_statement_that_decrypts_to_match_is_audited(start_server, engine) -> None:
    """The WHERE of the analyst's statement reads the card numbers through a policy that
    decrypts them: an audit line names the column and the rows changed, as for a query;
    one that reads no such column decrypts nothing and is not logged."""
    srv = start_server(engine)
    _cards(srv)
    audit = engine.policies.audit
    before = len(audit.entries())
    with _connect(srv, "bob") as bob:
        assert bob.execute("UPDATE cards SET n = n + 1 WHERE n = 0").rowcount == 1
        assert len(audit.entries()) == before
        assert bob.execute("DELETE FROM cards WHERE pan LIKE '%%1111'").rowcount == 1
    (line,) = audit.entries()[before:]
    assert (line["kind"], line["tables"], line["columns"], line["rows"]) == (
        "policy", ["cards"], ["cards.pan"], 1)
    assert line["current_user"] == "bob" and "fpe_decrypt" in line["functions"]
