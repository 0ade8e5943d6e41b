"""SQLite's statement cache under privileges: a statement checked once is reused only while
the privileges it was checked under hold."""

from __future__ import annotations

from typing import Any

import pytest

from cryptdisk.errors import ServerError
from cryptdisk.server import Privileges, SQLiteEngine, UserStore


@pytest.fixture
def setup(tmp_path: Any, keyring: Any) -> tuple[Any, UserStore, Privileges]:
    engine = SQLiteEngine(tmp_path / "p.db", None, plaintext=True)
    admin = engine.open_session()
    admin.run("CREATE TABLE t (a INTEGER)", [])
    admin.run("INSERT INTO t VALUES (1)", [])
    admin.close()
    store = UserStore(tmp_path / "users", keyring, iterations=4096)
    store.set_user("root", "pw-root", admin=True, create=True)
    store.set_user("bob", "pw-bob", create=True)
    store.create_role("readers")
    store.change_grants(["readers"], ["t"], ["SELECT"], grant=True)
    session = engine.open_session()
    privileges = Privileges(store, "bob")
    session.set_privileges(privileges)
    return session, store, privileges


def test_a_repeated_statement_is_prepared_once(setup) -> None:
    session, store, _ = setup
    store.change_grants(["bob"], ["t"], ["SELECT"], grant=True)
    session.run("SELECT a FROM t", [])
    hits = session.conn.cache_stats()["hits"]
    assert session.run("SELECT a FROM t", []).rows == [(1,)]
    assert session.run_quick("SELECT a FROM t", []).rows == [(1,)]
    assert session.conn.cache_stats()["hits"] == hits + 2


def test_a_revoke_counts_for_a_cached_statement(setup) -> None:
    session, store, _ = setup
    store.change_grants(["bob"], ["t"], ["SELECT"], grant=True)
    for _ in range(3):
        assert session.run("SELECT a FROM t", []).rows == [(1,)]
    store.change_grants(["bob"], ["t"], ["SELECT"], grant=False)
    with pytest.raises(ServerError, match="permission denied"):
        session.run("SELECT a FROM t", [])
    store.change_grants(["bob"], ["t"], ["SELECT"], grant=True)
    assert session.run("SELECT a FROM t", []).rows == [(1,)]


def test_set_role_counts_for_a_cached_statement(setup) -> None:
    session, store, privileges = setup
    store.change_grants(["bob"], ["t"], ["SELECT"], grant=True)
    store.create_role("nobody")  # no grants of its own
    store.grant_roles(["nobody"], ["bob"], grant=True)
    assert session.run("SELECT a FROM t", []).rows == [(1,)]
    privileges.set_role("nobody")  # SET ROLE: the role's privileges only
    with pytest.raises(ServerError, match="permission denied"):
        session.run("SELECT a FROM t", [])
    privileges.set_role(None)  # RESET ROLE
    assert session.run("SELECT a FROM t", []).rows == [(1,)]
