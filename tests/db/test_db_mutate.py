"""DELETE and UPDATE: the parts holding matching rows are rewritten, the others kept; the
statement returns the rows it changed; refusals are clear errors."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.errors import DatabaseError, NotSupportedError

from .dbhelpers import SCHEMA, gen, write_config


def _count(result):
    assert result is not None and result.column_names == ["count"]
    return result.column(0)[0].as_py()


def _parts(db, table="t"):
    return [p for (p,) in db.query(f"SELECT part FROM system.parts WHERE \"table\" = '{table}'")]


def _files(root):
    return {os.path.join(r, f) for r, _d, fs in os.walk(root) for f in fs}


@pytest.fixture
def db(tmp_path):
    with cryptdisk.connect(str(tmp_path / "db")) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
        db.sql(f"INSERT INTO t {gen(1000)}")           # part 1: keys 0..999
        db.sql(f"INSERT INTO t {gen(1000, 1000)}")     # part 2: keys 1000..1999
        db.sql(f"INSERT INTO t {gen(1000, 2000)}")     # part 3: keys 2000..2999
        yield db


def test_delete_rewrites_only_the_parts_that_hold_matching_rows(db, tmp_path):
    before = _parts(db)
    files = _files(tmp_path / "db")
    assert _count(db.execute("DELETE FROM t WHERE c_int BETWEEN 1500 AND 1509")) == 10
    after = _parts(db)
    assert after[0] == before[0] and after[2] == before[2]  # kept, in their place
    assert after[1] != before[1]  # rewritten under a new part id
    assert db.query("SELECT count(*), count(DISTINCT c_int) FROM t") == [(2990, 2990)]
    assert db.query("SELECT count(*) FROM t WHERE c_int BETWEEN 1500 AND 1509") == [(0,)]
    gone = files - _files(tmp_path / "db")
    assert len([f for f in gone if f.endswith(".parquet")]) == 1  # the old part's file
    # the new part is sorted and indexed like any part: its key range in the catalog
    assert db.query(f"SELECT key_min, key_max FROM system.parts WHERE part = '{after[1]}'") \
        == [("1000", "1999")]
    db.check()


def test_a_condition_no_row_matches_rewrites_nothing(db):
    before = _parts(db)
    version = db.catalog.version
    assert _count(db.execute("DELETE FROM t WHERE c_int > 10000")) == 0
    assert _count(db.execute("UPDATE t SET c_str = 'x' WHERE c_str = 'nope'")) == 0
    assert _parts(db) == before and db.catalog.version == version  # no commit


def test_update_sets_values_in_the_matching_rows(db):
    n = _count(db.execute("UPDATE t SET c_str = upper(c_str) || '!', c_float = c_int * 2 "
                          "WHERE c_int % 100 = 7"))
    assert n == 30
    rows = db.query("SELECT c_int, c_str, c_float FROM t WHERE c_int IN (7, 8, 2907) "
                    "ORDER BY c_int")
    assert rows[0][1].endswith("!") and rows[0][1][:-1].isupper() and rows[0][2] == 14.0
    assert not rows[1][1].endswith("!") and rows[1][2] == 8 / 7
    assert rows[2][2] == 5814.0
    assert db.query("SELECT count(*) FROM t") == [(3000,)]
    db.check()


def test_update_to_null_and_back(db):
    assert _count(db.execute("UPDATE t SET c_float = NULL WHERE c_int < 5")) == 5
    assert db.query("SELECT count(*) FROM t WHERE c_float IS NULL") == [(5,)]
    assert _count(db.execute("UPDATE t SET c_float = 1 WHERE c_float IS NULL")) == 5
    assert db.query("SELECT sum(c_float) FROM t WHERE c_int < 5") == [(5.0,)]


def test_is_distinct_from_is_an_operator_not_a_from_clause(db):
    """``IS [NOT] DISTINCT FROM`` in a WHERE or a SET: its FROM was read as the clause of
    ``UPDATE ... FROM`` (refused with NotSupportedError) or ended a DELETE's WHERE."""
    assert _count(db.execute("UPDATE t SET c_str = 'd' WHERE c_int IS NOT DISTINCT FROM 3")) == 1
    assert _count(db.execute("UPDATE t SET c_float = NULL WHERE c_int < 2 AND c_str "
                             "IS DISTINCT FROM 'x'")) == 2
    assert _count(db.execute("UPDATE t SET c_str = (c_int IS DISTINCT FROM 5)::VARCHAR "
                             "WHERE c_int BETWEEN 4 AND 5")) == 2
    assert db.query("SELECT c_int, c_str FROM t WHERE c_int BETWEEN 3 AND 5 ORDER BY c_int") \
        == [(3, "d"), (4, "true"), (5, "false")]
    assert _count(db.execute("DELETE FROM t WHERE c_float IS NOT DISTINCT FROM NULL")) == 2
    assert _count(db.execute("DELETE FROM t WHERE c_int IS DISTINCT FROM 7")) == 2997
    assert db.query("SELECT c_int FROM t") == [(7,)]
    with pytest.raises(NotSupportedError, match=r"UPDATE \.\.\. FROM"):
        db.execute("UPDATE t SET c_str = o.s FROM other o WHERE c_int IS DISTINCT FROM 1")


def test_subqueries_read_other_tables_and_the_table_as_it_was(db):
    db.sql("CREATE TABLE gone (id BIGINT)")
    db.sql("INSERT INTO gone SELECT * FROM range(0, 3000, 3)")
    assert _count(db.execute("DELETE FROM t WHERE c_int IN (SELECT id FROM gone)")) == 1000
    # the subquery over t reads t as it was before the statement
    n = _count(db.execute("UPDATE t SET c_float = (SELECT max(c_float) FROM t) "
                          "WHERE c_int = (SELECT min(c_int) FROM t)"))
    assert n == 1
    assert db.query("SELECT c_float FROM t WHERE c_int = 1") == [(2999 / 7,)]
    assert _count(db.execute("DELETE FROM t AS x WHERE EXISTS (SELECT 1 FROM gone g "
                             "WHERE g.id = x.c_int + 1)")) == 999  # (2999 + 1 is not in gone)
    assert db.query("SELECT count(*) FROM t") == [(1001,)]


def test_delete_without_where_empties_the_table(db, tmp_path):
    assert _count(db.execute("DELETE FROM t")) == 3000
    assert db.query("SELECT count(*) FROM t") == [(0,)] and _parts(db) == []
    assert not [f for f in _files(tmp_path / "db") if f.endswith(".parquet")]
    assert _count(db.execute("DELETE FROM t")) == 0


def test_every_row_of_a_part_deleted_leaves_no_part(db):
    assert _count(db.execute("DELETE FROM t WHERE c_int < 1000")) == 1000
    assert len(_parts(db)) == 2


def test_update_of_the_order_by_key_is_refused(db):
    with pytest.raises(DatabaseError, match="ORDER BY key") as err:
        db.execute("UPDATE t SET c_int = c_int + 1")
    assert "DELETE" in err.value.hint
    with pytest.raises(DatabaseError, match="ORDER BY key"):
        db.execute("UPDATE t SET C_INT = 1, c_str = 'x'")


@pytest.mark.parametrize("statement, message", [
    ("UPDATE t SET c_float = 'abc'", "Could not convert string 'abc' to DOUBLE"),
    ("UPDATE t SET c_int2 = 1", "no column c_int2"),
    ("UPDATE t SET c_float = [1, 2]", "DOUBLE"),
    ("UPDATE t SET c_str = 'a', C_STR = 'b'", "set twice"),
    ("DELETE FROM t WHERE nope = 1", "nope"),
    ("DELETE FROM t WHERE", "needs a condition"),
    ("DELETE FROM main.t", "without a schema"),
    ("UPDATE t c_float = 1", "cannot read"),
    ("DELETE FROM nope", "no table"),
])
def test_bad_statements_are_clear_errors_and_change_nothing(db, statement, message):
    before = _parts(db)
    with pytest.raises(DatabaseError, match=message) as err:
        db.execute(statement)
    assert "__cd_" not in str(err.value)
    assert _parts(db) == before
    assert db.query("SELECT count(*), sum(c_int) FROM t") == [(3000, sum(range(3000)))]


@pytest.mark.parametrize("statement, message", [
    ("UPDATE t SET c_float = 'abc' WHERE c_int < 0", "Could not convert string 'abc'"),
    ("UPDATE t SET c_float = 'a' || 'bc' WHERE false", "Could not convert string 'abc'"),
])
def test_a_constant_set_value_is_checked_though_no_row_matches(db, statement, message):
    """As PostgreSQL folds a constant: SET n = 'abc' of a numeric column fails before any
    row is read (it was a count of 0 when no row matched); one that reads a column does
    not."""
    with pytest.raises(DatabaseError, match=message):
        db.execute(statement)
    assert _count(db.execute("UPDATE t SET c_float = c_float / 0 WHERE c_int < 0")) == 0
    assert _count(db.execute("UPDATE t SET c_float = '2.5' WHERE c_int < 0")) == 0


def test_a_failed_update_leaves_no_file_behind(db, tmp_path):
    files = _files(tmp_path / "db")
    # the first part is rewritten, the second fails to convert
    with pytest.raises(DatabaseError, match="Could not convert"):
        db.execute("UPDATE t SET c_float = CASE WHEN c_int < 1000 THEN '1' ELSE 'x' END")
    assert _files(tmp_path / "db") == files


@pytest.mark.parametrize("statement, form", [
    ("DELETE FROM t USING u WHERE t.c_int = u.id", "USING"),
    ("UPDATE t SET c_str = u.s FROM u WHERE t.c_int = u.id", "FROM"),
    ("DELETE FROM t WHERE c_int = 1 RETURNING *", "RETURNING"),
    ("INSERT INTO t (c_int) VALUES (1) RETURNING c_int", "RETURNING"),
    ("INSERT INTO t (c_int) SELECT 1 RETURNING *", "RETURNING"),
    ("MERGE INTO t USING u ON t.c_int = u.id WHEN MATCHED THEN DELETE", "MERGE"),
    ("WITH x AS (SELECT 1) DELETE FROM t WHERE c_int IN (SELECT * FROM x)", "WITH"),
])
def test_unsupported_forms_are_refused_with_a_hint(db, statement, form):
    with pytest.raises(NotSupportedError, match=form) as err:
        db.execute(statement)
    assert err.value.hint


def test_transaction_blocks_and_read_only_connections_refuse_them(db, tmp_path):
    db.execute("BEGIN")
    for statement in ("DELETE FROM t WHERE c_int = 1", "UPDATE t SET c_str = 'x'"):
        with pytest.raises(DatabaseError, match="transaction block"):
            db.execute(statement)
    db.execute("ROLLBACK")
    with cryptdisk.connect(str(tmp_path / "db"), read_only=True) as ro:
        with pytest.raises(DatabaseError, match="read-only"):
            ro.execute("DELETE FROM t WHERE c_int = 1")
        with pytest.raises(DatabaseError):
            ro.reader().execute("DELETE FROM t WHERE c_int = 1")
    assert db.query("SELECT count(*) FROM t") == [(3000,)]


def test_temporary_tables_are_duckdbs(db):
    db.execute("CREATE TEMP TABLE scratch AS SELECT * FROM range(10) x(i)")
    db.execute("DELETE FROM scratch WHERE i < 4")
    db.execute("UPDATE scratch SET i = i * 10")
    assert db.query("SELECT sum(i) FROM scratch") == [(390,)]


def test_a_table_without_order_by_and_with_nested_types(tmp_path):
    with cryptdisk.connect(str(tmp_path / "db")) as db:
        db.sql("CREATE TABLE n (id INTEGER, tags VARCHAR[], meta STRUCT(a INTEGER, b VARCHAR))")
        db.sql("INSERT INTO n SELECT i, [i::VARCHAR, 'x'], {'a': i, 'b': 'y'} "
               "FROM range(50) r(i)")
        assert _count(db.execute("UPDATE n SET tags = ['z'], meta = {'a': -1, 'b': NULL} "
                                 "WHERE id % 10 = 0")) == 5
        assert _count(db.execute("DELETE FROM n WHERE list_contains(tags, '7')")) == 1
        assert db.query("SELECT tags, meta FROM n WHERE id = 20") == [
            (["z"], {"a": -1, "b": None})]
        assert db.query("SELECT count(*) FROM n") == [(49,)]


_STATE = "SELECT count(*), sum(c_int), count(*) FILTER (WHERE c_float > c_int / 7 + 0.5) FROM t"


def test_a_reader_sees_the_table_before_or_after_never_half(tmp_path):
    path = str(tmp_path / "db")
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
        for i in range(4):
            db.sql(f"INSERT INTO t {gen(500, i * 500)}")  # rows of every part match
        seen, stop = set(), threading.Event()

        def read():
            with cryptdisk.connect(path, read_only=True) as ro:
                while not stop.is_set():
                    seen.add(ro.query(_STATE)[0])

        thread = threading.Thread(target=read)
        thread.start()
        states = [db.query(_STATE)[0]]
        for k in range(5):
            db.execute(f"DELETE FROM t WHERE c_int % 10 = {k}")
            states.append(db.query(_STATE)[0])
            db.execute(f"UPDATE t SET c_float = c_float + 1 WHERE c_int % 10 = {k + 5}")
            states.append(db.query(_STATE)[0])
        stop.set()
        thread.join()
    assert seen and seen <= set(states)


def test_a_running_query_keeps_the_parts_it_reads(tmp_path):
    """The old parts of a DELETE stay until the queries reading them end, then go."""
    path = str(tmp_path / "db")
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA}")
        db.sql(f"INSERT INTO t {gen(100)}")
        db._readers_running += 1  # as a reader's query running meanwhile
        db.execute("DELETE FROM t WHERE c_int = 3")
        assert len([f for f in _files(tmp_path / "db") if f.endswith(".parquet")]) == 2
        db._reader_ends()  # the query ends
        assert len([f for f in _files(tmp_path / "db") if f.endswith(".parquet")]) == 1


# -- erasure -------------------------------------------------------------------------------


def test_erased_values_leave_every_file_of_a_plain_table(tmp_path):
    cfg = write_config(tmp_path, [1], 1)
    path = str(tmp_path / "db")
    secret = b"ERASE-ME-7f3a9c1d2b"
    with cryptdisk.connect(path, cfg) as db:
        db.sql("CREATE TABLE p (id BIGINT, name VARCHAR) SETTINGS storage_policy = 'plain'")
        db.sql("INSERT INTO p SELECT i, 'name-' || i FROM range(1000) r(i)")
        db.sql(f"INSERT INTO p VALUES (5000, '{secret.decode()}'), (5001, 'keep')")
        db.sql("INSERT INTO p SELECT i, 'more-' || i FROM range(2000, 3000) r(i)")
        for _ in range(2):  # (a second read keeps the columns in the cache)
            db.query("SELECT * FROM p")
        held = _parts(db, "p")
        assert {k[0].split("/")[0] for k in db.cache._items} == set(held)

        def holders():
            return [f for f in _files(tmp_path) if secret in Path(f).read_bytes()]

        assert holders()  # the plain part holds it in clear (and nothing else does)
        assert _count(db.execute(f"DELETE FROM p WHERE name = '{secret.decode()}'")) == 1
        assert holders() == []
        assert db.query("SELECT count(*) FROM p") == [(2001,)]
        (erased,) = set(held) - set(_parts(db, "p"))
        assert not [k for k in db.cache._items if k[0].startswith(erased)]
        assert erased not in db._open_parts._items


def test_the_old_files_of_an_encrypted_table_are_gone(db, tmp_path):
    for _ in range(2):
        db.query("SELECT * FROM t")  # every row group cached
    old = {p: path for p, path in db.query("SELECT part, path FROM system.parts")}
    cached = list(db.cache._items)
    db.execute("UPDATE t SET c_str = 'erased' WHERE c_int = 2500")
    new = {p for (p,) in db.query("SELECT part FROM system.parts")}
    (changed,) = set(old) - new
    assert [k for k in cached if k[0].startswith(changed)]
    assert not any(os.path.basename(old[changed]) in f for f in _files(tmp_path / "db"))
    assert not [k for k in db.cache._items if k[0].startswith(changed)]


# -- DuckDB's own tables agree -------------------------------------------------------------

_TYPES = {"a": "BIGINT", "b": "VARCHAR", "c": "DOUBLE"}
_conditions = st.sampled_from([
    "a < {n}", "a >= {n}", "a = {n}", "a % 3 = {m}", "b LIKE '%{m}%'", "c > {n} / 3.0",
    "b IS NULL", "c IS NULL OR a = {n}", "a BETWEEN {n} AND {n} + 20", "NOT (a < {n})",
    "a IN (SELECT a FROM t WHERE a % 7 = {m})", "c < (SELECT avg(c) FROM t)",
    "a IN (SELECT k FROM other)", "TRUE", "FALSE",
])
_updates = st.sampled_from([
    "b = 'u{m}'", "c = c + {m}", "b = NULL", "c = a * 2, b = upper(b)",
    "c = (SELECT max(k) FROM other)", "b = b || b",
])
_statements = st.lists(st.tuples(st.booleans(), _conditions, _updates,
                                 st.integers(0, 120), st.integers(0, 6)),
                       min_size=1, max_size=4)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 60), min_size=1, max_size=4),
       order=st.booleans(), statements=_statements, seed=st.integers(0, 1000))
def test_delete_and_update_agree_with_duckdb(tmp_path_factory, sizes, order, statements, seed):
    path = str(tmp_path_factory.mktemp("h") / "db")
    ref = duckdb.connect()
    cols = ", ".join(f"{c} {t}" for c, t in _TYPES.items())
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t ({cols})" + (" ORDER BY a" if order else ""))
        db.sql("CREATE TABLE other (k BIGINT)")
        ref.sql(f"CREATE TABLE t ({cols})")
        ref.sql("CREATE TABLE other (k BIGINT)")
        for sql in ("INSERT INTO other SELECT * FROM range(0, 120, 11)",):
            db.sql(sql)
            ref.sql(sql)
        start = 0
        for size in sizes:  # a part per insert
            if not size:
                continue
            sql = (f"INSERT INTO t SELECT (i * {seed + 7}) % 131, CASE WHEN i % 9 = 0 THEN NULL "
                   f"ELSE 'v' || (i % 13) END, CASE WHEN i % 11 = 0 THEN NULL ELSE i / 4 END "
                   f"FROM range({start}, {start + size}) r(i)")
            db.sql(sql)
            ref.sql(sql)
            start += size
        for delete, cond, update, n, m in statements:
            where = cond.format(n=n, m=m)
            sql = (f"DELETE FROM t WHERE {where}" if delete
                   else f"UPDATE t SET {update.format(n=n, m=m)} WHERE {where}")
            expected = ref.execute(sql).fetchall()[0][0]
            assert _count(db.execute(sql)) == expected, sql
        got = db.query("SELECT a, b, c FROM t ORDER BY ALL")
        want = ref.execute("SELECT a, b, c FROM t ORDER BY ALL").fetchall()
        assert got == want
        if order:  # each part still sorted by its key
            for part in _parts(db):
                keys = db.read_part("t", part, ["a"]).column("a").to_pylist()
                assert keys == sorted(keys)
        db.check()


def test_count_result_is_an_arrow_table(db):
    result = db.execute("DELETE FROM t WHERE c_int = 0")
    assert isinstance(result, pa.Table) and result.schema.field(0).type == pa.int64()
