"""``SELECT cols FROM t LIMIT n [OFFSET m]`` reads only the rows it needs: the first
granules of its first row groups, the OFFSET's rows handed over unread."""

import hashlib

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.db import _partread, _parts
from cryptdisk.errors import AuthenticationError

from .dbhelpers import SCHEMA, gen
from .test_db_granule import _flip, _layout

_COLUMNS = ["k", "s", "f", "i", "d", "b", "ts", "dec", "l"]
_TYPES = ("(k BIGINT, s VARCHAR, f DOUBLE, i INTEGER, d DATE, b BOOLEAN, ts TIMESTAMP, "
          "dec DECIMAL(12, 3), l INTEGER[])")


def _rows(start: int, n: int, nulls: bool) -> str:
    """Rows ``start..start+n``; with ``nulls``, every column NULL in some rows."""
    def v(expr: str, every: int) -> str:
        return f"CASE WHEN i % {every} = 3 THEN NULL ELSE {expr} END" if nulls else expr
    exprs = [v("i::BIGINT", 7), v("md5(i::VARCHAR)", 5), v("i / 7", 11),
             v("(i * 3)::INTEGER", 13), v("DATE '2020-01-01' + (i % 999)::INTEGER", 4),
             v("i % 2 = 0", 6), v("TIMESTAMP '2021-01-01' + to_seconds(i)", 9),
             v("(i / 8)::DECIMAL(12, 3)", 10), v("[i, i + 1]", 12)]
    return f"SELECT {', '.join(exprs)} FROM range({start}, {start + n}) r(i)"


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """A database whose tables have several parts of a few small row groups (granules of
    50 rows), with NULLs and columns of every kind: some the page index describes, some
    it does not (TIMESTAMP, DECIMAL, a list), read whole."""
    path = tmp_path_factory.mktemp("limit") / "db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_parts, "GRANULE_ROWS", 50)
        mp.setattr(_parts, "ROW_GROUP_ROWS", 300)
        with cryptdisk.connect(path) as db:
            db.sql(f"CREATE TABLE sorted {_TYPES} ORDER BY k")
            db.sql(f"CREATE TABLE plain {_TYPES} SETTINGS storage_policy = 'plain'")
            db.sql(f"CREATE TABLE unsorted {_TYPES}")
            for t in ("sorted", "plain", "unsorted"):
                for start, n, nulls in ((0, 1000, False), (5000, 37, True), (2000, 650, True),
                                        (9000, 1, False)):
                    db.sql(f"INSERT INTO {t} " + _rows(start, n, nulls))
                assert len(db.table(t).parts) >= 4
            db.sql("CREATE TABLE one (k BIGINT, s VARCHAR) ORDER BY k")
    return path


def _answer(db, sql: str, table: str):
    """What DuckDB answers for ``sql`` over the table's rows in the table's order."""
    con = duckdb.connect()
    con.register(table, db.arrow_table(table))
    return con.execute(sql).fetchall()


_SELECTS = st.sampled_from(["*", "k", "s", "k, s, f", "s, ts, dec, l", "f AS x, k",
                            "d, b, i", "l", "dec, k AS kk, s", "* EXCLUDE (ts)"])


@settings(max_examples=120, deadline=None)
@given(table=st.sampled_from(["sorted", "plain", "unsorted", "one"]), cols=_SELECTS,
       limit=st.sampled_from([0, 1, 3, 10, 49, 50, 51, 120, 299, 300, 301, 700, 5000]),
       offset=st.one_of(st.none(), st.integers(0, 2000)), cache=st.booleans())
def test_limit_equals_duckdb_cold_and_warm(tables, table, cols, limit, offset, cache):
    if table == "one" and cols not in ("*", "k", "s"):
        cols = "s, k"
    sql = f"SELECT {cols} FROM {table} LIMIT {limit}"
    if offset is not None:
        sql += f" OFFSET {offset}"
    with cryptdisk.connect(tables, read_only=True, cache_bytes=(64 << 20) if cache else 0
                           ) as db:
        want = _answer(db, sql, table)
        for _ in range(3):  # cold, a second read (whole, kept), then from the cache
            assert db.query(sql) == want
        if offset is None and limit and table != "one":  # a subquery's LIMIT is the same
            outer = f"SELECT count(*), max(k) FROM ({sql.replace(cols, 'k', 1)})"
            assert db.query(outer) == _answer(db, outer, table)


def _big(db, monkeypatch, policy="default"):
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int SETTINGS storage_policy = '{policy}'")
    db.sql("INSERT INTO t " + gen(5000))
    db.sql("INSERT INTO t " + gen(5000, 5000))
    return db.table("t").parts


def _md5(i: int) -> str:
    return hashlib.md5(str(i).encode()).hexdigest()


@pytest.mark.parametrize("policy", ["default", "plain"])
def test_a_limit_reads_the_first_granules_only(db, monkeypatch, policy):
    parts = _big(db, monkeypatch, policy)
    assert len(parts) == 2
    rows_read = []
    real = _partread.OpenPart.read_rows

    def read_rows(self, rg, column, first, end):
        rows_read.append((self.part.id, rg, column, first, end))
        return real(self, rg, column, first, end)
    monkeypatch.setattr(_partread.OpenPart, "read_rows", read_rows)
    whole = []
    real_read = _partread.OpenPart.read
    monkeypatch.setattr(_partread.OpenPart, "read", lambda self, rgs, cols, *j: (
        whole.append((rgs, cols)), real_read(self, rgs, cols, *j))[1])
    with cryptdisk.connect(db.path, read_only=True) as r:
        assert r.query("SELECT c_int, c_str FROM t LIMIT 3") == [(i, _md5(i)) for i in range(3)]
        assert r.last_scans["t"] == {"parts_skipped": 1, "row_groups_read": 1,
                                     "row_groups_skipped": 4, "parts_from_index": 0,
                                     "granule_reads": 1}
        # the first granule of each column, no whole column chunk
        assert sorted(c for *_x, c, _f, _e in rows_read) == ["c_int", "c_str"]
        assert all((f, e) == (0, 3) for *_x, f, e in rows_read)
        assert whole == []
        rows_read.clear()
        # OFFSET: the rows before are not read, a part wholly before is not opened
        got = r.query("SELECT c_str, c_float FROM t LIMIT 2 OFFSET 6250")
        assert got == [(_md5(i), i / 7) for i in (6250, 6251)]
        assert r.last_scans["t"] == {"parts_skipped": 1, "row_groups_read": 1,
                                     "row_groups_skipped": 4, "parts_from_index": 0,
                                     "granule_reads": 1}
        assert {(f, e) for *_x, f, e in rows_read} == {(250, 252)}
        assert whole == []
        # past the table's end: what there is
        assert r.query("SELECT c_int FROM t LIMIT 5 OFFSET 9998") == [(9998,), (9999,)]
        assert r.query("SELECT c_int FROM t LIMIT 0") == []


def test_an_offset_reads_its_rows_when_duckdb_may_not_keep_the_scans_order(db, monkeypatch):
    _big(db, monkeypatch)
    db.con.execute("SET preserve_insertion_order = false")
    got = db.query("SELECT c_int FROM t LIMIT 2 OFFSET 4500")
    assert len(got) == 2 and all(0 <= v < 10000 for (v,) in got)  # any two rows of it
    assert db.last_scans["t"]["row_groups_read"] == 5  # every row handed over is real
    db.con.execute("SET preserve_insertion_order = true")
    assert db.query("SELECT c_int FROM t LIMIT 2 OFFSET 4500") == [(4500,), (4501,)]
    assert db.last_scans["t"]["row_groups_read"] == 1


def test_other_shapes_read_as_before(db, monkeypatch):
    """A LIMIT with a WHERE, an ORDER BY, DISTINCT, an aggregate or an expression is not
    a scan's first rows: those are read as any scan."""
    _big(db, monkeypatch)
    for sql, want in [
            ("SELECT c_int FROM t WHERE c_float > 1000 LIMIT 2", [(7001,), (7002,)]),
            ("SELECT DISTINCT c_int % 3 AS m FROM t ORDER BY m LIMIT 2", [(0,), (1,)]),
            ("SELECT c_int + 1 FROM t LIMIT 2", [(1,), (2,)]),
            ("SELECT count(*) FROM t LIMIT 2", [(10000,)]),
            ("(SELECT c_int FROM t LIMIT 2) UNION ALL (SELECT 5) ORDER BY 1",
             [(0,), (1,), (5,)]),
            ("SELECT c_int FROM t UNION ALL SELECT 5 ORDER BY 1 DESC LIMIT 2",
             [(9999,), (9998,)])]:
        assert db.query(sql) == want, sql


def test_a_tampered_page_of_the_first_granule_fails_the_limit(tmp_path, monkeypatch):
    """A LIMIT decrypts the segments of the pages it decodes: a flipped byte there fails
    authentication, never other rows."""
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
        db.sql("INSERT INTO t " + gen(5000))
        part = db.table("t").parts[0]
        assert db.query("SELECT c_str FROM t LIMIT 1") == [(_md5(0),)]
        _meta, seg, spans = _layout(db.config.disks[part.disk], part)
    first = next(p for p in spans if not p.dictionary)
    index = _flip(path, part, seg, (first.start + first.end) // 2)
    with cryptdisk.connect(path, read_only=True) as db, \
            pytest.raises(AuthenticationError, match=f"segment {index}"):
        db.query("SELECT c_str FROM t LIMIT 1")


@settings(max_examples=60, deadline=None)
@given(table=st.sampled_from(["sorted", "plain", "unsorted"]),
       order=st.sampled_from(["k", "k DESC", "k ASC", "f DESC", "f", "s DESC"]),
       limit=st.sampled_from([1, 10, 50, 51, 400, 2000]),
       offset=st.one_of(st.none(), st.integers(0, 700)))
def test_top_n_equals_duckdb_cold_and_from_the_cache(tables, table, order, limit, offset):
    """ORDER BY ... LIMIT: cold (granules), the second run (whole row groups, kept) and
    the third (cut from the cache) answer as DuckDB does."""
    sql = f"SELECT k, s, i FROM {table} ORDER BY {order}, k, s, i LIMIT {limit}"
    if offset is not None:
        sql += f" OFFSET {offset}"
    with cryptdisk.connect(tables, read_only=True) as db:
        want = _answer(db, sql, table)
        for _ in range(3):
            assert db.query(sql) == want


def test_a_reader_reads_a_limits_rows_only(db, monkeypatch):
    """A Reader's LIMIT with an OFFSET asks the reader's own cursor whether DuckDB keeps
    the scan's order (a global setting: set on the database's connection, seen by it)."""
    _big(db, monkeypatch)
    r = db.reader()
    sql = "SELECT c_int FROM t LIMIT 2 OFFSET 4500"
    try:
        assert r.execute(sql).column(0).to_pylist() == [4500, 4501]
        assert r.last_scans["t"]["row_groups_read"] == 1
        db.con.execute("SET preserve_insertion_order = false")
        assert len(r.execute(sql)) == 2
        assert r.last_scans["t"]["row_groups_read"] == 5
    finally:
        r.close()
