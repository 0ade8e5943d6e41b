"""Inserts sorted a block at a time (cryptdisk.db._blocks): same rows, sorted parts, memory."""

import itertools
import math
import subprocess
import sys
import textwrap

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.db import _blocks, _insert, _parts

_FLOATS = st.one_of(st.none(), st.just(math.nan), st.sampled_from([-2.5, -0.0, 1.0, 3.25]))
_ROWS = st.lists(st.tuples(st.one_of(st.none(), st.integers(-20, 20)),
                           st.one_of(st.none(), st.text("abc", max_size=3)), _FLOATS),
                 max_size=120)
_QUERIES = [
    "SELECT k, s, f FROM {t} ORDER BY ALL",
    "SELECT k, s, f FROM {t} WHERE k = 3 ORDER BY ALL",
    "SELECT k, s, f FROM {t} WHERE k BETWEEN -4 AND 6 ORDER BY ALL",
    "SELECT count(*), count(k), sum(k), count(f) FROM {t} WHERE s >= 'b'",
    "SELECT k FROM {t} ORDER BY k NULLS FIRST LIMIT 3",
    "SELECT f FROM {t} ORDER BY f DESC NULLS LAST LIMIT 3",
]


def _norm(rows):
    return [tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in r)
            for r in rows]


def _rank(v):
    """DuckDB's ascending order of one value: numbers and strings, then NaN, then NULL."""
    if v is None:
        return (2, 0)
    if isinstance(v, float) and math.isnan(v):
        return (1, 0)
    return (0, v)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    d = cryptdisk.connect(tmp_path_factory.mktemp("blocks") / "db", insert_block_bytes=600)
    yield d
    d.close()


_COUNTER = iter(range(10**9))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inserts=st.lists(_ROWS, min_size=1, max_size=3),
       order_by=st.sampled_from(["k", "(k, s)", "s", "f", "(s, k)", None]),
       presorted=st.booleans(), plain=st.booleans(), threads=st.sampled_from([1, 2, 3]))
def test_results_equal_duckdb_and_each_part_is_sorted(shared, inserts, order_by, presorted,
                                                       plain, threads):
    """Blocks of a few rows (insert_block_bytes=600, batches of 5 rows, row groups of 7), on
    1-3 threads: the table holds exactly the rows inserted, queries answer as DuckDB does
    on the same rows, and every part is sorted by the ORDER BY."""
    db = shared
    cols = order_by.strip("()").split(", ") if order_by else []
    pos = {"k": 0, "s": 1, "f": 2}
    if presorted and cols:
        inserts = [sorted(rows, key=lambda r: tuple(_rank(r[pos[c]]) for c in cols))
                   for rows in inserts]
    t = f"t{next(_COUNTER)}"
    old = _parts.ROW_GROUP_ROWS, _insert.BATCH_ROWS
    _parts.ROW_GROUP_ROWS, _insert.BATCH_ROWS = 7, 5
    db.con.execute(f"SET threads = {threads}")
    try:
        db.sql(f"CREATE TABLE {t} (k BIGINT, s VARCHAR, f DOUBLE)"
               f"{' ORDER BY ' + order_by if order_by else ''}"
               f" SETTINGS storage_policy = '{'plain' if plain else 'default'}'")
        for rows in inserts:
            db.insert(t, pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                                   "s": pa.array([r[1] for r in rows], pa.string()),
                                   "f": pa.array([r[2] for r in rows], pa.float64())}))
    finally:
        _parts.ROW_GROUP_ROWS, _insert.BATCH_ROWS = old
    ref = duckdb.connect()
    ref.execute(f"CREATE TABLE {t} (k BIGINT, s VARCHAR, f DOUBLE)")
    for rows in inserts:
        if rows:
            ref.executemany(f"INSERT INTO {t} VALUES (?, ?, ?)", rows)
    for q in _QUERIES:
        sql = q.format(t=t)
        assert _norm(db.query(sql)) == _norm(ref.execute(sql).fetchall()), sql
    parts = db.query(f"SELECT part, rows FROM system.parts WHERE \"table\" = '{t}'")
    assert sum(n for _p, n in parts) == sum(len(r) for r in inserts)
    for part, _n in parts:
        got = db.read_part(t, part).to_pylist()
        keys = [tuple(_rank(r[c]) for c in cols) for r in got]
        assert keys == sorted(keys), (order_by, part)
    db.sql(f"DROP TABLE {t}")


def test_sorted_input_becomes_disjoint_parts_without_a_sort(tmp_path, monkeypatch):
    """Input already in key order: blocks go on at the end of the part being written (no
    sort), parts hold up to PART_ROWS rows and their key ranges do not overlap. Unsorted
    input: one sorted part per block, all published in one commit."""
    from cryptdisk.db import _blocks

    monkeypatch.setattr(_insert, "PART_ROWS", 300_000)
    sorts = []
    real = _blocks._sorted_pieces
    monkeypatch.setattr(_blocks, "_sorted_pieces",
                        lambda b, o, n: sorts.append(b.num_rows) or real(b, o, n))
    path = tmp_path / "db"
    with cryptdisk.connect(path, insert_block_bytes=1 << 20) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        version = db.catalog.version
        db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR) FROM range(600000) r(i)")
        parts = db.query("SELECT rows, key_min::BIGINT, key_max::BIGINT FROM system.parts "
                         "ORDER BY 2")
        assert sorts == []
        # blocks of one 131072-row batch (over 1 MiB), two to a part: at most PART_ROWS
        assert [p[0] for p in parts] == [262144, 262144, 75712]
        assert all(a[2] < b[1] for a, b in itertools.pairwise(parts))
        assert db.catalog.version == version + 1

        db.sql("CREATE TABLE u (k BIGINT, s VARCHAR) ORDER BY k")
        version = db.catalog.version
        db.sql("INSERT INTO u SELECT hash(i) // 2, md5(i::VARCHAR) FROM range(250000) r(i)")
        n = db.query("SELECT count(*), sum(rows)::BIGINT FROM system.parts "
                     "WHERE \"table\" = 'u'")[0]
        assert n == (len(sorts), 250000) and n[0] >= 2  # one part per block, each sorted
        assert db.catalog.version == version + 1  # one commit for all of them
        assert db.query("SELECT count(*) FROM u WHERE k = (SELECT min(k) FROM u)") == [(1,)]


def test_an_error_in_a_block_publishes_nothing(tmp_path, monkeypatch):
    """A part's thread failing mid-insert: no part of the insert is in the catalog, and the
    connection can run the next statement (DuckDB's result was closed)."""
    from cryptdisk.db import _blocks

    def fail(block, order, rows):
        raise OSError("disk full")

    with cryptdisk.connect(tmp_path / "db", insert_block_bytes=1 << 20) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        monkeypatch.setattr(_blocks, "_sorted_pieces", fail)
        with pytest.raises(OSError, match="disk full"):
            db.sql("INSERT INTO t SELECT hash(i) // 2, md5(i::VARCHAR) FROM range(200000) r(i)")
        monkeypatch.undo()
        assert db.query("SELECT count(*) FROM t") == [(0,)]
        db.sql("INSERT INTO t VALUES (1, 'a')")
        assert db.query("SELECT count(*), count(*) FILTER (k = 1) FROM t") == [(1, 1)]


_MEM_CHILD = textwrap.dedent("""
    import sys, cryptdisk
    def hwm():
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
    db = cryptdisk.connect(sys.argv[1], memory_limit="256MB", threads=2,
                           insert_block_bytes=8 << 20)
    db.con.execute("SET enable_progress_bar = false")
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
    db.sql("INSERT INTO t VALUES (1, 'a', 1)")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here on: the insert's peak
    db.sql(f"INSERT INTO t SELECT hash(i) // 2, md5(i::VARCHAR), i / 7 "
           f"FROM range({int(sys.argv[2])}) r(i)")
    print(hwm(), db.query("SELECT count(*) FROM t")[0][0])
""")


@pytest.mark.slow
def test_an_insert_peaks_at_the_same_memory_whatever_its_rows(tmp_path):
    """An insert of random keys, 1M and 3M rows (about 53 and 159 MB of Arrow data), in a
    child process with insert_block_bytes=8 MiB and memory_limit='256MB': its peak RSS does
    not grow with the rows (the whole-insert sort it replaces did not fit 3M rows)."""
    peaks = {}
    for rows in (1_000_000, 3_000_000):
        proc = subprocess.run([sys.executable, "-c", _MEM_CHILD, str(tmp_path / f"db{rows}"),
                               str(rows)], capture_output=True, text=True, timeout=600,
                              check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        peak, count = map(int, proc.stdout.split())
        assert count == rows + 1
        peaks[rows] = peak
    # Materialising the insert would add at least the extra 106 MB of Arrow data (159 - 53);
    # a streamed insert's peak varies with how its blocks and parts overlap in time (6-45 MB
    # between 1M and 3M rows in idle runs, 58 MB in a CI run), so the margin is 80 MB.
    assert peaks[3_000_000] < peaks[1_000_000] + (80 << 20), peaks
    assert peaks[3_000_000] < 600 << 20, peaks


_KEY_TYPES = {
    "int8": (pa.int8(), st.integers(-128, 127)),
    "int64": (pa.int64(), st.integers(-2**63, 2**63 - 1)),
    "int64 narrow": (pa.int64(), st.integers(-3, 3)),
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "uint16": (pa.uint16(), st.integers(0, 2**16 - 1)),
    "float64": (pa.float64(), st.one_of(st.floats(allow_nan=True), st.just(-0.0),
                                        st.just(0.0), st.just(math.nan))),
    "float32": (pa.float32(), st.floats(width=32, allow_nan=True)),
    "timestamp": (pa.timestamp("us"), st.integers(-2**63 + 1, 2**63 - 1)),
    "date32": (pa.date32(), st.integers(-2**31, 2**31 - 1)),
}


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(sorted(_KEY_TYPES)), data=st.data(),
       outlier=st.sampled_from([None, 0, -1]))
def test_a_numeric_key_sorts_as_arrows_stable_sort(kind, data, outlier):
    """One key column without NULLs (numbers, dates, times) is sorted by packing each value
    with its position: the permutation equals Arrow's stable sort_indices exactly (NaN
    above every number, -0.0 equal to 0.0, ties in input order), also when a few extreme
    values leave most keys with the same top bits (the runs sorted again)."""
    import numpy as np
    import pyarrow.compute as pc

    from cryptdisk.db import _blocks

    typ, values = _KEY_TYPES[kind]
    keys = data.draw(st.lists(values, min_size=2, max_size=300))
    if outlier is not None and kind in ("int64", "int64 narrow", "timestamp"):
        keys[outlier] = 2**62  # small keys with one far away: one long run of equal top bits
    arr = pa.array(keys, pa.int64()).view(typ) if kind == "timestamp" else \
        pa.array(keys, pa.int32()).view(typ) if kind == "date32" else pa.array(keys, typ)
    want = pc.array_sort_indices(arr, null_placement="at_end").to_numpy()
    got = _blocks._packed_sort_indices(arr)
    assert got is not None
    assert np.array_equal(got, want), (kind, keys)
    block = pa.table({"k": arr, "i": pa.array(range(len(arr)))})
    assert _blocks._sorted(block, ["k"]).column("i").to_pylist() == want.tolist()
    # the same order a few rows at a time, from a block of several chunks
    cut = data.draw(st.integers(0, len(keys)))
    chunked = pa.concat_tables([block.slice(0, cut), block.slice(cut)])
    rows = data.draw(st.integers(1, 64))
    pieces = list(_blocks._sorted_pieces(chunked, ["k"], rows))
    assert [p.num_rows for p in pieces] == [min(rows, len(keys) - s)
                                           for s in range(0, len(keys), rows)]
    assert pa.concat_tables(pieces).column("i").to_pylist() == want.tolist()


def test_keys_that_need_the_second_sort_of_runs():
    """Many keys sharing their top bits (dense small keys plus the extremes of int64) and
    runs of equal keys: the packed sort's runs are sorted again by the whole value."""
    import numpy as np
    import pyarrow.compute as pc

    from cryptdisk.db import _blocks

    rng = np.random.default_rng(7)
    keys = rng.integers(-1000, 1000, 200_000)
    keys[[5, 77, 1234]] = [-2**63, 2**63 - 1, 2**40]
    arr = pa.array(keys)
    got = _blocks._packed_sort_indices(arr)
    assert np.array_equal(got, pc.array_sort_indices(arr).to_numpy())


@pytest.mark.parametrize("native", [True, False])
def test_the_packed_keys_sort_as_numpy_sorts_them(monkeypatch, native):
    """The C radix sort of packed keys (and numpy's, where it is not built) puts any uint64
    values in numpy's ascending order: random, equal digits (skipped passes), all equal,
    descending, the extremes, none and one value; the C sort refuses other buffers."""
    import numpy as np

    from cryptdisk.db import _blocks

    if native:
        if _blocks._csort is None:  # as tests/format/test_cseal.py: optional extension
            pytest.skip("cryptdisk.db._csort not built")
    else:
        monkeypatch.setattr(_blocks, "_csort", None)
    rng = np.random.default_rng(11)
    cases = [rng.integers(0, 2**64 - 1, 100_003, dtype=np.uint64, endpoint=True),
             rng.integers(0, 300, 5000, dtype=np.uint64) << np.uint64(24),
             np.full(77, 2**63 + 5, dtype=np.uint64),
             np.arange(4000, dtype=np.uint64)[::-1].copy(),
             np.array([2**64 - 1, 0, 2**63, 1, 2**64 - 1], dtype=np.uint64),
             np.array([], dtype=np.uint64), np.array([9], dtype=np.uint64)]
    for values in cases:
        want = np.sort(values)
        _blocks._sort_u64(values)
        assert np.array_equal(values, want)
    if native:
        with pytest.raises(TypeError):
            _blocks._csort.sort_u64(np.zeros(4, dtype=np.int32))
        with pytest.raises((TypeError, ValueError, BufferError)):
            _blocks._csort.sort_u64(np.zeros(8, dtype=np.uint64)[::2])
        with pytest.raises((TypeError, BufferError)):
            _blocks._csort.sort_u64(b"\0" * 16)  # read-only


def test_the_c_sort_by_the_bits_above_low_keeps_the_order_of_values_equal_there():
    """``sort_u64(values, low)`` sorts by the bits from ``low`` up only, stably: values equal
    there keep their order whatever their low bits (so packed keys whose positions are
    ascending come out fully sorted, as numpy sorts them, with fewer passes); a ``low``
    outside 0..63 is refused."""
    import numpy as np

    from cryptdisk.db import _blocks

    if _blocks._csort is None:
        pytest.skip("cryptdisk.db._csort not built")
    high = np.array([3, 1, 3, 0, 1, 3], dtype=np.uint64) << np.uint64(20)
    low = np.array([9, 8, 7, 6, 5, 4], dtype=np.uint64)  # descending: kept where tied
    values = high | low
    _blocks._csort.sort_u64(values, 20)
    assert values.tolist() == [(0 << 20) | 6, (1 << 20) | 8, (1 << 20) | 5, (3 << 20) | 9,
                               (3 << 20) | 7, (3 << 20) | 4]
    rng = np.random.default_rng(5)
    for n, top in [(300_001, 2**44 - 1), (70_000, 1000), (5, 2**44 - 1)]:
        b = (n - 1).bit_length()  # as _packed_sort_indices packs: key bits, then positions
        packed = (rng.integers(0, top, n, dtype=np.uint64, endpoint=True) << np.uint64(b)
                  ) | np.arange(n, dtype=np.uint64)
        want = np.sort(packed)
        _blocks._sort_u64(packed, b)
        assert np.array_equal(packed, want)
    for bad in (-1, 64):
        with pytest.raises(ValueError, match="low"):
            _blocks._csort.sort_u64(np.zeros(4, dtype=np.uint64), bad)


@pytest.mark.parametrize("typ", [pa.string(), pa.binary(), pa.large_string(),
                                 pa.large_binary()])
def test_values_of_one_length_are_taken_as_fixed_width_with_the_same_result(typ):
    """A string or binary column whose values in a block all have one byte length is taken
    in key order as fixed-size binary over the same bytes: the pieces equal the general
    take's, of the column's own type, from a block of several chunks sliced off its first
    rows; a column with another length, a NULL or only empty values takes the general
    path."""
    import numpy as np

    from cryptdisk.db import _blocks

    rng = np.random.default_rng(5)
    n = 5000
    same = [f"{v:08x}" for v in rng.integers(0, 2**32, n)]
    cases = {"same": (same, 8), "one longer": ([*same[:-1], "123456789"], 0),
             "a null": ([*same[:10], None, *same[11:]], 0), "empty": ([""] * n, 0)}
    for name, (values, width) in cases.items():
        binary = pa.types.is_binary(typ) or pa.types.is_large_binary(typ)
        data = [v.encode() if v is not None and binary else v for v in values]
        block = pa.table({"k": rng.integers(-50, 50, n), "s": pa.array(data, typ),
                          "i": np.arange(n)}).slice(3)
        chunked = pa.concat_tables([block.slice(0, 1000), block.slice(1000)])
        assert _blocks._equal_width(chunked.combine_chunks().column("s").chunk(0)) == width, name
        want = _blocks._sorted(chunked, ["k"])
        pieces = list(_blocks._sorted_pieces(chunked, ["k"], 1024))
        got = pa.concat_tables(pieces)
        assert got.schema == chunked.schema, name
        assert got.equals(want), name
        for piece in pieces:
            piece.validate(full=True)


def test_keys_with_nulls_or_of_other_types_keep_arrows_sort():
    """A key with NULLs, or a string, decimal or boolean key, has no packed order: Arrow
    sorts it (NULLs last)."""
    import decimal

    from cryptdisk.db import _blocks

    for arr in (pa.array([3, None, 1]), pa.array(["b", "a"]), pa.array([True, False]),
                pa.array([decimal.Decimal("1.5"), decimal.Decimal("0.5")])):
        assert _blocks._order_bits(arr) is None
        assert _blocks._packed_sort_indices(arr) is None
    block = pa.table({"k": pa.array([3, None, 1, 2])})
    assert _blocks._sorted(block, ["k"]).column("k").to_pylist() == [1, 2, 3, None]


def _leaves(db, table, skip=()):
    """Each part's columns as Parquet stores them: {column: max definition level} (0 is
    REQUIRED), in key order of the parts (those of ``skip``'s ids left out)."""
    found = []
    for part in sorted(db.table(table).parts, key=lambda p: (p.key_min is None, p.key_min)):
        if part.id in skip:
            continue
        meta = db._open_parts.get(part).meta
        found.append({meta.schema.column(j).name: meta.schema.column(j).max_definition_level
                      for j in range(meta.num_columns)})
    return found


@pytest.mark.parametrize("plain", [False, True])
def test_an_insert_writes_the_columns_a_block_has_no_null_in_as_required(tmp_path, plain):
    """Each part stores as Parquet REQUIRED the columns its rows hold no NULL in, as OPTIMIZE
    does: blocks with and without NULLs in one table (one insert of sorted input, whose
    chaining stops at a block with a NULL where the part has none, and one of random keys,
    a part per block), queries equal DuckDB's, the table's columns stay nullable, and
    merging REQUIRED with OPTIONAL parts keeps every row."""
    policy = " SETTINGS storage_policy = 'plain'" if plain else ""
    ref = duckdb.connect()
    with cryptdisk.connect(tmp_path / "db", insert_block_bytes=1 << 20) as db:
        db.sql(f"CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k{policy}")
        # sorted: blocks of 131072 rows; the third holds the only NULLs of f
        src = ("SELECT i::BIGINT k, md5(i::VARCHAR) s, CASE WHEN i = 300000 THEN NULL "
               "ELSE i / 7 END f FROM range(400000) r(i)")
        db.sql(f"INSERT INTO t {src}")
        assert _leaves(db, "t") == [{"k": 0, "s": 0, "f": 0}, {"k": 0, "s": 0, "f": 1}]
        assert [p.rows for p in sorted(db.table("t").parts, key=lambda p: p.key_min)] == \
            [262144, 137856]
        # random keys, a part per block; NULLs of s in one block only, NULL keys in another
        rnd = ("SELECT CASE WHEN i = 399999 THEN NULL ELSE hash(i) // 2 END k, "
               "CASE WHEN i < 1000 AND i % 3 = 0 THEN NULL ELSE md5(i::VARCHAR) END s, "
               "i / 3 f FROM range(400000) r(i)")
        first = {p.id for p in db.table("t").parts}
        db.sql(f"INSERT INTO t {rnd}")
        new = _leaves(db, "t", first)
        assert len(new) >= 3
        assert {"k": 0, "s": 1, "f": 0} in new and {"k": 1, "s": 0, "f": 0} in new
        assert all(leaves["f"] == 0 for leaves in new)
        ref.execute(f"CREATE TABLE t AS {src} UNION ALL {rnd}")
        queries = ["SELECT count(*), count(k), count(s), count(f), sum(k % 1000), max(s), "
                   "min(f), max(f) FROM {}",
                   "SELECT k, s, f FROM {} WHERE k IN (5, 299999, 300000, 300001) ORDER BY 1",
                   "SELECT k, s, f FROM {} WHERE k IS NULL OR s IS NULL OR f IS NULL "
                   "ORDER BY ALL",
                   "SELECT k, f FROM {} ORDER BY f DESC NULLS FIRST, k LIMIT 3"]

        def same():
            db.cache.clear()
            for q in queries:
                assert db.query(q.format("t")) == ref.execute(q.format("t")).fetchall(), q

        same()
        # the table's columns stay nullable: DESCRIBE and system.parts say the table's
        assert [r[2] for r in db.query("DESCRIBE t")] == ["YES"] * 3
        assert db.query("SELECT sum(rows)::BIGINT FROM system.parts") == [(800000,)]
        before = {p.id for p in db.table("t").parts}
        db.sql("INSERT INTO t VALUES (7, NULL, NULL)")
        ref.execute("INSERT INTO t VALUES (7, NULL, NULL)")
        assert _leaves(db, "t", before) == [{"k": 0, "s": 1, "f": 1}]  # k REQUIRED
        same()
        assert db.check() == len(db.table("t").parts)
        db.optimize("t", final=True)  # REQUIRED and OPTIONAL parts merged
        assert all(leaves == {"k": 1, "s": 1, "f": 1} for leaves in _leaves(db, "t"))
        same()


def test_an_insert_sorted_by_duckdb_writes_null_free_columns_required(tmp_path, monkeypatch):
    """A key Arrow cannot sort (a STRUCT): DuckDB sorts the whole insert and the parts are
    written as the rows stream; each part's columns without NULL are REQUIRED, and a NULL
    after a part's first rows ends that part rather than failing the insert."""
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    monkeypatch.setattr(_insert, "BATCH_ROWS", 1000)
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE w (k STRUCT(a BIGINT), v BIGINT, s VARCHAR) ORDER BY k")
        src = ("SELECT {'a': i} k, i v, CASE WHEN i = 4500 THEN NULL ELSE i::VARCHAR END s "
               "FROM range(6000) r(i)")
        db.sql(f"INSERT INTO w {src}")
        parts = db.table("w").parts
        found = []
        for part in parts:
            meta = db._open_parts.get(part).meta
            found.append((meta.num_rows, [meta.schema.column(j).max_definition_level
                                          for j in range(meta.num_columns)]))
        # k.a: the struct REQUIRED, its field nullable (one definition level)
        assert found == [(4000, [1, 0, 0]), (2000, [1, 0, 1])]
        ref = duckdb.connect()
        q = "SELECT count(*), count(s), sum(v), max(k), min(s) FROM {}"
        assert db.query(q.format("w")) == ref.execute(q.format(f"({src})")).fetchall()


def _mixed_rows(n):
    """``n`` rows with NULLs, NaN, -0.0, repeated and random keys, multi-byte strings."""
    import random

    rnd = random.Random(n)
    return [(rnd.choice([None, rnd.randint(-50, 50), rnd.randint(-2**63, 2**63 - 1)]),
             rnd.choice([None, "", "é" * rnd.randint(1, 3), f"s{rnd.randint(0, 99)}"]),
             rnd.choice([None, math.nan, -0.0, 0.0, rnd.random()])) for _ in range(n)]


def test_arrow_data_of_the_tables_types_is_written_as_it_comes_as_duckdb_reads_it(
        tmp_path, monkeypatch):
    """An Arrow table, batch or reader whose columns are the table's (other order and case,
    one missing) with the same types is written from its own batches, not through DuckDB,
    in batches of a few rows: the table then holds what DuckDB gives for the same data,
    in sorted parts; Arrow data of other types (INTEGER for BIGINT) is read and cast by
    DuckDB, with the same rows."""
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 7)
    monkeypatch.setattr(_insert, "BATCH_ROWS", 5)
    direct = []
    real = _insert._arrow_source
    monkeypatch.setattr(_insert, "_arrow_source",
                        lambda d, s: direct.append(r := real(d, s)) or r)
    rows = _mixed_rows(300)
    same = pa.table({"F": pa.array([r[2] for r in rows], pa.float64()),
                     "k": pa.array([r[0] for r in rows], pa.int64())})
    small = [r for r in rows if r[0] is None or -2**31 <= r[0] < 2**31]
    other = pa.table({"k": pa.array([r[0] for r in small], pa.int32()),
                      "s": pa.array([r[1] for r in small], pa.string()),
                      "f": pa.array([r[2] for r in small], pa.float64())})
    whole = pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                     "s": pa.array([r[1] for r in rows], pa.string()),
                     "f": pa.array([r[2] for r in rows], pa.float64())})
    with cryptdisk.connect(tmp_path / "db", insert_block_bytes=600) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
        assert db.insert("t", same) == len(rows)
        assert direct[-1] is not None
        assert db.insert("t", other) == len(small)
        assert direct[-1] is None
        assert db.insert("t", whole.to_batches()[0]) == len(rows)
        assert direct[-1] is not None
        assert db.insert("t", pa.RecordBatchReader.from_batches(
            whole.schema, whole.to_batches(max_chunksize=17))) == len(rows)
        assert direct[-1] is not None
        ref = duckdb.connect()
        ref.execute("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE)")
        ref.execute("INSERT INTO t (f, k) SELECT * FROM same")
        ref.execute("INSERT INTO t SELECT * FROM other")
        ref.execute("INSERT INTO t SELECT * FROM whole")
        ref.execute("INSERT INTO t SELECT * FROM whole")
        for q in _QUERIES:
            sql = q.format(t="t")
            assert _norm(db.query(sql)) == _norm(ref.execute(sql).fetchall()), sql
        parts = db.query("SELECT part FROM system.parts WHERE \"table\" = 't'")
        assert len(parts) > 4  # blocks of a few rows: several parts
        for (part,) in parts:
            keys = [_rank(r["k"]) for r in db.read_part("t", part).to_pylist()]
            assert keys == sorted(keys)


def test_arrow_strings_that_are_not_utf8_publish_nothing(tmp_path):
    """A VARCHAR column of Arrow data holding bytes that are not UTF-8 (an array made from
    buffers, unchecked): a DatabaseError, and no part published."""
    from cryptdisk.errors import DatabaseError

    good = pa.array([f"v{i}" for i in range(1000)], pa.string())
    data = good.buffers()[2].to_pybytes()
    bad = pa.Array.from_buffers(pa.string(), len(good),
                                [None, good.buffers()[1],
                                 pa.py_buffer(data[:500] + b"\xff" + data[501:])])
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        version = db.catalog.version
        with pytest.raises(DatabaseError, match="cannot read the data"):
            db.insert("t", pa.table({"k": pa.array(range(1000), pa.int64()), "s": bad}))
        assert db.catalog.version == version
        assert db.query("SELECT count(*) FROM t") == [(0,)]
        db.insert("t", pa.table({"k": pa.array([1], pa.int64())}))
        assert db.query("SELECT k, s FROM t") == [(1, None)]


def test_pieces_taken_ahead_come_in_order_and_an_error_reaches_the_part_thread():
    """A part's row groups taken on a taker thread while a core is spare (and inline when
    none is) come in their order, each once; a failure taking one is raised where the part
    asks for it, and the iterator is not left running when the part's thread goes on."""
    from cryptdisk.db import _blocks

    takers = _blocks._Pool(2)
    try:
        tables = [pa.table({"i": [i]}) for i in range(9)]
        flips = itertools.cycle([True, False, False])
        got = [t.column("i")[0].as_py()
               for t in _blocks._ahead(iter(tables), takers, lambda: next(flips))]
        assert got == list(range(9))

        def failing():
            yield tables[0]
            raise OSError("cannot take")

        seen = []
        with pytest.raises(OSError, match="cannot take"):
            for t in _blocks._ahead(failing(), takers, lambda: True):
                seen.append(t)
        assert len(seen) == 1

        started = []

        def slow():
            for t in tables:
                started.append(t)
                yield t

        ahead = _blocks._ahead(slow(), takers, lambda: True)
        next(ahead)
        ahead.close()  # waits for the row group being taken ahead
        assert len(started) == 2
    finally:
        takers.close()


def test_a_small_insert_starts_one_part_thread_and_no_taker(db, monkeypatch):
    """The insert's threads start as parts and row groups need them: a block of one row
    group (one part, nothing to take ahead) starts one part thread and no taker, while
    a block of several row groups, alone, has its next row groups taken ahead."""
    from cryptdisk.db import _blocks

    pools = []

    class Spy(_blocks._Pool):
        def __init__(self, threads):
            super().__init__(threads)
            pools.append(self)

    monkeypatch.setattr(_blocks, "_Pool", Spy)
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 100)
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t VALUES (2, 'b'), (1, 'a')")
    assert [p.started for p in pools] == [1, 0, 1]  # part threads, takers, publishers
    assert db.query("SELECT k, s FROM t") == [(1, "a"), (2, "b")]
    pools.clear()
    db.sql("INSERT INTO t SELECT (i * 7) % 1000, 'x' FROM range(1000) r(i)")
    part_threads, takers, publishers = (p.started for p in pools)
    assert part_threads == 1 and takers >= 1 and publishers == 1
    assert db.query("SELECT count(*), count(DISTINCT k) FROM t") == [(1002, 1000)]


def test_the_pool_runs_every_job_with_no_more_threads_than_needed():
    """Jobs that wait for each other all run: each job submitted while the others are
    busy gets a thread of its own, up to the pool's size; closing joins them."""
    import threading

    from cryptdisk.db import _blocks

    pool = _blocks._Pool(3)
    release = threading.Event()
    ran = []

    class Wait:
        def __init__(self, i):
            self.i = i

        def run(self):
            release.wait(10)
            ran.append(self.i)

    try:
        for i in range(3):  # three blocked jobs: three threads
            pool.submit(Wait(i))
        assert pool.started == 3
        release.set()
        for i in range(3, 6):  # more jobs reuse the threads
            pool.submit(Wait(i))
    finally:
        pool.close()
    assert sorted(ran) == list(range(6)) and pool.started == 3


def test_a_part_waiting_for_its_publish_holds_up_no_other_part(tmp_path, monkeypatch):
    """A part's publish (its fsync and rename: 60-280 ms for a 33 MB part on a busy disk)
    runs beside the next parts' encoding: with every publish held back until all five
    parts of an insert on one thread have their footers written, the insert completes
    without waiting out the hold. (Published on the part threads, two held publishes took
    both part threads, so no third part was encoded until the hold timed out.)"""
    import threading

    import numpy as np

    sealed = []
    all_sealed = threading.Event()
    waited = []
    release = _parts._HashingWriter.release

    def footer(self, block):  # a part's footer, written as the part is sealed
        release(self, block)
        sealed.append(1)
        if len(sealed) == 5:
            all_sealed.set()

    init = _parts._PartWriter.__init__

    def writer(self, *args, **kwargs):
        init(self, *args, **kwargs)
        publish = self._raw.close

        def held():  # the disk file's close: the part's publish
            # (whether all five were sealed while it waited; False: the hold ran out)
            waited.append(all_sealed.wait(30))
            publish()

        self._raw.close = held

    monkeypatch.setattr(_parts._HashingWriter, "release", footer)
    monkeypatch.setattr(_parts._PartWriter, "__init__", writer)
    keys = np.random.default_rng(7).permutation(25_000).astype(np.int64)
    data = pa.Table.from_batches([pa.record_batch({"k": keys[i:i + 5000], "v": keys[i:i + 5000]})
                                  for i in range(0, 25_000, 5000)])
    with cryptdisk.connect(tmp_path / "db", threads=1, insert_block_bytes=1 << 16) as db:
        db.sql("CREATE TABLE t (k BIGINT, v BIGINT) ORDER BY k")
        assert db.insert("t", data) == 25_000
        assert len(db.table("t").parts) == 5 and len(waited) == 5
        assert all(waited), waited  # (no publish waited out the hold)
        assert db.query("SELECT count(*), sum(k) = sum(v) FROM t") == [(25_000, True)]


@pytest.mark.parametrize("typ", [
    pa.int8(), pa.uint64(), pa.float16(), pa.float32(), pa.float64(), pa.string(),
    pa.large_string(), pa.binary(), pa.large_binary(), pa.binary(16), pa.string_view(),
    pa.date32(), pa.date64(), pa.timestamp("ns", "UTC"), pa.time32("ms"), pa.time64("us"),
    pa.duration("us"), pa.month_day_nano_interval(), pa.decimal128(38, 0),
    pa.decimal256(40, 2), pa.bool_(), pa.null(), pa.list_(pa.int64()),
    pa.struct([("a", pa.int64())]), pa.dictionary(pa.int32(), pa.string())])
def test_sortable_without_compute_agrees_with_arrow(typ):
    """The types sortable() answers without pyarrow.compute are ones Arrow sorts."""
    import pyarrow.compute as pc

    schema = pa.schema([("k", typ)])
    try:
        pc.sort_indices(pa.nulls(0, typ))
        pc.greater_equal(pa.nulls(0, typ), pa.nulls(0, typ))
        arrow = True
    except pa.ArrowException:
        arrow = False
    if _blocks._plainly_sortable(typ):
        assert arrow
    assert _blocks.sortable(schema, ["k"]) is arrow
    assert not _blocks.sortable(schema, ["missing"])


@pytest.mark.parametrize("block_bytes", [1 << 30, 1 << 14])
def test_the_parts_encodings_are_judged_as_the_first_rows_come(tmp_path, monkeypatch,
                                                                block_bytes):
    """On the insert's first 64Ki rows as soon as they are held, not once the whole first
    block is (the judging held up DuckDB and every part thread); a first block shorter
    than that is judged on itself."""
    from cryptdisk.disks import LocalDisk

    schema = pa.schema([("k", pa.int64()), ("s", pa.string())])
    n = 1 << 15  # rows a batch
    pulled = []

    def batches():
        for i in range(8):
            pulled.append(i)
            keys = list(range((8 - i) * n, (7 - i) * n, -1))  # out of order: sorted
            yield pa.record_batch([pa.array(keys, pa.int64()),
                                   pa.array([str(k % 7) for k in keys])], schema=schema)

    judged = []
    real = _blocks.dictionary_columns

    def spy(sample, schema):
        judged.append((len(pulled), sample.num_rows, sample.column("k")[0].as_py()))
        return real(sample, schema)

    monkeypatch.setattr(_blocks, "dictionary_columns", spy)
    parts = _blocks.write_sorted_parts(LocalDisk("d", str(tmp_path)), "t", batches(), schema,
                                       version=1, max_rows=1 << 24, block_bytes=block_bytes,
                                       order=["k"], workers=2)
    assert sum(p.rows for p in parts) == 8 * n
    [(seen, rows, first)] = judged
    assert first == 8 * n  # the input's first row
    if block_bytes > 1 << 20:  # one block of all the rows: judged on its first 2 batches
        assert rows == _parts._SAMPLE_ROWS
        assert seen < 8  # before: once all 8 were pulled (the block complete)
        assert len(parts) == 1
    else:  # blocks of one batch, shorter than the sample: judged on the first
        assert rows == n
