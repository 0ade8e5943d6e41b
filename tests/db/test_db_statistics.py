"""Which columns of a part get Parquet statistics (cryptdisk.db._parts.statistics_columns):
all but text spread evenly over the part's row order, which no filter's row groups differ in."""

import hashlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cryptdisk
from cryptdisk.db._parts import statistics_columns

_N = 140_000


def _md5(i):
    return hashlib.md5(str(i).encode()).hexdigest()


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("stats") / "db"
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (k BIGINT, h VARCHAR, near VARCHAR, few VARCHAR, f DOUBLE, "
               "b BLOB) ORDER BY k SETTINGS storage_policy = 'plain'")
        # k in a shuffled order; h a hash (spread), near follows k (clustered), few has
        # 4 values (a dictionary), b bytes of the hash
        order = sorted(range(_N), key=_md5)
        db.insert("t", pa.table({
            "k": pa.array(order, pa.int64()),
            "h": pa.array([_md5(i) for i in order]),
            "near": pa.array([f"{i:09d}" for i in order]),
            "few": pa.array(["abcd"[i % 4] for i in order]),
            "f": pa.array([i / 3 for i in order]),
            "b": pa.array([_md5(i).encode() for i in order], pa.binary())}))
        db.sql("CREATE TABLE s (h VARCHAR, k BIGINT) ORDER BY h SETTINGS storage_policy = "
               "'plain'")
        db.sql("INSERT INTO s SELECT h, k FROM t")
        yield db


def _stats(db, table):
    part = db.table(table).parts[0]
    meta = pq.read_metadata(db.config.disks[part.disk].local_path(part.path))
    rg = meta.row_group(0)
    return {rg.column(j).path_in_schema: rg.column(j).statistics is not None
            for j in range(rg.num_columns)}


def test_spread_text_gets_none_and_the_rest_do(db):
    assert _stats(db, "t") == {"k": True, "h": False, "near": True, "few": True, "f": True,
                               "b": False}
    assert _stats(db, "s") == {"h": True, "k": True}  # the ORDER BY key keeps them
    part = db.table("s").parts[0]
    assert (part.key_min, part.key_max) == db.query("SELECT min(h), max(h) FROM t")[0]


def test_filters_on_columns_without_statistics_read_every_row_group(db):
    groups = len(db.scan_plan("t")[0][1])
    assert groups > 1
    assert len(db.scan_plan("t", [("h", "=", _md5(5))])[0][1]) == groups
    assert len(db.scan_plan("t", [("near", "=", f"{5:09d}")])[0][1]) == 1  # kept: pruned
    assert db.query(f"SELECT k, b FROM t WHERE h = '{_md5(77)}'") == [(77, _md5(77).encode())]
    assert db.query("SELECT count(*), min(h), max(h) FROM t WHERE h < '08'") == \
        db.con.execute("SELECT count(*), min(h), max(h) FROM (SELECT md5(CAST(i AS VARCHAR)) "
                       f"AS h FROM range({_N}) r(i)) WHERE h < '08'").fetchall()


def test_small_samples_and_other_schemas_keep_every_column():
    rows = pa.record_batch({"k": pa.array(range(5000), pa.int64()),
                            "h": pa.array([_md5(i) for i in range(5000)])})
    assert statistics_columns(rows.slice(0, 4000), rows.schema, [], ["k"]) is True
    assert statistics_columns(rows, rows.schema, [], ["k"]) == ["k"]
    assert statistics_columns(rows, rows.schema, [], ["h"]) is True  # the key
    assert statistics_columns(rows, rows.schema, True, ["k"]) is True  # a dictionary
    assert statistics_columns(rows, rows.schema, ["h"], ["k"]) is True
    dotted = rows.rename_columns(["k", "h.x"])
    assert statistics_columns(dotted, dotted.schema, [], ["k"]) is True
    nulls = pa.record_batch({"k": rows.column(0), "h": pa.nulls(5000, pa.string())})
    assert statistics_columns(nulls, nulls.schema, [], ["k"]) is True  # no range to judge


def test_a_merge_keeps_a_column_without_statistics_required(tmp_path):
    """A merge stores as REQUIRED the columns no source row group holds a NULL in: a part's
    REQUIRED column counts as such without statistics (else the merged part's hash column
    became OPTIONAL, and every scan of it decoded definition levels)."""
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (k BIGINT, h VARCHAR, n VARCHAR) ORDER BY k SETTINGS "
               "storage_policy = 'plain'")
        for start in (0, _N // 2):
            keys = sorted(range(start, start + _N // 2), key=_md5)
            db.insert("t", pa.table({"k": pa.array(keys, pa.int64()),
                                     "h": pa.array([_md5(i) for i in keys]),
                                     "n": pa.array([None if i == 7 else _md5(-i)
                                                    for i in keys])}))
        assert _stats(db, "t")["h"] is False
        db.optimize("t", final=True)
        part = db.table("t").parts[0]
        schema = pq.read_metadata(db.config.disks[part.disk].local_path(part.path)).schema
        levels = {schema.column(j).name: schema.column(j).max_definition_level
                  for j in range(len(schema))}
        assert levels == {"k": 0, "h": 0, "n": 1}
        assert db.query("SELECT count(*), count(h), count(n) FROM t") == [(_N, _N, _N - 1)]
