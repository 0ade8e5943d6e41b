"""CREATE TABLE ... AS and ALTER TABLE of a table's name and columns (cryptdisk.db._schema)."""

import os
import signal
import subprocess
import sys
import tempfile

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


# -- ALTER TABLE ---------------------------------------------------------------------------


def _made(db, rows=3000):
    """t (k BIGINT key, s VARCHAR, f DOUBLE) in two parts whose key ranges overlap."""
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
    db.sql(f"INSERT INTO t SELECT i, 's' || i, i / 4 FROM range(0, {rows}, 2) r(i)")
    db.sql(f"INSERT INTO t SELECT i, NULL, i / 4 FROM range(1, {rows}, 2) r(i)")


def test_alter_parse_forms():
    assert _sql.parse("ALTER TABLE t RENAME TO \"U\"") == _sql.AlterTable("t", "rename",
                                                                          new_name="U")
    assert _sql.parse("alter table t rename a to b") == _sql.AlterTable(
        "t", "rename_column", "a", new_name="b")
    assert _sql.parse("ALTER TABLE t ADD COLUMN IF NOT EXISTS c DECIMAL(10, 2) NULL") == \
        _sql.AlterTable("t", "add", "c", type="DECIMAL(10, 2)", if_exists=True)
    assert _sql.parse("ALTER TABLE t DROP IF EXISTS c") == _sql.AlterTable(
        "t", "drop", "c", if_exists=True)
    for other in ("ALTER TABLE t ADD ROW ACCESS POLICY r ON (a)",
                  "ALTER TABLE t DROP ROW ACCESS POLICY r", "ALTER TABLE t DROP CONSTRAINT x",
                  "ALTER TABLE t ADD CONSTRAINT x CHECK (a > 0)"):
        assert isinstance(_sql.parse(other), _sql.Passthrough), other
    assert _sql.parse("ALTER TABLE t ADD COLUMN c INT DEFAULT 3 NOT NULL") == _sql.AlterTable(
        "t", "add", "c", type="INT", not_null=True, default="3")
    with pytest.raises(DatabaseError, match="ADD COLUMN c: CHECK is not supported") as e:
        _sql.parse("ALTER TABLE t ADD COLUMN c INT CHECK (c > 0)")
    assert "WHERE" in (e.value.hint or "")


def test_add_drop_rename_columns_read_everywhere(db):
    _made(db)
    before = db.query("SELECT k, s, f FROM t ORDER BY k")
    db.query("SELECT s FROM t")
    db.query("SELECT s FROM t")  # (cached now: the cache must not answer for new parts)
    db.sql("ALTER TABLE t ADD COLUMN n INTEGER")
    assert db.query("SELECT k, s, f, n FROM t ORDER BY k") == [(*r, None) for r in before]
    db.sql("INSERT INTO t VALUES (5000, 'x', 1.0, 7)")
    assert db.query("SELECT k, n FROM t WHERE n IS NOT NULL") == [(5000, 7)]
    assert db.query("SELECT count(*) FROM t WHERE n = 7") == [(1,)]
    db.sql("ALTER TABLE t RENAME COLUMN s TO label")
    db.sql("ALTER TABLE t RENAME k TO key")
    assert db.catalog.tables["t"].order_by == "key"
    assert db.query("SELECT key, label FROM t WHERE key = 2") == [(2, "s2")]
    assert db.last_scans["t"]["parts_skipped"] + db.last_scans["t"]["row_groups_skipped"] \
        >= 1  # the key still skips (the new parts carry its ranges)
    with pytest.raises(DatabaseError):
        db.query("SELECT s FROM t")
    db.sql("ALTER TABLE t DROP COLUMN f")
    assert db.query("SELECT name, type, is_in_order_by FROM system.columns "
                    "WHERE \"table\" = 't' ORDER BY position") == [
        ("key", "BIGINT", True), ("label", "VARCHAR", False), ("n", "INTEGER", False)]
    assert db.query("SELECT * FROM t WHERE key IN (2, 3, 5000) ORDER BY key") == [
        (2, "s2", None), (3, None, None), (5000, "x", 7)]
    assert db.arrow_table("t").column_names == ["key", "label", "n"]
    plan = db.scan_plan("t", [("key", "=", 2)])
    assert plan
    part = db.read_part("t", plan[0][0], filters=[("key", "=", 2)])
    assert part.to_pylist() == [{"key": 2, "label": "s2", "n": None}]
    for pid, _groups in db.scan_plan("t"):  # no part holds the dropped column's bytes
        assert "f" not in db.read_part("t", pid).column_names
    assert db.query("SELECT count(*), sum(key) FROM t") == [(3001, sum(range(3000)) + 5000)]
    db.check()


def test_rename_table(db):
    _made(db, 100)
    parts = [p.path for p in db.catalog.tables["t"].parts]
    db.sql("CREATE TABLE other (x BIGINT)")
    with pytest.raises(DatabaseError, match="a table other exists"):
        db.sql("ALTER TABLE t RENAME TO OTHER")
    db.sql("ALTER TABLE t RENAME TO sales")
    assert sorted(db.catalog.tables) == ["other", "sales"]
    assert [p.path for p in db.catalog.tables["sales"].parts] == parts  # no data moved
    assert db.query("SELECT count(*) FROM sales WHERE k < 10") == [(10,)]
    with pytest.raises(TableNotFoundError):
        db.query("SELECT * FROM t")
    db.sql("ALTER TABLE Sales RENAME TO SALES")  # a change of case
    assert sorted(db.catalog.tables) == ["SALES", "other"]
    db.sql("CREATE TABLE t (k BIGINT)")  # the old name is free
    assert db.query("SELECT count(*) FROM t") == [(0,)]


@pytest.mark.parametrize(("sql", "match"), [
    ("ALTER TABLE t DROP COLUMN k", "in the table's ORDER BY"),
    ("ALTER TABLE t ADD COLUMN S INTEGER", "has a column s"),
    ("ALTER TABLE t RENAME COLUMN s TO F", "has a column f"),
    ("ALTER TABLE t ADD COLUMN i INTERVAL", "ALTER TABLE t: column i of type INTERVAL"),
    ("ALTER TABLE t ADD COLUMN z TIMETZ", "TIME ZONE"),
    ("ALTER TABLE t DROP COLUMN nope", "no column nope"),
    ("ALTER TABLE t RENAME COLUMN nope TO x", "no column nope"),
    ("ALTER TABLE t ALTER COLUMN s TYPE INTEGER", "Could not convert"),
])
def test_alter_refusals_change_nothing(db, sql, match):
    _made(db, 10)
    version, rows = db.catalog.version, db.query("SELECT * FROM t ORDER BY k")
    with pytest.raises(DatabaseError, match=match):
        db.sql(sql)
    assert db.catalog.version == version
    assert db.query("SELECT * FROM t ORDER BY k") == rows
    db.sql("ALTER TABLE t ADD COLUMN IF NOT EXISTS S INTEGER")  # (IF: no error, no change)
    db.sql("ALTER TABLE t DROP COLUMN IF EXISTS nope")
    assert db.catalog.version == version


def test_alter_in_a_transaction_block_and_read_only_is_refused(db, tmp_path):
    _made(db, 10)
    db.sql("BEGIN")
    for change in ("ALTER TABLE t ADD COLUMN c INT", "ALTER TABLE t DROP COLUMN s",
                   "ALTER TABLE t RENAME COLUMN s TO z", "ALTER TABLE t RENAME TO u"):
        with pytest.raises(DatabaseError, match="holds queries only"):
            db.sql(change)
    db.sql("ROLLBACK")
    with cryptdisk.connect(db.path, read_only=True) as reader:
        with pytest.raises(DatabaseError, match="read-only"):
            reader.sql("ALTER TABLE t ADD COLUMN c INT")


def test_a_reader_sees_the_old_columns_or_the_new(db):
    _made(db, 1000)
    with cryptdisk.connect(db.path, read_only=True) as reader:
        assert reader.query("SELECT count(*) FROM t WHERE s IS NOT NULL") == [(500,)]
        db.sql("ALTER TABLE t RENAME COLUMN s TO z")
        db.sql("ALTER TABLE t ADD COLUMN n BIGINT")
        assert reader.query("SELECT count(*), count(z), count(n) FROM t") == [(1000, 500, 0)]
        assert reader.query("SELECT name FROM system.columns ORDER BY position") == [
            ("k",), ("z",), ("f",), ("n",)]


def test_a_temporary_tables_alter_is_duckdbs(db):
    db.sql("CREATE TEMP TABLE scratch (x BIGINT)")
    db.sql("ALTER TABLE scratch ADD COLUMN y VARCHAR")
    db.sql("INSERT INTO scratch VALUES (1, 'a')")
    assert db.query("SELECT * FROM scratch") == [(1, "a")]
    assert not db.catalog.tables


@pytest.mark.parametrize("statement", [
    "ALTER TABLE t ADD COLUMN n BIGINT", "ALTER TABLE t DROP COLUMN s",
    "ALTER TABLE t RENAME COLUMN k TO key", "ALTER TABLE t RENAME TO u",
    "ALTER TABLE t ALTER COLUMN f TYPE VARCHAR"])
def test_kill_before_an_alter_commits_leaves_the_old_table(tmp_path, statement):
    path = str(tmp_path / "db")
    with cryptdisk.connect(path) as db:
        _made(db, 40000)
        rows = db.query("SELECT * FROM t ORDER BY k")
        columns = list(db.catalog.tables["t"].columns)
    _kill_at_catalog(path, statement)
    with cryptdisk.connect(path, read_only=True) as reader:
        assert reader.catalog.tables["t"].columns == columns
        assert reader.query("SELECT * FROM t ORDER BY k") == rows
    with cryptdisk.connect(path) as db:  # the next writer removes the rewritten parts
        pending = f"v{db.catalog.version + 1}-"
        db.sql("SELECT 1")
        live = {p for _d, p in db.query("SELECT disk, path FROM system.parts")}
        stray = [f for f in disk_files(path) if f.endswith(".parquet")
                 and not any(f.endswith(p) for p in live)]
        assert all(os.path.basename(f).startswith(pending) for f in stray), stray
        db.sql(statement)  # and it runs whole
        db.check()
        assert db.query("SELECT count(*) FROM " + ("u" if "RENAME TO" in statement
                                                   else "t")) == [(len(rows),)]


# -- the same sequence on DuckDB ----------------------------------------------------------

_TYPES = {"BIGINT": st.integers(-(2 ** 40), 2 ** 40), "VARCHAR": st.text(max_size=5),
          "DOUBLE": st.floats(allow_nan=False, allow_infinity=False, width=32)}
_NAMES = ["a", "b", "c", "d", "e", "F", "g"]


@st.composite
def _steps(draw):
    """ADD, DROP, RENAME COLUMN, ALTER COLUMN TYPE and INSERT steps valid on table t (k
    BIGINT ORDER BY k)."""
    columns = [("k", "BIGINT")]
    steps = []
    for _ in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["add", "drop", "rename", "retype", "insert", "insert"]))
        names = [c for c, _t in columns]
        free = [n for n in [*_NAMES, "k", "key"] if n.lower() not in {c.lower() for c in names}]
        if kind == "add" and free:
            column = (draw(st.sampled_from(free)), draw(st.sampled_from(sorted(_TYPES))))
            columns.append(column)
            steps.append(f"ALTER TABLE t ADD COLUMN {column[0]} {column[1]}")
        elif kind == "drop" and len(columns) > 1:
            name = draw(st.sampled_from(names[1:]))  # (never the key, the first column)
            columns = [c for c in columns if c[0] != name]
            steps.append(f"ALTER TABLE t DROP COLUMN {name}")
        elif kind == "retype" and any(t != "VARCHAR" for _c, t in columns[1:]):
            name = draw(st.sampled_from([c for c, t in columns[1:] if t != "VARCHAR"]))
            columns = [(c, "VARCHAR" if c == name else t) for c, t in columns]
            steps.append(f"ALTER TABLE t ALTER COLUMN {name} TYPE VARCHAR")
        elif kind == "rename" and free:
            old, new = draw(st.sampled_from(names)), draw(st.sampled_from(free))
            columns = [(new if c == old else c, t) for c, t in columns]
            steps.append(f"ALTER TABLE t RENAME COLUMN {old} TO {new}")
        else:
            rows = draw(st.lists(st.tuples(*[st.one_of(st.none(), _TYPES[t])
                                             for _c, t in columns]), min_size=1, max_size=4))
            steps.append(("insert", [c for c, _t in columns], rows))
    return steps


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_steps())
def test_alter_sequences_match_duckdb(steps):
    ref = duckdb.connect()
    ref.execute("CREATE TABLE t (k BIGINT)")
    with tempfile.TemporaryDirectory() as tmp:
        db = cryptdisk.connect(os.path.join(tmp, "db"))
        try:
            db.sql("CREATE TABLE t (k BIGINT) ORDER BY k")
            for step in steps:
                if isinstance(step, tuple):
                    _kind, names, rows = step
                    table = pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)},
                                     schema=db.arrow_schema(db.table("t")))
                    db.insert("t", table)
                    ref.register("new_rows", table)
                    ref.execute("INSERT INTO t BY NAME SELECT * FROM new_rows")
                    ref.unregister("new_rows")
                else:
                    db.sql(step)
                    ref.execute(step)
            want = ref.sql("SELECT * FROM t ORDER BY ALL").fetchall()
            assert db.query("SELECT * FROM t ORDER BY ALL") == want
            assert [c for c, _t in db.table("t").columns] == ref.sql("FROM t").columns
            db.check()
        finally:
            db.close()


def test_dask_reads_the_new_columns(db):
    import cryptdisk.dask as dask
    _made(db, 100)
    db.sql("ALTER TABLE t ADD COLUMN n INTEGER")
    db.sql("ALTER TABLE t DROP COLUMN f")
    db.sql("ALTER TABLE t RENAME COLUMN s TO label")
    frame = dask.read_table(db.path, "t", filters=[("k", "<", 4)]).compute()
    assert list(frame.columns) == ["k", "label", "n"]
    assert sorted(frame["k"].tolist()) == [0, 1, 2, 3]
    assert frame["n"].isna().all()


def test_alter_column_type_casts_as_duckdb_casts(db):
    _made(db, 10)
    db.sql("ALTER TABLE t ADD COLUMN code VARCHAR")
    db.sql("INSERT INTO t VALUES (100, 'x', 0.5, '42'), (101, 'y', 0.25, NULL)")
    db.sql("ALTER TABLE t ALTER COLUMN code TYPE BIGINT")
    db.sql("ALTER TABLE t ALTER f SET DATA TYPE VARCHAR")
    assert db.catalog.tables["t"].columns == [("k", "BIGINT"), ("s", "VARCHAR"),
                                              ("f", "VARCHAR"), ("code", "BIGINT")]
    assert db.query("SELECT k, f, code FROM t WHERE k >= 100 ORDER BY k") == [
        (100, "0.5", 42), (101, "0.25", None)]
    assert db.query("SELECT sum(code) FROM t") == [(42,)]
    db.check()


def test_a_value_that_does_not_cast_is_named_with_its_column(db):
    db.sql('CREATE TABLE t (k BIGINT, "Some Col" VARCHAR)')
    db.sql("INSERT INTO t VALUES (1, '12'), (2, 'x')")
    with pytest.raises(DatabaseError) as caught:
        db.sql('ALTER TABLE t ALTER COLUMN "some col" TYPE INTEGER')
    # DuckDB names the column it casts from: the table's, not one cryptdisk made up
    assert "Could not convert string 'x'" in str(caught.value)
    assert str(caught.value).endswith("source column Some Col"), str(caught.value)
    assert db.query("SELECT * FROM t ORDER BY k") == [(1, "12"), (2, "x")]


@pytest.mark.parametrize(("sql", "match"), [
    ("ALTER TABLE t ALTER COLUMN s TYPE INTEGER", "Could not convert string 's0'"),
    ("ALTER TABLE t ALTER COLUMN k TYPE VARCHAR", "in the table's ORDER BY"),
    ("ALTER TABLE t ALTER COLUMN f TYPE INTERVAL", "column f of type INTERVAL"),
    ("ALTER TABLE t ALTER COLUMN f TYPE BIGINT USING f * 2", "TYPE is not supported"),
])
def test_a_failed_type_change_leaves_the_table_and_no_file(db, sql, match):
    _made(db, 10)
    files = set(disk_files(db.path))
    version, rows = db.catalog.version, db.query("SELECT * FROM t ORDER BY k")
    with pytest.raises(DatabaseError, match=match):
        db.sql(sql)
    assert db.catalog.version == version
    assert db.query("SELECT * FROM t ORDER BY k") == rows
    assert set(disk_files(db.path)) == files  # the parts written before the error: gone
