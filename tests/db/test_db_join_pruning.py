"""Filters reach a table through inner joins: t1.k = t2.k with a bound on t1.k skips t2's
row groups too, and the answers stay DuckDB's."""

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """a and b in several parts each (one per insert, each with its key range), keys
    overlapping between parts, NULL keys in some; the same rows in plain DuckDB."""
    db = cryptdisk.connect(tmp_path_factory.mktemp("h") / "db")
    native = duckdb.connect()
    inserts = {
        "a": ["SELECT i::BIGINT, i % 7, md5(i::VARCHAR) FROM range(0, 500, 3) r(i)",
              "SELECT i::BIGINT, i % 5, md5(i::VARCHAR) FROM range(400, 900, 2) r(i)",
              "SELECT CASE WHEN i % 4 = 0 THEN NULL ELSE i END::BIGINT, i, 'x' "
              "FROM range(800, 1000) r(i)"],
        "b": ["SELECT i::BIGINT, i % 3, md5((i % 50)::VARCHAR) FROM range(100, 300) r(i)",
              "SELECT i::BIGINT, i % 11, NULL FROM range(250, 700, 5) r(i)",
              "SELECT NULL::BIGINT, 1, 'n' FROM range(10)",
              "SELECT i::BIGINT, i, md5(i::VARCHAR) FROM range(650, 1200, 7) r(i)"],
    }
    for name, rows in inserts.items():
        db.sql(f"CREATE TABLE {name} (k BIGINT, n BIGINT, s VARCHAR) ORDER BY k")
        native.execute(f"CREATE TABLE {name} (k BIGINT, n BIGINT, s VARCHAR)")
        for r in rows:
            db.sql(f"INSERT INTO {name} {r}")
            native.execute(f"INSERT INTO {name} {r}")
    yield db, native
    db.close()
    native.close()


_CONST = st.integers(-50, 1250)
_COND = st.one_of(
    st.builds(lambda c, op, v: f"{c}.k {op} {v}", st.sampled_from("ab"),
              st.sampled_from(["=", "<", "<=", ">", ">="]), _CONST),
    st.builds(lambda c, lo, hi: f"{c}.k BETWEEN {lo} AND {hi}", st.sampled_from("ab"),
              _CONST, _CONST),
    st.builds(lambda c, vs: f"{c}.k IN ({', '.join(map(str, vs))})", st.sampled_from("ab"),
              st.lists(_CONST, min_size=1, max_size=4)),
    st.builds(lambda c, v: f"{c}.n < {v}", st.sampled_from("ab"), st.integers(0, 20)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conds=st.lists(_COND, max_size=3), join=st.sampled_from(
    ["a JOIN b ON a.k = b.k", "a, b", "a JOIN b ON b.k = a.k AND a.n = b.n",
     "a LEFT JOIN b ON a.k = b.k", "a JOIN b ON a.k = b.k OR a.n = b.n",
     "a JOIN b ON a.k = b.k AND b.k < 300", "a LEFT JOIN b ON a.k = b.k AND b.k < 300",
     "b RIGHT JOIN a ON a.k = b.k AND a.k > 600"]),
    where_join=st.booleans())
def test_random_filters_through_joins_answer_as_duckdb(parts, conds, join, where_join):
    db, native = parts
    if join == "a, b" or where_join:
        conds = [*conds, "a.k = b.k"]
    where = f" WHERE {' AND '.join(conds)}" if conds else ""
    query = (f"SELECT count(*), sum(a.k), sum(b.n), max(b.s) FROM {join}{where}")
    assert db.sql(query).to_pylist() == native.sql(query).to_arrow_table().to_pylist()
