"""Database.scan_plan and Database.read_part: one part's rows under tuple filters, as the
engine answers the same WHERE (what cryptdisk.dask's workers call)."""

import math

import pytest

import cryptdisk
from cryptdisk.errors import CatalogError, DatabaseError


@pytest.fixture
def db(tmp_path):
    d = cryptdisk.connect(tmp_path / "db")
    d.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
    d.sql("INSERT INTO t SELECT i, CASE WHEN i % 5 = 0 THEN NULL ELSE i::VARCHAR END, "
          "CASE WHEN i % 7 = 0 THEN 'nan'::DOUBLE ELSE i / 3 END FROM range(0, 100) r(i)")
    d.sql("INSERT INTO t SELECT i, i::VARCHAR, i / 3 FROM range(100, 200) r(i)")
    yield d
    d.close()


def _rows(table):
    return sorted(tuple("nan" if isinstance(v, float) and math.isnan(v) else v
                        for v in r.values()) for r in table.to_pylist())


@pytest.mark.parametrize("filters, where", [
    ([("f", ">", 20.0)], "f > 20.0"),  # NaN is above every number, as in DuckDB
    ([("s", "!=", "3")], "s <> '3'"),  # NULL never matches
    ([("k", "in", [3, 150, 999])], "k IN (3, 150, 999)"),
    ([("k", "not in", [1, 2]), ("f", "<=", 10)], "k NOT IN (1, 2) AND f <= 10"),
    ([("k", "==", 42)], "k = 42"),
])
def test_parts_read_under_filters_equal_the_engine(db, filters, where):
    plan = db.scan_plan("t", filters)
    got = [r for part, groups in plan
           for r in _rows(db.read_part("t", part, ["k", "s", "f"], filters, groups))]
    assert sorted(got) == _rows(db.sql(f"SELECT k, s, f FROM t WHERE {where}"))


def test_the_plan_leaves_out_parts_outside_the_key_range(db):
    assert len(db.scan_plan("t")) == 2
    (part, _groups), = db.scan_plan("t", [("k", ">=", 150)])
    assert db.read_part("t", part, ["k"], [("k", ">=", 150)]).column("k").to_pylist() == \
        list(range(150, 200))
    assert db.scan_plan("t", [("k", ">", 10**6)]) == []


def test_bad_parts_columns_and_row_groups_are_refused(db):
    part = db.scan_plan("t")[0][0]
    with pytest.raises(CatalogError, match="no part"):
        db.read_part("t", "f" * 32)
    with pytest.raises(DatabaseError, match="no column"):
        db.read_part("t", part, ["nope"])
    with pytest.raises(DatabaseError, match="no row group 7"):
        db.read_part("t", part, row_groups=[7])
    with pytest.raises(DatabaseError, match="column k is BIGINT; the value 'not a number'"):
        db.read_part("t", part, filters=[("k", "=", "not a number")])


def test_a_part_merged_away_is_no_longer_readable(db):
    part = db.scan_plan("t")[0][0]
    db.sql("OPTIMIZE TABLE t FINAL")
    with pytest.raises(CatalogError, match="merged or dropped") as info:
        db.read_part("t", part)
    assert info.value.hint == "plan the read again"


def test_threads_of_one_process_read_parts_at_the_same_time(db, monkeypatch):
    """read_part reads row groups outside the connection's lock: while one thread is
    inside a row group's read, another thread's read_part on the same connection
    completes (a Dask worker's threads read partitions in parallel)."""
    import threading

    from cryptdisk.db._scan import TableScan

    plan = db.scan_plan("t")
    assert len(plan) == 2
    inside, other_done = threading.Event(), threading.Event()
    real = TableScan.read_group
    blocker = threading.get_ident()

    def read_group(self, op, rg):
        if threading.get_ident() == blocker and not inside.is_set():
            inside.set()
            # the other thread's whole read_part runs while this one is mid-read; on a
            # connection that held its lock here it could not, and this wait would end
            # unset (a deadlock guard, not a timing)
            assert other_done.wait(30), "the other thread's read_part waited for this one"
        return real(self, op, rg)

    monkeypatch.setattr(TableScan, "read_group", read_group)
    got = {}

    def other():
        inside.wait(60)
        got["other"] = db.read_part("t", plan[1][0], ["k"], [("k", ">=", 150)])
        other_done.set()

    t = threading.Thread(target=other)
    t.start()
    got["mine"] = db.read_part("t", plan[0][0], ["k", "s"])
    t.join(60)
    assert got["mine"].num_rows == 100
    assert got["other"].column("k").to_pylist() == list(range(150, 200))


@pytest.fixture
def groups_db(tmp_path, monkeypatch):
    """Table g (ORDER BY k): one part of 10 row groups of 100 rows (k 0..999), a nullable
    integer n (NULL every 7th row) and a double f."""
    from cryptdisk.db import _parts

    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 100)
    d = cryptdisk.connect(tmp_path / "db")
    d.sql("CREATE TABLE g (k BIGINT, n BIGINT, f DOUBLE) ORDER BY k")
    d.sql("INSERT INTO g SELECT i, CASE WHEN i % 7 = 0 THEN NULL ELSE i END, i / 3 "
          "FROM range(0, 1000) r(i)")
    yield d
    d.close()


def _record_reads(monkeypatch):
    """``[(row groups, columns)]`` of every OpenPart.read call."""
    from cryptdisk.db import _partread

    reads = []
    read = _partread.OpenPart.read
    monkeypatch.setattr(_partread.OpenPart, "read", lambda self, rgs, cols, *j: (
        reads.append((list(rgs), list(cols))) or read(self, rgs, cols, *j)))
    return reads


def _sorted(rows):
    return sorted(rows, key=lambda r: tuple((v is None, v or 0) for v in r))


def _read_all(db, table, columns, filters):
    return _sorted(tuple(r.values()) for part, groups in db.scan_plan(table, filters)
                   for r in db.read_part(table, part, columns, filters, groups).to_pylist())


def test_row_groups_wholly_inside_a_key_range_are_read_without_the_key(groups_db,
                                                                      monkeypatch):
    """k in [150, 850): row groups 2 to 7 hold only matching rows (their key bounds say
    so): read as one run, f only, and not filtered; row groups 1 and 8 are read with k
    and filtered row by row. The rows equal the engine's, in the part's order."""
    filters = [("k", ">=", 150), ("k", "<", 850)]
    ((part, groups),) = groups_db.scan_plan("g", filters)
    assert groups == list(range(1, 9))
    want = [r[0] for r in groups_db.query("SELECT f FROM g WHERE k >= 150 AND k < 850 "
                                          "ORDER BY k")]
    reads = _record_reads(monkeypatch)
    got = groups_db.read_part("g", part, ["f"], filters, groups)
    assert got.column_names == ["f"]
    assert got.column("f").to_pylist() == want
    assert ([2, 3, 4, 5, 6, 7], ["f"]) in reads, reads
    assert not any("k" in cols and set(rgs) & set(range(2, 8)) for rgs, cols in reads), reads
    assert any("k" in cols and rgs == [1] for rgs, cols in reads)
    assert any("k" in cols and rgs == [8] for rgs, cols in reads)


@pytest.mark.parametrize("filters, where", [
    ([("k", ">=", 420), ("k", "<", 430)], "k >= 420 AND k < 430"),  # inside one row group
    ([("k", ">", 199), ("k", "<=", 500)], "k > 199 AND k <= 500"),  # on row group bounds
    ([("k", "!=", 1000)], "k <> 1000"),  # every row group passes
    ([("k", "in", [5, 550, 551])], "k IN (5, 550, 551)"),
    ([("k", "not in", [5, 550])], "k NOT IN (5, 550)"),
    ([("n", ">=", 0)], "n >= 0"),  # statistics pass every value, the NULLs still drop
    ([("k", ">=", 100), ("f", "<", 200.5)], "k >= 100 AND f < 200.5"),  # f: row by row
    ([("k", ">=", 100.5)], "k >= 100.5"),  # a float value: filtered row by row
])
def test_reads_with_and_without_row_filtering_equal_the_engine(groups_db, filters, where):
    for columns in (["f"], ["k", "n", "f"], ["n", "k"]):
        want = _sorted(groups_db.query(f"SELECT {', '.join(columns)} FROM g WHERE {where}"))
        assert _read_all(groups_db, "g", columns, filters) == want, columns


def test_only_certain_statistics_let_rows_through_unfiltered():
    import pyarrow as pa

    from cryptdisk.db._pushdown import all_pass

    i64 = pa.int64()
    assert all_pass(("k", ">=", 10), i64, (10, 20), 0)
    assert not all_pass(("k", ">", 10), i64, (10, 20), 0)
    assert all_pass(("k", "<", 21), i64, (10, 20), 0)
    assert not all_pass(("k", "<=", 19), i64, (10, 20), 0)
    assert all_pass(("k", "=", 7), i64, (7, 7), 0) and not all_pass(("k", "=", 7), i64, (7, 8), 0)
    assert all_pass(("k", "!=", 21), i64, (10, 20), 0)
    assert not all_pass(("k", "!=", 15), i64, (10, 20), 0)
    assert all_pass(("k", "in", [3, 7]), i64, (7, 7), 0)
    assert not all_pass(("k", "in", [True]), i64, (1, 1), 0)  # a bool is not an integer here
    assert all_pass(("k", "not in", [3, 30]), i64, (10, 20), 0)
    assert not all_pass(("k", "not in", [3, 15]), i64, (10, 20), 0)
    assert not all_pass(("k", ">=", 10), i64, (10, 20), 1)  # a NULL passes no filter
    assert not all_pass(("k", ">=", 10), i64, (10, 20), None)  # NULLs unknown
    assert not all_pass(("k", ">=", 10), i64, None, 0)
    assert not all_pass(("k", ">=", 9.5), i64, (10, 20), 0)  # not an integer value
    assert not all_pass(("k", ">=", 2**64), i64, (10, 20), 0)  # beyond BIGINT
    assert not all_pass(("f", ">=", 1), pa.float64(), (1.0, 2.0), 0)  # NaN unrecorded
    assert not all_pass(("s", ">=", "a"), pa.string(), ("b", "c"), 0)
