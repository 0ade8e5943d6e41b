"""A worker process that dies mid-task (os._exit from inside the task, right after its
read or its parts' write): Dask reruns the task on a worker, and the results are exact
(a write's lost attempt leaves orphan parts, never duplicate rows)."""

import os

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
