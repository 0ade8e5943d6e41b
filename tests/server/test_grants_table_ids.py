"""Analytical engine: a table grant records the catalog id of the table it was given on, so
a table another connection drops and creates again under the name while the server is
stopped does not get the old table's grants (docs/server-privileges.md, "Grants are kept by
name")."""

from __future__ import annotations

import json
import warnings

import psycopg
import pytest

import cryptdisk
from cryptdisk.server import AnalyticalEngine, ScramAuthenticator, UserStore, _users

DENIED = psycopg.errors.InsufficientPrivilege
SETUP = ["CREATE USER bob PASSWORD 'bob pw'", "CREATE ROLE readers", "GRANT readers TO bob",
         "CREATE TABLE open_t (a BIGINT)", "INSERT INTO open_t VALUES (1)",
         "GRANT SELECT, INSERT ON open_t TO bob", "GRANT SELECT ON open_t TO readers"]
TABLE_GRANTS = ("SELECT \"user\", \"table\", privilege FROM system.grants "
                "WHERE privilege <> 'MEMBER' ORDER BY 1, 2, 3")


def _bob(srv):
    return psycopg.connect(**{**srv.dsn, "user": "bob", "password": "bob pw"},
                           autocommit=True)


def _set_up(start_server, analytical):
    """A server with bob (and his role readers) granted on open_t; stopped. The user file."""
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        for st in SETUP:
            admin.execute(st)
    with _bob(srv) as bob:
        assert bob.execute("SELECT a FROM open_t").fetchall() == [(1,)]
    path = srv.server.authenticator.store.path
    srv.stop()  # (closes the engine)
    return path


def _embedded(tmp_path, *statements: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated-key warning
        with cryptdisk.connect(tmp_path / "a.db") as db:
            for st in statements:
                db.sql(st)


def _restart(start_server, tmp_path, users: str, *, read_only: bool = False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = AnalyticalEngine(tmp_path / "a.db", read_only=read_only)
    store = UserStore(users, engine.keyring, iterations=4096)
    srv = start_server(engine, authenticator=ScramAuthenticator(store, delay=0.01,
                                                                max_delay=0.05))
    return srv, store


def _file(users: str, keyring) -> dict:
    with cryptdisk.open(users, "rb", keyring=keyring) as f:
        return json.loads(f.read())


def test_a_table_made_again_while_stopped_gets_no_grants(start_server, analytical,
                                                         tmp_path) -> None:
    users = _set_up(start_server, analytical)
    _embedded(tmp_path, "DROP TABLE open_t", "CREATE TABLE open_t (a BIGINT)",
              "INSERT INTO open_t VALUES (2)")
    srv, store = _restart(start_server, tmp_path, users)
    try:
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            assert admin.execute(TABLE_GRANTS).fetchall() == []
        with _bob(srv) as bob:
            for sql in ("SELECT a FROM open_t", "INSERT INTO open_t VALUES (3)"):
                with pytest.raises(DENIED):
                    bob.execute(sql)
        data = _file(users, store.keyring)  # removed from the file, ids with them
        for entry in (data["users"]["bob"], data["roles"]["readers"]):
            assert entry["grants"] == {} and _users.GRANT_IDS not in entry
    finally:
        store.close()


def test_read_only_start_ignores_the_old_tables_grants_and_keeps_them(
        start_server, analytical, tmp_path) -> None:
    users = _set_up(start_server, analytical)
    before = _file(users, analytical.keyring)
    _embedded(tmp_path, "DROP TABLE open_t", "CREATE TABLE open_t (a BIGINT)")
    srv, store = _restart(start_server, tmp_path, users, read_only=True)
    try:
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            assert admin.execute(TABLE_GRANTS).fetchall() == []
        with _bob(srv) as bob, pytest.raises(DENIED):
            bob.execute("SELECT a FROM open_t")
        assert _file(users, store.keyring) == before  # ignored, not removed
        assert before["users"]["bob"]["grants"] == {"open_t": ["INSERT", "SELECT"]}
    finally:
        store.close()


def test_a_rename_through_the_server_keeps_the_grants_across_a_restart(
        start_server, analytical, tmp_path) -> None:
    users = _set_up(start_server, analytical)
    srv, store = _restart(start_server, tmp_path, users)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute("ALTER TABLE open_t RENAME TO moved")
        admin.execute("CREATE TABLE open_t (a BIGINT)")
    with _bob(srv) as bob:
        assert bob.execute("SELECT a FROM moved").fetchall() == [(1,)]
        with pytest.raises(DENIED):
            bob.execute("SELECT a FROM open_t")
    srv.stop()
    store.close()
    srv, store = _restart(start_server, tmp_path, users)
    try:
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            assert admin.execute(TABLE_GRANTS).fetchall() == [
                ("bob", "moved", "INSERT"), ("bob", "moved", "SELECT"),
                ("readers", "moved", "SELECT")]
        with _bob(srv) as bob:
            assert bob.execute("SELECT a FROM moved").fetchall() == [(1,)]
    finally:
        store.close()


def test_an_old_user_file_without_ids_keeps_its_grants_and_records_the_ids(
        start_server, analytical, tmp_path) -> None:
    users = _set_up(start_server, analytical)
    table_id = analytical.db.catalog.tables["open_t"].id
    with UserStore(users, analytical.keyring, iterations=4096) as old:  # as written before
        for entry in (old.users["bob"], old.roles["readers"]):
            assert entry.pop(_users.GRANT_IDS) == {"open_t": table_id}
        old._save()
    srv, store = _restart(start_server, tmp_path, users)
    try:
        with _bob(srv) as bob:
            assert bob.execute("SELECT a FROM open_t").fetchall() == [(1,)]
        data = _file(users, store.keyring)
        assert data["users"]["bob"][_users.GRANT_IDS] == {"open_t": table_id}
        assert data["roles"]["readers"][_users.GRANT_IDS] == {"open_t": table_id}
    finally:
        store.close()


def test_the_grant_and_its_table_id_are_one_file_commit(analytical, tmp_path,
                                                        monkeypatch) -> None:
    """GRANT writes the user file once (a sealed file published by rename: all or
    nothing), with the grant and the id in it; when that write fails neither stays."""
    analytical.db.sql("CREATE TABLE t (a BIGINT)")
    table_id = analytical.db.catalog.tables["t"].id
    store = UserStore(tmp_path / "users", analytical.keyring, iterations=4096)
    try:
        store.set_user("bob", "pw", create=True)
        store.table_id = lambda name: (analytical.db.catalog.tables[name].id
                                       if name in analytical.db.catalog.tables else None)
        writes: list[bytes] = []
        real = _users.cd_open

        class Recorded:
            def __init__(self, path, mode, **kw):
                self.f = real(path, mode, **kw)

            def __enter__(self):
                return self

            def __getattr__(self, name):
                return getattr(self.f, name)

            def write(self, data):
                writes.append(bytes(data))  # (every user file write is one "wb" opening)
                if fail:
                    raise OSError(28, "No space left on device")
                return self.f.write(data)

            def __exit__(self, *exc):
                return self.f.__exit__(*exc)

        monkeypatch.setattr(_users, "cd_open", Recorded)
        fail = True
        with pytest.raises(OSError):
            store.change_grants(["bob"], ["t"], ["SELECT"], grant=True)
        assert store.users["bob"].get("grants", {}) == {}
        assert _users.GRANT_IDS not in store.users["bob"]
        fail = False
        store.change_grants(["bob"], ["t"], ["SELECT"], grant=True)
        assert len(writes) == 2
        entry = json.loads(writes[-1])["users"]["bob"]
        assert entry["grants"] == {"t": ["SELECT"]}
        assert entry[_users.GRANT_IDS] == {"t": table_id}
        assert _file(store.path, analytical.keyring)["users"]["bob"] == entry
    finally:
        store.close()
