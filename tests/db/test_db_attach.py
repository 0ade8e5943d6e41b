"""ATTACH: another DuckDB database's tables, named with its name, are DuckDB's; a database
file is attached READ_ONLY (its file is plaintext, out of cryptdisk's reach)."""

from __future__ import annotations

import duckdb
import pytest

from cryptdisk.errors import DatabaseError, TableNotFoundError


@pytest.fixture
def other(tmp_path):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE x AS SELECT 1 AS a")
    con.execute("CREATE TABLE t AS SELECT 2 AS a")  # the name of a table of the database
    con.close()
    return path


@pytest.fixture
def t(db):
    db.sql("CREATE TABLE t (a BIGINT) ORDER BY a")
    db.sql("INSERT INTO t VALUES (10)")
    return db


def test_attached_read_only_database_is_read_by_qualified_names(t, other):
    db = t
    db.sql(f"ATTACH '{other}' AS o (READ_ONLY)")
    assert db.query("SELECT a FROM o.main.x") == [(1,)]
    assert db.query("SELECT a FROM o.x") == [(1,)]
    # o.t is the attached database's t, t the database's
    assert db.query("SELECT a FROM o.t") == [(2,)]
    assert db.query("SELECT a FROM o.main.t") == [(2,)]
    assert db.query("SELECT o.t.a, u.a FROM o.t, t AS u") == [(2, 10)]
    assert db.query("SELECT count(*) FROM t") == [(1,)]
    with pytest.raises(TableNotFoundError, match="not in a DuckDB schema"):
        db.query("SELECT a FROM main.t")  # still: the database's tables have no schema
    with pytest.raises(DatabaseError, match="read-only"):
        db.sql("CREATE TABLE o.main.y AS SELECT * FROM t")
    with pytest.raises(DatabaseError, match="read-only"):
        db.sql("INSERT INTO o.x SELECT a FROM t")
    db.sql("DETACH o")
    with pytest.raises(DatabaseError, match="o"):
        db.query("SELECT a FROM o.x")
    check = duckdb.connect(str(other), read_only=True)
    assert check.sql("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall() == [
        ("t",), ("x",)]
    check.close()


@pytest.mark.parametrize("options", [
    "", "(READ_ONLY false)", "(TYPE duckdb)",
    '("READ_ONLY" false)', '("read_only" 0)',             # a quoted option name
    "(/* READ_ONLY */ TYPE duckdb)", "(TYPE duckdb) -- (READ_ONLY)",   # comments
    "(ACCESS_MODE READ_WRITE)", "(TYPE duckdb, ACCESS_MODE 'read_write')",
])
def test_attach_of_a_writable_file_is_refused(t, tmp_path, options):
    path = tmp_path / "new.duckdb"
    with pytest.raises(DatabaseError, match="READ_ONLY") as e:
        t.sql(f"ATTACH '{path}' AS n {options}")
    assert "plaintext" in str(e.value) and "COPY" in (e.value.hint or "")
    assert not path.exists()
    assert t.query("SELECT count(*) FROM duckdb_databases() WHERE NOT internal") == [(1,)]


def test_attach_of_a_path_made_of_memory_and_more_is_refused(t, tmp_path, monkeypatch):
    """':memory:' || 'x' is the file ':memory:x' to DuckDB, not an in-memory database."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ":memory:").mkdir()
    with pytest.raises(DatabaseError, match="READ_ONLY"):
        t.sql("ATTACH ':memory:' || '/new.duckdb' AS n")
    assert not (tmp_path / ":memory:" / "new.duckdb").exists()
    t.sql("ATTACH ':memory:' AS m (READ_ONLY false)")  # in memory, whatever its options
    t.sql("ATTACH ':memory:' /* x */ AS m2")
    assert t.query("SELECT count(*) FROM duckdb_databases() WHERE NOT internal") == [(3,)]


def test_attached_in_memory_database_takes_writes(t):
    db = t
    db.sql("ATTACH ':memory:' AS m")
    db.sql("CREATE TABLE m.t AS SELECT a FROM t")
    db.sql("CREATE TABLE m.main.y (a INTEGER)")
    db.sql("INSERT INTO m.y SELECT a + 1 FROM t")
    db.sql("UPDATE m.t SET a = 11")
    db.sql("DELETE FROM m.y")
    assert db.query("SELECT a FROM m.t") == [(11,)]
    assert db.query("SELECT count(*) FROM m.y") == [(0,)]
    assert db.query("SELECT a FROM t") == [(10,)]  # the database's t, untouched
    db.sql("DROP TABLE m.t")
    assert sorted(db.catalog.tables) == ["t"]
    with pytest.raises(DatabaseError, match="no attached database is named q"):
        db.sql("INSERT INTO q.t VALUES (1)")
