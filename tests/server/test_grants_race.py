"""Grants and concurrent DDL on the analytical engine: a statement that gives a name to a
table or a view with its owner's rights, renames one or drops one does its grant
bookkeeping and its catalog commit while no other such statement runs, so a grant moved
to a name by one statement never lands on what another statement created under it."""

from __future__ import annotations

import os

os.environ["PSYCOPG_IMPL"] = "python"  # as tests/server/conftest.py explains

import threading
import time

import psycopg
import pytest

from .test_grants import ANALYTICAL_SETUP, admin_and_bob

DENIED = psycopg.errors.InsufficientPrivilege


@pytest.mark.parametrize("rename", ["ALTER VIEW v RENAME TO w", "ALTER TABLE t0 RENAME TO w"])
@pytest.mark.parametrize("create", ["CREATE TABLE w AS SELECT s FROM secret",
                                    "CREATE VIEW w WITH (security_invoker = false) AS "
                                    "SELECT s FROM secret"])
def test_a_rename_racing_a_create_of_its_new_name_gives_the_new_object_no_grant(
        start_server, analytical, rename, create) -> None:
    """A CREATE of ``w`` queued (behind a long query) before a rename to ``w``: the create
    commits, the rename fails. The rename had copied bob's grants to ``w`` before it
    queued, and its failure left them there, on the new table or view: bob read the
    secret through it."""
    srv = start_server(analytical)
    setup = [*ANALYTICAL_SETUP, "CREATE TABLE t0 (a BIGINT)",
             "CREATE VIEW v WITH (security_invoker = false) AS SELECT length(s) AS n "
             "FROM secret", "GRANT SELECT ON v, t0 TO bob"]
    failed: dict[str, Exception] = {}

    def run(name: str, sql: str) -> None:
        try:
            with psycopg.connect(**srv.dsn, autocommit=True) as conn:
                conn.execute(sql)
        except psycopg.Error as exc:
            failed[name] = exc

    turns = analytical.turns
    with admin_and_bob(srv, setup) as bob:
        with analytical.turn(None, shared=True):  # a long query: statements queue behind it
            first = threading.Thread(target=run, args=("create", create))
            first.start()
            deadline = time.monotonic() + 30
            while turns.waiting < 1:
                assert time.monotonic() < deadline
                time.sleep(0.005)
            second = threading.Thread(target=run, args=("rename", rename))
            second.start()
            # the rename queues behind the create (or, serialised, waits before its
            # bookkeeping); give it the time to get as far as it gets
            deadline = time.monotonic() + 1
            while turns.waiting < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
        first.join(60)
        second.join(60)
        assert set(failed) == {"rename"}, failed
        with psycopg.connect(**srv.dsn, autocommit=True) as admin:
            grants = admin.execute("SELECT \"user\", \"table\" FROM system.grants WHERE "
                                   "\"table\" IS NOT NULL ORDER BY 2").fetchall()
        assert grants == [("bob", "t0"), ("bob", "v")]
        with pytest.raises(DENIED):
            bob.execute("SELECT * FROM w")
