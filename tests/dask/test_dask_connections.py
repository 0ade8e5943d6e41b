"""The read-only connections each process keeps (cryptdisk.dask._read._OPEN): at most
OPEN_DATABASES of them, the least recently used closed once no task reads it, and a kept
connection that no longer fits the database (replaced at its path, keys rotated) replaced
by a new one instead of failing every task until the worker restarts."""

import shutil

import pytest

import cryptdisk
import cryptdisk.dask
from cryptdisk.dask import _read
from cryptdisk.keys import Key


def _make(path, start, n=1000):
    """A database at ``path`` (its key file beside it) with table u: a = start..start+n."""
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE u (a BIGINT, s VARCHAR) ORDER BY a")
        db.sql(f"INSERT INTO u SELECT i, md5(i::VARCHAR) FROM range({start}, {start + n}) r(i)")
    return sum(range(start, start + n))


def _kept_on_workers(client):
    def kept():
        from cryptdisk.dask import _read
        return sorted(k[0] for k in _read._OPEN)
    return client.run(kept)


def test_a_database_replaced_at_its_path_is_read_anew_by_workers_that_had_it_open(
        client, tmp_path):
    path = tmp_path / "db"
    first = _make(path, 0)
    assert client.compute(cryptdisk.dask.read_table(path, "u").a.sum()).result() == first
    assert any(str(path) in kept for kept in _kept_on_workers(client).values())
    shutil.rmtree(path)
    (tmp_path / "db.key").unlink()
    second = _make(path, 10**6)  # another database: a new key, a new catalog
    assert client.compute(cryptdisk.dask.read_table(path, "u").a.sum()).result() == second


def test_keys_rotated_while_workers_have_the_database_open_are_loaded_anew(client, tmp_path):
    """cryptdisk rotate --new-key, then keys --remove 1, then an insert under key 2: the
    workers' kept connections hold key 1 only; their next read loads the keys again."""
    path = tmp_path / "db"
    want = _make(path, 0)
    df = cryptdisk.dask.read_table(path, "u")
    assert client.compute(df.a.sum()).result() == want
    with cryptdisk.connect(path) as db:
        db.rotate_keys(new_key=Key.generate(2))
        db.remove_key(1)
        db.sql("INSERT INTO u VALUES (5000000, 'x')")
    assert not (tmp_path / "db.key.1").exists()
    assert client.compute(df.a.sum()).result() == want  # planned before: parts under key 2
    again = cryptdisk.dask.read_table(path, "u")
    assert client.compute(again.a.sum()).result() == want + 5000000


def test_workers_keep_at_most_open_databases_connections(client, tmp_path):
    def bound(n):  # and close what earlier tests left open (pushed out only by an open)
        from cryptdisk.dask import _read
        old, _read.OPEN_DATABASES = _read.OPEN_DATABASES, n
        with _read._OPEN_LOCK:
            kept = list(_read._OPEN.values())
            _read._OPEN.clear()
        for k in kept:
            k.db.close()
        return old

    old = client.run(bound, 2)
    try:
        wants = [_make(tmp_path / f"db{i}", i * 1000) for i in range(4)]
        for i, want in enumerate(wants):
            df = cryptdisk.dask.read_table(tmp_path / f"db{i}", "u")
            assert client.compute(df.a.sum()).result() == want
        for kept in _kept_on_workers(client).values():
            assert len(kept) <= 2, kept
            assert not any(str(tmp_path / f"db{i}") in kept for i in (0, 1)), kept
        df = cryptdisk.dask.read_table(tmp_path / "db0", "u")  # opened again
        assert client.compute(df.a.sum()).result() == wants[0]
    finally:
        client.run(lambda: setattr(_read, "OPEN_DATABASES", next(iter(old.values()))))


def test_the_least_recently_used_connection_closes_once_its_last_reader_leaves(
        tmp_path, monkeypatch):
    monkeypatch.setattr(_read, "OPEN_DATABASES", 1)
    paths = [str(tmp_path / f"db{i}") for i in range(3)]
    for i, p in enumerate(paths):
        _make(p, i * 1000)
    with _read._process_database(paths[0], None) as (first, opened):
        assert opened
        with _read._process_database(paths[1], None) as (second, _opened):
            pass  # pushes out the first, which a reader still uses
        part = first.scan_plan("u")[0][0]
        assert first.read_part("u", part, ["a"]).num_rows == 1000  # still open
        assert list(_read._OPEN) == [(paths[1], None, "null")]
    with pytest.raises(cryptdisk.errors.DatabaseError, match="closed"):
        first.arrow_table("u", ["a"])  # closed when its reader left
    with _read._process_database(paths[2], None) as (third, _opened):
        pass
    with pytest.raises(cryptdisk.errors.DatabaseError, match="closed"):
        second.arrow_table("u", ["a"])  # pushed out while unused: closed at once
    assert third.arrow_table("u", ["a"]).num_rows == 1000
    df = cryptdisk.dask.read_table(paths[0], "u")
    assert df.a.sum().compute(scheduler="sync") == sum(range(1000))
    assert list(_read._OPEN) == [(paths[0], None, "null")]


class _CountingPool:
    """Arrow's default pool, counting release_unused calls."""

    def __init__(self, pool):
        self.pool, self.releases = pool, 0

    def release_unused(self):
        self.releases += 1
        self.pool.release_unused()

    def __getattr__(self, name):
        return getattr(self.pool, name)


def test_each_read_and_write_task_gives_arrow_s_freed_memory_back(tmp_path, monkeypatch):
    """Arrow's allocator keeps what a partition's read freed, which Dask counts as the
    worker's unmanaged memory: 600 MB workers reading a 1.7 GB table paused at 80% and
    never resumed (docs/dask-cost.md, Memory). Every read and write task releases it."""
    import dask.dataframe as dd
    import pandas as pd
    import pyarrow as pa

    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE u (a BIGINT, s VARCHAR) ORDER BY a")
        for i in range(3):
            db.sql(f"INSERT INTO u SELECT i, md5(i::VARCHAR) FROM range({i * 1000}, "
                   f"{(i + 1) * 1000}) r(i)")
    pool = _CountingPool(pa.default_memory_pool())
    monkeypatch.setattr(pa, "default_memory_pool", lambda: pool)
    df = cryptdisk.dask.read_table(path, "u", min_partition_rows=0)
    assert df.npartitions == 3
    assert df.a.sum().compute(scheduler="sync") == sum(range(3000))
    assert pool.releases == 3
    pool.releases = 0
    rows = dd.from_pandas(pd.DataFrame({"a": range(5000, 5010), "s": "x"}), npartitions=2)
    with dask_sync():
        assert cryptdisk.dask.to_table(rows, path, "u") == 10
    assert pool.releases == 2


def dask_sync():
    import dask
    return dask.config.set(scheduler="sync")


def test_to_table_after_a_rotation_seals_the_new_parts_under_the_new_key(client, tmp_path):
    """Workers that kept a connection from before cryptdisk rotate --new-key write the
    job's parts under the key that is current now, not the one they loaded."""
    import dask.dataframe as dd
    import pandas as pd

    from cryptdisk.format import Header

    path = tmp_path / "db"
    want = _make(path, 0)
    assert client.compute(cryptdisk.dask.read_table(path, "u").a.sum()).result() == want
    rows = dd.from_pandas(pd.DataFrame({"a": range(10**6, 10**6 + 10), "s": "x"}),
                          npartitions=2)
    assert cryptdisk.dask.to_table(rows, path, "u") == 10  # every worker has it open now
    with cryptdisk.connect(path) as db:
        db.rotate_keys(new_key=Key.generate(2))
        before = {p["path"] for p in db.sql("SELECT path FROM system.parts").to_pylist()}
    assert cryptdisk.dask.to_table(rows, path, "u") == 10
    with cryptdisk.connect(path) as db:
        paths = [p["path"] for p in db.sql("SELECT path FROM system.parts").to_pylist()]
        new = [p for p in paths if p not in before]
        files = {f.name: f for f in tmp_path.rglob("*.parquet")}
        assert new and all(
            Header.parse(files[p.rsplit("/", 1)[-1]].read_bytes()[:128]).key_id == 2
            for p in new), new
        db.remove_key(1)  # no file uses key 1
