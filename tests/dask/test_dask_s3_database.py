"""A whole database on S3 (moto's server on loopback): its directory (catalog, pin) at an
s3:// URL, its parts on an encrypted disk over the same bucket, its keys from the config on
each machine. Written locally and published with ``cryptdisk.db.publish``; read by the
embedded engine and by a LocalCluster's worker processes with the same results, the same
authentication and the same rollback evidence as a local directory; writes refused."""

import json
import logging
import os
import uuid

import pandas as pd
import pytest
import s3fs

import cryptdisk
import cryptdisk.dask
import cryptdisk.db
from cryptdisk.db._remote import RemoteDirectory
from cryptdisk.errors import CatalogError, ConfigError, DatabaseError, PublishConflictError
from cryptdisk.format import MAGIC

from .conftest import S3_BUCKET
from .daskhelpers import TaskRecorder, key_needles, recorded_tasks, write_s3_config

PART_ROWS = 70_000  # 2 row groups of 64Ki rows per part


@pytest.fixture
def recorder(client):
    client.register_plugin(TaskRecorder())
    recorded_tasks(client)  # start empty
    yield
    client.unregister_scheduler_plugin(TaskRecorder.name)


@pytest.fixture
def published(s3, tmp_path):
    """A local database whose parts are on S3, published to an s3:// URL: (local path,
    config, URL, storage options, bucket, key and secret needles)."""
    endpoint, aws_secret = s3
    prefix = uuid.uuid4().hex
    cfg = write_s3_config(tmp_path, endpoint, S3_BUCKET, f"{prefix}/parts")
    db = tmp_path / "db"
    url = f"s3://{S3_BUCKET}/{prefix}/db"
    opts = {"endpoint_url": endpoint}
    with cryptdisk.connect(db, cfg) as con:
        con.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
        for i in range(3):
            con.sql(f"INSERT INTO t SELECT i, 'row-' || i, i / 7 FROM range({i * PART_ROWS}, "
                    f"{(i + 1) * PART_ROWS}) r(i)")
        assert cryptdisk.db.publish(con, url, opts) == con.catalog.version
    bucket = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
    return db, cfg, url, opts, bucket, key_needles(tmp_path, aws_secret)


def _engine(db, cfg, sql, **options):
    with cryptdisk.connect(db, cfg, read_only=True, **options) as con:
        return con.sql(sql).to_pandas()


def _same(got, want):
    got = got.sort_values(list(got.columns)).reset_index(drop=True)
    want = want.sort_values(list(want.columns)).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_a_published_database_is_read_from_s3_by_the_engine_and_the_cluster(
        client, recorder, published):
    db, cfg, url, opts, bucket, needles = published
    key = url.removeprefix("s3://")
    assert sorted(p.rsplit("/", 1)[-1] for p in bucket.find(key)) == ["catalog", "pin"]
    assert bucket.cat_file(f"{key}/catalog") == (db / "catalog").read_bytes()
    ring = cryptdisk.Keyring.from_config(cfg)
    for name in ("catalog", "pin"):  # sealed: no table or column name in the clear
        data = bucket.cat_file(f"{key}/{name}")
        copy = db.parent / f"published-{name}"
        copy.write_bytes(data)
        with cryptdisk.open(copy, "rb", keyring=ring) as f:
            plain = f.read()
        # needles of 8+ bytes the plaintext holds (a 3-byte one such as "t" is in random
        # ciphertext of this size about once in 10,000 runs)
        db_id = json.loads(plain)["db_id"].encode()
        words = [db_id] + ([b'"name":"t"', b'["s","VARCHAR"]'] if name == "catalog" else [])
        assert len(db_id) >= 8 and all(w in plain for w in words)
        assert data.startswith(MAGIC) and not any(w in data for w in words)

    sql = "SELECT k, s, f FROM t WHERE k % 3 = 1"
    want = _engine(db, cfg, sql)
    assert len(want) == PART_ROWS
    _same(_engine(url, cfg, sql, storage_options=opts), want)

    df = cryptdisk.dask.read_table(url, "t", config=cfg, storage_options=opts,
                                   min_partition_rows=0)
    assert df.npartitions == 3
    _same(client.compute(df[df.k % 3 == 1]).result(), want)
    lo, hi = PART_ROWS + 5, PART_ROWS + 60_000
    flt = cryptdisk.dask.read_table(url, "t", ["k", "f"], [("k", ">=", lo), ("k", "<", hi)],
                                    config=cfg, storage_options=opts, min_partition_rows=0)
    assert flt.npartitions == 1  # the catalog read from S3 prunes the other parts
    _same(client.compute(flt).result(),
          _engine(db, cfg, f"SELECT k, f FROM t WHERE k >= {lo} AND k < {hi}"))

    # A new commit, published: the workers' connections (kept per process) see it.
    with cryptdisk.connect(db, cfg) as con:
        con.sql(f"INSERT INTO t SELECT i, 'new-' || i, 0 FROM range({3 * PART_ROWS}, "
                f"{3 * PART_ROWS + 100}) r(i)")
        cryptdisk.db.publish(con, url, opts)
    again = cryptdisk.dask.read_table(url, "t", ["k", "s"], config=cfg, storage_options=opts)
    _same(client.compute(again).result(), _engine(db, cfg, "SELECT k, s FROM t"))

    tasks = recorded_tasks(client)
    assert tasks
    for task_key, blobs in tasks:
        for blob in blobs:
            assert not any(n in blob for n in needles), task_key
    # the tasks name the database by URL and the config by path, nothing more
    assert any(url.encode() in b for _k, blobs in tasks for b in blobs)
    assert any(str(cfg).encode() in b for _k, blobs in tasks for b in blobs)


def test_a_rolled_back_catalog_on_s3_is_reported(published, caplog):
    db, cfg, url, opts, bucket, _needles = published
    key = url.removeprefix("s3://")
    old_catalog, old_pin = bucket.cat_file(f"{key}/catalog"), bucket.cat_file(f"{key}/pin")
    with cryptdisk.connect(db, cfg) as con:
        # two commits: a part named for the version after the old catalog's is not proof
        # (a writer killed before its commit leaves one), a part named for the one after is
        con.sql("INSERT INTO t VALUES (-1, 'late', 0)")
        con.sql("INSERT INTO t VALUES (-2, 'later', 0)")
        cryptdisk.db.publish(con, url, opts)
    with cryptdisk.connect(url, cfg, read_only=True, storage_options=opts) as con:
        assert con.rollback_evidence() is None
        assert con.sql("SELECT count(*) FROM t").to_pylist()[0]["count_star()"] == \
            3 * PART_ROWS + 2

    bucket.pipe_file(f"{key}/catalog", old_catalog)  # the catalog alone put back: the pin
    with caplog.at_level(logging.WARNING, logger="cryptdisk.db"):
        with cryptdisk.connect(url, cfg, read_only=True, storage_options=opts) as con:
            evidence = con.rollback_evidence()
    assert evidence is not None and "pin" in evidence
    assert "rolled back" in caplog.text
    caplog.clear()

    bucket.pipe_file(f"{key}/pin", old_pin)  # both put back: the newer part's name
    with caplog.at_level(logging.WARNING, logger="cryptdisk.db"):
        df = cryptdisk.dask.read_table(url, "t", config=cfg, storage_options=opts)
    assert "rolled back" in caplog.text and "later catalog versions" in caplog.text
    assert len(df.compute(scheduler="sync")) == 3 * PART_ROWS  # answered, not trusted silently

    # Publishing the current catalog again restores the newer version.
    with cryptdisk.connect(db, cfg) as con:
        cryptdisk.db.publish(con, url, opts)
    with cryptdisk.connect(url, cfg, read_only=True, storage_options=opts) as con:
        assert con.rollback_evidence() is None


def test_of_two_publishers_one_wins_and_the_other_overwrites_nothing(published, monkeypatch):
    db, cfg, url, opts, bucket, _needles = published
    key = url.removeprefix("s3://")
    before = bucket.cat_file(f"{key}/catalog")
    theirs = b"another publisher's catalog"
    real = RemoteDirectory.read_tagged

    def racing(self, name):  # another process uploads right after this one checked
        got = real(self, name)
        bucket.pipe_file(f"{self.url.removeprefix('s3://')}/{name}", theirs)
        return got

    with cryptdisk.connect(db, cfg) as con:
        con.sql("INSERT INTO t VALUES (-1, 'late', 0)")
        monkeypatch.setattr(RemoteDirectory, "read_tagged", racing)
        with pytest.raises(PublishConflictError, match="nothing was overwritten"):
            cryptdisk.db.publish(con, url, opts)  # If-Match on the catalog it checked
        assert bucket.cat_file(f"{key}/catalog") == theirs
        with pytest.raises(PublishConflictError):
            cryptdisk.db.publish(con, url + "-new", opts)  # If-None-Match: a first publish
        assert bucket.cat_file(f"{key}-new/catalog") == theirs
        monkeypatch.undo()
        with pytest.raises(CatalogError, match="cannot be trusted"):
            cryptdisk.db.publish(con, url, opts)  # never over a catalog it cannot read
        bucket.pipe_file(f"{key}/catalog", before)
        assert cryptdisk.db.publish(con, url, opts) == con.catalog.version
    with cryptdisk.connect(url, cfg, read_only=True, storage_options=opts) as con:
        assert con.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 3 * PART_ROWS + 1}]


def test_a_tampered_catalog_on_s3_is_refused(published):
    _db, cfg, url, opts, bucket, _needles = published
    key = url.removeprefix("s3://")
    data = bytearray(bucket.cat_file(f"{key}/catalog"))
    data[-20] ^= 1
    bucket.pipe_file(f"{key}/catalog", bytes(data))
    with pytest.raises(CatalogError, match="cannot be trusted"):
        cryptdisk.connect(url, cfg, read_only=True, storage_options=opts)
    with pytest.raises(CatalogError, match="cannot be trusted"):
        cryptdisk.dask.read_table(url, "t", config=cfg, storage_options=opts)


def _part_files(bucket, cfg_prefix):
    return sorted(p.rsplit("/", 1)[-1] for p in bucket.find(cfg_prefix)
                  if p.endswith(".parquet"))


def _catalog_parts(url, cfg, opts):
    with cryptdisk.connect(url, cfg, read_only=True, storage_options=opts) as con:
        return sorted(p["path"].rsplit("/", 1)[-1]
                      for p in con.sql("SELECT path FROM system.parts").to_pylist())


def test_the_cluster_writes_to_a_database_on_s3(client, recorder, published):
    db, cfg, url, opts, _bucket, needles = published
    with cryptdisk.connect(url, cfg, storage_options=opts) as w:  # no lock: conditional
        w.sql("CREATE TABLE u (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
        w.sql("INSERT INTO u VALUES (-1, 'sql', 0.5)")
    df = cryptdisk.dask.read_table(url, "t", config=cfg, storage_options=opts)
    with client.as_current():
        assert cryptdisk.dask.to_table(df[df.k % 2 == 0], url, "u", config=cfg,
                                       storage_options=opts) == 3 * PART_ROWS // 2
    want = pd.concat([_engine(db, cfg, "SELECT * FROM t WHERE k % 2 = 0"),
                      pd.DataFrame({"k": [-1], "s": ["sql"], "f": [0.5]})])
    _same(_engine(url, cfg, "SELECT * FROM u", storage_options=opts), want)
    _same(client.compute(cryptdisk.dask.read_table(url, "u", config=cfg,
                                                   storage_options=opts)).result(), want)
    for task_key, blobs in recorded_tasks(client):
        for blob in blobs:
            assert not any(n in blob for n in needles), task_key
    # the local copy is now behind the store: it refuses to write
    with pytest.raises(CatalogError, match="ahead of this copy"):
        cryptdisk.connect(db, cfg)


def test_of_two_writers_on_s3_one_commits_and_the_other_publishes_nothing(
        published, monkeypatch):
    _db, cfg, url, opts, bucket, _needles = published
    parts_prefix = url.removeprefix("s3://").rsplit("/", 1)[0] + "/parts"
    rows = "SELECT k FROM t WHERE k < 0 ORDER BY k"
    w1 = cryptdisk.connect(url, cfg, storage_options=opts)
    w2 = cryptdisk.connect(url, cfg, storage_options=opts)
    try:
        # w2 commits between w1's check of the catalog and w1's upload: If-Match fails
        real, fired = RemoteDirectory.commit_sealed, []

        def racing(self, *args, **kwargs):
            if not fired:
                fired.append(True)
                w2.sql("INSERT INTO t VALUES (-7, 'w2', 0)")
            return real(self, *args, **kwargs)

        monkeypatch.setattr(RemoteDirectory, "commit_sealed", racing)
        with pytest.raises(PublishConflictError, match="another writer committed first"):
            w1.sql("INSERT INTO t VALUES (-8, 'w1', 0)")
        monkeypatch.undo()
        assert _engine(url, cfg, rows, storage_options=opts).k.tolist() == [-7]
        # w1's part, named for the version w2 published, was collected by w2's commit
        assert _part_files(bucket, parts_prefix) == _catalog_parts(url, cfg, opts)
        assert len(_part_files(bucket, parts_prefix)) == 4

        # parts staged for a catalog another writer has passed are never committed
        w1.sql("SELECT 1")  # each statement of a writer at a URL loads the newest catalog
        version = w1.catalog.version + 1
        with cryptdisk.connect(url, cfg, read_only=True, storage_options=opts) as reader:
            staged = reader.stage_parts("t", pd.DataFrame({"k": [-9], "s": ["st"],
                                                           "f": [0.0]}), version)
        w2.sql("INSERT INTO t VALUES (-6, 'w2', 0)")
        with pytest.raises(PublishConflictError, match="since these parts were staged"):
            w1.commit_parts("t", staged)
        assert _engine(url, cfg, rows, storage_options=opts).k.tolist() == [-7, -6]
        # w1 again, on the newest catalog
        w1.sql("INSERT INTO t VALUES (-5, 'w1', 0)")
    finally:
        w1.close()
        w2.close()
    assert _engine(url, cfg, rows, storage_options=opts).k.tolist() == [-7, -6, -5]
    assert _part_files(bucket, parts_prefix) == _catalog_parts(url, cfg, opts)


def test_a_commit_whose_answer_is_lost_is_not_taken_for_a_lost_race(published, monkeypatch):
    _db, cfg, url, opts, _bucket, _needles = published
    with cryptdisk.connect(url, cfg, storage_options=opts) as w:
        fs = w._remote._disk.fs  # (fsspec puts its sync methods on the instance)
        real, lost = fs.pipe_file, []

        def answer_lost(path, data, **kwargs):  # S3 took the upload; the reply is lost
            real(path, data, **kwargs)
            if path.endswith("/catalog"):
                lost.append(path)
                raise OSError("connection reset by peer")

        monkeypatch.setattr(fs, "pipe_file", answer_lost)
        w.sql("INSERT INTO t VALUES (-1, 'once', 0)")
        monkeypatch.undo()
        assert lost  # the reply of the catalog's upload was lost
        w.sql("INSERT INTO t VALUES (-2, 'next', 0)")  # conditional on the first's ETag
    got = _engine(url, cfg, "SELECT k FROM t WHERE k < 0 ORDER BY k", storage_options=opts)
    assert got.k.tolist() == [-2, -1]


def test_a_commit_that_landed_stands_whatever_is_raised_after_it(published, monkeypatch):
    """As a local catalog is committed once renamed into place, a catalog at the URL is
    once the object is there: an interrupt after the upload keeps the commit (no undo
    in memory, the ETag it has), and an upload whose reply is lost while the store does
    not answer the check says that it may be published, never that it was not."""
    _db, cfg, url, opts, _bucket, _needles = published
    rows = "SELECT k FROM t WHERE k < 0 ORDER BY k"
    with cryptdisk.connect(url, cfg, storage_options=opts) as w:
        fs = w._remote._disk.fs  # (fsspec puts its sync methods on the instance)
        real = fs.pipe_file

        def then(exc):
            def upload(path, data, **kwargs):  # S3 takes the upload, then ...
                real(path, data, **kwargs)
                if path.endswith("/catalog"):
                    raise exc
            return upload

        version = w.catalog.version
        monkeypatch.setattr(fs, "pipe_file", then(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            w.sql("INSERT INTO t VALUES (-1, 'interrupted', 0)")
        monkeypatch.undo()
        assert w.catalog.version == version + 1  # published: not undone
        assert w.catalog.etag == w._remote.etag("catalog")
        assert [p.rows for p in w.catalog.tables["t"].parts][-1] == 1
        assert _engine(url, cfg, rows, storage_options=opts).k.tolist() == [-1]

        down, real_etag = [], RemoteDirectory.etag

        def reset(path, data, **kwargs):  # the upload lands, then the network goes down
            real(path, data, **kwargs)
            if path.endswith("/catalog"):
                down.append(path)
                raise OSError("connection reset by peer")

        def etag(self, name):
            if down:
                raise OSError("the store does not answer")
            return real_etag(self, name)

        monkeypatch.setattr(fs, "pipe_file", reset)
        monkeypatch.setattr(RemoteDirectory, "etag", etag)
        with pytest.raises(DatabaseError, match="did not answer whether it landed: it may be "
                                                "published"):
            w.sql("INSERT INTO t VALUES (-2, 'reply lost', 0)")
        monkeypatch.undo()
        # the next statement reads what the store holds: the insert is there, once
        assert w.sql(rows).to_pylist() == [{"k": -2}, {"k": -1}]
        w.sql("INSERT INTO t VALUES (-3, 'next', 0)")  # conditional on the landed ETag
    assert _engine(url, cfg, rows, storage_options=opts).k.tolist() == [-3, -2, -1]


def test_a_local_copy_behind_its_store_refuses_to_write(published):
    """A commit at the URL: its parts are named for versions beyond the published catalog's,
    which a local writer would take for a dead writer's and delete. Here the local copy has
    a commit of its own too (so its version is not behind the store's)."""
    db, cfg, url, opts, bucket, _needles = published
    parts_prefix = url.removeprefix("s3://").rsplit("/", 1)[0] + "/parts"
    with cryptdisk.connect(db, cfg) as con:
        con.sql("INSERT INTO t VALUES (-2, 'local, not published', 0)")
    with cryptdisk.connect(url, cfg, storage_options=opts) as w:
        w.sql("INSERT INTO t VALUES (-1, 'at the url', 0)")
    files = _part_files(bucket, parts_prefix)
    with pytest.raises(CatalogError, match="ahead of this copy's publish"):
        cryptdisk.connect(db, cfg)
    assert _part_files(bucket, parts_prefix) == files
    assert set(_catalog_parts(url, cfg, opts)) <= set(files)
    with cryptdisk.connect(db, cfg, read_only=True) as con:  # reading it is still fine
        assert con.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 3 * PART_ROWS + 1}]


def test_a_writer_on_s3_refuses_a_rolled_back_catalog_and_deletes_nothing(published):
    _db, cfg, url, opts, bucket, _needles = published
    key = url.removeprefix("s3://")
    parts_prefix = key.rsplit("/", 1)[0] + "/parts"
    old = {n: bucket.cat_file(f"{key}/{n}") for n in ("catalog", "pin")}
    with cryptdisk.connect(url, cfg, storage_options=opts) as w:
        w.sql("INSERT INTO t VALUES (-1, 'a', 0)")
        w.sql("INSERT INTO t VALUES (-2, 'b', 0)")
    files = _part_files(bucket, parts_prefix)
    for name, data in old.items():
        bucket.pipe_file(f"{key}/{name}", data)
    with pytest.raises(CatalogError, match="rolled back"):
        cryptdisk.connect(url, cfg, storage_options=opts)
    assert _part_files(bucket, parts_prefix) == files


def test_what_a_database_at_a_url_refuses(published, tmp_path, monkeypatch):
    db, cfg, url, opts, bucket, _needles = published
    monkeypatch.chdir(tmp_path)
    with cryptdisk.connect(url, cfg, storage_options=opts) as w:
        for sql in ("DROP TABLE t", "TRUNCATE t", "OPTIMIZE TABLE t",
                    "ALTER TABLE t MODIFY SETTING storage_policy = 'plain'", "SYSTEM ROTATE KEYS"):
            with pytest.raises(DatabaseError, match="not available on a database at a URL"):
                w.sql(sql)
    assert not os.path.exists(tmp_path / "s3:")  # not taken for a local path
    with pytest.raises(DatabaseError, match="no catalog"):
        cryptdisk.connect(url + "-empty", cfg, storage_options=opts)
    # elsewhere than S3 (no conditional upload): read-only
    with cryptdisk.connect(db, cfg) as con:
        cryptdisk.db.publish(con, "memory://cryptdisk-test/db")
    with pytest.raises(DatabaseError, match="only on S3"):
        cryptdisk.connect("memory://cryptdisk-test/db", cfg)
    _same(_engine("memory://cryptdisk-test/db", cfg, "SELECT count(*) AS n FROM t"),
          pd.DataFrame({"n": [3 * PART_ROWS]}))
    with pytest.raises(DatabaseError, match="needs a config"):
        cryptdisk.connect(url, read_only=True, storage_options=opts)
    with pytest.raises(ConfigError, match="credential"):
        cryptdisk.connect(url, cfg, read_only=True,
                          storage_options={**opts, "secret": "x"})
    with pytest.raises(ConfigError, match="credentials"):
        cryptdisk.connect(url.replace("s3://", "s3://user:pw@"), cfg, read_only=True,
                          storage_options=opts)
    with pytest.raises(DatabaseError, match="no catalog"):
        cryptdisk.connect(url + "-missing", cfg, read_only=True, storage_options=opts)
    with pytest.raises(DatabaseError, match="storage_options apply"):
        cryptdisk.connect(db, cfg, read_only=True, storage_options=opts)

    # another database is never published over this one
    with cryptdisk.connect(tmp_path / "other", cfg) as other, \
            pytest.raises(DatabaseError, match="another database"):
        cryptdisk.db.publish(other, url, opts)
    # a database made without a config keeps its key beside it: not published
    with cryptdisk.connect(tmp_path / "plain") as own, \
            pytest.raises(DatabaseError, match="without a config"):
        cryptdisk.db.publish(own, url + "-own", opts)
    assert not bucket.exists(url.removeprefix("s3://") + "-own")
