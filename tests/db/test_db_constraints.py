"""NOT NULL and DEFAULT: declared at CREATE TABLE (or ADD COLUMN, ALTER COLUMN), kept in
the catalog, checked or filled on every write path; other constraints stay refused."""

from __future__ import annotations

import datetime

import duckdb
import pandas as pd
import pyarrow as pa
import pytest

import cryptdisk
from cryptdisk.db import _sql
from cryptdisk.errors import DatabaseError


class _Today:
    """What a DEFAULT current_date writes: the day of the write, which lies between this
    module's import and the comparison (a test run may cross midnight)."""

    def __init__(self) -> None:
        self.since = datetime.date.today()

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, datetime.date)
                and self.since <= other <= datetime.date.today())

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"<a day from {self.since} to today>"


TODAY = _Today()


@pytest.fixture
def t(db):
    db.sql("CREATE TABLE t (k BIGINT NOT NULL, s VARCHAR DEFAULT 'none', "
           "d DATE NOT NULL DEFAULT current_date, n INTEGER NULL) ORDER BY k")
    return db


def _unchanged(db, rows):
    assert db.query("SELECT count(*) FROM t") == [(rows,)]


def test_create_table_parses_not_null_and_default():
    st = _sql.parse("CREATE TABLE t (a INT NOT NULL, b VARCHAR DEFAULT 'x, NOT NULL' NOT NULL, "
                    "c DECIMAL(10,2) DEFAULT (1 + 2) * 3, d INT DEFAULT NULL, "
                    "e TIMESTAMP DEFAULT now())")
    assert st.columns == [("a", "INT"), ("b", "VARCHAR"), ("c", "DECIMAL(10,2)"), ("d", "INT"),
                          ("e", "TIMESTAMP")]
    assert st.not_null == ["a", "b"]
    assert st.defaults == {"b": "'x, NOT NULL'", "c": "(1 + 2) * 3", "e": "now()"}


def test_defaults_fill_the_columns_an_insert_leaves_out(t):
    t.sql("INSERT INTO t (k) VALUES (1)")
    t.sql("INSERT INTO t (k, n) SELECT 2, 5")
    t.sql("INSERT INTO t BY NAME SELECT 3 AS k, 'three' AS s")
    t.sql("INSERT INTO t VALUES (4, NULL, DATE '2020-01-02', NULL)")  # NULL given: stays NULL
    assert t.query("SELECT * FROM t ORDER BY k") == [
        (1, "none", TODAY, None), (2, "none", TODAY, 5), (3, "three", TODAY, None),
        (4, None, datetime.date(2020, 1, 2), None)]


@pytest.mark.parametrize("sql", [
    "INSERT INTO t (s) VALUES ('x')",                      # k left out: no default
    "INSERT INTO t VALUES (NULL, 'a', DATE '2020-01-01', 1)",
    "INSERT INTO t (k, d) VALUES (1, current_date), (2, NULL)",
    "INSERT INTO t (s) SELECT 'x'",
    "INSERT INTO t BY NAME SELECT 'x' AS s",
    # a NULL far into the stream: DuckDB's error comes through its Arrow reader
    "INSERT INTO t (k) SELECT CASE WHEN range = 300000 THEN NULL ELSE range END "
    "FROM range(400000)",
])
def test_not_null_refuses_an_insert_whole(t, sql):
    t.sql("INSERT INTO t (k) VALUES (0)")
    with pytest.raises(DatabaseError, match=r"NOT NULL constraint failed: t\.[kd]") as e:
        t.sql(sql)
    assert "nothing is written" in str(e.value)
    _unchanged(t, 1)


def test_not_null_and_defaults_in_python_inserts(t, tmp_path):
    whole = pa.table({"k": pa.array([None, 2], pa.int64()), "s": ["a", "b"],
                      "d": pa.array([TODAY.since] * 2, pa.date32()),
                      "n": pa.array([1, 2], pa.int32())})
    with pytest.raises(DatabaseError, match=r"NOT NULL constraint failed: t\.k"):
        t.insert("t", whole)  # (the table's own columns: written without DuckDB)
    with pytest.raises(DatabaseError, match=r"NOT NULL constraint failed: t\.k"):
        t.insert("t", [{"s": "no key"}])
    _unchanged(t, 0)
    assert t.insert("t", [{"k": 7}]) == 1  # s and d: their defaults
    assert t.insert("t", pa.table({"k": pa.array([8], pa.int64())})) == 1
    parquet = tmp_path / "p.parquet"
    duckdb.sql(f"COPY (SELECT 9::BIGINT AS k) TO '{parquet}'")
    assert t.insert("t", str(parquet)) == 1
    assert t.query("SELECT k, s, d FROM t ORDER BY k") == [
        (7, "none", TODAY), (8, "none", TODAY), (9, "none", TODAY)]


def test_copy_from_fills_defaults_and_checks_not_null(t, tmp_path):
    good = tmp_path / "good.csv"
    good.write_text("k,n\n1,10\n2,20\n")
    bad = tmp_path / "bad.csv"
    bad.write_text("k,n\n1,10\n,20\n")
    t.sql(f"COPY t (k, n) FROM '{good}' (HEADER)")
    assert t.query("SELECT k, s, d, n FROM t ORDER BY k") == [
        (1, "none", TODAY, 10), (2, "none", TODAY, 20)]
    with pytest.raises(DatabaseError, match=r"COPY t FROM: NOT NULL constraint failed: t\.k"):
        t.sql(f"COPY t (k, n) FROM '{bad}' (HEADER)")
    _unchanged(t, 2)


def test_update_to_null_is_refused(t):
    t.sql("INSERT INTO t (k, n) VALUES (1, 1), (2, 2)")
    with pytest.raises(DatabaseError, match=r"UPDATE t: NOT NULL constraint failed: t\.d"):
        t.sql("UPDATE t SET d = NULL WHERE k = 2")
    t.sql("UPDATE t SET n = NULL, s = NULL WHERE k = 2")  # nullable columns
    assert t.query("SELECT k, s, d, n FROM t ORDER BY k") == [
        (1, "none", TODAY, 1), (2, None, TODAY, None)]


def test_update_set_default_sets_the_columns_default(t):
    """UPDATE t SET c = DEFAULT gives c its DEFAULT (NULL where it has none), as DuckDB's
    UPDATE does."""
    t.sql("INSERT INTO t (k, n, s) VALUES (1, 1, 'a'), (2, 2, 'b')")
    t.sql("UPDATE t SET s = DEFAULT, n = default WHERE k = 2")
    assert t.query("SELECT k, s, n FROM t ORDER BY k") == [(1, "a", 1), (2, "none", None)]
    duck = duckdb.connect()
    duck.execute("CREATE TABLE t (k INTEGER, s VARCHAR DEFAULT 'none', n INTEGER)")
    duck.execute("INSERT INTO t VALUES (1, 'a', 1), (2, 'b', 2)")
    duck.execute("UPDATE t SET s = DEFAULT, n = default WHERE k = 2")
    assert duck.execute("SELECT k, s, n FROM t ORDER BY k").fetchall() == \
        t.query("SELECT k, s, n FROM t ORDER BY k")


def test_add_column_not_null_needs_a_default_on_a_table_with_rows(t):
    t.sql("ALTER TABLE t ADD COLUMN e INTEGER NOT NULL")  # no rows: allowed
    t.sql("INSERT INTO t (k, e) VALUES (1, 5)")
    with pytest.raises(DatabaseError, match="ADD COLUMN f: the column is NOT NULL") as e:
        t.sql("ALTER TABLE t ADD COLUMN f INTEGER NOT NULL")
    assert "DEFAULT" in (e.value.hint or "")
    t.sql("ALTER TABLE t ADD COLUMN f INTEGER NOT NULL DEFAULT 7")
    t.sql("ALTER TABLE t ADD COLUMN g VARCHAR DEFAULT 'g'")
    assert t.query("SELECT k, e, f, g FROM t") == [(1, 5, 7, "g")]
    t.sql("INSERT INTO t (k, e) VALUES (2, 6)")
    assert t.query("SELECT f, g FROM t WHERE k = 2") == [(7, "g")]
    with pytest.raises(DatabaseError, match=r"NOT NULL constraint failed: t\.e"):
        t.sql("INSERT INTO t (k) VALUES (3)")


def test_alter_column_set_and_drop_default_and_not_null(t):
    t.sql("INSERT INTO t (k) VALUES (1)")
    t.sql("ALTER TABLE t ALTER COLUMN n SET DEFAULT 42")
    t.sql("INSERT INTO t (k) VALUES (2)")
    with pytest.raises(DatabaseError, match="SET NOT NULL: 1 rows hold NULL"):
        t.sql("ALTER TABLE t ALTER COLUMN n SET NOT NULL")
    t.sql("UPDATE t SET n = 0 WHERE n IS NULL")
    t.sql("ALTER TABLE t ALTER COLUMN n SET NOT NULL")
    with pytest.raises(DatabaseError, match=r"NOT NULL constraint failed: t\.n"):
        t.sql("INSERT INTO t (k, n) VALUES (3, NULL)")
    with pytest.raises(DatabaseError, match="DEFAULT 'x'"):
        t.sql("ALTER TABLE t ALTER COLUMN n SET DEFAULT 'x'")  # not an INTEGER
    t.sql("ALTER TABLE t ALTER n DROP NOT NULL")
    t.sql("ALTER TABLE t ALTER COLUMN n DROP DEFAULT")
    t.sql("INSERT INTO t (k) VALUES (3)")
    assert t.query("SELECT k, n FROM t ORDER BY k") == [(1, 0), (2, 42), (3, None)]


def test_constraints_follow_column_changes_and_are_kept(tmp_path):
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (k BIGINT NOT NULL, s VARCHAR DEFAULT 'x' NOT NULL, "
               "n INTEGER DEFAULT 1)")
        db.sql("ALTER TABLE t RENAME COLUMN s TO label")
        db.sql("ALTER TABLE t DROP COLUMN n")
        db.sql("ALTER TABLE t ALTER COLUMN k TYPE INTEGER")  # keeps its NOT NULL
        with pytest.raises(DatabaseError, match="DEFAULT 'x'"):
            db.sql("ALTER TABLE t ALTER COLUMN label TYPE INTEGER")  # its default: no INTEGER
    with cryptdisk.connect(path) as db:
        meta = db.table("t")
        assert meta.columns == [("k", "INTEGER"), ("label", "VARCHAR")]
        assert (meta.not_null, meta.defaults) == (["k", "label"], {"label": "'x'"})
        db.sql("INSERT INTO t (k) VALUES (1)")
        assert db.query("SELECT * FROM t") == [(1, "x")]
        with pytest.raises(DatabaseError, match=r"NOT NULL constraint failed: t\.k"):
            db.sql("INSERT INTO t (label) VALUES ('y')")


def test_constraints_are_shown(t):
    assert t.query("DESCRIBE t") == [
        ("k", "BIGINT", "NO", None, None, None), ("s", "VARCHAR", "YES", None, "'none'", None),
        ("d", "DATE", "NO", None, "current_date", None),
        ("n", "INTEGER", "YES", None, None, None)]
    assert t.query("SHOW t") == t.query("DESCRIBE t")
    assert t.query("SELECT name, is_nullable, default_expression FROM system.columns") == [
        ("k", False, None), ("s", True, "'none'"), ("d", False, "current_date"),
        ("n", True, None)]
    assert t.query("SELECT column_name, is_nullable, column_default "
                   "FROM information_schema.columns ORDER BY ordinal_position") == [
        ("k", "NO", None), ("s", "YES", "'none'"), ("d", "NO", "current_date"),
        ("n", "YES", None)]
    reader = t.reader()
    assert reader.query("DESCRIBE t") == t.query("DESCRIBE t")
    reader.close()


@pytest.mark.parametrize("sql", [
    "SELECT * FROM (DESCRIBE t)", "FROM (DESCRIBE TABLE \"t\")", "SELECT * FROM (SHOW t)",
    "WITH d AS (SELECT * FROM ( describe t )) SELECT * FROM d",
    "SELECT * FROM (DESCRIBE t) WHERE column_name <> '(DESCRIBE t)'",
])
def test_a_described_table_in_a_query_shows_its_constraints(t, sql):
    """``(DESCRIBE t)`` in a query is the table's description as ``DESCRIBE t`` gives it
    (its NOT NULL and DEFAULT were YES and NULL: DuckDB's description of the scan)."""
    want = t.query("DESCRIBE t")
    assert t.query(sql) == want
    assert t.query("SELECT column_name, \"null\", \"default\" FROM (DESCRIBE t) "
                   "WHERE \"null\" = 'NO' ORDER BY 1") == [("d", "NO", "current_date"),
                                                           ("k", "NO", None)]
    reader = t.reader()
    try:
        assert reader.query(sql) == want
        with pytest.raises(DatabaseError, match=r"FROM \(DESCRIBE t\) WHERE nope") as err:
            reader.query("SELECT * FROM (DESCRIBE t) WHERE nope")
        assert "__cd" not in str(err.value)  # (what it reads is cryptdisk's own name)
    finally:
        reader.close()
    with pytest.raises(DatabaseError, match=r"FROM \(DESCRIBE t\) WHERE nope") as err:
        t.query("SELECT * FROM (DESCRIBE t) WHERE nope")
    assert "__cd" not in str(err.value)


@pytest.mark.parametrize(("sql", "message"), [
    ("CREATE TABLE u (a INT PRIMARY KEY)", "ORDER BY is the table's sort key, as in ClickHouse"),
    ("CREATE TABLE u (a INT UNIQUE)", "ORDER BY is the table's sort key"),
    ("CREATE TABLE u (a INT, PRIMARY KEY (a))", "ORDER BY is the table's sort key"),
    ("CREATE TABLE u (a INT CHECK (a > 0))", "NOT NULL and DEFAULT, no other"),
    ("CREATE TABLE u (a INT DEFAULT a)", "column names"),
    ("CREATE TABLE u (a INT DEFAULT (SELECT 1))", "subqueries"),
    ("CREATE TABLE u (a INT DEFAULT 'x')", "DEFAULT 'x'"),
    ("CREATE TABLE u (a INT DEFAULT)", "DEFAULT needs one expression"),
    ("CREATE TABLE u (a NOT NULL)", "needs a type"),
])
def test_other_constraints_and_bad_defaults_are_refused(db, sql, message):
    with pytest.raises(DatabaseError, match="CREATE TABLE u") as e:
        db.sql(sql)
    assert message in str(e.value)
    assert "u" not in db.catalog.tables


def test_insert_default_values_is_one_row_of_defaults(t):
    with pytest.raises(DatabaseError, match=r"NOT NULL constraint failed: t\.k"):
        t.sql("INSERT INTO t DEFAULT VALUES")  # k has no default
    t.sql("ALTER TABLE t ALTER COLUMN k SET DEFAULT 5")
    t.sql("INSERT INTO t DEFAULT VALUES")
    assert t.query("SELECT * FROM t") == [(5, "none", TODAY, None)]


def test_a_volatile_default_is_not_called_when_the_table_is_made(db):
    """A DEFAULT that calls nextval gives the first row the sequence's first value, as
    DuckDB's own table does: checking the DEFAULT when the table is made (or the column
    added or changed) does not call it."""
    duck = duckdb.connect()
    for run in (db.sql, duck.execute):
        run("CREATE SEQUENCE s")
        run("CREATE TABLE q (id BIGINT DEFAULT nextval('s') NOT NULL, b INTEGER)")
        run("INSERT INTO q (b) VALUES (10), (20)")
        run("ALTER TABLE q ALTER COLUMN b SET DEFAULT nextval('s')")
        run("INSERT INTO q (id) VALUES (7)")
    assert db.query("SELECT id, b FROM q ORDER BY b") == \
        duck.execute("SELECT id, b FROM q ORDER BY b").fetchall() == [(7, 3), (1, 10), (2, 20)]
    with pytest.raises(DatabaseError, match=r"its DEFAULT CAST\(NULL AS INTEGER\) \+ 1 is NULL"):
        db.sql("CREATE TABLE n (a INTEGER NOT NULL DEFAULT CAST(NULL AS INTEGER) + 1)")


@pytest.mark.parametrize("write", [
    lambda db, tmp: db.insert("t", pa.table({"k": ["zz"]})),
    lambda db, tmp: db.insert("t", pa.table({"k": [1], "d": ["2024-13-45"]})),
    lambda db, tmp: db.insert("t", pd.DataFrame({"k": ["7x"]})),
    lambda db, tmp: db.sql("INSERT INTO t (k) SELECT 'zz'"),
    lambda db, tmp: db.sql("INSERT INTO t (k) VALUES ('zz')"),
    lambda db, tmp: db.sql("UPDATE t SET d = 'not a date'"),
    lambda db, tmp: (tmp.joinpath("x.csv").write_text("k,d\nzz,2024-01-01\n"),
                     db.sql(f"COPY t (k, d) FROM '{tmp / 'x.csv'}' (HEADER)")),
], ids=["arrow", "arrow-date", "pandas", "insert-select", "values", "update", "copy"])
def test_a_value_that_does_not_cast_to_a_not_null_column_is_a_conversion_error(t, tmp_path,
                                                                               write):
    """A value that does not cast to a NOT NULL column's type fails with DuckDB's
    conversion error, not as a NULL given to it (the check's text, in the statement
    DuckDB quotes after its error, was taken for the error)."""
    t.sql("INSERT INTO t (k, d) VALUES (1, DATE '2024-01-01')")
    with pytest.raises(DatabaseError) as err:
        write(t, tmp_path)
    assert "Conversion Error" in str(err.value) and "NOT NULL" not in str(err.value)
    assert "#1" not in str(err.value) and "coalesce" not in str(err.value)  # (cryptdisk's SQL)
    assert t.query("SELECT k, d FROM t") == [(1, datetime.date(2024, 1, 1))]


@pytest.mark.parametrize(("sql", "want"), [
    ("SELECT $$see (DESCRIBE t)$$", "see (DESCRIBE t)"),
    ("SELECT $x$see (SHOW t)$x$", "see (SHOW t)"),
    ("SELECT E'it''s (DESCRIBE t)'", "it's (DESCRIBE t)"),
    ("SELECT E'it\\'s (DESCRIBE t)'", "it's (DESCRIBE t)"),
    ("SELECT 'x' -- (DESCRIBE t)\n", "x"),
    ("SELECT /* (DESCRIBE t) */ 'x'", "x"),
])
def test_describe_in_a_string_or_comment_is_left_as_it_is(t, sql, want):
    """Only a ``(DESCRIBE t)`` subquery is read from the table's description: the same
    text in a dollar-quoted or E'' string was rewritten to cryptdisk's own name, so an
    INSERT stored '(SELECT * FROM __cd_describe_0)' in place of what it was given, and a
    quoted column alias was renamed."""
    assert t.query(sql) == [(want,)]
    t.sql("CREATE TABLE notes (s VARCHAR)")
    t.sql(f"INSERT INTO notes {sql}")
    assert t.query("SELECT s FROM notes") == [(want,)]
    result = t.sql('SELECT 1 AS "(DESCRIBE t)"')
    assert result.schema.names == ["(DESCRIBE t)"]
