"""The decoded row-group cache: admitted on the second offer, bounded, scan-resistant."""

import pyarrow as pa

import cryptdisk
from cryptdisk.db import ColumnCache
from cryptdisk.db._cache import measured_size


def _entry() -> pa.ChunkedArray:
    return pa.chunked_array([pa.array(range(128), pa.int64())])  # 1 KiB


def _run(cache: ColumnCache, keys: range) -> int:
    """One statement scanning ``keys`` in order, as a scan does: get, else read and put."""
    statement = cache.new_statement()
    hits = cache.hits
    for k in keys:
        if statement.get(str(k), "c") is None:
            statement.put(str(k), "c", _entry())
    statement.end()
    return cache.hits - hits


def test_a_running_statements_entries_are_evicted_for_no_other():
    """Two statements at once (readers): what the one still running kept stays while the
    other fills the cache; once it ends, its entries go first."""
    cache = ColumnCache(4 * 1024)
    _run(cache, range(2))  # 0 and 1 offered, then kept by the next
    long = cache.new_statement()
    for k in range(2):
        long.get(str(k), "c") or long.put(str(k), "c", _entry())
    _run(cache, range(10, 14))  # 10-13 offered by a statement that ended
    other = cache.new_statement()
    for k in range(10, 14):
        if other.get(str(k), "c") is None:
            other.put(str(k), "c", _entry())
    assert sorted(int(k) for k, _c in cache._items) == [0, 1, 10, 11]  # 12, 13 left out
    assert cache.evictions == 0
    long.end()
    for k in (12, 13):
        other.put(str(k), "c", _entry())
    assert sorted(int(k) for k, _c in cache._items) == [10, 11, 12, 13]
    assert cache.evictions == 2 and cache.size <= cache.bound
    other.end()


def test_a_scan_larger_than_the_cache_keeps_its_first_row_groups_and_stops_churning():
    """10 row groups, room for 4: the second run keeps the first 4 and leaves the rest out
    (evicting its own would let every later run evict what the next one reads first);
    later runs answer those 4 from the cache and evict nothing."""
    cache = ColumnCache(4 * 1024)
    assert _run(cache, range(10)) == 0  # first offers: nothing kept
    assert _run(cache, range(10)) == 0
    assert sorted(int(k) for k, _c in cache._items) == [0, 1, 2, 3]
    for _ in range(3):
        assert _run(cache, range(10)) == 4
    assert cache.evictions == 0 and cache.size <= cache.bound


def test_another_statement_evicts_the_least_recently_used():
    cache = ColumnCache(4 * 1024)
    for _ in range(2):
        _run(cache, range(4))  # 0-3 kept
    for _ in range(2):
        _run(cache, range(10, 12))  # a later statement: its row groups push 0 and 1 out
    assert sorted(int(k) for k, _c in cache._items) == [2, 3, 10, 11]
    assert cache.evictions == 2


def test_repeats_of_a_scan_larger_than_the_cache_hit_the_same_row_groups(tmp_path):
    """10 row groups of about 512 KiB, room for 6. The scan reads on two threads, so which
    6 the second run keeps, and the order later runs touch them in, vary a little: a row
    group may still push out one not yet read by the same run, a few times at most (an
    LRU evicted at every run)."""
    with cryptdisk.connect(tmp_path / "db", cache_bytes=3 << 20) as db:
        db.sql("CREATE TABLE t (c_int BIGINT) ORDER BY c_int")
        db.sql("INSERT INTO t SELECT i FROM range(655360) r(i)")
        hits = []
        for _ in range(6):
            before = db.cache.hits
            assert db.query("SELECT sum(c_int) FROM t") == [(sum(range(655360)),)]
            hits.append(db.cache.hits - before)
        assert hits[:2] == [0, 0] and min(hits[2:]) >= 4, hits
        assert db.cache.evictions <= 3, db.cache.evictions


def test_a_statement_that_reads_an_entry_twice_keeps_nothing():
    """Two scans of one table in a statement (a self-join, two subqueries) offer each row
    group twice: neither offer keeps it, so a cold statement holds what it holds with the
    cache off; the next statement's read keeps it, and the one after answers from it."""
    cache = ColumnCache(64 * 1024)
    statement = cache.new_statement()
    for _scan in range(2):
        for k in range(4):
            assert statement.get(str(k), "c") is None
            statement.put(str(k), "c", _entry())
    assert not statement.offered("0", "c")  # offered by this statement only
    statement.end()
    assert len(cache) == 0 and cache.size == 0
    assert _run(cache, range(4)) == 0  # a second statement: kept
    assert len(cache) == 4 and cache.size == 4 * measured_size(_entry())
    assert _run(cache, range(4)) == 4


def test_a_later_statement_keeps_what_a_running_one_read_twice():
    """Statements at once (readers): the first one's second read keeps nothing, a read
    by another that started meanwhile keeps."""
    cache = ColumnCache(64 * 1024)
    first = cache.new_statement()
    first.put("0", "c", _entry())
    second = cache.new_statement()
    assert second.offered("0", "c") and not first.offered("0", "c")
    first.put("0", "c", _entry())
    assert len(cache) == 0
    second.put("0", "c", _entry())
    assert len(cache) == 1
    first.end()
    second.end()


def test_a_granule_read_counts_as_the_statements_first_offer():
    cache = ColumnCache(64 * 1024)
    statement = cache.new_statement()
    statement.offer("0", "c")
    assert not statement.offered("0", "c")
    statement.put("0", "c", _entry())  # the same statement reads it whole: not kept
    assert len(cache) == 0
    statement.end()
    later = cache.new_statement()
    assert later.offered("0", "c")
    later.put("0", "c", _entry())
    assert len(cache) == 1
    later.end()


def test_offers_outside_a_statement_keep_from_the_second():
    """ColumnCache used directly (no statement): the second offer keeps, as it does for
    arrow_table and read_part calls."""
    cache = ColumnCache(64 * 1024)
    cache.put("0", "c", _entry())
    assert cache.offered("0", "c") and len(cache) == 0
    cache.put("0", "c", _entry())
    assert len(cache) == 1


def test_a_cold_statement_scanning_a_table_twice_fills_nothing(tmp_path):
    sql = ("SELECT (SELECT count(DISTINCT c_str) FROM t) AS n, "
           "(SELECT max(c_str) FROM t) AS m, (SELECT sum(c_int) FROM t) AS s")
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR) ORDER BY c_int")
        db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR) FROM range(200000) r(i)")
    with cryptdisk.connect(tmp_path / "db", read_only=True, cache_bytes=0) as off:
        expected = off.query(sql)
    with cryptdisk.connect(tmp_path / "db", read_only=True) as db:
        assert db.query(sql) == expected
        assert len(db.cache) == 0 and db.cache.size == 0 and db.cache.peak == 0
        assert db.query(sql) == expected  # a second statement: kept
        assert {c for _k, c in db.cache._items} == {"c_int", "c_str"}
        hits = db.cache.hits
        assert db.query(sql) == expected  # answered from the cache
        assert db.cache.hits > hits


def test_repeated_reads_outside_sql_fill_the_cache(tmp_path):
    """arrow_table and read_part calls keep from the second on."""
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR) ORDER BY c_int")
        db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR) FROM range(50000) r(i)")
        first = db.arrow_table("t", ["c_str"])
        assert len(db.cache) == 0
        assert db.arrow_table("t", ["c_str"]).equals(first)
        assert {c for _k, c in db.cache._items} == {"c_str"}
        db.cache.clear()
        part = db.scan_plan("t")[0][0]
        one = db.read_part("t", part, ["c_int"])
        assert len(db.cache) == 0
        assert db.read_part("t", part, ["c_int"]).equals(one)
        assert {c for _k, c in db.cache._items} == {"c_int"}
