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
    with pytest.raises(DatabaseError, match="filters"):
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
