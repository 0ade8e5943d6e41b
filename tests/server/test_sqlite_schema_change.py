"""--sqlite: a statement SQLite prepared before another connection changed the schema is
prepared again by SQLite as it runs; its columns are described as it runs now. The
server took the columns' declared types from the statement as first prepared: a table
dropped and created again (by another session, or a process beside the server) with
other column types answered its values under the old types (a text value sent as an
int8 the client cannot read, an integer turned into a boolean)."""

from __future__ import annotations

import os

os.environ["PSYCOPG_IMPL"] = "python"  # as tests/server/conftest.py explains

import psycopg
import pytest

SQLITE_JOURNALS = ["delete", "wal"]


@pytest.mark.parametrize(("old", "new", "value"), [
    ("INTEGER", "TEXT", "x"),
    ("BOOLEAN", "INTEGER", 5),
    ("TEXT", "INTEGER", 7),
])
def test_a_query_run_again_after_the_table_is_made_again_has_its_new_types(
        start_server, sqlite_engine, old, new, value) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as a, \
            psycopg.connect(**srv.dsn, autocommit=True) as b:
        a.execute(f"CREATE TABLE t (c {old})")
        a.execute("INSERT INTO t VALUES (1)")
        assert len(a.execute("SELECT c FROM t").fetchall()) == 1  # prepared, kept
        b.execute("DROP TABLE t")
        b.execute(f"CREATE TABLE t (c {new})")
        b.execute("INSERT INTO t VALUES (%s)", (value,))
        assert a.execute("SELECT c FROM t").fetchall() == [(value,)]
        b.execute("DELETE FROM t")
        assert a.execute("SELECT c FROM t").fetchall() == []
