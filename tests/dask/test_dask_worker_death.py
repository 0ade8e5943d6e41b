"""A worker process that dies mid-task: os._exit from inside the task, right after its
read or its parts' write, and kill -9 from the test while the worker is in the middle of
writing a part (on a local directory and on S3), once it reports that point itself. Dask
reruns the task and the results are exact (a lost attempt leaves orphans, never duplicate
rows), or, without retries, the job fails and the table keeps its old rows."""

import os

import dask
import dask.dataframe as dd
import pandas as pd
import pytest

import cryptdisk
import cryptdisk.dask

from ..db.dbhelpers import write_config
from .conftest import local_cluster


@pytest.fixture
def dying_client():
    """Its own cluster: one of its worker processes is killed (the nanny starts a new one)."""
    with local_cluster() as c:
        yield c


def _die_once_after(method, marker):
    """Patch Database.METHOD in every worker: the first call anywhere returns its work
    done, then kills its own process before the result leaves it."""
    def patch():
        from cryptdisk.db import Database

        original = getattr(Database, method)

        def dying(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return result
            os._exit(1)

        setattr(Database, method, dying)
    return patch


def test_a_read_whose_worker_dies_is_rerun_exactly(dying_client, tmp_path):
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        for i in range(3):
            db.sql(f"INSERT INTO t SELECT i, i::VARCHAR FROM range({i * 1000}, "
                   f"{(i + 1) * 1000}) r(i)")
    marker = str(tmp_path / "died")
    dying_client.run(_die_once_after("read_part", marker))
    df = cryptdisk.dask.read_table(tmp_path / "db", "t")
    got = dying_client.compute(df).result().sort_values("k").reset_index(drop=True)
    assert os.path.exists(marker)  # a worker did die mid-task
    assert got.k.tolist() == list(range(3000)) and got.s.tolist() == [str(i) for i in
                                                                      range(3000)]


def test_a_write_whose_worker_dies_after_writing_commits_each_row_once(dying_client,
                                                                       tmp_path):
    cfg = write_config(tmp_path, [1], 1)
    with cryptdisk.connect(tmp_path / "db", cfg) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR)")
    marker = str(tmp_path / "died")
    dying_client.run(_die_once_after("stage_parts", marker))
    pdf = pd.DataFrame({"k": range(3000), "s": [str(i) for i in range(3000)]})
    with dying_client.as_current():
        n = cryptdisk.dask.to_table(dd.from_pandas(pdf, npartitions=3), tmp_path / "db", "t",
                                    config=cfg)
    assert os.path.exists(marker) and n == 3000
    with cryptdisk.connect(tmp_path / "db", cfg, read_only=True) as db:
        assert db.query("SELECT count(*), count(DISTINCT k), sum(k) FROM t") == [
            (3000, 3000, sum(range(3000)))]
        assert len(db.table("t").parts) == 3
    files = list((tmp_path / "store" / "secure").rglob("*.parquet"))
    assert len(files) == 4  # the dead attempt's part: an orphan until the catalog moves on


# -- kill -9 of a worker process in the middle of writing a part ---------------------------

PAUSE_AFTER = 256 << 10  # bytes of a part the backing store has taken when the worker stops


def _pause_mid_part(marker):
    """Patch every backing disk's open_write in the worker: the first part (anywhere) to
    reach PAUSE_AFTER bytes reports ``pid path`` in ``marker`` and waits to be killed."""
    def patch():
        import time

        from cryptdisk.disks import FsspecDisk, LocalDisk

        class Pausing:
            def __init__(self, inner, path):
                self._inner, self._path, self._written = inner, path, 0

            def write(self, data):
                n = self._inner.write(data)
                self._written += len(memoryview(data).cast("B"))
                if self._written >= PAUSE_AFTER:
                    try:  # the first part anywhere claims the pause
                        os.close(os.open(marker + ".claim", os.O_CREAT | os.O_EXCL))
                    except FileExistsError:
                        return n
                    fd = os.open(marker + ".tmp", os.O_CREAT | os.O_WRONLY)
                    os.write(fd, f"{os.getpid()} {self._path}".encode())
                    os.close(fd)
                    os.rename(marker + ".tmp", marker)  # the report appears whole
                    deadline = time.monotonic() + 300
                    while time.monotonic() < deadline:  # until the test kills this process
                        time.sleep(0.05)
                    raise RuntimeError("the test never killed this worker")
                return n

            def __getattr__(self, name):
                return getattr(self._inner, name)

        for cls in (LocalDisk, FsspecDisk):
            original = cls.open_write

            def open_write(self, path, _original=original):
                f = _original(self, path)
                return Pausing(f, path) if path.endswith(".parquet") else f

            cls.open_write = open_write
    return patch


def _wait_for(what, check):
    import time

    deadline = time.monotonic() + 300
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _backing(kind, s3, tmp_path):
    """(config, published part files of the backing store, part file exists?) for kind."""
    import uuid

    if kind == "local":
        cfg = write_config(tmp_path, [1], 1)
        store = tmp_path / "store" / "secure"

        def published():
            return sorted(p.name for p in store.rglob("*.parquet"))

        return cfg, published, lambda path: (store / path).exists()
    import s3fs

    from .conftest import S3_BUCKET
    from .daskhelpers import write_s3_config

    endpoint, _secret = s3
    prefix = uuid.uuid4().hex
    cfg = write_s3_config(tmp_path, endpoint, S3_BUCKET, prefix)
    bucket = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
    root = f"{S3_BUCKET}/{prefix}"

    def s3_published():
        bucket.invalidate_cache()
        return sorted(p.rsplit("/", 1)[-1] for p in bucket.find(root) if p.endswith(".parquet"))

    return cfg, s3_published, lambda path: bucket.exists(f"{root}/{path}")


ROWS = 240_000  # two partitions of 120k rows: parts of about 2 MB each
#: each worker holds one partition at a time, so the two go to the two workers
ONE_TASK_EACH = {"distributed.scheduler.worker-saturation": 1.0}


def _kill_mid_part(client, tmp_path, cfg, published):
    """Run to_table of two partitions; once one worker is mid-part and the other's part is
    published, kill -9 the first. Returns (the to_table future, the killed part's path,
    the job's catalog version)."""
    import signal
    from concurrent.futures import ThreadPoolExecutor

    with cryptdisk.connect(tmp_path / "db", cfg) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        db.sql("INSERT INTO t SELECT i, 'old' FROM range(10) r(i)")
        version = db.catalog.version + 1
    marker = str(tmp_path / "paused")
    client.run(_pause_mid_part(marker))
    half = ROWS // 2

    def partition(i):  # made on the worker: a graph carrying 2 x 120k rows is large
        import pandas

        ks = range(10 + i * half, 10 + (i + 1) * half)
        return pandas.DataFrame({"k": list(ks), "s": [f"{k:032x}" for k in ks]})

    df = dd.from_map(partition, [0, 1])
    pool = ThreadPoolExecutor(1)

    def job():
        with client.as_current():
            return cryptdisk.dask.to_table(df, tmp_path / "db", "t", config=cfg)

    result = pool.submit(job)
    _wait_for("a worker mid-part", lambda: os.path.exists(marker) or result.done())
    assert not result.done(), result.result()
    with open(marker) as f:
        pid, path = f.read().split()
    # the other worker's partition: its part published (parts are named v<version>-<id>)
    _wait_for("the other partition's part",
              lambda: any(n.startswith(f"v{version}-") for n in published()))
    os.kill(int(pid), signal.SIGKILL)
    pool.shutdown(wait=False)
    return result, path, version


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_worker_killed_mid_part_is_replaced_and_the_write_is_exact(kind, s3, tmp_path):
    cfg, published, exists = _backing(kind, s3, tmp_path)
    with dask.config.set(ONE_TASK_EACH), local_cluster() as c:  # after s3: its environment
        result, path, version = _kill_mid_part(c, tmp_path, cfg, published)
        assert not exists(path)  # killed before its part was published
        assert result.result(timeout=300) == ROWS  # Dask reran the task
    with cryptdisk.connect(tmp_path / "db", cfg, read_only=True) as db:
        assert db.catalog.version == version  # one commit for the job
        assert db.query("SELECT count(*), count(DISTINCT k), min(k), max(k) FROM t "
                        "WHERE s <> 'old'") == [(ROWS, ROWS, 10, 9 + ROWS)]
        parts = {p["path"].rsplit("/", 1)[-1]
                 for p in db.sql("SELECT path FROM system.parts").to_pylist()}
    assert len(parts) == 3 and path.rsplit("/", 1)[-1] not in parts
    assert set(published()) == parts  # the killed part never appeared
    if kind == "local":  # what the killed worker left: a temporary, never listed
        temps = list((tmp_path / "store" / "secure").rglob("*.cdtmp"))
        assert len(temps) == 1


def test_a_worker_killed_mid_part_without_retries_fails_the_job_cleanly(s3, tmp_path):
    from distributed import KilledWorker

    cfg, published, exists = _backing("local", s3, tmp_path)
    with dask.config.set({**ONE_TASK_EACH, "distributed.scheduler.allowed-failures": 0}), \
            local_cluster() as c:
        result, path, version = _kill_mid_part(c, tmp_path, cfg, published)
        with pytest.raises(KilledWorker):
            result.result(timeout=300)
    orphans = published()
    assert len(orphans) == 2  # the old row's part and the finished partition's
    with cryptdisk.connect(tmp_path / "db", cfg) as db:  # the job's write lock is gone
        assert db.catalog.version == version - 1  # nothing committed
        assert db.query("SELECT count(*), min(s), max(s) FROM t") == [(10, "old", "old")]
        db.sql("INSERT INTO t SELECT 100, 'new'")
        db.sql("INSERT INTO t SELECT 101, 'new'")  # the catalog has passed the job's version
        parts = sorted(p["path"].rsplit("/", 1)[-1]
                       for p in db.sql("SELECT path FROM system.parts").to_pylist())
    assert published() == parts and not exists(path)  # the finished partition's part: gone
