"""``SELECT count(DISTINCT col) FROM t`` counted by the scan threads (cryptdisk.db._distinct):
the answer and the result's schema are DuckDB's, NULLs, duplicates, empty strings, parts
and the cache alike; a collation or any other clause leaves the count to DuckDB; the set
stays within memory_limit, and the C set's own contract."""

import os
import threading

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.db import _distinct
from cryptdisk.db._columns import parse_tree, parser_cursor
from cryptdisk.db._distinct import DistinctCount, count_distinct_item, memory_limit_bytes
from cryptdisk.errors import AuthenticationError, DatabaseError

#: the C set's own tests need it built (as tests/db/test_db_blocks.py: an optional
#: extension); every other test runs either way (without it DuckDB counts)
needs_set = pytest.mark.skipif(not DistinctCount.available(),
                               reason="cryptdisk.db._csort is not built (DuckDB counts)")

_TEXT = st.one_of(st.none(), st.sampled_from(["", "a", "A", "ab", "é", "a\x00b", "x" * 40]),
                  st.text(max_size=20))
_INSERTS = st.lists(st.lists(_TEXT, max_size=40), max_size=4)


def _reference(rows: list, typ: str) -> duckdb.DuckDBPyConnection:
    ref = duckdb.connect()
    ref.execute(f"CREATE TABLE t (k BIGINT, s {typ})")
    if rows:
        ref.executemany("INSERT INTO t VALUES (?, ?)",
                        [(i, v if v is None or typ == "VARCHAR" else v.encode())
                         for i, v in enumerate(rows)])
    return ref


def _insert(db, rows: list, start: int, typ: str) -> None:
    values = pa.array(rows, pa.string()) if typ == "VARCHAR" else \
        pa.array([None if v is None else v.encode() for v in rows], pa.binary())
    db.insert("t", pa.table({"k": pa.array(range(start, start + len(rows)), pa.int64()),
                             "s": values}))


@st.composite
def _select(draw):
    """count(DISTINCT s) as a user may spell it; the table as it may be named."""
    source = draw(st.sampled_from(["t", "T", "t AS x"]))
    qualifier = draw(st.sampled_from(["", "x.", "X."] if source == "t AS x" else ["", "t.", "T."]))
    column = draw(st.sampled_from(["s", "S", '"s"']))
    item = f"{draw(st.sampled_from(['count', 'COUNT', 'Count']))}(" \
        f"{draw(st.sampled_from(['DISTINCT', 'distinct']))} {qualifier}{column})"
    alias = draw(st.sampled_from(["", " AS n", " AS \"Distinct Values\"", " n"]))
    return f"SELECT {item}{alias} FROM {source}"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), inserts=_INSERTS, typ=st.sampled_from(["VARCHAR", "BLOB"]),
       plain=st.booleans(), cache=st.booleans())
def test_the_count_and_its_schema_are_duckdbs(tmp_path_factory, data, inserts, typ, plain,
                                              cache):
    """NULLs (not counted), duplicates across rows and parts, empty strings, values that
    differ only in case or by a NUL byte, empty inserts (no part), an empty table (0);
    the first run (read from the parts) and the repeat (from the cache) alike."""
    policy = "plain" if plain else "default"
    options = {} if cache else {"cache_bytes": 0}
    with cryptdisk.connect(tmp_path_factory.mktemp("x") / "db", **options) as db:
        db.sql(f"CREATE TABLE t (k BIGINT, s {typ}) ORDER BY k "
               f"SETTINGS storage_policy = '{policy}'")
        rows: list = []
        for part in inserts:
            _insert(db, part, len(rows), typ)
            rows.extend(part)
        sql = data.draw(_select())
        want = _reference(rows, typ).sql(sql).to_arrow_table()
        # (the path under test, where the C set is built)
        assert isinstance(db._prepare(sql), DistinctCount) == DistinctCount.available(), sql
        db._release()
        for _ in range(2):
            got = db.sql(sql)
            assert got.schema == want.schema, sql
            assert got.to_pylist() == want.to_pylist(), sql


def test_a_run_spanning_many_batches_and_parts_counts_exactly(db):
    """200K rows in 3 inserts, each value of a 90K-value range repeated (so values meet
    again in other parts and other threads' arrays), a tenth NULL."""
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    for start in (0, 70_000, 140_000):
        db.sql("INSERT INTO t SELECT i, CASE WHEN i % 10 = 3 THEN NULL "
               f"ELSE md5((i % 90000)::VARCHAR) END FROM range({start}, {start + 70_000}) r(i)")
    want = duckdb.sql("SELECT count(DISTINCT CASE WHEN i % 10 = 3 THEN NULL "
                      "ELSE md5((i % 90000)::VARCHAR) END) FROM range(210000) r(i)").fetchall()
    assert db.query("SELECT count(DISTINCT s) FROM t") == want
    assert db.query("SELECT count(DISTINCT s) FROM t") == want  # from the cache


def test_other_statements_are_duckdbs(db):
    """WHERE, GROUP BY, two items, count(s) without DISTINCT, a numeric column, FILTER, a
    LIMIT: DuckDB runs them (nothing prepared here), and answers as ever."""
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t SELECT i, (i % 5)::VARCHAR FROM range(100) r(i)")
    for sql, want in [
        ("SELECT count(DISTINCT s) FROM t WHERE k < 3", [(3,)]),
        ("SELECT count(DISTINCT s) FROM t GROUP BY k % 2 ORDER BY 1", [(5,), (5,)]),
        ("SELECT count(DISTINCT s), count(*) FROM t", [(5, 100)]),
        ("SELECT count(s) FROM t", [(100,)]),
        ("SELECT count(DISTINCT k) FROM t", [(100,)]),
        ("SELECT count(DISTINCT s) FILTER (WHERE k > 97) FROM t", [(2,)]),
        ("SELECT count(DISTINCT s) FROM t LIMIT 1", [(5,)]),
        ("SELECT count(DISTINCT s || 'x') FROM t", [(5,)]),
    ]:
        prepared = db._prepare(sql)
        db._release()
        assert not isinstance(prepared, DistinctCount), sql
        assert db.query(sql) == want, sql


def test_under_a_collation_duckdb_counts(db):
    """SET default_collation = 'nocase': 'a' and 'A' are one value to DuckDB, so the count
    is DuckDB's (the set compares bytes)."""
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.insert("t", pa.table({"k": [1, 2, 3], "s": ["a", "A", "b"]}))
    assert db.query("SELECT count(DISTINCT s) FROM t") == [(3,)]
    db.sql("SET default_collation = 'nocase'")
    assert db.query("SELECT count(DISTINCT s) FROM t") == \
        duckdb.sql("SELECT count(DISTINCT s COLLATE nocase) FROM "
                   "(VALUES ('a'), ('A'), ('b')) v(s)").fetchall() == [(2,)]


def test_without_the_c_set_duckdb_counts(db, monkeypatch):
    monkeypatch.setattr(_distinct, "_SET", None)
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.insert("t", pa.table({"k": [1, 2, 3, 4], "s": ["a", None, "a", ""]}))
    prepared = db._prepare("SELECT count(DISTINCT s) FROM t")
    db._release()
    assert isinstance(prepared, str)
    assert db.query("SELECT count(DISTINCT s) FROM t") == [(2,)]


def test_a_count_past_memory_limit_fails_clearly(tmp_path):
    """The set's bytes count against memory_limit: over it, the DatabaseError of any query
    that needs more memory than memory_limit; raised, it answers again."""
    with cryptdisk.connect(tmp_path / "db", memory_limit="4MB", cache_bytes=0) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR) FROM range(200000) r(i)")
        with pytest.raises(DatabaseError, match="memory_limit") as info:
            db.query("SELECT count(DISTINCT s) FROM t")
        assert "spill" in str(info.value) and "memory_limit" in (info.value.hint or "")
        db.sql("SET memory_limit = '256MB'")
        assert db.query("SELECT count(DISTINCT s) FROM t") == [(200000,)]


def test_many_rows_of_few_values_count_within_a_small_memory_limit(tmp_path):
    """The set's tables are sized from the table's rows, but never past a quarter of
    memory_limit: 400K rows of 12 values count at 4MB (tables sized for every row would
    take 4.6MB)."""
    with cryptdisk.connect(tmp_path / "db", memory_limit="4MB", cache_bytes=0) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        db.sql("INSERT INTO t SELECT i, md5((i % 12)::VARCHAR) FROM range(400000) r(i)")
        assert db.query("SELECT count(DISTINCT s) FROM t") == [(12,)]


def test_rows_many_times_the_values_count_whatever_counts_with_tables_doubled(tmp_path):
    """Tables sized for the rows take bytes of memory_limit that the values' copies may
    need: 30,000 values of 192 bytes in 400K rows counted at 10MB before the tables were
    sized from the rows, so they still count (the sized tables shrink at the limit)."""
    with cryptdisk.connect(tmp_path / "db", memory_limit="10MB", cache_bytes=0) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        db.sql("INSERT INTO t SELECT i, repeat(md5((i % 30000)::VARCHAR), 6) "
               "FROM range(400000) r(i)")
        assert db.query("SELECT count(DISTINCT s) FROM t") == [(30000,)]

def test_a_tampered_part_fails_the_count(tmp_path, db):
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR) FROM range(20000) r(i)")
    (path,) = db.query("SELECT path FROM system.parts")[0]
    full = tmp_path / "db" / "data" / path
    data = bytearray(full.read_bytes())
    data[len(data) // 2] ^= 1
    full.write_bytes(bytes(data))
    db.cache.clear()
    with pytest.raises(AuthenticationError):
        db.query("SELECT count(DISTINCT s) FROM t")


def test_readers_count_at_once(db):
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t SELECT i, (i % 3000)::VARCHAR FROM range(50000) r(i)")
    got: list = []

    def run() -> None:
        r = db.reader()
        try:
            got.extend(r.query("SELECT count(DISTINCT s) FROM t") for _ in range(3))
        finally:
            r.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [[(3000,)]] * 9


@needs_set
@pytest.mark.parametrize("how", ["database", "reader"])
def test_an_interrupt_stops_the_count(db, monkeypatch, how):
    """As DuckDB's interrupt: the statement fails with its error; the next one answers."""
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t SELECT i, (i % 1000)::VARCHAR FROM range(300000) r(i)")
    runner = db if how == "database" else db.reader()
    started, asked, add = threading.Event(), threading.Event(), _distinct._add

    def gated_add(seen, arr):
        # every batch waits until the interrupt has been asked for: it lands while the
        # count runs, however late the interrupting thread is scheduled
        started.set()
        asked.wait(30)
        return add(seen, arr)

    monkeypatch.setattr(_distinct, "_add", gated_add)

    def interrupt() -> None:
        started.wait(30)
        runner.interrupt()
        asked.set()

    th = threading.Thread(target=interrupt)
    th.start()
    try:
        with pytest.raises(DatabaseError, match=r"(?i)interrupt"):
            runner.query("SELECT count(DISTINCT s) FROM t")
    finally:
        th.join()
    monkeypatch.setattr(_distinct, "_add", add)
    assert runner.query("SELECT count(DISTINCT s) FROM t") == [(1000,)]
    if runner is not db:
        runner.close()


def test_count_distinct_item_reads_the_parse_tree():
    schema = pa.schema([("k", pa.int64()), ("s", pa.string()), ("Weird Col", pa.binary())])
    con = parser_cursor(duckdb.connect())

    def item(sql):
        return count_distinct_item(parse_tree(con, sql), "t", schema)

    assert item("SELECT count(DISTINCT s) FROM t") == ("s", "count(DISTINCT s)")
    assert item("SELECT count(DISTINCT t.S) AS n FROM t") == ("s", "n")
    assert item('SELECT count(DISTINCT "Weird Col") FROM t') == \
        ("Weird Col", 'count(DISTINCT "Weird Col")')
    for sql in ["SELECT count(DISTINCT k) FROM t", "SELECT count(s) FROM t",
                "SELECT count(DISTINCT s) FROM u", "SELECT count(DISTINCT u.s) FROM t",
                "SELECT count(DISTINCT s) FROM main.t", "SELECT count(DISTINCT s) FROM t x(a)",
                "SELECT count(DISTINCT s ORDER BY s) FROM t",
                "WITH c AS (SELECT 1) SELECT count(DISTINCT s) FROM t",
                "SELECT DISTINCT count(DISTINCT s) FROM t",
                "SELECT count(DISTINCT s) FROM t HAVING count(*) > 1"]:
        assert item(sql) is None, sql


def test_memory_limit_bytes_reads_duckdbs_setting():
    """As DuckDB reports it: a tenth of its unit (2GB reads as 1.8 GiB)."""
    con = duckdb.connect()
    for text, size in [("100MB", 100_000_000), ("2GB", 2_000_000_000), ("500KB", 500_000)]:
        con.execute(f"SET memory_limit = '{text}'")
        assert abs(memory_limit_bytes(con) - size) <= 0.05 * size


def _buffers(arr):
    validity, offsets, data = arr.buffers()[:3]
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    return offsets, data if data is not None else b"", validity, arr.offset, len(arr), wide


@needs_set
@pytest.mark.parametrize("typ", [pa.string(), pa.large_string(), pa.binary()])
def test_the_c_set_counts_slices_nulls_and_duplicates(typ):
    values = ["a", None, "", "a", "bb", None, "x" * 100, "bb", "é"]
    if pa.types.is_binary(typ):
        values = [None if v is None else v.encode() for v in values]
    arr = pa.array(values, typ)
    for start in range(len(values)):
        part = arr.slice(start)
        seen = _distinct._SET(1 << 20, int.from_bytes(os.urandom(8), "little"))
        assert seen.add(*_buffers(part)) is True
        assert seen.count() == len({v for v in values[start:] if v is not None})
        assert seen.add(*_buffers(part)) is True  # all seen: nothing more
        assert seen.count() == len({v for v in values[start:] if v is not None})


@needs_set
def test_the_c_set_refuses_buffers_that_do_not_fit():
    seen = _distinct._SET(1 << 20, 7)
    arr = pa.array(["abc", "de"])
    offsets, data, _v, _o, n, _w = _buffers(arr)
    with pytest.raises(ValueError, match="offsets"):
        seen.add(offsets, data, None, 0, n + 5, False)  # past the offsets
    with pytest.raises(ValueError, match="offsets"):
        seen.add(offsets, b"ab", None, 0, n, False)  # values past the data
    with pytest.raises(ValueError, match="negative"):
        seen.add(offsets, data, None, -1, n, False)
    assert seen.count() == 0


@needs_set
def test_the_c_set_stops_at_its_limit():
    seen = _distinct._SET(64 * 1024, 7)
    arr = pa.array([f"value {i:08d}" for i in range(100_000)])
    assert seen.add(*_buffers(arr)) is False
    assert 0 < seen.count() < 100_000 and seen.nbytes() <= 64 * 1024


@needs_set
def test_the_c_set_sizes_its_tables_from_the_rows_expected():
    """expect: the tables are made at once for that many values (not doubled as they
    fill: the bytes held grow by the copies alone), never past a quarter of the limit;
    fewer values than expected (or none) count exactly."""
    arr = pa.array([f"value {i:08d}" for i in range(100_000)])
    seen = _distinct._SET(1 << 30, 7, expect=100_000)
    assert seen.add(*_buffers(arr.slice(0, 1))) is True
    tables = seen.nbytes() - 4096  # (the first value's partition: a first arena chunk)
    assert tables >= 100_000 * 10 // 7 // 256 * 8  # (its partition's share, 70% full)
    assert seen.add(*_buffers(arr)) is True and seen.count() == 100_000
    copies = sum(4 + (len(v) + 3) // 4 * 4 for v in arr.to_pylist())
    assert tables * 256 < seen.nbytes() <= tables * 256 + 2 * copies + 256 * 4096
    unsized = _distinct._SET(1 << 30, 7)
    assert unsized.add(*_buffers(arr.slice(0, 1))) is True
    assert unsized.nbytes() - 4096 <= tables // 8

    repeated = _distinct._SET(1 << 30, 7, expect=10**9)  # more rows than values
    for _ in range(3):
        assert repeated.add(*_buffers(arr.slice(0, 500))) is True
    assert repeated.count() == 500 and repeated.nbytes() <= (1 << 30) // 4 + 256 * 8192
    empty = _distinct._SET(1 << 30, 7, expect=10**6)
    assert empty.add(*_buffers(pa.array([], pa.string()))) is True
    assert empty.count() == 0 and empty.nbytes() == 0


@needs_set
def test_the_c_set_sized_past_its_limit_still_stops_at_it():
    """Rows expected whose tables would pass the limit: the tables shrink to a quarter of
    it, and values past the limit are refused as without expect."""
    seen = _distinct._SET(64 * 1024, 7, expect=10**9)
    arr = pa.array([f"value {i:08d}" for i in range(100_000)])
    assert seen.add(*_buffers(arr)) is False
    assert 0 < seen.count() < 100_000 and seen.nbytes() <= 64 * 1024


@needs_set
@pytest.mark.parametrize("threads", [1, 4])
def test_the_c_set_sized_from_rows_holds_what_it_holds_unsized(threads):
    """A set sized for many more rows than it gets values holds, within its limit, every
    value a set doubling its tables holds (its tables shrink to the doubled sizes at the
    limit, then grow by doubling), on one thread or several adding at once; past what
    either holds both stop."""
    values = pa.array([f"{i:08d}" * 25 for i in range(22_000)])  # 200 bytes each
    limit = 8 << 20
    unsized = _distinct._SET(limit, 7)
    assert unsized.add(*_buffers(values)) is True and unsized.count() == 22_000
    sized = _distinct._SET(limit, 7, expect=10**8)
    chunks = [values.slice(k, 1000) for k in range(0, len(values), 1000)]
    added = []
    workers = [threading.Thread(target=lambda k=k: added.extend(
        sized.add(*_buffers(c)) for c in chunks[k::threads])) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert all(added) and sized.count() == 22_000 and sized.nbytes() <= limit
    assert sized.add(*_buffers(values)) is True and sized.count() == 22_000  # (no change)
    more = pa.array([f"{i:08d}" * 25 for i in range(22_000, 60_000)])
    assert sized.add(*_buffers(more)) is False and unsized.add(*_buffers(more)) is False
    assert sized.nbytes() <= limit
