"""The statement recogniser: what cryptdisk handles itself, what goes to DuckDB."""

import duckdb
import pytest

from cryptdisk.db import _sql
from cryptdisk.errors import DatabaseError


def test_create_table_full():
    st = _sql.parse("create table IF NOT EXISTS T (c_int BIGINT, \"Odd Name\" DECIMAL(10, 2)) "
                    "ENGINE = MergeTree() ORDER BY (c_int, \"Odd Name\") "
                    "SETTINGS storage_policy = 'plain';")
    assert st == _sql.CreateTable("t", [("c_int", "BIGINT"), ("Odd Name", "DECIMAL(10, 2)")],
                                  ["c_int", "Odd Name"], {"storage_policy": "plain"}, True)


def test_create_table_minimal_and_order_by_single():
    assert _sql.parse("CREATE TABLE t (a INT)") == _sql.CreateTable("t", [("a", "INT")])
    assert _sql.parse("CREATE TABLE t (a INT) ORDER BY a").order_by == ["a"]


@pytest.mark.parametrize("bad", [
    "CREATE TABLE t AS SELECT 1",
    "CREATE TABLE t (a INT) PARTITION BY a",
    "CREATE TABLE t ()",
    "CREATE TABLE t (a INT) SETTINGS storage_policy",
    "CREATE TABLE t (a)",
])
def test_create_table_errors(bad):
    with pytest.raises(DatabaseError):
        _sql.parse(bad)


def test_insert_forms():
    assert _sql.parse("INSERT INTO t SELECT 1") == _sql.Insert("t", "SELECT 1")
    assert _sql.parse("insert into t values (1, 'a')") == _sql.Insert("t", "values (1, 'a')")
    assert _sql.parse("INSERT INTO t (a, B) VALUES (1, 2)") == _sql.Insert(
        "t", "VALUES (1, 2)", ["a", "b"])
    assert _sql.parse("INSERT INTO t (SELECT 1)").query == "(SELECT 1)"
    assert _sql.parse("INSERT INTO t WITH x AS (SELECT 1) SELECT * FROM x").columns is None
    with pytest.raises(DatabaseError):
        _sql.parse("INSERT INTO t DEFAULT VALUES")


def test_other_statements():
    assert _sql.parse("DROP TABLE IF EXISTS t") == _sql.DropTable("t", True)
    assert _sql.parse("drop table t") == _sql.DropTable("t", False)
    assert _sql.parse("TRUNCATE t") == _sql.Truncate("t")
    assert _sql.parse("TRUNCATE TABLE t") == _sql.Truncate("t")
    assert _sql.parse("ALTER TABLE t MODIFY SETTING storage_policy = 'x'") == \
        _sql.AlterSetting("t", {"storage_policy": "x"})
    assert _sql.parse("OPTIMIZE TABLE t FINAL") == _sql.Optimize("t", True)
    assert _sql.parse("OPTIMIZE TABLE t") == _sql.Optimize("t", False)
    assert _sql.parse("SYSTEM ROTATE KEYS") == _sql.SystemCommand("rotate")
    assert _sql.parse("system reencrypt") == _sql.SystemCommand("reencrypt")


def test_passthrough_and_refusals():
    assert _sql.parse("SELECT * FROM t") == _sql.Passthrough("SELECT * FROM t")
    assert _sql.parse("SET threads = 1") == _sql.Passthrough("SET threads = 1")
    for bad in ("UPDATE t SET a = 1", "DELETE FROM t", "SET temp_directory = '/tmp'",
                "PRAGMA temp_directory='/x'", "SET max_temp_directory_size = '1GB'"):
        with pytest.raises(DatabaseError):
            _sql.parse(bad)


def test_split_statements_respects_quotes_and_comments():
    sql = "SELECT ';' AS a; -- a comment; still comment\nSELECT \"x;y\" FROM t;/* ; */ SELECT 3;;"
    assert _sql.split_statements(sql) == ["SELECT ';' AS a", 'SELECT "x;y" FROM t', "SELECT 3"]
    assert _sql.split_statements("SELECT 'it''s; fine'") == ["SELECT 'it''s; fine'"]


def test_insert_values_casts_each_value_to_its_column_as_duckdb_does(db):
    """A VALUES list's values are cast one by one to the table's types, as DuckDB's own
    INSERT does: read as a query first, VALUES gave a column one type for all its rows,
    so (1), (1.5) into a VARCHAR column stored '1.0', (0.10), (2) stored '2.00', and
    'NaN' beside numbers into a DOUBLE column failed."""
    ref = duckdb.connect()
    statements = ["INSERT INTO t VALUES (1, 1, 1), (1.5, 2.5, 'NaN')",
                  "INSERT INTO t (s) VALUES (0.10), (2)",
                  "INSERT INTO t VALUES (true, '3', -0.0), ('x', 4, 2)"]
    for run in (db.sql, ref.execute):
        run("CREATE TABLE t (s VARCHAR, i INTEGER, f DOUBLE)")
        for sql in statements:
            run(sql)
    want = ref.execute("FROM t").fetchall()
    assert repr(db.query("FROM t")) == repr(want)  # NaN and -0.0 as DuckDB has them
    with pytest.raises(DatabaseError, match='table "t" has 3 columns but 2 values'):
        db.sql("INSERT INTO t VALUES (1, 2)")
    with pytest.raises(DatabaseError, match="INT32"):
        db.sql("INSERT INTO t (i) VALUES ('x')")
    assert len(db.query("FROM t")) == len(want)
    assert "__cd_insert_values" not in str(db.con.sql("FROM duckdb_tables()").fetchall())
