"""Filters reach a table through inner joins: t1.k = t2.k with a bound on t1.k skips t2's
row groups too, and the answers stay DuckDB's."""

import duckdb
import pytest

import cryptdisk

TABLES = {
    # rows in row groups of 64Ki (t1 and p: 5, t2: 3, t3: 4): t2 holds every other key of
    # t1, t3 every third; p is on the plain policy (unencrypted), joined like the others
    "t1": "SELECT i::BIGINT AS k, md5(i::VARCHAR) AS s, i / 7 AS v FROM range(300000) r(i)",
    "t2": "SELECT (2 * i)::BIGINT, md5((2 * i)::VARCHAR), i / 3 FROM range(150000) r(i)",
    "t3": "SELECT (3 * i)::BIGINT, md5(i::VARCHAR), i FROM range(200000) r(i)",
    "p": "SELECT i::BIGINT, md5((i % 100)::VARCHAR), i / 5 FROM range(300000) r(i)",
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    db = cryptdisk.connect(tmp_path_factory.mktemp("j") / "db")
    native = duckdb.connect()
    for name, rows in TABLES.items():
        settings = " SETTINGS storage_policy = 'plain'" if name == "p" else ""
        db.sql(f"CREATE TABLE {name} (k BIGINT, s VARCHAR, v DOUBLE) ORDER BY k{settings}")
        db.sql(f"INSERT INTO {name} {rows}")
        native.execute(f"CREATE TABLE {name} (k BIGINT, s VARCHAR, v DOUBLE)")
        native.execute(f"INSERT INTO {name} {rows}")
    yield db, native
    db.close()
    native.close()


QUERIES = [
    # (query, {table: row groups read at most, or None: all of them})
    ("SELECT count(*), sum(t2.v) FROM t1 JOIN t2 ON t1.k = t2.k "
     "WHERE t1.k BETWEEN 100000 AND 100100", {"t1": 1, "t2": 1}),
    ("SELECT count(*) FROM t1 a, t2 b WHERE a.k = b.k AND b.k < 1000", {"t1": 1, "t2": 1}),
    ("SELECT t1.k, t3.s FROM t1 JOIN t2 ON t1.k = t2.k JOIN t3 ON t3.k = t2.k "
     "WHERE t1.k IN (6, 60, 294000) ORDER BY 1", {"t1": 2, "t2": 2, "t3": 2}),
    ("SELECT count(*) FROM t1 JOIN p ON p.k = t1.k WHERE p.k >= 290000 AND t1.v > 1",
     {"t1": 1, "p": 1}),
    ("SELECT max(t1.s), count(*) FROM t1 JOIN t2 ON t1.k = t2.k AND t1.s = t2.s "
     "WHERE t2.k > 299990", {"t1": 1, "t2": 1}),
    # nothing to propagate: every row group is read, the answer is the same
    ("SELECT count(*) FROM t1 LEFT JOIN t2 ON t1.k = t2.k WHERE t1.k < 10", {"t2": None}),
    ("SELECT count(*) FROM t1 JOIN t2 ON t1.k = t2.v WHERE t1.k < 10", {"t2": None}),
    ("SELECT count(*) FROM t1 JOIN t2 ON t1.k + 1 = t2.k WHERE t1.k < 10", {"t2": None}),
    ("SELECT count(*) FROM t1 JOIN t2 ON t1.k = t2.k OR t1.k = 5 WHERE t1.k < 10",
     {"t2": None}),
]


@pytest.mark.parametrize(("query", "most"), QUERIES)
def test_join_results_equal_duckdb_and_read_fewer_row_groups(pair, query, most):
    db, native = pair
    db.cache.clear()
    got = db.sql(query).to_pylist()
    assert got == native.sql(query).to_arrow_table().to_pylist()
    for t, n in most.items():
        stats = db.last_scans[t]
        if n is None:  # no filter implied: everything is read
            assert stats["row_groups_skipped"] == stats["parts_skipped"] == 0, stats
        else:
            assert 0 < stats["row_groups_read"] <= n, (t, stats)
