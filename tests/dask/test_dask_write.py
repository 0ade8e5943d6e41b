"""cryptdisk.dask.to_table on a LocalCluster: workers write the parts, one commit publishes
them; a failed job publishes nothing and its parts are removed by the next writer."""

import time

import cloudpickle
import dask.dataframe as dd
import pandas as pd
import pytest

import cryptdisk
import cryptdisk.dask
from cryptdisk.errors import CatalogError

from ..db.dbhelpers import write_config
from .daskhelpers import key_needles


def _pdf(n, start=0):
    return pd.DataFrame({"k": range(start, start + n), "s": [f"v{i}" for i in range(n)],
                         "f": [i / 3 for i in range(n)]})


def _parquet_files(tmp_path):
    return sorted(p.name for p in (tmp_path / "store" / "secure").rglob("*.parquet"))


def _settled(tmp_path, quiet=1.0, limit=60.0):
    """The part files once none has appeared or gone for ``quiet`` seconds."""
    end = time.monotonic() + limit
    seen, since = _parquet_files(tmp_path), time.monotonic()
    while time.monotonic() < end and time.monotonic() - since < quiet:
        time.sleep(0.05)
        now = _parquet_files(tmp_path)
        if now != seen:
            seen, since = now, time.monotonic()
    return seen


def test_workers_write_the_parts_and_one_commit_publishes_them(client, tmp_path):
    cfg = write_config(tmp_path, [1], 1)
    with cryptdisk.connect(tmp_path / "db", cfg) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE, extra BIGINT) ORDER BY k")
        version = db.catalog.version
    pdf = _pdf(3000)
    df = dd.from_pandas(pdf.sample(frac=1, random_state=1), npartitions=3)
    with client.as_current():
        assert cryptdisk.dask.to_table(df, tmp_path / "db", "t", config=cfg) == 3000
    with cryptdisk.connect(tmp_path / "db", cfg, read_only=True) as db:
        assert db.catalog.version == version + 1  # one commit for the whole job
        assert len(db.table("t").parts) == 3
        got = db.sql("SELECT k, s, f, extra FROM t ORDER BY k").to_pandas()
        keys = db.sql("SELECT key_min, key_max FROM system.parts").to_pylist()
    pd.testing.assert_frame_equal(got[["k", "s", "f"]], pdf, check_dtype=False)
    assert got.extra.isna().all()
    assert all(r["key_min"] is not None for r in keys)  # each part sorted, its range recorded
    back = cryptdisk.dask.read_table(tmp_path / "db", "t", ["k"], config=cfg)
    assert sorted(client.compute(back.k).result()) == list(range(3000))


def test_the_write_graph_carries_no_key(tmp_path):
    cfg = write_config(tmp_path, [1], 1)
    from cryptdisk.dask._write import _stage_partition

    spec = (str(tmp_path / "db"), str(cfg), "t", 2, None, 1)
    blob = cloudpickle.dumps((_stage_partition, spec))
    assert str(cfg).encode() in blob
    assert not any(n in blob for n in key_needles(tmp_path))


def test_a_failed_job_publishes_nothing_and_its_parts_are_collected(client, tmp_path):
    cfg = write_config(tmp_path, [1], 1)
    with cryptdisk.connect(tmp_path / "db", cfg) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE)")
        db.sql("INSERT INTO t SELECT i, 'x', 0 FROM range(5) r(i)")
        job = f"v{db.catalog.version + 1}-*.parquet"  # what the job's parts are named
    before = _parquet_files(tmp_path)

    store = tmp_path / "store" / "secure"

    def boom(pdf):
        # the last partition fails once the other worker has written the other two, or
        # after 30 s if the scheduler queued one of them behind this task on its worker
        # (that one never runs: the job has failed); at least one was written before
        if len(pdf) and pdf.k.min() >= 2000:
            import time

            deadline = time.monotonic() + 30
            while len(list(store.rglob(job))) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            deadline = time.monotonic() + 60
            while not list(store.rglob(job)) and time.monotonic() < deadline:
                time.sleep(0.05)
            raise RuntimeError("partition lost")
        return pdf

    df = dd.from_pandas(_pdf(3000), npartitions=3).map_partitions(boom)
    with client.as_current(), pytest.raises(RuntimeError, match="partition lost"):
        cryptdisk.dask.to_table(df, tmp_path / "db", "t", config=cfg)
    written = _settled(tmp_path)
    assert 1 <= len(written) - len(before) <= 2  # the written partitions' parts stay
    with cryptdisk.connect(tmp_path / "db", cfg) as db:
        assert db.query("SELECT count(*) FROM t") == [(5,)]
        # the next writer collects them once its catalog has passed their version
        db.sql("INSERT INTO t SELECT 9, 'y', 1")
        db.sql("INSERT INTO t SELECT 10, 'z', 2")
        named = sorted(p["path"].rsplit("/", 1)[-1]
                       for p in db.sql("SELECT path FROM system.parts").to_pylist())
    assert _parquet_files(tmp_path) == named and len(named) == 3


def test_parts_of_another_version_or_table_are_refused(tmp_path):
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (k BIGINT)")
        db.sql("CREATE TABLE u (k BIGINT)")
        with cryptdisk.connect(tmp_path / "db", read_only=True) as worker:
            staged = worker.stage_parts("t", _pdf(10)[["k"]], db.catalog.version + 1)
            with pytest.raises(CatalogError, match="another writer"):
                worker.stage_parts("t", _pdf(10)[["k"]], db.catalog.version)
        with pytest.raises(CatalogError, match="not a new part of u"):
            db.commit_parts("u", staged)
        db.sql("INSERT INTO u VALUES (1)")  # the catalog moves on: staged is for a past version
        with pytest.raises(CatalogError, match="not a new part of t"):
            db.commit_parts("t", staged)
        assert db.query("SELECT count(*) FROM t") == [(0,)]
