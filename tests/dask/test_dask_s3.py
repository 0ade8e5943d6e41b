"""Encrypted tables and cryptdisk:// datasets whose files live on S3 (moto's server on
loopback), read and written by a LocalCluster's worker processes: results equal the
embedded engine's, every object in the bucket is sealed, and no task the scheduler sends
carries the encryption key or the S3 secret (workers take both from their own config and
environment)."""

import uuid

import dask.dataframe as dd
import pandas as pd
import pytest
import s3fs

import cryptdisk
import cryptdisk.dask
from cryptdisk.format import MAGIC

from .conftest import S3_BUCKET
from .daskhelpers import TaskRecorder, key_needles, recorded_tasks, write_s3_config

# dask 2026.8's read_parquet calls reset_index and set_index with inplace=True (deprecated
# by pandas 3.1)
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword in DataFrame")

PART_ROWS = 70_000  # 2 row groups of 64Ki rows per part


@pytest.fixture
def on_s3(s3, tmp_path):
    """A config whose encrypted disk ``secure`` is on S3 under a fresh prefix."""
    endpoint, aws_secret = s3
    prefix = uuid.uuid4().hex
    cfg = write_s3_config(tmp_path, endpoint, S3_BUCKET, prefix)
    bucket = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
    return cfg, bucket, f"{S3_BUCKET}/{prefix}", key_needles(tmp_path, aws_secret)


@pytest.fixture
def recorder(client):
    client.register_plugin(TaskRecorder())
    recorded_tasks(client)  # start empty
    yield
    client.unregister_scheduler_plugin(TaskRecorder.name)


def _objects(bucket, root):
    return {p: bucket.cat_file(p) for p in bucket.find(root)}


def _assert_sealed(objects, *plaintexts):
    assert objects
    for path, data in objects.items():
        assert data.startswith(MAGIC), path
        assert b"PAR1" not in data and not any(p in data for p in plaintexts), path


def _assert_no_secret(tasks, needles, config_path):
    assert tasks
    for key, blobs in tasks:
        for blob in blobs:
            assert not any(n in blob for n in needles), key
    # the scan sees the tasks' arguments: some task names the config by path
    assert any(str(config_path).encode() in b for _k, blobs in tasks for b in blobs)


def _engine(db, cfg, sql):
    with cryptdisk.connect(db, cfg, read_only=True) as con:
        return con.sql(sql).to_pandas()


def _same(got, want):
    got = got.sort_values(list(got.columns)).reset_index(drop=True)
    want = want.sort_values(list(want.columns)).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_a_table_on_s3_is_read_and_written_by_the_cluster(client, recorder, on_s3, tmp_path):
    cfg, bucket, root, needles = on_s3
    db = tmp_path / "db"
    with cryptdisk.connect(db, cfg) as con:
        con.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
        con.sql("CREATE TABLE u (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
        for i in range(3):
            con.sql(f"INSERT INTO t SELECT i, 'row-' || i, i / 7 FROM range({i * PART_ROWS}, "
                    f"{(i + 1) * PART_ROWS}) r(i)")
    assert not (tmp_path / "store").exists()  # the parts are on S3, not in the directory

    df = cryptdisk.dask.read_table(db, "t", config=cfg, min_partition_rows=0)  # one per part
    assert df.npartitions == 3
    _same(client.compute(df).result(), _engine(db, cfg, "SELECT * FROM t"))
    lo, hi = PART_ROWS + 5, PART_ROWS + 60_000
    flt = cryptdisk.dask.read_table(db, "t", ["k", "f"], [("k", ">=", lo), ("k", "<", hi)],
                                    config=cfg, min_partition_rows=0)
    assert flt.npartitions == 1
    _same(client.compute(flt).result(),
          _engine(db, cfg, f"SELECT k, f FROM t WHERE k >= {lo} AND k < {hi}"))

    with client.as_current():
        assert cryptdisk.dask.to_table(df[df.k % 2 == 0], db, "u", config=cfg) == \
            3 * PART_ROWS // 2
    _same(_engine(db, cfg, "SELECT * FROM u"), _engine(db, cfg, "SELECT * FROM t WHERE k % 2 = 0"))
    with cryptdisk.connect(db, cfg, read_only=True) as con:
        parts = con.sql('SELECT "table", path FROM system.parts').to_pylist()
    assert sorted(p["table"] for p in parts) == ["t"] * 3 + ["u"] * 3
    objects = _objects(bucket, root)
    assert len(objects) == 6 and {p.rsplit("/", 1)[-1] for p in objects} == {
        p["path"].rsplit("/", 1)[-1] for p in parts}
    _assert_sealed(objects, b"row-1234")
    _assert_no_secret(recorded_tasks(client), needles, cfg)


def test_a_dataset_on_s3_round_trips_through_the_cluster(client, recorder, on_s3):
    cfg, bucket, root, needles = on_s3
    opts = {"config": str(cfg)}  # all the storage_options there are: a path
    pdf = pd.DataFrame({"k": range(3000), "s": [f"v{i % 97}-x" for i in range(3000)],
                        "f": [i / 7 for i in range(3000)]})
    client.compute(dd.from_pandas(pdf, npartitions=3).to_parquet(
        "cryptdisk://secure/ds", storage_options=opts, compute=False)).result()
    objects = _objects(bucket, root)
    assert sum(p.endswith(".parquet") for p in objects) == 3
    _assert_sealed(objects, b"v96-x")

    back = dd.read_parquet("cryptdisk://secure/ds", storage_options=opts)
    got = client.compute(back).result().sort_values("k").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, pdf, check_dtype=False)
    filtered = dd.read_parquet("cryptdisk://secure/ds", storage_options=opts,
                               filters=[("k", ">=", 2500)])
    assert sorted(client.compute(filtered.k).result()) == list(range(2500, 3000))
    _assert_no_secret(recorded_tasks(client), needles, cfg)


def test_a_kms_wrapped_key_is_unwrapped_by_each_worker_never_sent(client, recorder, s3,
                                                                  tmp_path):
    """The keyring key is an aws-kms entry (KMS on the same moto server): tasks carry the
    config path; each worker process asks KMS itself; the key is in no task."""
    import base64

    import boto3

    from cryptdisk.keys.providers import create_aws_kms_wrapped_key

    endpoint, aws_secret = s3
    kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
    kms_key = kms.create_key(KeyUsage="ENCRYPT_DECRYPT")["KeyMetadata"]["KeyId"]
    create_aws_kms_wrapped_key(tmp_path / "k6.kms", kms_key, key_id=6, region="us-east-1",
                               endpoint=endpoint)
    kek = kms.decrypt(CiphertextBlob=base64.b64decode((tmp_path / "k6.kms").read_text()),
                      EncryptionContext={"cryptdisk-key-id": "6"})["Plaintext"]
    prefix = uuid.uuid4().hex
    cfg = tmp_path / "kms.toml"
    cfg.write_text(f"""[keyring]
current_key_id = 6
[[keyring.keys]]
id = 6
source = "aws-kms"
kms_key = "{kms_key}"
wrapped_key = "k6.kms"
region = "us-east-1"
endpoint = "{endpoint}"
[disks.raw]
type = "fsspec"
url = "s3://{S3_BUCKET}/{prefix}"
storage_options = {{ endpoint_url = "{endpoint}" }}
[disks.secure]
type = "encrypted"
disk = "raw"
[policies.default]
volumes = [{{ name = "main", disks = ["secure"] }}]
""")
    db = tmp_path / "db"
    with cryptdisk.connect(db, cfg) as con:
        con.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        con.sql("CREATE TABLE u (k BIGINT, s VARCHAR) ORDER BY k")
        con.sql("INSERT INTO t SELECT i, 'kms-' || i FROM range(5000) r(i)")
        con.sql("INSERT INTO t SELECT i, 'kms-' || i FROM range(5000, 9000) r(i)")
    df = cryptdisk.dask.read_table(db, "t", config=cfg)
    _same(client.compute(df).result(), _engine(db, cfg, "SELECT * FROM t"))
    with client.as_current():
        assert cryptdisk.dask.to_table(df, db, "u", config=cfg) == 9000
    _same(_engine(db, cfg, "SELECT * FROM u"), _engine(db, cfg, "SELECT * FROM t"))
    _assert_sealed(_objects(s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True),
                            f"{S3_BUCKET}/{prefix}"), b"kms-4321")

    path, config = str(db), str(cfg)

    def key_here():  # this worker's keyring key: from KMS, used by this process
        from cryptdisk.dask._read import _process_database

        with _process_database(path, config) as (db, _opened):
            key = db.keyring.current_key()
            return type(key).__name__, key.source, key.uses["provider_calls"] > 0

    assert set(client.run(key_here).values()) == {("ProviderKey", "aws-kms", True)}
    needles = [aws_secret.encode(), kek, kek.hex().encode(), kek.hex().upper().encode()]
    _assert_no_secret(recorded_tasks(client), needles, cfg)
