"""A CREATE or RENAME TO of a name a table or view has fails with PostgreSQL's
duplicate_table (42P07, psycopg's DuplicateTable), on both engines, where it said
internal_error (XX000) on the analytical engine and 42000 on SQLite: a client that
creates a table unless it exists (a migration tool catching DuplicateTable) failed."""

from __future__ import annotations

import os

os.environ["PSYCOPG_IMPL"] = "python"  # as tests/server/conftest.py explains

import psycopg
import pytest

ANALYTICAL = [
    "CREATE TABLE t (a BIGINT)", "CREATE TABLE T (a BIGINT)", "CREATE TABLE t AS SELECT 1 AS a",
    "CREATE VIEW v AS SELECT 2 AS x", "CREATE VIEW t AS SELECT 2 AS x",
    "CREATE TABLE v (a BIGINT)", "ALTER TABLE t RENAME TO u", "ALTER TABLE t RENAME TO v",
    "ALTER VIEW v RENAME TO t",
]
SQLITE = ["CREATE TABLE t (a INTEGER)", "CREATE TABLE T (a INTEGER)",
          "CREATE VIEW v AS SELECT 2 AS x", "CREATE VIEW t AS SELECT 2 AS x",
          "CREATE TABLE v (a INTEGER)", "ALTER TABLE t RENAME TO u"]


@pytest.mark.parametrize("sql", ANALYTICAL)
def test_analytical_a_name_taken_is_duplicate_table(start_server, analytical, sql) -> None:
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        for setup in ("CREATE TABLE t (a BIGINT)", "CREATE TABLE u (a BIGINT)",
                      "CREATE VIEW v AS SELECT 1 AS x"):
            conn.execute(setup)
        with pytest.raises(psycopg.errors.DuplicateTable):
            conn.execute(sql)


@pytest.mark.parametrize("sql", SQLITE)
def test_sqlite_a_name_taken_is_duplicate_table(start_server, sqlite_engine, sql) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        for setup in ("CREATE TABLE t (a INTEGER)", "CREATE TABLE u (a INTEGER)",
                      "CREATE VIEW v AS SELECT 1 AS x"):
            conn.execute(setup)
        with pytest.raises(psycopg.errors.DuplicateTable):
            conn.execute(sql)
