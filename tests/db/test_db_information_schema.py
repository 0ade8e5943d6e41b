"""DuckDB's catalog views (information_schema.tables / columns, duckdb_tables(),
duckdb_columns()) list the database's tables with DuckDB's own."""

from __future__ import annotations

import duckdb
import pytest

import cryptdisk


@pytest.fixture
def tables(db):
    db.sql('CREATE TABLE t (k BIGINT, "Note" VARCHAR, d DECIMAL(10,2)) ORDER BY k')
    db.sql("CREATE TABLE u (x DOUBLE) SETTINGS storage_policy = 'plain'")
    db.sql("INSERT INTO t VALUES (1, 'a', 1.5), (2, 'b', 2.5)")
    return db


def test_information_schema_tables_lists_the_tables(tables):
    db = tables
    db.sql("CREATE TEMP TABLE scratch (z INTEGER)")  # DuckDB's own: listed too
    got = db.query("SELECT table_catalog, table_schema, table_name, table_type "
                   "FROM information_schema.tables ORDER BY table_name")
    assert got == [("temp", "main", "scratch", "LOCAL TEMPORARY"),
                   ("memory", "main", "t", "BASE TABLE"), ("memory", "main", "u", "BASE TABLE")]
    # a filter, a join with the columns, a string that names the view: as DuckDB runs them
    assert db.query("SELECT table_name FROM information_schema.tables WHERE table_name = 'u'"
                    ) == [("u",)]
    assert db.query("SELECT 'information_schema.tables'") == [("information_schema.tables",)]


def test_information_schema_columns_describes_the_columns(tables):
    got = tables.query(
        "SELECT table_name, column_name, ordinal_position, data_type, is_nullable, "
        "numeric_precision, numeric_scale FROM information_schema.columns "
        "ORDER BY table_name, ordinal_position")
    assert got == [("t", "k", 1, "BIGINT", "YES", 64, 0),
                   ("t", "Note", 2, "VARCHAR", "YES", None, None),
                   ("t", "d", 3, "DECIMAL(10,2)", "YES", 10, 2),
                   ("u", "x", 1, "DOUBLE", "YES", 53, 0)]
    assert tables.query(
        "SELECT c.table_name, count(*) FROM information_schema.tables t "
        "JOIN information_schema.columns c USING (table_name) GROUP BY ALL ORDER BY 1"
    ) == [("t", 3), ("u", 1)]


def test_duckdb_tables_and_columns_list_the_tables(tables):
    db = tables
    assert db.query("SELECT schema_name, table_name, estimated_size, column_count, temporary "
                    "FROM duckdb_tables() ORDER BY table_name") == [
        ("main", "t", 2, 3, False), ("main", "u", 0, 1, False)]
    assert db.query("SELECT table_name, column_name, data_type FROM duckdb_columns() "
                    "WHERE NOT internal ORDER BY table_name, column_index") == [
        ("t", "k", "BIGINT"), ("t", "Note", "VARCHAR"), ("t", "d", "DECIMAL(10,2)"),
        ("u", "x", "DOUBLE")]


def test_catalog_views_follow_ddl_and_work_on_readers_and_read_only(tmp_path):
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (k BIGINT)")
        reader = db.reader()
        assert reader.query("SELECT table_name FROM information_schema.tables") == [("t",)]
        db.sql("ALTER TABLE t RENAME TO t2")
        db.sql("ALTER TABLE t2 ADD COLUMN s VARCHAR")
        assert db.query("SELECT table_name, column_name FROM information_schema.columns "
                        "ORDER BY ordinal_position") == [("t2", "k"), ("t2", "s")]
        assert reader.query("SELECT table_name FROM information_schema.tables") == [("t2",)]
        reader.close()
    with cryptdisk.connect(path, read_only=True) as ro:
        assert ro.query("SELECT table_name FROM duckdb_tables()") == [("t2",)]


def test_the_databases_views_are_listed(tables):
    db = tables
    db.sql("CREATE VIEW v AS SELECT k, d * 2 AS twice FROM t")
    db.sql("CREATE VIEW w (total) AS SELECT sum(twice) FROM v")  # a view over a view
    assert db.query("SELECT table_name, table_type FROM information_schema.tables "
                    "ORDER BY table_name") == [
        ("t", "BASE TABLE"), ("u", "BASE TABLE"), ("v", "VIEW"), ("w", "VIEW")]
    assert db.query("SELECT table_name, column_name, data_type FROM information_schema.columns "
                    "WHERE table_name IN ('v', 'w') ORDER BY table_name, ordinal_position") == [
        ("v", "k", "BIGINT"), ("v", "twice", "DECIMAL(18,2)"), ("w", "total", "DECIMAL(38,2)")]
    assert db.query("SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1") == [
        ("v",), ("w",)]


def test_catalog_views_give_the_types_queries_read(db):
    """information_schema.columns and duckdb_columns() name each column's type as DESCRIBE
    t and typeof() do (a HUGEINT column is read as DECIMAL(38,0), a UUID one as VARCHAR;
    they named the declared types, which no query of the table returns)."""
    db.sql("CREATE TABLE h (x HUGEINT NOT NULL, u UUID DEFAULT 'a0eebc99-9c0b-4ef8-bb6d-"
           "6bb9bd380a11', e ENUM('a', 'b'), n INTEGER)")
    db.sql("INSERT INTO h (x, e, n) VALUES (1, 'a', 2)")
    described = [(r[0], r[1]) for r in db.query("DESCRIBE h")]
    assert described == [("x", "DECIMAL(38,0)"), ("u", "VARCHAR"), ("e", "VARCHAR"),
                         ("n", "INTEGER")]
    assert db.query("SELECT typeof(x), typeof(u), typeof(e), typeof(n) FROM h") == \
        [tuple(t for _c, t in described)]
    assert db.query("SELECT column_name, data_type, is_nullable, column_default "
                    "FROM information_schema.columns WHERE table_name = 'h' "
                    "ORDER BY ordinal_position") == [
        ("x", "DECIMAL(38,0)", "NO", None),
        ("u", "VARCHAR", "YES", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"),
        ("e", "VARCHAR", "YES", None), ("n", "INTEGER", "YES", None)]
    assert db.query("SELECT column_name, data_type FROM duckdb_columns() "
                    "WHERE table_name = 'h' ORDER BY column_index") == described


def test_show_all_tables_lists_the_tables_as_duckdb_does(tables):
    """SHOW ALL TABLES lists the database's tables and views with DuckDB's own, in the
    columns DuckDB gives it (it listed DuckDB's own only: none of the tables)."""
    db = tables
    db.sql("CREATE VIEW v AS SELECT k FROM t")
    db.sql("CREATE TEMP TABLE scratch (x INTEGER)")
    ref = duckdb.connect()
    ref.execute('CREATE TABLE t (k BIGINT, "Note" VARCHAR, d DECIMAL(10,2))')
    ref.execute("CREATE TABLE u (x DOUBLE)")
    ref.execute("CREATE VIEW v AS SELECT k FROM t")
    ref.execute("CREATE TEMP TABLE scratch (x INTEGER)")
    want = ref.execute("SHOW ALL TABLES").fetchall()
    assert want[0][2] == "t" and len(want) == 4
    assert db.query("SHOW ALL TABLES") == want
    assert db.sql("show all tables;").schema == ref.sql("SHOW ALL TABLES").to_arrow_table().schema
    reader = db.reader()
    try:
        assert reader.query("SHOW ALL TABLES") == [r for r in want if r[2] != "scratch"]
    finally:
        reader.close()
