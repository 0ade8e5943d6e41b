"""Reading and writing encrypted Parquet through cryptdisk:// with the common data tools."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pyarrow as pa
import pytest

from cryptdisk.fs import CryptdiskFileSystem

from .conftest import MARKER, assert_ciphertext_only

N = 5000


def table() -> pa.Table:
    return pa.table({"i": pa.array(range(N), pa.int64()),
                     "s": [f"{MARKER}-{i}" for i in range(N)]})


def check(t: pa.Table) -> None:
    t = t.select(["i", "s"]).sort_by("i")
    assert t.num_rows == N
    assert t.column("i").to_pylist() == list(range(N))
    assert t.column("s")[123].as_py() == f"{MARKER}-123"


@pytest.fixture
def fs(config_path: str) -> CryptdiskFileSystem:
    return CryptdiskFileSystem(config=config_path)


def test_duckdb_copy_to_and_read_parquet(fs: CryptdiskFileSystem, tmp_path: Path) -> None:
    import duckdb

    con = duckdb.connect()
    con.register_filesystem(fs)
    con.execute(f"COPY (SELECT range AS i, '{MARKER}-' || range AS s FROM range({N})) "
                "TO 'cryptdisk://secure/duck/t.parquet' (FORMAT parquet)")
    got = con.execute("SELECT count(*), sum(i), max(s) FROM "
                      "read_parquet('cryptdisk://secure/duck/t.parquet')").fetchall()[0]
    assert got == (N, N * (N - 1) // 2, f"{MARKER}-999")
    check(con.sql("SELECT * FROM read_parquet('cryptdisk://secure/duck/*.parquet')")
          .to_arrow_table())
    assert assert_ciphertext_only(tmp_path / "raw" / "enc") == 1


def test_duckdb_threads_read_one_file(fs: CryptdiskFileSystem) -> None:
    import duckdb
    import pyarrow.parquet as pq

    big = pa.table({"i": pa.array(range(400_000), pa.int64())})
    with fs.open("cryptdisk://secure/big.parquet", "wb") as f:
        pq.write_table(big, f, row_group_size=20_000)
    con = duckdb.connect(config={"threads": 4})
    con.register_filesystem(fs)
    for _ in range(3):
        assert con.execute("SELECT sum(i) FROM 'cryptdisk://secure/big.parquet'").fetchall() == [(
            400_000 * 399_999 // 2,)]


def test_pyarrow_parquet_and_dataset(fs: CryptdiskFileSystem, tmp_path: Path) -> None:
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    pq.write_table(table(), "secure/pa/t.parquet", filesystem=fs)
    check(pq.read_table("secure/pa/t.parquet", filesystem=fs))
    ds.write_dataset(table(), "secure/pads", format="parquet", filesystem=fs,
                     max_rows_per_file=2000, max_rows_per_group=2000)
    dataset = ds.dataset("secure/pads", format="parquet", filesystem=fs)
    assert len(dataset.files) == 3
    check(dataset.to_table())
    assert assert_ciphertext_only(tmp_path / "raw" / "enc") == 4


def test_pandas_storage_options(config_path: str, tmp_path: Path) -> None:
    import pandas as pd

    df = table().to_pandas()
    opts = {"config": config_path}
    df.to_parquet("cryptdisk://secure/pd/t.parquet", storage_options=opts)
    back = pd.read_parquet("cryptdisk://secure/pd/t.parquet", storage_options=opts)
    check(pa.Table.from_pandas(back, preserve_index=False))
    df.head(10).to_csv("cryptdisk://secure/pd/t.csv", storage_options=opts, index=False)
    assert pd.read_csv("cryptdisk://secure/pd/t.csv", storage_options=opts)["s"][9] == \
        f"{MARKER}-9"
    assert assert_ciphertext_only(tmp_path / "raw" / "enc") == 2


def test_polars_through_file_objects_and_pyarrow(fs: CryptdiskFileSystem, tmp_path: Path) -> None:
    import polars as pl
    import pyarrow.dataset as ds

    df = pl.from_arrow(table())
    with fs.open("cryptdisk://secure/pl/t.parquet", "wb") as f:
        df.write_parquet(f)
    with fs.open("cryptdisk://secure/pl/t.parquet", "rb") as f:
        back = pl.read_parquet(f)
    check(back.to_arrow())
    lazy = pl.scan_pyarrow_dataset(ds.dataset("secure/pl", format="parquet", filesystem=fs))
    assert lazy.filter(pl.col("i") < 10).collect().height == 10
    # URLs with use_pyarrow=True (Polars' own readers do not use fsspec for cryptdisk://)
    opts = {"config": fs.config_path}
    check(pl.read_parquet("cryptdisk://secure/pl/t.parquet", storage_options=opts,
                          use_pyarrow=True).to_arrow())
    with fs.open("cryptdisk://secure/pl/t.csv", "wb") as f:
        df.write_csv(f)
    check(pl.read_csv("cryptdisk://secure/pl/t.csv", storage_options=opts,
                      use_pyarrow=True).to_arrow())
    assert assert_ciphertext_only(tmp_path / "raw" / "enc") == 2


# dask 2026.x still calls reset_index(inplace=True), which pandas 3.1 deprecates.
@pytest.mark.filterwarnings("ignore:The inplace keyword in DataFrame.reset_index")
def test_dask_read_and_write(config_path: str, tmp_path: Path) -> None:
    import dask
    import dask.dataframe as dd

    opts = {"config": config_path}
    ddf = dd.from_pandas(table().to_pandas(), npartitions=3)
    with dask.config.set(scheduler="threads"):
        ddf.to_parquet("cryptdisk://secure/dask", storage_options=opts, write_index=False)
        back = dd.read_parquet("cryptdisk://secure/dask", storage_options=opts)
        assert int(back["i"].sum().compute()) == N * (N - 1) // 2
        assert back.npartitions == 3
    assert assert_ciphertext_only(tmp_path / "raw" / "enc") == 3


def test_fsspec_open_url(config_path: str) -> None:
    with fsspec.open("cryptdisk://secure/u.txt", "w", config=config_path) as f:
        f.write(f"{MARKER}\n")
    with fsspec.open("cryptdisk://secure/u.txt", "r", config=config_path) as f:
        assert f.read() == f"{MARKER}\n"


def test_dask_csv_one_file_per_partition_and_single_file_refused_clearly(
        config_path: str, tmp_path: Path) -> None:
    import dask
    import dask.dataframe as dd

    opts = {"config": config_path}
    ddf = dd.from_pandas(table().to_pandas(), npartitions=3)
    with dask.config.set(scheduler="threads"):
        ddf.to_csv("cryptdisk://secure/csv/*.csv", storage_options=opts, index=False)
        back = dd.read_csv("cryptdisk://secure/csv/*.csv", storage_options=opts, blocksize=20000)
        assert back.npartitions > 3 and int(back["i"].sum().compute()) == N * (N - 1) // 2
        # single_file appends each partition after the first: sealed files take no appends
        with pytest.raises(ValueError, match=r"not 'ab'.*one file per piece.*single_file"):
            ddf.to_csv("cryptdisk://secure/one.csv", storage_options=opts, single_file=True)
    assert assert_ciphertext_only(tmp_path / "raw" / "enc") == 4
