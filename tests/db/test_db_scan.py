"""Streaming scans: results equal DuckDB's; skipped row groups and parts; the key index."""

import collections
import hashlib
import math
import os
import subprocess
import sys
import threading

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.db import _partread, _parts
from cryptdisk.db._catalog import load_catalog, save_catalog
from cryptdisk.db._scan import scan_workers
from cryptdisk.errors import CatalogError

from .dbhelpers import SCHEMA, gen


@pytest.fixture
def small_groups(monkeypatch):
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)


def test_point_query_reads_one_row_group_per_matching_part(db, small_groups):
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(20_000))
    db.sql("INSERT INTO t " + gen(20_000, start=20_000))
    assert db.query("SELECT c_str FROM t WHERE c_int = 12345") == \
        db.con.sql("SELECT md5('12345')").fetchall()
    stats = db.last_scans["t"]
    assert stats == {"parts_skipped": 1, "row_groups_read": 1, "row_groups_skipped": 19,
                     "parts_from_index": 0, "granule_reads": 0}  # (one page a row group)
    assert db.query("SELECT count(*) FROM t WHERE c_int BETWEEN 19500 AND 20499") == [(1000,)]
    assert db.last_scans["t"]["row_groups_read"] == 2  # one in each part
    parts = db.query('SELECT key_min, key_max FROM system.parts WHERE "table" = \'t\' '
                     "ORDER BY rows, key_min")
    assert sorted(parts) == [("0", "19999"), ("20000", "39999")]


def test_a_warm_query_reads_nothing(db, small_groups):
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(20_000))
    sql = "SELECT sum(c_int), count(*), sum(c_float) FROM t WHERE c_int < 5500"
    cold = db.query(sql)
    assert db.last_scans["t"]["row_groups_read"] == 6
    assert len(db.cache) == 0  # a first read is not kept (scan resistance)
    assert db.query(sql)[0][:2] == cold[0][:2]  # the second fills the cache
    assert len(db.cache) == 6 * 2  # 6 row groups of c_int and c_float
    warm = db.query(sql)
    # the float sum may differ in its last bit: DuckDB adds a stream's batches in arrival
    # order and the cached row groups on several threads
    assert warm[0][:2] == cold[0][:2]
    assert warm[0][2] == pytest.approx(cold[0][2], rel=1e-12)
    assert db.last_scans["t"]["row_groups_read"] == 0  # all from the cache


def test_count_star_reads_no_part(db, small_groups):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(5000))
    assert db.query("SELECT count(*) FROM t") == [(5000,)]
    assert db.last_scans["t"]["row_groups_read"] == 0


def test_limit_stops_the_scan_early(db, small_groups):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(100_000))
    assert len(db.query("SELECT * FROM t LIMIT 3")) == 3
    assert db.last_scans["t"]["row_groups_read"] < 20  # of 100


def test_a_full_scan_reads_runs_of_row_groups_and_answers_as_one_by_one(db, small_groups,
                                                                         monkeypatch):
    from cryptdisk.db._partread import OpenPart

    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(40_000))
    db.sql("INSERT INTO t " + gen(30_500, start=40_000))
    reads: list[list[int]] = []
    real = OpenPart.read

    def read(self, row_groups, columns, *joined):
        reads.append(list(row_groups))
        return real(self, row_groups, columns, *joined)

    monkeypatch.setattr(OpenPart, "read", read)
    sql = "SELECT sum(c_int), count(c_float), max(c_str), min(c_float) FROM t"
    expected = db.con.sql("SELECT sum(i), count(*), max(md5(i::VARCHAR)), min(i / 7) "
                          "FROM range(70500) r(i)").fetchall()
    for _ in range(3):  # cold, filling the cache, from the cache
        assert db.query(sql) == expected
    got = db.query("SELECT c_int FROM t")
    assert sorted(r[0] for r in got) == list(range(70500))
    db.cache.clear()
    reads.clear()
    assert db.query("SELECT sum(c_int) FROM t") == [(sum(range(70500)),)]
    assert max(len(r) for r in reads) > 1  # runs of row groups, each within one part
    assert sorted(g for r in reads for g in r) == sorted(list(range(40)) + list(range(31)))
    assert all(r == list(range(r[0], r[0] + len(r))) for r in reads)


def test_a_table_read_twice_in_one_query_is_read_twice(db, small_groups):
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(3000))
    got = db.query("SELECT count(*) FROM t a JOIN t b ON a.c_int = b.c_int + 1 "
                   "WHERE a.c_int < 10")
    assert got == [(9,)]


def test_a_changed_index_entry_is_an_error_not_a_wrong_answer(tmp_path, small_groups):
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
        db.sql("INSERT INTO t " + gen(5000))
        keyring = db.keyring
    catalog = load_catalog(str(path), keyring)
    part = catalog.tables["t"].parts[0]
    part.key_max = 4000  # claims rows 4001..4999 are not there
    save_catalog(str(path), keyring, catalog)
    with cryptdisk.connect(path, read_only=True) as db, \
            pytest.raises(CatalogError, match="key range"):
        db.query("SELECT count(*) FROM t WHERE c_int > 10")


def test_a_tampered_catalog_is_refused(tmp_path):
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
        db.sql("INSERT INTO t " + gen(100))
    raw = bytearray((path / "catalog").read_bytes())
    raw[-20] ^= 1
    (path / "catalog").write_bytes(bytes(raw))
    with pytest.raises(CatalogError):
        cryptdisk.connect(path, read_only=True)


# -- results equal DuckDB's on the same rows ----------------------------------------------

_FLOATS = st.one_of(st.none(), st.just(math.nan), st.just(-0.0),
                    st.sampled_from([-2.5, 0.0, 1.0, 3.25, 7.5]))
_ROWS = st.lists(st.tuples(st.one_of(st.none(), st.integers(-12, 12)),
                           st.one_of(st.none(), st.text("abc", max_size=3)), _FLOATS),
                 max_size=120)
_INT = st.integers(-14, 14)
_FLIT = st.sampled_from(["-3", "-2.5", "0", "0.0", "1", "2", "3.25", "8.5"])
_FILTERS = st.one_of(
    _INT.map(lambda v: f"k = {v}"),
    _INT.map(lambda v: f"k < {v}"), _INT.map(lambda v: f"{v} <= k"),
    st.tuples(_INT, _INT).map(lambda p: f"k BETWEEN {min(p)} AND {max(p)}"),
    st.lists(_INT, min_size=1, max_size=4).map(lambda vs: f"k IN ({', '.join(map(str, vs))})"),
    _FLIT.map(lambda v: f"f > {v}"), _FLIT.map(lambda v: f"{v} <= f"),
    _FLIT.map(lambda v: f"f <= {v}"), _FLIT.map(lambda v: f"f = {v}"),
    st.tuples(_FLIT, _FLIT).map(lambda p: f"f BETWEEN {p[0]} AND {p[1]}"),
    st.text("abc", max_size=2).map(lambda v: f"s >= '{v}'"),
    st.text("abc", max_size=2).map(lambda v: f"s = '{v}'"),
    st.just("k IS NULL"), st.just("isnan(f)"),
)
_SHAPES = [
    "SELECT k, s, f FROM {t} WHERE {w} ORDER BY ALL",
    "SELECT count(*), sum(k), count(f) FROM {t} WHERE {w}",
    "SELECT k, f FROM {t} WHERE {w} ORDER BY f DESC NULLS LAST, k, s LIMIT 3",
    "SELECT s, count(*), min(k), max(f) FROM {t} WHERE {w} GROUP BY s ORDER BY ALL",
    "SELECT * FROM (SELECT k FROM {t} WHERE {w} ORDER BY k NULLS FIRST) LIMIT 2",
]


def _norm(rows):
    return [tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in r)
            for r in rows]


@pytest.fixture(scope="module")
def shared_db(tmp_path_factory):
    d = cryptdisk.connect(tmp_path_factory.mktemp("scan") / "db")
    yield d
    d.close()


_COUNTER = iter(range(10**9))


def _table_and_reference(db, inserts, row_group_rows, order_by, settings="", page_rows=None):
    """A new table (k BIGINT, s VARCHAR, f DOUBLE) in ``db``, one insert per list of rows and
    ``row_group_rows`` rows per row group (``page_rows`` per page), and the same rows in a
    DuckDB table of the same name: (name, DuckDB connection)."""
    t = f"t{next(_COUNTER)}"
    old, old_pages = _parts.ROW_GROUP_ROWS, _parts.GRANULE_ROWS
    _parts.ROW_GROUP_ROWS = row_group_rows
    _parts.GRANULE_ROWS = page_rows or old_pages
    try:
        db.sql(f"CREATE TABLE {t} (k BIGINT, s VARCHAR, f DOUBLE)"
               f"{' ORDER BY k' if order_by else ''}{settings}")
        for rows in inserts:  # an empty list is an empty insert (no part)
            db.insert(t, pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                                   "s": pa.array([r[1] for r in rows], pa.string()),
                                   "f": pa.array([r[2] for r in rows], pa.float64())}))
    finally:
        _parts.ROW_GROUP_ROWS, _parts.GRANULE_ROWS = old, old_pages
    ref = duckdb.connect()
    ref.execute(f"CREATE TABLE {t} (k BIGINT, s VARCHAR, f DOUBLE)")
    for rows in inserts:
        if rows:
            ref.executemany(f"INSERT INTO {t} VALUES (?, ?, ?)", rows)
    return t, ref


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inserts=st.lists(_ROWS, min_size=1, max_size=4),
       where=st.lists(_FILTERS, min_size=1, max_size=3), shape=st.sampled_from(_SHAPES),
       plain=st.booleans(), order_by=st.booleans())
def test_results_through_granule_bounds_equal_duckdb(shared_db, inserts, where, shape, plain,
                                                     order_by):
    """Filters on a number that is not the key skip granules (2 rows each, 4 a row group
    here) by their bounds: same rows as DuckDB, cold, second and warm."""
    db = shared_db
    t, ref = _table_and_reference(db, inserts, 8, order_by,
                                  " SETTINGS storage_policy = 'plain'" if plain else "",
                                  page_rows=2)
    sql = shape.format(t=t, w=" AND ".join(where))
    want = ref.execute(sql).fetchall()
    if "ORDER BY ALL" not in sql and "LIMIT" not in sql:
        want = sorted(want, key=repr)
    for run in ("cold", "second", "warm"):
        got = db.query(sql)
        if "ORDER BY ALL" not in sql and "LIMIT" not in sql:
            got = sorted(got, key=repr)
        assert _norm(got) == _norm(want), (sql, run)
    db.sql(f"DROP TABLE {t}")


def test_a_filter_on_a_number_that_is_not_the_key_reads_its_granules_only(db, monkeypatch):
    """``WHERE c_float > x`` decodes only the granules whose bounds reach above x (and
    skips the row groups with none), parsing no statistics of the Parquet footer."""
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR), CASE WHEN i IN (1234, 5678, 5699) "
           "THEN 2000 + i ELSE i % 1000 END FROM range(10000) r(i)")
    sql = "SELECT c_int, c_str FROM t WHERE c_float > 1500 ORDER BY c_int"
    want = [(i, hashlib.md5(str(i).encode()).hexdigest()) for i in (1234, 5678, 5699)]
    assert db.query(sql) == want
    stats = db.last_scans["t"]
    assert stats["row_groups_read"] == 2 and stats["row_groups_skipped"] == 8, stats
    assert stats["granule_reads"] == 2, stats  # one run of granules in each
    assert db.query(sql) == want  # read before: whole, kept
    assert db.query(sql) == want
    assert db.last_scans["t"]["granule_reads"] == 0


def test_a_key_range_and_a_filter_on_another_number_read_the_granules_both_leave(
        db, monkeypatch):
    """``WHERE key < a AND c_float > x``: a granule is decoded when the key's granule
    bounds and c_float's may both hold a wanted row (not the whole row group the key's
    range leaves); the filtered column need not be selected. Same rows as DuckDB."""
    from cryptdisk.db import _scan

    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    # every row group holds large values, each in one granule (row group statistics of
    # c_float do not skip it)
    body = ("SELECT i, md5(i::VARCHAR), CASE WHEN i % 1000 BETWEEN 420 AND 429 "
            "THEN 5000 + i ELSE i % 1000 END FROM range(10000) r(i)")
    db.sql("INSERT INTO t " + body)
    decoded = []
    rows_at_once = _scan._read_rows_at_once
    monkeypatch.setattr(_scan, "_read_rows_at_once", lambda op, rg, cols, first, end: (
        decoded.append(end - first), rows_at_once(op, rg, cols, first, end))[1])
    for sql, ranges in [
            ("SELECT c_int, c_str FROM t WHERE c_int < 3000 AND c_float > 2000", 3),
            ("SELECT c_str FROM t WHERE c_int BETWEEN 1000 AND 2999 AND c_float > 2000", 2),
            ("SELECT count(*) FROM t WHERE c_int >= 8000 AND c_float > 2000", 2)]:
        decoded.clear()
        want = db.con.sql(sql.replace(" FROM t ", f" FROM ({body}) t(c_int, c_str, c_float) ")
                          ).fetchall()
        assert sorted(db.query(sql)) == sorted(want), sql
        stats = db.last_scans["t"]
        assert stats["row_groups_read"] == ranges and stats["granule_reads"] == ranges, (
            sql, stats)
        assert sum(decoded) == 100 * ranges, (sql, decoded)  # one granule of 1000 rows each
        db.cache.clear()


_KEY_AND_NUMBER = st.tuples(
    st.one_of(_INT.map(lambda v: f"k < {v}"), _INT.map(lambda v: f"{v} <= k"),
              st.tuples(_INT, _INT).map(lambda p: f"k BETWEEN {min(p)} AND {max(p)}"),
              st.lists(_INT, min_size=1, max_size=3).map(
                  lambda vs: f"k IN ({', '.join(map(str, vs))})")),
    st.one_of(_FLIT.map(lambda v: f"f > {v}"), _FLIT.map(lambda v: f"f <= {v}"),
              _FLIT.map(lambda v: f"f = {v}"),
              st.tuples(_FLIT, _FLIT).map(lambda p: f"f BETWEEN {p[0]} AND {p[1]}")))
_KEY_AND_NUMBER_SHAPES = [
    "SELECT k, s, f FROM {t} WHERE {w} ORDER BY ALL",
    "SELECT s, k FROM {t} WHERE {w} ORDER BY ALL",
    "SELECT count(*), sum(k) FROM {t} WHERE {w}",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inserts=st.lists(_ROWS.map(lambda rows: sorted(
           rows, key=lambda r: (r[0] is None, r[0] or 0))), min_size=1, max_size=3),
       where=_KEY_AND_NUMBER, shape=st.sampled_from(_KEY_AND_NUMBER_SHAPES),
       plain=st.booleans())
def test_a_key_filter_and_a_number_filter_through_granule_bounds_equal_duckdb(
        shared_db, inserts, where, shape, plain):
    """A filter on the key AND one on another number (the table sorted by the key,
    granules of 2 rows, 8 a row group): same rows as DuckDB, cold, second and warm."""
    db = shared_db
    t, ref = _table_and_reference(db, inserts, 8, True,
                                  " SETTINGS storage_policy = 'plain'" if plain else "",
                                  page_rows=2)
    sql = shape.format(t=t, w=" AND ".join(where))
    want = ref.execute(sql).fetchall()
    for run in ("cold", "second", "warm"):
        assert _norm(db.query(sql)) == _norm(want), (sql, run)
    db.sql(f"DROP TABLE {t}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inserts=st.lists(_ROWS, min_size=1, max_size=4),
       where=st.lists(_FILTERS, min_size=1, max_size=3), shape=st.sampled_from(_SHAPES),
       plain=st.booleans(), order_by=st.booleans())
def test_results_equal_duckdb(shared_db, inserts, where, shape, plain, order_by):
    db = shared_db
    t, ref = _table_and_reference(db, inserts, 7, order_by,
                                  " SETTINGS storage_policy = 'plain'" if plain
                                  else " SETTINGS storage_policy = 'default'")
    sql = shape.format(t=t, w=" AND ".join(where))
    want = ref.execute(sql).fetchall()
    got = db.query(sql)  # cold: streamed
    db.query(sql)  # the second read fills the cache
    warm = db.query(sql)  # what the second read cached: one Arrow table
    if "ORDER BY ALL" not in sql and "LIMIT" not in sql:
        want, got, warm = (sorted(x, key=repr) for x in (want, got, warm))
    assert _norm(got) == _norm(want), sql
    assert _norm(warm) == _norm(want), sql
    db.sql(f"DROP TABLE {t}")


_KEY_FILTERS = st.one_of(
    _INT.map(lambda v: f"k = {v}"), _INT.map(lambda v: f"k <= {v}"),
    _INT.map(lambda v: f"{v} < k"),
    st.tuples(_INT, _INT).map(lambda p: f"k BETWEEN {min(p)} AND {max(p)}"),
    st.lists(_INT, min_size=1, max_size=4).map(lambda vs: f"k IN ({', '.join(map(str, vs))})"),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inserts=st.lists(_ROWS, min_size=1, max_size=3),
       where=st.lists(_KEY_FILTERS, min_size=1, max_size=2),
       other=st.lists(_FILTERS, max_size=1), shape=st.sampled_from(_SHAPES),
       plain=st.booleans(), dictionary=st.booleans(), index=st.booleans())
def test_granule_reads_equal_duckdb(shared_db, inserts, where, other, shape, plain,
                                    dictionary, index):
    """Row groups of 40 rows in pages of 3: a filter on the key decodes only the pages
    (granules) of the other columns that hold the rows it may keep, cold (with the page
    index and the key's granule bounds, the key's pages of the granules that may match
    too; ``index`` False: parts as earlier versions wrote them); the second run reads
    whole row groups into the cache, the third answers from it."""
    db = shared_db
    if dictionary:  # few distinct strings: a dictionary page comes first in each chunk
        inserts = [[(k, (s or "")[:1] or None, f) for k, s, f in rows] for rows in inserts]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_parts, "WRITE_PAGE_INDEX", index)
        t, ref = _table_and_reference(db, inserts, 40, True,
                                      " SETTINGS storage_policy = 'plain'" if plain
                                      else " SETTINGS storage_policy = 'default'", page_rows=3)
    sql = shape.format(t=t, w=" AND ".join(where + other))
    want = ref.execute(sql).fetchall()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_partread, "_GRANULE_MIN_BYTES", 0)  # short strings by granule too
        runs = [db.query(sql) for _ in range(3)]  # cold (granules), whole (cached), warm
    if "ORDER BY ALL" not in sql and "LIMIT" not in sql:
        want, *runs = (sorted(x, key=repr) for x in (want, *runs))
    for got in runs:
        assert _norm(got) == _norm(want), sql
    db.sql(f"DROP TABLE {t}")


def test_a_point_query_decodes_one_granule_then_caches_the_row_group(db, small_groups,
                                                                    monkeypatch):
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(5000))
    sql = "SELECT c_int, c_str, c_float FROM t WHERE c_int = 1234"
    want = [(1234, hashlib.md5(b"1234").hexdigest(), 1234 / 7)]
    assert db.query(sql) == want
    assert db.last_scans["t"]["row_groups_read"] == 1
    assert db.last_scans["t"]["granule_reads"] == 1
    assert len(db.cache) == 0
    assert db.query(sql) == want  # read whole now, and kept
    assert db.last_scans["t"]["granule_reads"] == 0
    assert len(db.cache) == 3
    assert db.query(sql) == want
    assert db.last_scans["t"]["row_groups_read"] == 0  # from the cache
    # a range keeping most of a row group reads it whole
    assert db.query("SELECT count(*), max(c_str) FROM t WHERE c_int BETWEEN 3000 AND 3900") \
        == [(901, max(hashlib.md5(str(i).encode()).hexdigest() for i in range(3000, 3901)))]
    assert db.last_scans["t"]["granule_reads"] == 0


def test_the_key_range_survives_rotation_moves_and_merges(db, small_groups):
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(3000, start=5000))
    db.sql("INSERT INTO t " + gen(3000))
    ranges = "SELECT key_min, key_max FROM system.parts ORDER BY key_min::BIGINT"
    assert db.query(ranges) == [("0", "2999"), ("5000", "7999")]
    db.sql("SYSTEM ROTATE KEYS")
    db.sql("ALTER TABLE t MODIFY SETTING storage_policy = 'plain'")
    assert db.query(ranges) == [("0", "2999"), ("5000", "7999")]
    assert db.query("SELECT count(*) FROM t WHERE c_int = 6000") == [(1,)]
    assert db.last_scans["t"]["parts_skipped"] == 1
    db.sql("OPTIMIZE TABLE t FINAL")
    assert db.query(ranges) == [("0", "7999")]


def test_a_process_exits_cleanly_with_scans_cut_short(tmp_path):
    """No pyarrow thread holds a Python file at exit: LIMITs and errors mid-scan, no close()."""
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
        db.sql("INSERT INTO t " + gen(300_000))
    child = (
        "import cryptdisk, sys\n"
        f"db = cryptdisk.connect({str(path)!r}, read_only=True, cache_bytes=0)\n"
        "for _ in range(20):\n"
        "    assert len(db.query('SELECT * FROM t LIMIT 1')) == 1\n"
        "try:\n"
        "    db.query('SELECT CAST(c_str AS INTEGER) FROM t')\n"
        "    sys.exit('no error')\n"
        "except cryptdisk.errors.CryptdiskError:\n"
        "    pass\n"
        "print(db.query('SELECT count(*) FROM t WHERE c_str > \\'f\\'')[0][0] > 0)\n"
    )
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                              timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == "True"


def test_nested_columns_stream_whole(db, small_groups):
    db.sql("CREATE TABLE n (k BIGINT, s STRUCT(a INT, b VARCHAR), l INT[]) ORDER BY k")
    db.sql("INSERT INTO n SELECT i, {'a': i, 'b': i::VARCHAR}, [i, i + 1] "
           "FROM range(5000) r(i)")
    assert db.query("SELECT s, l FROM n WHERE k = 4321") == [({"a": 4321, "b": "4321"},
                                                             [4321, 4322])]
    assert db.last_scans["n"]["row_groups_read"] == 1
    assert db.query("SELECT sum(s.a), sum(len(l)), count(s.b) FROM n") == \
        [(12497500, 10000, 5000)]


#: DuckDB's default_null_order values ("": left as it is, NULLS_LAST)
_NULL_ORDERS = ["", "nulls_first", "nulls_last", "nulls_first_on_asc_last_on_desc",
                "nulls_last_on_asc_first_on_desc"]
_TOP_FLOATS = st.sampled_from([None, math.nan, math.nan, -0.0, -2.5, 0.0, 1.0, 3.25, 7.5,
                               9.0, 11.5, 20.0])
_TOP_ROWS = st.lists(st.tuples(st.one_of(st.integers(-12, 12), st.none()),
                               st.text("abc", max_size=3), _TOP_FLOATS), max_size=200)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inserts=st.lists(_TOP_ROWS, min_size=1, max_size=3),
       column=st.sampled_from(["k", "s", "f"]), desc=st.sampled_from([True, False, None]),
       default_desc=st.booleans(),
       nulls=st.sampled_from(["", " NULLS FIRST", " NULLS LAST"]),
       limit=st.integers(1, 6), offset=st.sampled_from([None, 0, 3]),
       star=st.booleans(), order_by=st.booleans(), null_order=st.sampled_from(_NULL_ORDERS))
def test_top_n_equals_duckdb(shared_db, inserts, column, desc, default_desc, nulls, limit,
                             offset, star, order_by, null_order):
    """ORDER BY col LIMIT n skips row groups that cannot reach the top: same rows as DuckDB.

    With no direction (``desc`` None) DuckDB's ``default_order`` decides, set to DESC or
    ASC on both connections; with no NULLS FIRST|LAST its ``default_null_order``, set on
    both (or left as it is).
    """
    db = shared_db
    t, ref = _table_and_reference(db, inserts, 5, order_by)
    ties = ", ".join(f"{c} ASC NULLS FIRST" for c in "ksf")
    direction = {True: " DESC", False: " ASC", None: ""}[desc]
    sql = (f"SELECT {'*' if star else 'f, s, k'} FROM {t} ORDER BY {column}"
           f"{direction}{nulls}, {ties} LIMIT {limit}"
           + ("" if offset is None else f" OFFSET {offset}"))
    order = "DESC" if default_desc else "ASC"
    for con in (db.con, ref):
        con.execute(f"SET default_order = '{order}'")
        if null_order:
            con.execute(f"SET default_null_order = '{null_order}'")
    try:
        want = ref.execute(sql).fetchall()
        got = db.query(sql)
    finally:
        db.con.execute("RESET default_order")
        db.con.execute("RESET default_null_order")
    assert _norm(got) == _norm(want), (sql, order, null_order)
    db.sql(f"DROP TABLE {t}")


_GRANULE_FLOATS = st.one_of(st.none(), st.just(math.nan),
                            st.sampled_from([-0.0, -2.5, 0.0, 1.0, 3.25, 7.5, 9.0, 20.0]),
                            st.floats(-50, 50, allow_nan=False))
_GRANULE_ROWS = st.lists(st.tuples(st.one_of(st.integers(-40, 40), st.none()),
                                   st.text("ab", max_size=2), _GRANULE_FLOATS), max_size=150)
#: rows mostly NULL in k and f (granules of NULLs only, and some holding one)
_NULL_HEAVY = st.lists(st.tuples(st.one_of(st.none(), st.none(), st.none(),
                                           st.integers(-40, 40)),
                                 st.text("ab", max_size=2),
                                 st.one_of(st.none(), st.none(), st.none(), _GRANULE_FLOATS)),
                       max_size=150)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inserts=st.lists(st.tuples(st.one_of(_GRANULE_ROWS, _NULL_HEAVY), st.booleans()),
                        min_size=1, max_size=4),
       column=st.sampled_from(["k", "f"]), desc=st.sampled_from([True, False, None]),
       nulls=st.sampled_from(["", " NULLS FIRST", " NULLS LAST"]),
       limit=st.integers(1, 12), offset=st.sampled_from([None, 0, 5]),
       order_by=st.booleans(), plain=st.booleans(), null_order=st.sampled_from(_NULL_ORDERS))
def test_top_n_by_granules_equals_duckdb(shared_db, inserts, column, desc, nulls, limit,
                                          offset, order_by, plain, null_order):
    """A top-N on a numeric column that is not the key ranks granules (4 rows each, 3
    granules a row group here) across parts: same rows as DuckDB, cold, on the second run
    (row groups read before are read whole) and warm (from the cache), with NULLs (NULL
    heavy columns, NULLS FIRST|LAST or DuckDB's default_null_order set on both), NaN,
    ties, OFFSET, empty inserts and parts written without the granule bounds (old)."""
    db = shared_db
    t = f"t{next(_COUNTER)}"
    old = (_parts.ROW_GROUP_ROWS, _parts.GRANULE_ROWS, _parts.WRITE_COLUMN_GRANULES)
    _parts.ROW_GROUP_ROWS, _parts.GRANULE_ROWS = 12, 4
    try:
        db.sql(f"CREATE TABLE {t} (k BIGINT, s VARCHAR, f DOUBLE)"
               f"{' ORDER BY s' if order_by else ''}"
               f"{' SETTINGS storage_policy = ' + repr('plain') if plain else ''}")
        for rows, new in inserts:
            _parts.WRITE_COLUMN_GRANULES = new
            db.insert(t, pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                                   "s": pa.array([r[1] for r in rows], pa.string()),
                                   "f": pa.array([r[2] for r in rows], pa.float64())}))
    finally:
        _parts.ROW_GROUP_ROWS, _parts.GRANULE_ROWS, _parts.WRITE_COLUMN_GRANULES = old
    ref = duckdb.connect()
    ref.execute(f"CREATE TABLE {t} (k BIGINT, s VARCHAR, f DOUBLE)")
    for rows, _new in inserts:
        if rows:
            ref.executemany(f"INSERT INTO {t} VALUES (?, ?, ?)", rows)
    direction = {True: " DESC", False: " ASC", None: ""}[desc]
    ties = ", ".join(f"{c} ASC NULLS FIRST" for c in "ksf")
    sql = (f"SELECT f, s, k FROM {t} ORDER BY {column}{direction}{nulls}, {ties} "
           f"LIMIT {limit}" + ("" if offset is None else f" OFFSET {offset}"))
    for con in (db.con, ref) if null_order else ():
        con.execute(f"SET default_null_order = '{null_order}'")
    try:
        want = _norm(ref.execute(sql).fetchall())
        for run in ("cold", "second", "warm"):
            assert _norm(db.query(sql)) == want, (sql, run, null_order)
    finally:
        db.con.execute("RESET default_null_order")
    db.sql(f"DROP TABLE {t}")


def test_a_top_n_reads_the_granules_holding_nulls_only_when_nulls_can_reach_it(db, monkeypatch):
    """Every granule of c_float holds a NULL (and one granule nothing else): with NULLs
    last (DuckDB's default, or NULLS LAST, or a default_null_order that puts them last for
    the direction) a top-N ranks those granules by their values and reads a handful of
    the 100; with NULLs first (said, or the connection's default_null_order) NULLs are
    the answer and those granules are read. Same rows as DuckDB each time."""
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    body = ("SELECT i, md5(i::VARCHAR), CASE WHEN i % 50 = 7 OR i BETWEEN 5000 AND 5099 "
            "THEN NULL ELSE (i * 7919) % 10007 END FROM range(10000) r(i)")
    db.sql("INSERT INTO t " + body)
    ref = duckdb.connect()
    ref.execute(f"CREATE TABLE t {SCHEMA}")
    ref.execute("INSERT INTO t " + body)
    few = 3 + scan_workers()
    cases = [("DESC", "", few), ("ASC", "", few), ("DESC", " NULLS LAST", few),
             ("ASC", " NULLS LAST", few), ("DESC", " NULLS FIRST", 100),
             ("ASC", " NULLS FIRST", 100)]
    for direction, nulls, most in cases:
        sql = f"SELECT c_int, c_float FROM t ORDER BY c_float {direction}{nulls}, c_int LIMIT 3"
        assert db.query(sql) == ref.execute(sql).fetchall(), sql
        assert db.last_scans["t"]["granule_reads"] <= most, (sql, db.last_scans["t"])
        db.cache.clear()
    few = 5 + scan_workers()  # (OFFSET 2: the 5 best rows)
    for setting, direction, most in [("nulls_first", "DESC", 100),
                                     ("nulls_first_on_asc_last_on_desc", "DESC", few),
                                     ("nulls_first_on_asc_last_on_desc", "ASC", 100),
                                     ("nulls_last_on_asc_first_on_desc", "ASC", few)]:
        sql = f"SELECT c_int, c_float FROM t ORDER BY c_float {direction}, c_int LIMIT 3 OFFSET 2"
        for con in (db.con, ref):
            con.execute(f"SET default_null_order = '{setting}'")
        try:
            assert db.query(sql) == ref.execute(sql).fetchall(), (sql, setting)
        finally:
            db.con.execute("RESET default_null_order")
        assert db.last_scans["t"]["granule_reads"] <= most, (sql, setting, db.last_scans["t"])
        db.cache.clear()


def test_top_n_by_a_column_that_is_not_the_key_reads_granules_only(db, monkeypatch):
    """ORDER BY a non-key number LIMIT n ranks granules by their bounds (written with the
    part) and decodes only the best ones' pages: here the 4 granules holding the top rows,
    of 10 row groups; a part written without those bounds is read by row groups, as
    before. A repeat reads those row groups whole (the cache keeps them), the third
    answers from the cache."""
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    # every granule peaks at a small value but 4, which hold the 6 best rows (2 a tie)
    body = ("SELECT i, md5(i::VARCHAR), CASE WHEN i IN (1234, 5678, 5679, 8001, 9999) "
            "THEN i WHEN i = 4321 THEN 5679 ELSE (i * 7919) % 1000 END FROM range({}, {}) r(i)")
    db.sql("INSERT INTO t " + body.format(0, 10_000))
    sql = "SELECT c_int, c_str, c_float FROM t ORDER BY c_float DESC, c_int LIMIT 5"
    want = db.con.sql("SELECT * FROM (" + body.format(0, 10_000) + ") ORDER BY 3 DESC, 1 "
                      "LIMIT 5").fetchall()
    assert [r[0] for r in want] == [9999, 8001, 4321, 5679, 5678]
    assert db.query(sql) == want
    stats = db.last_scans["t"]
    # 9999, 8001, 5678 with 5679, 4321: then 1234's granule is beaten, unless it was read
    # already while the 4th was (one granule in flight per scan thread)
    assert 4 <= stats["granule_reads"] <= 3 + scan_workers(), stats
    assert stats["row_groups_read"] == stats["granule_reads"], stats  # of 100 granules
    assert stats["row_groups_read"] + stats["row_groups_skipped"] == 10, stats
    assert db.query(sql) == want  # read before: whole row groups, kept
    assert db.query(sql) == want
    assert db.last_scans["t"]["row_groups_read"] == 4  # all from the cache, one by one
    assert db.last_scans["t"]["granule_reads"] == 0
    monkeypatch.setattr(_parts, "WRITE_COLUMN_GRANULES", False)  # a part of an earlier version
    db.sql("CREATE TABLE u AS SELECT * FROM t")
    db.cache.clear()
    assert db.query(sql.replace(" t ", " u ")) == want
    assert db.last_scans["u"]["granule_reads"] == 0
    assert db.last_scans["u"]["row_groups_read"] >= 4  # whole


def test_granules_of_one_row_group_decode_a_chunk_read_whole_once(db, monkeypatch):
    """Columns the granule reader does not decode by page (here all of them: tiny chunks;
    a LIST) are read whole and sliced for each granule: two granules of one row group (a
    top-N's, in flight at once, or a filter's two runs) decode such a chunk once, not
    once each; a chunk in the cache is not decoded at all. Same rows as DuckDB."""
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    db.sql("CREATE TABLE t (k BIGINT, f DOUBLE, l INT[], b BOOLEAN) ORDER BY k")
    body = ("SELECT i, CASE WHEN i IN (3150, 3750) THEN 10000 + i ELSE i % 1000 END, "
            "[i, i + 1], i % 2 = 0 FROM range(10000) r(i)")
    db.sql("INSERT INTO t " + body)
    reads = collections.Counter()
    read = _partread.OpenPart.read

    def counted(self, row_groups, columns, *joined):
        reads.update((rg, c) for rg in row_groups for c in columns)
        return read(self, row_groups, columns, *joined)

    monkeypatch.setattr(_partread.OpenPart, "read", counted)
    src = f"({body}) t(k, f, l, b)"
    for sql in ["SELECT k, f, l, b FROM t ORDER BY f DESC LIMIT 2",
                "SELECT k, l, b FROM t WHERE f > 10000 ORDER BY k"]:
        db.cache.clear()
        reads.clear()
        assert db.query(sql) == db.con.sql(sql.replace(" t ", f" {src} ")).fetchall(), sql
        assert db.last_scans["t"]["granule_reads"] >= 2, (sql, db.last_scans["t"])
        assert reads[(3, "l")] == 1 and max(reads.values()) == 1, (sql, reads)
    sql = "SELECT k, f, l, b FROM t ORDER BY f DESC LIMIT 2"
    db.cache.clear()
    db.query("SELECT l FROM t WHERE k BETWEEN 3000 AND 3999")
    db.query("SELECT l FROM t WHERE k BETWEEN 3000 AND 3999")  # l of row group 3 kept
    reads.clear()
    assert db.query(sql) == db.con.sql(sql.replace(" t ", f" {src} ")).fetchall()
    assert db.last_scans["t"]["granule_reads"] >= 2, db.last_scans["t"]
    assert (3, "l") not in reads and max(reads.values()) == 1, reads


def test_a_top_n_by_granules_ends_its_plan_at_the_first_beaten_granule(db, monkeypatch):
    """Granules are ranked best-first (in NumPy), so the first one the rows seen beat ends
    the plan: of 100 granules, a handful are looked at, not each of the others in turn."""
    from cryptdisk.db._scan import _Stream

    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR), (i * 7919) % 10007 FROM range(10000) r(i)")
    looked = []
    beaten = _Stream._beaten
    monkeypatch.setattr(_Stream, "_beaten", lambda self, bound, top: (
        looked.append(bound), beaten(self, bound, top))[1])
    want = db.con.sql("SELECT i FROM range(10000) r(i) ORDER BY (i * 7919) % 10007 DESC "
                      "LIMIT 3").fetchall()
    assert db.query("SELECT c_int FROM t ORDER BY c_float DESC LIMIT 3") == want
    assert db.last_scans["t"]["granule_reads"] <= 2 + scan_workers()
    assert len(looked) <= 2 * (3 + scan_workers()), len(looked)  # of 100 granules


_EXTREMES = [
    "SELECT min(k), max(k) FROM {t}",
    "SELECT max(k) - min(k) AS spread, min({t}.k) FROM {t}",
    "SELECT min(k), count(*) FROM {t}",  # count(*) needs the rows: read as usual
    "SELECT min(k), max(k) FROM {t} WHERE k > 0",
    "SELECT count(*) FROM (SELECT max(k) AS m FROM {t}) WHERE m IS NOT NULL",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inserts=st.lists(_ROWS, min_size=0, max_size=4), shape=st.sampled_from(_EXTREMES),
       plain=st.booleans(), order_by=st.booleans())
def test_min_max_of_the_key_equal_duckdb(shared_db, inserts, shape, plain, order_by):
    """min/max of the key answered from the parts' key ranges: DuckDB's answer, NULLs,
    empty inserts and empty tables included."""
    db = shared_db
    t, ref = _table_and_reference(db, inserts, 7, order_by,
                                  " SETTINGS storage_policy = 'plain'" if plain else "")
    sql = shape.format(t=t)
    assert db.query(sql) == ref.execute(sql).fetchall(), sql
    db.sql(f"DROP TABLE {t}")


def test_min_max_of_the_key_read_no_row_group(db, small_groups):
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(20_000, start=-5000))
    db.sql("INSERT INTO t " + gen(3000, start=40_000))
    db.sql("INSERT INTO t SELECT NULL, 'x', 1.0")  # a part with no key range
    assert db.query("SELECT min(c_int), max(c_int) FROM t") == [(-5000, 42_999)]
    assert db.last_scans["t"] == {"parts_skipped": 0, "row_groups_read": 1,
                                  "row_groups_skipped": 0, "parts_from_index": 2,
                                  "granule_reads": 0}
    assert db.query("SELECT max(c_int) FROM t WHERE c_str <> 'x'") == [(42_999,)]
    assert db.last_scans["t"]["parts_from_index"] == 0  # a WHERE: rows are read
    assert db.query("SELECT min(c_float) FROM t") == [(-5000 / 7,)]  # not the key: read
    assert db.last_scans["t"]["row_groups_read"] == 24


def test_top_n_and_key_extremes_do_not_import_pandas(tmp_path):
    """pyarrow imports pandas (most of a second) for some conversions of Python values,
    and pyarrow.compute costs 40-80 ms to import; the scans of the key's extremes and of
    top-N on a number avoid both, so a cold query does not pay them."""
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
        db.sql("INSERT INTO t " + gen(300_000))
        # every row group spans 0..999: no bound from statistics, the rows set the threshold
        db.sql(f"CREATE TABLE u {SCHEMA} ORDER BY c_int")
        db.sql("INSERT INTO u SELECT i, 'x', (i * 7) % 1000 FROM range(300000) r(i)")
    child = (
        "import cryptdisk, sys\n"
        f"db = cryptdisk.connect({str(path)!r}, read_only=True)\n"
        "assert db.query('SELECT min(c_int), max(c_int) FROM t') == [(0, 299999)]\n"
        "assert db.query('SELECT c_int FROM t ORDER BY c_float DESC LIMIT 1') == [(299999,)]\n"
        "assert db.query('SELECT c_int FROM t ORDER BY c_int LIMIT 1') == [(0,)]\n"
        "assert db.query('SELECT c_float FROM u ORDER BY c_float DESC LIMIT 2') == "
        "[(999.0,), (999.0,)]\n"
        "assert db.query('SELECT c_int FROM u ORDER BY c_int DESC LIMIT 1') == [(299999,)]\n"
        "print('pandas' in sys.modules, 'pyarrow.compute' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False False"


def test_selective_queries_on_the_key_do_not_import_pyarrow_compute(tmp_path):
    """Importing pyarrow.compute builds its Python wrappers (40-80 ms of CPU): the point,
    range, min/max of the key, count(*) and ORDER BY key LIMIT queries of a fresh process
    do without it."""
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
        db.sql("INSERT INTO t " + gen(200_000))
    child = (
        "import cryptdisk, sys\n"
        f"db = cryptdisk.connect({str(path)!r}, read_only=True)\n"
        "assert db.query('SELECT min(c_int), max(c_int) FROM t') == [(0, 199999)]\n"
        "assert db.query('SELECT count(*) FROM t') == [(200000,)]\n"
        "assert db.query('SELECT c_int FROM t WHERE c_int = 7') == [(7,)]\n"
        "assert db.query('SELECT c_int, c_str FROM t WHERE c_int = 70001') == "
        f"[(70001, {hashlib.md5(b'70001').hexdigest()!r})]\n"
        "assert db.last_scans['t']['granule_reads'] == 1\n"
        "assert db.query('SELECT count(*), sum(c_float) FROM t WHERE c_int BETWEEN 10 AND 13')"
        " == [(4, 46 / 7)]\n"
        "assert db.query('SELECT c_int FROM t ORDER BY c_int DESC LIMIT 2') == "
        "[(199999,), (199998,)]\n"
        "print('pyarrow.compute' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


@pytest.mark.parametrize("typ", ["TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT",
                                 "USMALLINT", "UINTEGER", "UBIGINT"])
def test_min_max_of_a_key_of_any_integer_type(db, typ):
    lo, hi = (0, 100) if typ.startswith("U") else (-100, 100)
    if typ in ("UBIGINT", "BIGINT"):
        lo, hi = (0, 2**64 - 1) if typ == "UBIGINT" else (-(2**63), 2**63 - 1)
    db.sql(f"CREATE TABLE t (k {typ}, v VARCHAR) ORDER BY k")
    db.sql(f"INSERT INTO t VALUES ({lo}, 'a'), ({hi}, 'b')")
    db.sql(f"INSERT INTO t VALUES ({lo + 1}, 'c')")
    got = db.sql("SELECT min(k), max(k) FROM t")
    assert db.last_scans["t"]["parts_from_index"] == 2
    assert got.to_pylist() == [{"min(k)": lo, "max(k)": hi}]
    key_type = db.arrow_schema(db.table("t")).field(0).type
    assert [f.type for f in got.schema] == [key_type, key_type]


def test_top_n_reads_only_what_can_reach_the_top(db, small_groups):
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR), CASE WHEN i = 7777 THEN 'nan'::DOUBLE "
           "ELSE i % 1000 END FROM range(50000) r(i)")
    got = db.query("SELECT c_int, c_float FROM t ORDER BY c_float DESC LIMIT 2")
    assert math.isnan(got[0][1]) and got[0][0] == 7777  # NaN sorts first, as in DuckDB
    assert db.query("SELECT c_int FROM t ORDER BY c_int DESC LIMIT 3") == \
        [(49999,), (49998,), (49997,)]
    assert db.last_scans["t"]["row_groups_read"] <= 5  # of 50
    db.cache.clear()
    assert db.query("SELECT c_int FROM t ORDER BY c_int LIMIT 2") == [(0,), (1,)]
    assert db.last_scans["t"]["row_groups_read"] <= 5  # no direction: default_order (ASC)


def test_top_n_by_the_key_ranks_row_groups_by_its_bounds_at_once(db, small_groups,
                                                                 monkeypatch):
    """A top-N on a key without NULLs ranks each part's row groups by the key's bounds in
    one step (no statistics looked up per row group), across parts, best first, and
    answers as DuckDB does; a column without such bounds (nor granule bounds: parts of an
    earlier version) is ranked by each row group's statistics."""
    monkeypatch.setattr(_parts, "WRITE_COLUMN_GRANULES", False)
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(20_000, start=10_000))
    db.sql("INSERT INTO t " + gen(10_000))
    looked = []
    stats = _partread.OpenPart.stats
    monkeypatch.setattr(_partread.OpenPart, "stats", lambda self, rg, c: (
        looked.append((rg, c)), stats(self, rg, c))[1])
    assert db.query("SELECT c_int FROM t ORDER BY c_int LIMIT 3") == [(0,), (1,), (2,)]
    assert db.query("SELECT c_int FROM t ORDER BY c_int DESC LIMIT 2") == [(29_999,),
                                                                           (29_998,)]
    assert len(looked) <= 4  # (the bound of the first row groups taken; 30 row groups)
    looked.clear()
    assert db.query("SELECT c_int FROM t ORDER BY c_float DESC LIMIT 1") == [(29_999,)]
    assert len(looked) >= 30


def test_top_n_by_a_sorted_key_reads_only_the_first_row_groups(db, small_groups):
    """The statistics alone bound the top rows: the first row groups (best-first) that hold
    ``limit`` rows are read, and no other."""
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(20_000, start=10_000))
    db.sql("INSERT INTO t " + gen(10_000))
    assert db.query("SELECT c_int FROM t ORDER BY c_int LIMIT 3") == [(0,), (1,), (2,)]
    assert db.last_scans["t"]["row_groups_read"] == 1  # of 30
    assert db.query("SELECT c_int FROM t ORDER BY c_int DESC LIMIT 1500") == \
        [(i,) for i in range(29_999, 28_499, -1)]
    assert db.last_scans["t"]["row_groups_read"] == 2
    got = db.query("SELECT c_int, c_str FROM t ORDER BY c_int LIMIT 2 OFFSET 9999")
    assert got == db.con.sql("SELECT i, md5(i::VARCHAR) FROM range(9999, 10001) r(i)").fetchall()
    assert db.last_scans["t"]["row_groups_read"] == 11  # 10 of one part, 1 of the other


def test_top_n_reads_one_row_group_per_thread_when_the_best_holds_the_top(db, small_groups):
    """Each row group is checked against the freshest threshold: with the top rows in the
    best-ranked row group (whose wide min/max give no bound from statistics alone), at most
    one row group per scan thread is read."""
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR), CASE WHEN i BETWEEN 49000 AND 49004 "
           "THEN i WHEN i % 1000 = 0 THEN 40000 + i // 1000 ELSE -1000 END "
           "FROM range(50000) r(i)")  # every row group but the last peaks at 40000 + r
    for sql, want in [("SELECT c_int FROM t ORDER BY c_float DESC LIMIT 3",
                       [(49004,), (49003,), (49002,)]),
                      ("SELECT c_int, c_str FROM t ORDER BY c_float DESC, c_int LIMIT 1",
                       [(49004, hashlib.md5(b"49004").hexdigest())])]:
        db.cache.clear()
        assert db.query(sql) == want
        assert db.last_scans["t"]["row_groups_read"] <= scan_workers(), sql


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inserts=st.lists(_ROWS, min_size=1, max_size=4),
       order=st.sampled_from(["k", "k, s", "f", "s, k"]), merge_rows=st.sampled_from([1, 7, 50]),
       plain=st.booleans())
def test_optimize_sorts_one_key_interval_at_a_time(shared_db, inserts, order, merge_rows,
                                                   plain):
    """OPTIMIZE of a table with an ORDER BY sorts interval by interval (here a few rows each):
    the merged part holds the same rows, in the table's order (NULLs, then NaN, last)."""
    from cryptdisk.db import _maintenance

    db = shared_db
    t, ref = _table_and_reference(db, inserts, 5, False,
                                  f" ORDER BY ({order})"
                                  + (" SETTINGS storage_policy = 'plain'" if plain else ""))
    old = _maintenance.MERGE_ROWS
    _maintenance.MERGE_ROWS = merge_rows
    try:
        db.sql(f"OPTIMIZE TABLE {t} FINAL")
    finally:
        _maintenance.MERGE_ROWS = old
    got = db.arrow_table(t).to_pylist()  # part by part, row group by row group: stored order
    assert len(db.table(t).parts) <= 1
    cols = [c.strip() for c in order.split(",")]
    want = ref.execute(f"SELECT {order} FROM {t} ORDER BY "
                       + ", ".join(f"{c} ASC NULLS LAST" for c in cols)).fetchall()
    assert _norm([tuple(r[c] for c in cols) for r in got]) == _norm(want)
    everything = ref.execute(f"SELECT k, s, f FROM {t}").fetchall()
    assert sorted(_norm([(r["k"], r["s"], r["f"]) for r in got]), key=repr) == \
        sorted(_norm(everything), key=repr)
    db.sql(f"DROP TABLE {t}")


def test_optimize_by_a_key_without_statistics_sorts_in_one_piece(tmp_path):
    """A nested ORDER BY column has no min/max: OPTIMIZE sorts the table at once (on the
    insert's source thread, while the writer holds the database; in a child with a
    timeout, so a deadlock fails instead of hanging)."""
    child = (
        "import cryptdisk, sys\n"
        f"db = cryptdisk.connect({str(tmp_path / 'db')!r})\n"
        "db.sql('CREATE TABLE n (k INT[], v BIGINT) ORDER BY k')\n"
        "db.sql('INSERT INTO n SELECT [i % 5, i], i FROM range(300) r(i)')\n"
        "db.sql('INSERT INTO n SELECT [i % 3], i FROM range(300, 400) r(i)')\n"
        "db.sql('OPTIMIZE TABLE n FINAL')\n"
        "print(db.query('SELECT count(*), sum(v) FROM n'), len(db.table('n').parts))\n"
        "ks = db.arrow_table('n', ['k']).column('k').to_pylist()\n"
        "print(ks == sorted(ks))\n"
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["[(400, 79800)] 1", "True"]  # (a HUGEINT sum)


# -- the cold path: planning cost, schemas -------------------------------------------------

def test_a_point_query_checks_few_row_groups_of_a_sorted_part(db, small_groups, monkeypatch):
    """Row groups of a part sorted by the key are found by bisection: planning a point query
    does not compare the filter with every row group's statistics."""
    from cryptdisk.db import _scan

    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(200_000))  # 200 row groups
    calls = []
    real = _scan.may_match
    monkeypatch.setattr(_scan, "may_match", lambda *a: calls.append(a) or real(*a))
    assert db.query("SELECT c_str FROM t WHERE c_int = 123456") == \
        db.con.sql("SELECT md5('123456')").fetchall()
    assert db.last_scans["t"]["row_groups_read"] == 1
    assert 0 < len(calls) <= 8  # the part's range, then the one row group left
    assert db.query("SELECT count(*) FROM t WHERE c_int BETWEEN 1500 AND 3499") == [(2000,)]
    assert db.last_scans["t"]["row_groups_read"] == 3


def test_sorted_bounds_only_for_row_groups_in_order(db, small_groups):
    """Bisection is used only where every row group has a range and they ascend."""
    db.sql(f"CREATE TABLE s {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO s " + gen(3000))
    db.sql(f"CREATE TABLE u {SCHEMA}")  # no ORDER BY: rows stay in insert order
    db.sql("INSERT INTO u SELECT i, md5(i::VARCHAR), i / 7 FROM range(3000) r(i) "
           "ORDER BY md5(i::VARCHAR)")
    db.sql(f"CREATE TABLE n {SCHEMA} ORDER BY c_int")  # a row group of NULL keys
    db.sql("INSERT INTO n SELECT CASE WHEN i < 1000 THEN NULL ELSE i END, c_str, c_float "
           "FROM (SELECT i, md5(i::VARCHAR) c_str, i / 7 c_float FROM range(3000) r(i))")
    ops = {t: db._open_parts.get(db.table(t).parts[0]) for t in "sun"}
    mins, maxs = ops["s"].sorted_bounds("c_int")
    assert mins == [0, 1000, 2000] and maxs == [999, 1999, 2999]
    assert ops["s"].sorted_bounds("c_str") is None  # md5 of a sorted key: not in order
    assert ops["u"].sorted_bounds("c_int") is None
    assert ops["n"].sorted_bounds("c_int") is None  # the NULL row group has no range
    op = ops["s"]  # each row group's range within itself and below the next one's
    for ranges, ordered in (([(0, 5), (5, 9), (9, 9)], True), ([(0, 5), (4, 9)], False),
                            ([(6, 5), (7, 9)], False), ([(0, 5), (6, "x")], False),
                            ([(0.5, 1.0), (1.0, 2.0)], True), ([(0, 1), None], False)):
        op._sorted.clear()
        op.ranges = lambda column, r=ranges: r
        want = ([r[0] for r in ranges], [r[1] for r in ranges]) if ordered else None
        assert op.sorted_bounds("x") == want, ranges
    op._sorted.clear()
    del op.ranges
    for t, op in ops.items():  # the key range the part's reader checks is _stats' one
        from cryptdisk.db._stats import key_range_of
        assert op.key_range("c_int") == key_range_of(op.meta, "c_int"), t
    assert ops["n"].key_range("c_int") == (1000, 2999)
    for t, want in (("s", 10), ("u", 10), ("n", 0)):
        assert db.query(f"SELECT count(*) FROM {t} WHERE c_int BETWEEN 500 AND 509") == \
            [(want,)]


def test_arrow_types_are_duckdbs():
    """A table's Arrow schema comes without a DuckDB statement for plain types: each is the
    type DuckDB gives that column type."""
    from cryptdisk.db._database import ARROW_TYPES

    con = duckdb.connect()
    for name, typ in ARROW_TYPES.items():
        got = con.sql(f"SELECT CAST(NULL AS {name}) AS x").to_arrow_table().schema.field(0)
        assert got.type == typ, name


def test_a_table_of_other_types_gets_duckdbs_schema(db):
    db.sql("CREATE TABLE o (a DECIMAL(10, 2), b TIMESTAMP, c bigint, d VARCHAR[])")
    db.sql("INSERT INTO o VALUES (1.25, TIMESTAMP '2026-01-02 03:04:05', 7, ['x'])")
    schema = db.arrow_schema(db.table("o"))
    assert [str(f.type) for f in schema] == ["decimal128(10, 2)", "timestamp[us]", "int64",
                                             "list<l: string>"]
    assert db.query("SELECT a, c, d FROM o")[0][1:] == (7, ["x"])


_COUNTS = [  # (statement, answered from the catalog)
    ("SELECT count(*) FROM t", True),
    ("select COUNT( * ) AS n, count() FROM t", True),
    ('SELECT count(*) AS "a b" FROM t AS x', True),
    ("SELECT count(*) FROM t WHERE k > 3", False),
    ("SELECT count(k) FROM t", False),
    ("SELECT count(*) FROM t GROUP BY k % 2 ORDER BY 1", False),
    ("SELECT count(*) FROM t LIMIT 0", False),
    ("SELECT DISTINCT count(*) FROM t", False),
    ("SELECT count(*) FILTER (WHERE k > 3) FROM t", False),
    ("SELECT count(*) OVER () FROM t LIMIT 1", False),
    ("SELECT count(*), min(k) FROM t", False),
    ("SELECT count(*) + 1 FROM t", False),
    ("WITH t AS (SELECT 1 AS k) SELECT count(*) FROM t", False),
    ("SELECT count(*) FROM t HAVING count(*) > 100", False),
    ("SELECT count(*) FROM t USING SAMPLE 100%", False),
    ("SELECT count(*) FROM t a JOIN t b ON a.k = b.k", False),
    ("SELECT count(*) FROM (SELECT * FROM t)", False),
]


@pytest.mark.parametrize("plain", [False, True])
def test_count_star_alone_is_answered_from_the_catalog(db, small_groups, plain):
    """``SELECT count(*) FROM t`` (and nothing else) reads the catalog's row counts, named
    and typed as DuckDB answers; any other shape is DuckDB's over the parts."""
    policy = "plain" if plain else "default"
    db.sql(f"CREATE TABLE t (k BIGINT, s VARCHAR) SETTINGS storage_policy = '{policy}'")
    db.sql(f"CREATE TABLE e (k BIGINT) SETTINGS storage_policy = '{policy}'")
    ref = duckdb.connect()
    ref.execute("CREATE TABLE t (k BIGINT, s VARCHAR)")
    for lo, hi in ((0, 2500), (2500, 4000)):
        rows = (f"SELECT CASE WHEN i % 5 = 0 THEN NULL ELSE i END, i::VARCHAR "
                f"FROM range({lo}, {hi}) r(i)")
        db.sql("INSERT INTO t " + rows)
        ref.execute("INSERT INTO t " + rows)
    for sql, from_catalog in _COUNTS:
        got = db.sql(sql)
        want = ref.sql(sql).to_arrow_table()
        assert got.schema == want.schema, sql  # names and types
        assert got.to_pylist() == want.to_pylist(), sql
        index = db.last_scans.get("t", {}).get("parts_from_index", 0)
        assert index == (2 if from_catalog else 0), sql
        if from_catalog:
            assert db.last_scans == {"t": {"parts_skipped": 0, "row_groups_read": 0,
                                           "row_groups_skipped": 0, "parts_from_index": 2,
                                           "granule_reads": 0}}
    assert db.query("SELECT count(*) FROM e") == [(0,)]


def test_a_prefetched_scan_duckdb_never_reads_is_stopped(db, small_groups, monkeypatch):
    """A scan starts reading when the statement is prepared; if DuckDB's plan never scans
    the table, the stream is stopped with the statement and nothing waits on it."""
    from cryptdisk.db import _scan

    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(20_000))
    made, taken = [], []
    init, batches = _scan._Stream.__init__, _scan._Stream.batches
    monkeypatch.setattr(_scan._Stream, "__init__",
                        lambda self, scan: made.append(self) or init(self, scan))
    monkeypatch.setattr(_scan._Stream, "batches",
                        lambda self: taken.append(self) or batches(self))
    assert db.query("SELECT c_int FROM t WHERE c_int > 10 AND 1 = 0") == []
    assert len(made) == 1 and taken == []  # prefetched, then DuckDB's plan read nothing
    assert db.last_scans["t"]["row_groups_read"] > 0
    assert made[0]._closed and not made[0]._pending  # stopped with the statement
    assert db.query("SELECT count(*) FROM t WHERE c_int < 1500") == [(1500,)]
    assert len(made) == 2 and taken == [made[1]]  # DuckDB took the prefetched stream
    assert made[1]._closed and not made[1]._pending


def test_a_small_tables_parts_open_while_duckdb_parses(db, small_groups):
    """A statement with a WHERE naming a table of at most 4 parts opens them all on the scan
    pool (the point query then reads one); of a larger table, those whose key range holds
    a number the statement names, and its skipped parts stay closed."""
    from cryptdisk.db import _database

    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    for i in range(_database._PREOPEN_PARTS + 1):
        db.sql("INSERT INTO t " + gen(1000, start=1000 * i))
    parts = db.table("t").parts
    assert db.query("SELECT c_int FROM t WHERE c_int = 1500") == [(1500,)]
    assert set(db._open_parts._items) == {parts[1].id}  # 5 parts: only the one read
    # of more than 4 parts, those whose key range holds a number the statement names open
    # ahead (here while DuckDB parses the range query)
    ahead, preopen = [], db._open_parts.preopen
    db._open_parts.preopen = lambda ps, key, numbers: (ahead.append([p.id for p in ps])
                                                       or preopen(ps, key, numbers))
    assert db.query("SELECT count(*) FROM t WHERE c_int BETWEEN 2500 AND 3100") == [(601,)]
    assert ahead == [[parts[2].id, parts[3].id]]
    assert db.query("SELECT count(*) FROM t WHERE c_str = 'x' AND c_int > 99999") == [(0,)]
    assert ahead[1:] == []  # no part holds those numbers: none opens ahead
    del db._open_parts.preopen
    db.sql("OPTIMIZE TABLE t FINAL")
    db._open_parts.clear()
    db.sql("INSERT INTO t " + gen(1000, start=9000))
    assert db.query("SELECT min(c_int), max(c_int) FROM t") == [(0, 9999)]
    assert db.query("SELECT count(*) FROM t") == [(6000,)]
    assert db._open_parts._opening == {} and db._open_parts._items == {}  # no WHERE
    assert db.query("SELECT c_int FROM t WHERE c_int = 9500") == [(9500,)]
    assert db.last_scans["t"]["parts_skipped"] == 1
    for fut in [f for _pid, f in list(db._open_parts._opening.values())]:
        fut.result(timeout=60)  # the skipped part may still be opening in the background
    assert set(db._open_parts._items) == {p.id for p in db.table("t").parts}  # both
    assert db._open_parts._opening == {}
    db.sql(f"CREATE TABLE u {SCHEMA}")  # no ORDER BY: no key statistics to read ahead
    db.sql("INSERT INTO u " + gen(1000))
    assert db.query("SELECT count(*) FROM u WHERE c_int < 10") == [(10,)]
    assert db.table("u").parts[0].id in db._open_parts._items
    assert db._open_parts._opening == {}


def test_a_statement_without_where_opens_a_small_tables_parts_while_duckdb_parses(
        db, small_groups):
    """``ORDER BY key LIMIT n``, a LIMIT, a full scan: a statement without WHERE that reads
    rows opens the parts of a table of at most 4 parts on the scan pool while DuckDB parses
    it (no key granule read ahead: it names no key to look up); one the catalog may answer
    without a part (count(*), min/max of the key) or that reads none opens nothing."""
    from cryptdisk.db import _database

    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    for i in range(2):
        db.sql("INSERT INTO t " + gen(1000, start=1000 * i))
    ids = [p.id for p in db.table("t").parts]
    ahead, preopen = [], db._open_parts.preopen
    db._open_parts.preopen = lambda ps, key, numbers: (
        ahead.append(([p.id for p in ps], set(numbers))) or preopen(ps, key, numbers))
    for sql in ("SELECT count(*) FROM t", "SELECT min(c_int), max(c_int) FROM t"):
        db.query(sql)
        assert ahead == [] and db._open_parts._opening == {}, sql
    assert db._open_parts._items == {}
    for sql in ("DESCRIBE SELECT c_int FROM t", "SELECT max(c_float) FROM t"):
        db.query(sql)  # (their parts open when their scans read them)
        assert ahead == [], sql
    db._open_parts.clear()
    assert db.query("SELECT c_int FROM t ORDER BY c_int LIMIT 2") == [(0,), (1,)]
    assert ahead == [(ids, set())]
    db._open_parts.clear()
    assert db.query("SELECT sum(c_int) FROM t") == [(sum(range(2000)),)]
    assert ahead[1:] == [(ids, set())]
    del db._open_parts.preopen
    for i in range(2, _database._PREOPEN_PARTS + 1):
        db.sql("INSERT INTO t " + gen(1000, start=1000 * i))
    db._open_parts.clear()
    db._open_parts.preopen = lambda ps, key, numbers: (
        ahead.append(([p.id for p in ps], set(numbers))) or preopen(ps, key, numbers))
    assert db.query("SELECT c_int FROM t ORDER BY c_int LIMIT 1") == [(0,)]
    assert ahead[2:] == []  # 5 parts: opened when the scan knows which it reads


def test_a_part_that_fails_to_preopen_fails_the_statement(tmp_path, small_groups,
                                                          monkeypatch):
    """An error opening a part ahead of the statement (here: its file is gone) is the
    statement's error, raised when the scan needs the part (a part connect did not open:
    see test_connect_opens_a_few_parts_so_the_first_query_reads_at_once)."""
    from cryptdisk.db import _database

    monkeypatch.setattr(_database, "_CONNECT_OPENS", 0)
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
        db.sql("INSERT INTO t " + gen(3000))
    (part_file,) = (path / "data").rglob("*.parquet")
    with cryptdisk.connect(path, read_only=True) as db:
        part_file.unlink()
        with pytest.raises(CatalogError, match="missing"):
            db.query("SELECT count(*) FROM t WHERE c_int = 5")
        assert db._open_parts._opening == {} and db._open_parts._items == {}


def test_a_catalog_key_range_that_is_not_the_parts_own_fails_the_read(tmp_path):
    """The sparse index is written with the part (its footer, authenticated with it) and
    checked against the catalog's range when the part is read: an entry that differs is an
    error, never an answer computed from the wrong range."""
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
        db.sql("INSERT INTO t " + gen(100))
        assert db.query("SELECT key_min, key_max FROM system.parts") == [("0", "99")]
        part = db.table("t").parts[0]
        part.key_max = 150  # a range that still holds the value asked for below
        with pytest.raises(CatalogError, match="does not match the part's own index"):
            db.query("SELECT count(*) FROM t WHERE c_int = 50")


def test_a_prefetched_read_hints_once_and_drops_its_ciphertext_in_one_call(db, small_groups):
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(20_000))
    op = db._open_parts.get(db.table("t").parts[0])
    assert op._sealed and op.num_row_groups == 20
    assert op.meta is not None  # the footer a whole read needs, parsed (and hinted) first
    calls: list[tuple[int, int, bool]] = []
    real = op._handle.advise
    op._handle.advise = lambda offset, n, need: (calls.append((offset, n, need)),
                                                  real(offset, n, need))[1]
    want = db.con.sql("SELECT i / 7 FROM range(20000) r(i)").fetchall()

    def chunk(rg):
        return op._chunk_info(rg, op._index["c_float"])[:2]

    op.prefetch([0, 1, 2, 3], ["c_float"])  # a task queued behind others
    assert calls == [(*chunk(rg)[:1], chunk(rg)[1] - chunk(rg)[0], True) for rg in range(4)]
    calls.clear()
    got = op.read([0, 1, 2, 3], ["c_float"]).column("c_float").to_pylist()
    assert got == [r[0] for r in want[:4000]]
    # no second hint; the mapped ciphertext of all four chunks dropped in one call
    assert len(calls) == 1 and calls[0][2] is False
    assert calls[0][0] <= chunk(0)[0] and calls[0][0] + calls[0][1] >= chunk(3)[1]
    calls.clear()
    got = op.read([4, 5, 6], ["c_float"]).column("c_float").to_pylist()  # not prefetched
    assert got == [r[0] for r in want[4000:7000]]
    # it hints itself (one call per run of touching segments), then one drop
    assert len(calls) >= 2 and all(c[2] for c in calls[:-1]) and calls[-1][2] is False


@pytest.mark.parametrize("plain", [False, True])
def test_optimize_writes_null_free_columns_required_and_reads_equal(db, small_groups,
                                                                    monkeypatch, plain):
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    policy = " SETTINGS storage_policy = 'plain'" if plain else ""
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int{policy}")
    db.sql("INSERT INTO t SELECT i::BIGINT, md5(i::VARCHAR), CASE WHEN i % 97 = 5 THEN NULL "
           "ELSE i / 7 END FROM range(3000) r(i)")
    db.sql("INSERT INTO t " + gen(2000, start=3000))
    ref = ("(SELECT i::BIGINT c_int, md5(i::VARCHAR) c_str, CASE WHEN i % 97 = 5 AND i < 3000 "
           "THEN NULL ELSE i / 7 END c_float FROM range(5000) r(i))")
    queries = ["SELECT count(*), count(c_float), sum(c_int), max(c_str), min(c_float) FROM {}",
               "SELECT c_int, c_str, c_float FROM {} WHERE c_int = 1234",
               "SELECT c_int, c_str, c_float FROM {} WHERE c_int IN (5, 102, 4321) ORDER BY 1",
               "SELECT c_int, c_float FROM {} ORDER BY c_float DESC NULLS LAST, c_int LIMIT 3"]

    def leaves():
        (part,) = db.table("t").parts
        op = db._open_parts.get(part)
        return {op.meta.schema.column(j).name: op.meta.schema.column(j).max_definition_level
                for j in range(op.meta.num_columns)}

    db.optimize("t", final=True)
    assert leaves() == {"c_int": 0, "c_str": 0, "c_float": 1}  # REQUIRED unless a NULL
    db.cache.clear()
    for q in queries:
        assert db.query(q.format("t")) == db.con.sql(q.format(ref)).fetchall()
    assert db.last_scans["t"]["row_groups_read"] >= 1
    db.query(queries[1].format("t"))
    db.cache.clear()
    db._open_parts.clear()
    assert db.query(queries[1].format("t")) == [(1234, hashlib.md5(b"1234").hexdigest(),
                                                 1234 / 7)]
    assert db.last_scans["t"]["granule_reads"] == 1  # c_str's one page of a REQUIRED column
    db.sql("INSERT INTO t VALUES (7, NULL, 1.5)")  # the table's columns stay nullable
    ref = f"({ref[1:-1]} UNION ALL SELECT 7, NULL, 1.5)"
    for q in queries:
        assert db.query(q.format("t")) == db.con.sql(q.format(ref)).fetchall()
    db.optimize("t", final=True)
    assert leaves() == {"c_int": 0, "c_str": 1, "c_float": 1}
    for q in queries:
        assert db.query(q.format("t")) == db.con.sql(q.format(ref)).fetchall()


_KEY_TOP_ROWS = st.lists(st.tuples(st.integers(-40, 40), st.text("ab", max_size=2),
                                   _TOP_FLOATS), max_size=150)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inserts=st.lists(_KEY_TOP_ROWS, min_size=0, max_size=3),
       null_part=st.booleans(), desc=st.booleans(), limit=st.integers(1, 30),
       offset=st.sampled_from([None, 0, 7]), plain=st.booleans(), merged=st.booleans(),
       compressed=st.booleans(), page_rows=st.sampled_from([4, 20]))
def test_top_n_by_the_key_through_granules_equals_duckdb(shared_db, inserts, null_part, desc,
                                                          limit, offset, plain, merged,
                                                          compressed, page_rows):
    """ORDER BY key LIMIT n reads the granules that may hold each row group's n best keys
    (of uncompressed pages, the n rows alone when no tie crosses the cut) and hands DuckDB
    the rows of a sorted batch that can still reach the top: the same rows as DuckDB,
    ties, NULL keys (a part without granule bounds), empty tables and merged parts
    included."""
    db = shared_db
    if null_part:
        inserts = [*inserts, [(None, "n", 1.0), (3, "m", 2.0), (None, "o", None)]]
    old_codec = _parts.COMPRESSION
    _parts.COMPRESSION = "lz4" if compressed else "none"
    try:
        t, ref = _table_and_reference(db, inserts, 40, True,
                                      " SETTINGS storage_policy = 'plain'" if plain else "",
                                      page_rows=page_rows)
    finally:
        _parts.COMPRESSION = old_codec
    if merged:
        old, old_pages = _parts.ROW_GROUP_ROWS, _parts.GRANULE_ROWS
        _parts.ROW_GROUP_ROWS, _parts.GRANULE_ROWS = 40, page_rows
        _parts.COMPRESSION = "lz4" if compressed else "none"
        try:
            db.sql(f"OPTIMIZE TABLE {t}")
        finally:
            _parts.ROW_GROUP_ROWS, _parts.GRANULE_ROWS = old, old_pages
            _parts.COMPRESSION = old_codec
    direction = " DESC" if desc else ""
    sql = (f"SELECT k, s, f FROM {t} ORDER BY k{direction}, s, f LIMIT {limit}"
           + ("" if offset is None else f" OFFSET {offset}"))
    for _ in range(3):  # cold, then with the granules offered, then from the cache
        assert _norm(db.query(sql)) == _norm(ref.execute(sql).fetchall()), sql
    db.sql(f"DROP TABLE {t}")


def test_top_n_by_the_key_decodes_the_first_granule_only(db, monkeypatch):
    """On a part sorted by the key, ORDER BY key LIMIT n decodes the pages of its first
    (last, descending) granule of every column, and DuckDB gets the n rows only."""
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(5000))
    reads, rows_reads = [], []
    read, read_rows = _partread.OpenPart.read, _partread.OpenPart.read_rows
    monkeypatch.setattr(_partread.OpenPart, "read",
                        lambda self, rgs, cols, *j: reads.append(cols) or read(self, rgs, cols, *j))
    monkeypatch.setattr(_partread.OpenPart, "read_rows", lambda self, rg, c, a, b: (
        rows_reads.append((c, a, b)) or read_rows(self, rg, c, a, b)))
    seen = []
    from cryptdisk.db import _scan

    trim = _scan._Stream._trim
    monkeypatch.setattr(_scan._Stream, "_trim", lambda self, batch, top: seen.append(
        (out := trim(self, batch, top)).num_rows) or out)
    got = db.query("SELECT c_int, c_str FROM t ORDER BY c_int LIMIT 3")
    assert got == [(i, hashlib.md5(str(i).encode()).hexdigest()) for i in range(3)]
    assert reads == []
    assert sorted(rows_reads) == [("c_int", 0, 100), ("c_str", 0, 100)]
    assert seen == [3]
    assert db.last_scans["t"]["granule_reads"] == 1
    rows_reads.clear()
    got = db.query("SELECT c_int FROM t ORDER BY c_int DESC LIMIT 150")
    assert got == [(i,) for i in range(4999, 4849, -1)]
    assert rows_reads == [("c_int", 800, 1000)]


def test_top_n_by_the_key_decodes_its_rows_only(db, monkeypatch):
    """On a part sorted by the key whose pages are stored uncompressed, ORDER BY key LIMIT
    n decodes the n rows (the key's n + 1, to see that no tie crosses the cut) from the
    bytes that hold them, not the pages of the granule: on an encrypted disk one segment
    of each column is decrypted where the granule's strings take five (descending, the
    strings before the rows too, their lengths checked). A tie at the cut reads the
    granules (or the row group) as before."""
    monkeypatch.setattr(_parts, "COMPRESSION", "none")
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t SELECT i // 3 * 3 + (i % 3 = 2)::INT, md5(i::VARCHAR), i / 7 "
           "FROM range(20000) r(i)")  # keys 0, 0, 1, 3, 3, 4, ...: ties of two
    decrypted, rows_reads, page_reads = [], [], []
    call = _partread._SegmentReader.__call__
    monkeypatch.setattr(_partread._SegmentReader, "__call__", lambda self, at, n: (
        decrypted.append(n) or call(self, at, n)))
    read_rows = _partread.OpenPart.read_rows
    monkeypatch.setattr(_partread.OpenPart, "read_rows", lambda self, rg, c, a, b: (
        rows_reads.append(c) or read_rows(self, rg, c, a, b)))
    page_rows = getattr(_partread.OpenPart, "read_page_rows", None)
    monkeypatch.setattr(_partread.OpenPart, "read_page_rows", lambda self, rg, c, a, b: (
        page_reads.append((c, a, b)) or page_rows(self, rg, c, a, b)), raising=False)
    ref = duckdb.connect()
    ref.register("t", db.arrow_table("t"))
    for sql, want in (
            ("SELECT c_int, c_str, c_float FROM t ORDER BY c_int, c_str LIMIT 9",
             [("c_int", 0, 10), ("c_str", 0, 9), ("c_float", 0, 9)]),
            ("SELECT c_int, c_str, c_float FROM t ORDER BY c_int DESC, c_str LIMIT 3",
             [("c_int", 19996, 20000), ("c_str", 19997, 20000), ("c_float", 19997, 20000)]),
            ("SELECT c_str, c_int FROM t ORDER BY c_int, c_str LIMIT 3 OFFSET 3",
             [("c_int", 0, 7), ("c_str", 0, 6)])):
        decrypted.clear()
        page_reads.clear()
        with cryptdisk.connect(db.path, read_only=True, cache_bytes=0) as cold:
            assert cold.query(sql) == ref.execute(sql).fetchall(), sql
        assert rows_reads == [], sql
        assert page_reads == want, sql
        if "DESC" not in sql:  # (descending: the strings' lengths before the rows are read)
            assert sum(decrypted) < 64 * 1024, (sql, decrypted)  # no page read whole
    for sql in ("SELECT c_int, c_str FROM t ORDER BY c_int, c_str LIMIT 4",  # 0 0 1 3 | 3
                "SELECT c_int, c_str FROM t ORDER BY c_int DESC, c_str LIMIT 4"):
        page_reads.clear()
        with cryptdisk.connect(db.path, read_only=True, cache_bytes=0) as cold:
            assert cold.query(sql) == ref.execute(sql).fetchall(), sql
        assert [c for c, _a, _b in page_reads] == ["c_int"], sql  # the key's probe only


def test_a_cold_top_n_plans_once_its_part_opens_not_on_the_statements_thread(db,
                                                                            monkeypatch):
    """A cold top-N whose part is still opening (on the scan pool, while DuckDB parses the
    statement) is planned and its first granule read on the thread that opens the part:
    the statement goes on to DuckDB meanwhile instead of waiting for the open. A part
    that fails to open still fails the statement with its error."""
    from cryptdisk.db import _scan

    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(5000))
    events = []
    prefetched = threading.Event()
    prefetch = _scan.TableScan.prefetch
    monkeypatch.setattr(_scan.TableScan, "prefetch", lambda self: (
        prefetch(self), events.append("prefetch returned"), prefetched.set()))
    open_part = _scan.open_part

    def slow_open(disk, part):
        prefetched.wait(10)  # (before the change, prefetch waited for this open: 10 s)
        events.append("part opened")
        return open_part(disk, part)

    monkeypatch.setattr(_scan, "open_part", slow_open)
    start = _scan._Stream.start
    monkeypatch.setattr(_scan._Stream, "start", lambda self: (
        events.append(("planned", threading.current_thread().name)), start(self))[1])
    with cryptdisk.connect(db.path, read_only=True) as cold:
        got = cold.query("SELECT c_int, c_str FROM t ORDER BY c_int LIMIT 3")
    assert got == [(i, hashlib.md5(str(i).encode()).hexdigest()) for i in range(3)]
    assert events[:3] == ["prefetch returned", "part opened",
                          ("planned", events[2][1])], events
    assert events[2][1].startswith("cryptdisk-scan"), events

    def broken(disk, part):
        raise CatalogError(f"part {part.path} is gone")

    monkeypatch.setattr(_scan, "open_part", broken)
    with cryptdisk.connect(db.path, read_only=True) as cold, \
            pytest.raises(CatalogError, match="is gone"):
        cold.query("SELECT c_int, c_str FROM t ORDER BY c_int LIMIT 3")


def test_a_scan_thread_opens_a_part_itself_rather_than_wait_for_one_queued(db):
    """On a scan pool thread, OpenParts.get does not wait for an open still queued or
    running on the pool (a top-N's start runs there: with both pool threads waiting so,
    no thread would be left to run the opens); it opens the part itself. Elsewhere it
    waits for the open in flight."""
    from concurrent.futures import Future

    from cryptdisk.db import _scan

    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(100))
    part = db.catalog.tables["t"].parts[0]
    parts = _scan.OpenParts(lambda: db.config)
    never: Future = Future()  # an open queued behind the waiting threads: never runs
    parts._opening[part.id] = (os.getpid(), never)
    op = _scan._pool().submit(parts.get, part).result(timeout=60)
    assert op.part == part
    waiting = threading.Thread(target=parts.get, args=(part,), daemon=True)
    parts._items.clear()
    waiting.start()
    waiting.join(1)
    assert waiting.is_alive()  # (off the pool it waits for the open in flight)
    never.set_result(op)
    waiting.join(60)
    assert not waiting.is_alive()


def test_repeated_statements_reuse_the_parse_tree_until_a_setting_may_change(db,
                                                                           monkeypatch):
    """A repeated SELECT is parsed for cryptdisk once; a statement not a query forgets
    the trees, but for a SET of a setting that changes no name (default_order: the trees
    come from a parser with DuckDB's defaults); DuckDB's default_order is read again after
    any SET (one on ``con`` itself too)."""
    from cryptdisk.db import _database

    parsed = []
    parse_tree_text = _database.parse_tree_text
    monkeypatch.setattr(_database, "parse_tree_text",
                        lambda con, sql: parsed.append(sql) or parse_tree_text(con, sql))
    db.sql("CREATE TABLE t (k BIGINT) ORDER BY k")
    db.sql("INSERT INTO t SELECT * FROM range(10)")
    sql = "SELECT k FROM t ORDER BY k NULLS LAST LIMIT 2"  # (not one ._simpletree writes)
    simple = "SELECT k FROM t ORDER BY k LIMIT 2"  # (its tree written out, never parsed)
    assert db.query(sql) == [(0,), (1,)]
    assert db.query(sql) == [(0,), (1,)]
    assert db.query(simple) == [(0,), (1,)]
    assert parsed == [sql]
    db.sql("SET default_order = 'DESC'")
    assert db.query(sql) == [(9,), (8,)]
    assert db.query(simple) == [(9,), (8,)]
    assert parsed == [sql]
    db.sql("SET preserve_identifier_case = true")
    assert db.query(sql) == [(9,), (8,)]
    assert parsed == [sql, sql]
    db.sql("RESET default_order")
    assert db.query(sql) == [(0,), (1,)]
    assert db.query(simple) == [(0,), (1,)]
    db.con.execute("SET default_order = 'DESC'")
    try:
        assert db.query(sql) == [(9,), (8,)]
        assert db.query(simple) == [(9,), (8,)]
    finally:
        db.con.execute("RESET default_order")


def test_settings_are_read_once_until_a_statement_may_change_them(db, monkeypatch):
    """DuckDB's settings are read as the database opens, and again after a SET, RESET or
    PRAGMA anywhere on the database (db.sql, ``db.con`` itself, a reader's cursor), whose
    value each statement then honours; repeated top-N statements read none."""
    from cryptdisk.db import _database

    asked = []
    current = _database.current_settings
    monkeypatch.setattr(_database, "current_settings",
                        lambda con, names: asked.append(names) or current(con, names))
    db.sql("CREATE TABLE t (k BIGINT) ORDER BY k")
    db.sql("INSERT INTO t SELECT * FROM range(10)")
    sql = "SELECT k FROM t ORDER BY k LIMIT 2"
    other = "SELECT k FROM t ORDER BY k LIMIT 3"
    for _ in range(3):
        assert db.query(sql) == [(0,), (1,)]
        assert db.query(other) == [(0,), (1,), (2,)]
    assert asked == []  # read as the database opened, before this test counts
    ways = [lambda: db.sql("SET default_order = 'DESC'"),
            lambda: db.con.execute("SET default_order = 'DESC'"),
            lambda: db.con.execute("PRAGMA default_order = 'DESC'"),
            lambda: db.con.cursor().execute("SET GLOBAL default_order = 'DESC'")]
    for n, change in enumerate(ways):
        change()
        try:
            assert db.query(sql) == [(9,), (8,)], n
            assert db.query(sql) == [(9,), (8,)], n
        finally:
            db.con.execute("RESET default_order")
        assert db.query(sql) == [(0,), (1,)], n
    assert len(asked) == 2 * len(ways)
    other = cryptdisk.connect(db.path, read_only=True)  # reads them as it opens
    try:
        assert len(asked) == 1 + 2 * len(ways)
        assert other.query(sql) == [(0,), (1,)]  # its first top-N reads none
        assert len(asked) == 1 + 2 * len(ways)
    finally:
        other.close()
    r = db.reader()  # a reader keeps its own, for its cursor
    try:
        assert r.query(sql) == [(0,), (1,)]
        r.configure("SET default_order = 'DESC'")
        assert r.query(sql) == [(9,), (8,)]
        r.configure("RESET default_order")
        assert r.query(sql) == [(0,), (1,)]
    finally:
        r.close()
    assert db.query(sql) == [(0,), (1,)]


def test_a_reader_sees_whole_inserts_across_inserts_and_merges(tmp_path):
    """A read-only connection's count(*) (from the catalog) and ORDER BY key LIMIT (from
    the parts' granules) between another connection's inserts and merges: whole inserts only,
    and the first keys of exactly those rows."""
    path = tmp_path / "db"
    with cryptdisk.connect(path) as w:
        w.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        w.sql("INSERT INTO t SELECT 1000 - i, i::VARCHAR FROM range(1000) r(i)")
    reader = cryptdisk.connect(path, read_only=True)
    writer = cryptdisk.connect(path)
    try:
        for n in range(1, 7):
            # each insert adds 1000 rows whose keys are all below the earlier ones
            writer.sql(f"INSERT INTO t SELECT {-1000 * n} + i, 'x' FROM range(1000) r(i)")
            if n % 2 == 0:
                writer.sql("OPTIMIZE TABLE t")
            (count,) = reader.query("SELECT count(*) FROM t")[0]
            assert count % 1000 == 0
            inserts = count // 1000 - 1
            got = reader.query("SELECT k FROM t ORDER BY k LIMIT 2")
            lowest = -1000 * inserts if inserts else 1
            assert got == [(lowest,), (lowest + 1,)]
    finally:
        writer.close()
        reader.close()


_EXTREME_ITEMS = [
    ("SELECT min(k), max(k) FROM {t}", True),
    ("select MAX(k) AS hi, min({t}.k) FROM {t} AS x", False),  # x.k only: {t}.k is DuckDB's
    ("SELECT max(k) AS hi, min(x.k) lo, max(k) FROM {t} x", True),
    ('SELECT min("k") FROM {t}', True),
    ("SELECT min(k) FROM {t} LIMIT 0", False),
    ("SELECT DISTINCT max(k) FROM {t}", False),
    ("SELECT max(k) - min(k) FROM {t}", False),
    ("SELECT min(k), max(k) FROM {t} ORDER BY 1", False),
]


@pytest.mark.parametrize("key_type", ["BIGINT", "INTEGER", "SMALLINT", "UBIGINT"])
def test_a_repeated_min_max_of_the_key_is_answered_from_the_catalog(db, key_type,
                                                                    monkeypatch):
    """``SELECT min(key), max(key) FROM t`` and nothing else: every run, the first too, is the
    catalog's ranges in DuckDB's schema, with NULL for an empty table; after an insert of
    NULL keys only (a part without a range), or another shape, DuckDB answers."""
    from cryptdisk.db._database import Database

    answered = []
    extremes = Database._key_extremes
    monkeypatch.setattr(Database, "_key_extremes", lambda self, *a: answered.append(
        got := extremes(self, *a)) or got)
    ref = duckdb.connect()
    for name in ("t", "e"):
        db.sql(f"CREATE TABLE {name} (k {key_type}, s VARCHAR) ORDER BY k")
        ref.execute(f"CREATE TABLE {name} (k {key_type}, s VARCHAR)")
    for rows in ("SELECT i * 3 + 7, 'a' FROM range(2000) r(i)",
                 "SELECT i, 'b' FROM range(5, 900) r(i)",
                 "SELECT NULL, 'c'"):  # NULL keys beside keys: the part has a range
        db.sql("INSERT INTO t " + rows + " UNION ALL SELECT 50, 'd'")
        ref.execute("INSERT INTO t " + rows + " UNION ALL SELECT 50, 'd'")
    for table in ("t", "e"):
        for shape, direct in _EXTREME_ITEMS:
            sql = shape.format(t=table)
            try:
                want = ref.sql(sql).to_arrow_table()
            except duckdb.Error:
                with pytest.raises(cryptdisk.errors.DatabaseError):
                    db.sql(sql)
                continue
            for run in range(3):
                answered.clear()
                got = db.sql(sql)
                assert got.schema == want.schema, sql
                assert got.to_pylist() == want.to_pylist(), sql
                assert any(a is not None for a in answered) == direct, (sql, run)
    db.sql("INSERT INTO t SELECT NULL, 'z'")  # a part of NULL keys only: no key range
    sql = "SELECT min(k), max(k) FROM t"
    ref.execute("INSERT INTO t SELECT NULL, 'z'")
    for _ in range(2):
        answered.clear()
        assert db.query(sql) == ref.execute(sql).fetchall()
        assert answered == [None] and db.last_scans["t"]["row_groups_read"] == 1
    db.sql("DROP TABLE t")
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")  # same statement, other type
    db.sql("INSERT INTO t SELECT -5, 'x'")
    assert db.sql(sql).schema.field(0).type == pa.int64()
    assert db.query(sql) == [(-5, -5)]


def test_a_warm_point_query_hands_duckdb_the_keys_span_of_the_cached_row_group(db,
                                                                            small_groups,
                                                                            monkeypatch):
    """Answered from the cache, a filter on the key still hands DuckDB only the rows from
    the first to the last the filter may keep (slices of the cached row group)."""
    from cryptdisk.db._scan import TableScan

    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(5000))
    handed = []
    cached_table = TableScan.cached_table
    monkeypatch.setattr(TableScan, "cached_table", lambda self: handed.append(
        got := cached_table(self)) or got)
    sql = "SELECT c_int, c_str FROM t WHERE c_int BETWEEN 1990 AND 2003"
    want = [(i, hashlib.md5(str(i).encode()).hexdigest()) for i in range(1990, 2004)]
    for _ in range(3):
        handed.clear()
        assert db.query(sql) == want
    (table,) = handed
    assert table.num_rows == 14  # of the two cached row groups' 2000
    assert db.query("SELECT c_str FROM t WHERE c_int IN (3, 4999)") == [
        (hashlib.md5(b"3").hexdigest(),), (hashlib.md5(b"4999").hexdigest(),)]


@pytest.mark.parametrize("how", ["db.sql", "db.con"])
def test_a_default_collation_keeps_text_statistics_from_skipping_rows(db, small_groups, how):
    """Byte-order statistics of a text column bound neither its WHERE nor its ORDER BY
    under a collation, also when it is set on ``db.con`` behind the database's back."""
    db.sql("CREATE TABLE t (s VARCHAR, i BIGINT) ORDER BY s")
    db.sql("INSERT INTO t SELECT 'B' || lpad(range::VARCHAR, 5, '0'), range FROM range(3000)")
    db.sql("INSERT INTO t SELECT 'a' || lpad(range::VARCHAR, 5, '0'), range FROM range(3000)")
    queries = ["SELECT count(*) FROM t WHERE s = 'A00007'",
               "SELECT count(*) FROM t WHERE s >= 'A' AND s < 'B'",
               "SELECT s FROM t ORDER BY s LIMIT 2",
               "SELECT s FROM t ORDER BY s DESC LIMIT 1"]
    binary = [db.query(q) for q in queries]  # (statements are cached as they run)
    assert binary == [[(0,)], [(0,)], [("B00000",), ("B00001",)], [("a02999",)]]
    assert db.last_scans["t"]["row_groups_read"] < 6  # statistics skip row groups here
    set_nocase = "SET default_collation = 'nocase'"
    db.sql(set_nocase) if how == "db.sql" else db.con.execute(set_nocase)
    assert [db.query(q) for q in queries] == [
        [(1,)], [(3000,)], [("a00000",), ("a00001",)], [("B02999",)]]
    reset = "RESET default_collation"
    db.sql(reset) if how == "db.sql" else db.con.execute(reset)
    assert [db.query(q) for q in queries] == binary


@pytest.mark.parametrize("sql", ["SELECT k FROM t", "SELECT k FROM t LIMIT 1",
                                 "SELECT i FROM t WHERE k = TIMESTAMP_S '2024-01-01 12:00:00'"])
def test_a_cached_column_read_back_as_another_type_is_cast(db, sql):
    """TIMESTAMP_S reads back from Parquet as timestamp[ms]: the stream cast it, the
    answers from cached row groups (whole, a LIMIT's slices) failed with ArrowTypeError."""
    db.sql("CREATE TABLE t (k TIMESTAMP_S, i INTEGER) ORDER BY k")
    db.sql("INSERT INTO t VALUES ('2024-01-01 12:00:00', 1)")
    want = duckdb.sql(sql.replace("FROM t", "FROM (SELECT TIMESTAMP_S '2024-01-01 12:00:00' "
                                  "AS k, 1 AS i) t")).fetchall()
    for _ in range(3):  # cold, a second read (kept), from the cache
        assert db.query(sql) == want


def test_a_descending_top_n_keeps_every_value_until_it_has_its_limit():
    """A descending top-N that has seen fewer values than its limit keeps them all (a
    negative slice start dropped the smallest ones, loosening its threshold)."""
    from cryptdisk.db import _scan
    from cryptdisk.db._pushdown import TopN

    stream = _scan._Stream.__new__(_scan._Stream)
    stream._best, stream._threshold = None, None
    top = TopN("k", descending=True, limit=10)
    stream._see(pa.record_batch({"k": pa.array(list(range(8)), pa.int64())}), top)
    assert sorted(stream._best) == list(range(8))
    assert stream._threshold is None
    stream._see(pa.record_batch({"k": pa.array([20, 30, 40], pa.int64())}), top)
    assert sorted(stream._best) == [1, 2, 3, 4, 5, 6, 7, 20, 30, 40]
    assert stream._threshold == 1
