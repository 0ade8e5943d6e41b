"""The analytical engine's parsing connection keeps no unfinished DuckDB result.

A session checks privileges and rewrites queries for policies by asking DuckDB's parser
(``json_serialize_sql``) on a connection of its own, which then sits idle until the
session's next statement. A ``fetchone()`` that returns a result's only row leaves the
result unfinished and its transaction open: DuckDB then keeps the old versions of every
row the database changes meanwhile.
"""

from __future__ import annotations

from typing import Any

from cryptdisk.server import AnalyticalEngine, PolicyStore, Privileges, UserStore


class Recorder:
    """A DuckDB connection that counts the results left unfinished."""

    def __init__(self, con: Any) -> None:
        self.con = con
        self.statements = 0
        self.left_open = 0
        self.pending = False

    def execute(self, *args: Any) -> Recorder:
        self.left_open += self.pending
        self.con.execute(*args)
        self.statements += 1
        self.pending = True
        return self

    def fetchone(self) -> Any:
        row = self.con.fetchone()
        self.pending = row is not None
        return row

    def fetchall(self) -> Any:
        self.pending = False
        return self.con.fetchall()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)


def test_checks_and_policy_rewrites_finish_every_result(analytical: AnalyticalEngine,
                                                         keyring: Any, tmp_path: Any) -> None:
    admin = analytical.open_session()
    admin.run("CREATE TABLE t (a INTEGER, r VARCHAR)", [])
    admin.run("INSERT INTO t VALUES (1, 'US'), (2, 'EU')", [])
    admin.close()
    analytical.policies = policies = PolicyStore(tmp_path / "a.policies", keyring, analytical)
    policies.handle(None, "CREATE ROW ACCESS POLICY no_eu AS (r VARCHAR) RETURNS BOOLEAN -> "
                          "r <> 'EU' OR current_role() = 'auditor'")
    policies.handle(None, "ALTER TABLE t ADD ROW ACCESS POLICY no_eu ON (r)")
    store = UserStore(tmp_path / "users", keyring, iterations=4096)
    store.set_user("bob", "pw-bob", create=True)
    store.change_grants(["bob"], ["t"], ["SELECT"], grant=True)
    session = analytical.open_session()
    session.set_privileges(Privileges(store, "bob"))
    session.record_tables()
    recorder = Recorder(session._parser)  # type: ignore[attr-defined]
    session._parser = recorder  # type: ignore[attr-defined]
    try:
        assert session.run("SELECT a FROM t ORDER BY a", []).rows == [(1,)]
        assert session.run("WITH s AS (SELECT * FROM t) SELECT count(*) FROM s", []).rows \
            == [(1,)]
        session.authorize("SELECT a FROM t WHERE a > 0", session.privileges)  # type: ignore[attr-defined]
    finally:
        session.close()
    assert recorder.statements >= 6  # grants, policy rewrite and tables, per statement
    assert (recorder.left_open, recorder.pending) == (0, False)

