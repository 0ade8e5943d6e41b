"""CREATE TABLE ... AS and ALTER TABLE of a table's name and columns (cryptdisk.db._schema)."""

import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest

import cryptdisk
from cryptdisk.db import _sql
from cryptdisk.errors import DatabaseError, PolicyError, TableNotFoundError

from .test_db_crash import PAUSE_CHILD, disk_files, env


def test_create_as_forms_parse():
    st = _sql.parse("CREATE TABLE IF NOT EXISTS u ENGINE = MergeTree ORDER BY (k, \"S\") "
                    "SETTINGS storage_policy = 'default' AS SELECT k, s AS \"S\" FROM t")
    assert st == _sql.CreateTable("u", [], ["k", "S"], {"storage_policy": "default"}, True,
                                  "SELECT k, s AS \"S\" FROM t")
    assert _sql.parse("create table u order by k as (select 1 as k)").query == \
        "(select 1 as k)"
    assert _sql.parse("CREATE TABLE u AS WITH x AS (SELECT 1) FROM x").order_by is None
    assert _sql.parse("CREATE TABLE u AS VALUES (1)").query == "VALUES (1)"


def test_create_as_takes_the_querys_columns_and_rows(db):
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t VALUES (3, 'c'), (1, 'a'), (2, NULL)")
    db.sql("CREATE TABLE u ORDER BY n SETTINGS storage_policy = 'default' AS "
           "SELECT k * 2 AS n, s, [k] AS l, k / 2 AS half FROM t WHERE k > 1")
    assert db.catalog.tables["u"].columns == [("n", "BIGINT"), ("s", "VARCHAR"),
                                              ("l", "BIGINT[]"), ("half", "DOUBLE")]
    assert db.catalog.tables["u"].order_by == "n"
    assert db.query("SELECT * FROM u") == [(4, None, [2], 1.0), (6, "c", [3], 1.5)]
    assert db.query("SELECT name, type, is_in_order_by FROM system.columns "
                    "WHERE \"table\" = 'u' ORDER BY position") == [
        ("n", "BIGINT", True), ("s", "VARCHAR", False), ("l", "BIGINT[]", False),
        ("half", "DOUBLE", False)]
    db.sql("CREATE TABLE c ENGINE = MergeTree ORDER BY k AS SELECT count(*) AS k FROM t")
    assert db.query("SELECT * FROM c") == [(3,)]  # (an answer from the catalog's counts)
    db.sql("CREATE TABLE v AS VALUES (1, 'x')")
    assert db.query("SELECT col0, col1 FROM v") == [(1, "x")]
    db.sql("CREATE TABLE e AS SELECT * FROM t WHERE k < 0")
    assert db.query("SELECT count(*) FROM e") == [(0,)] and not db.catalog.tables["e"].parts
    db.sql("CREATE TABLE IF NOT EXISTS u AS SELECT * FROM nowhere")  # (not run)
    assert db.query("SELECT count(*) FROM u") == [(2,)]


def test_insert_of_a_count_answered_from_the_catalog(db):
    """INSERT INTO u SELECT count(*) FROM t failed with AttributeError: the catalog's
    answer (an Arrow table) was taken for the query's text."""
    db.sql("CREATE TABLE t (k BIGINT)")
    db.sql("INSERT INTO t VALUES (1), (2)")
    db.sql("CREATE TABLE u (n BIGINT)")
    db.sql("INSERT INTO u SELECT count(*) FROM t")
    db.sql("INSERT INTO u SELECT max(k) FROM t")
    assert db.query("SELECT n FROM u ORDER BY n") == [(2,), (2,)]


@pytest.mark.parametrize(("sql", "error", "match"), [
    ("CREATE TABLE u AS SELECT INTERVAL 1 DAY AS i", DatabaseError, "Parquet files"),
    ("CREATE TABLE u AS SELECT 1 AS a, 2 AS A", DatabaseError, "two columns named A"),
    ("CREATE TABLE u AS SELECT NULL AS x", DatabaseError, "NULL without a type"),
    ("CREATE TABLE t AS SELECT 1 AS k", DatabaseError, "already exists"),
    ("CREATE TABLE u AS SELECT * FROM nowhere", TableNotFoundError, "nowhere"),
    ("CREATE TABLE u ORDER BY z AS SELECT 1 AS k", DatabaseError, "ORDER BY z"),
    ("CREATE TABLE u SETTINGS storage_policy = 'nope' AS SELECT 1 AS k", PolicyError,
     "nope"),
    ("CREATE TABLE u AS SELECT TIMETZ '12:00:00+05' AS z", DatabaseError, "TIME ZONE"),
    ("CREATE TABLE u AS SELECT error('no ' || k)::BIGINT AS z FROM t", DatabaseError, "no 1"),
])
def test_create_as_refusals_leave_no_table(db, sql, error, match):
    db.sql("CREATE TABLE t (k BIGINT)")
    db.sql("INSERT INTO t VALUES (1)")
    version = db.catalog.version
    with pytest.raises(error, match=match):
        db.sql(sql)
    assert sorted(db.catalog.tables) == ["t"] and db.catalog.version == version


def test_create_as_in_a_transaction_block_is_refused(db):
    db.sql("CREATE TABLE t (k BIGINT)")
    db.sql("BEGIN")
    with pytest.raises(DatabaseError, match="holds queries only"):
        db.sql("CREATE TABLE u AS SELECT * FROM t")
    db.sql("ROLLBACK")
    assert "u" not in db.catalog.tables


def test_a_failing_create_as_query_writes_no_table(db):
    """An error while the rows stream (a cast failing on a later row) leaves no table."""
    db.sql("CREATE TABLE t (s VARCHAR)")
    db.insert("t", pa.table({"s": ["1", "2", "x"]}))
    with pytest.raises(DatabaseError):
        db.sql("CREATE TABLE u AS SELECT s::BIGINT AS n FROM t")
    assert "u" not in db.catalog.tables


def _kill_at_catalog(path, statement):
    """Run ``statement`` in a child that stops just before the catalog is published;
    kill -9 it there."""
    child = subprocess.Popen([sys.executable, PAUSE_CHILD, path, "catalog", statement],
                             stdout=subprocess.PIPE, text=True, env=env())
    try:
        assert child.stdout.readline().strip() == "open"
        line = child.stdout.readline()
        assert line.startswith("paused"), line
    finally:
        child.send_signal(signal.SIGKILL)
        child.stdout.close()
        child.wait()


def test_kill_before_create_as_commits_leaves_no_table(tmp_path):
    path = str(tmp_path / "db")
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR) FROM range(50000) r(i)")
        before = set(disk_files(path))
    _kill_at_catalog(path, "CREATE TABLE u ORDER BY k AS SELECT k, s FROM t")
    assert len(set(disk_files(path)) - before) >= 2  # its part(s) and the catalog temp
    with cryptdisk.connect(path, read_only=True) as reader:
        assert sorted(reader.catalog.tables) == ["t"]
    with cryptdisk.connect(path) as db:  # the next writer removes the orphans
        assert sorted(db.catalog.tables) == ["t"]
        db.sql("CREATE TABLE u ORDER BY k AS SELECT k, s FROM t")  # then it works whole
        assert db.query("SELECT count(*), sum(k) FROM u") == [(50000, sum(range(50000)))]
        db.check()
    leftovers = set(disk_files(path)) - before
    assert all("catalog" not in f for f in leftovers)
    assert len([f for f in leftovers if f.endswith(".parquet") or "/v" in f]) >= 1
    assert os.path.exists(os.path.join(path, "catalog"))
