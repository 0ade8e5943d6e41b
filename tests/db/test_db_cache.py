"""The decoded row-group cache: admitted on the second offer, bounded, scan-resistant."""

import pyarrow as pa

import cryptdisk
from cryptdisk.db import ColumnCache


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
    other = cache.new_statement()
    for _ in range(2):
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
