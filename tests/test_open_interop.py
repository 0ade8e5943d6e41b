"""cryptdisk.open returns ordinary binary file objects: pyarrow, pandas and zipfile use them."""

from __future__ import annotations

import io
import zipfile

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cryptdisk
from cryptdisk import Keyring

RING = Keyring.generate()


def test_file_object_protocol(tmp_path):
    path = tmp_path / "f.cd"
    with cryptdisk.open(path, "wb", keyring=RING) as f:
        assert f.writable() and not f.readable()
        f.write(b"hello ")
        f.write(bytearray(b"world"))
        assert f.tell() == 11
    with cryptdisk.open(path, "rb", keyring=RING) as f:
        assert f.readable() and f.seekable() and not f.writable()
        assert f.read(5) == b"hello" and f.tell() == 5
        assert f.seek(-5, io.SEEK_END) == 6 and f.read() == b"world"
        f.seek(0)
        buf = bytearray(20)
        assert f.readinto(buf) == 11 and buf[:11] == b"hello world"
        assert f.read() == b""
        assert "f.cd" in repr(f) and f.size == 11
        with pytest.raises(io.UnsupportedOperation):
            f.write(b"x")
    assert f.closed
    with pytest.raises(ValueError):
        f.read()
    buffered = io.BufferedReader(cryptdisk.open(path, "rb", keyring=RING))
    assert buffered.read() == b"hello world"
    buffered.close()


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "f.cd"
    with cryptdisk.open(path, "wb", keyring=RING) as f:
        f.write(b"old")
    with pytest.raises(RuntimeError), cryptdisk.open(path, "wb", keyring=RING) as f:
        f.write(b"new data")
        raise RuntimeError("boom")
    with cryptdisk.open(path, "rb", keyring=RING) as f:
        assert f.read() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.cd"]
    with pytest.raises(FileExistsError):
        cryptdisk.open(path, "xb", keyring=RING)
    with pytest.raises(cryptdisk.ImmutableFileError, match="sealed files"):
        cryptdisk.open(path, "r+b", keyring=RING)
    with pytest.raises(ValueError, match="mode"):
        cryptdisk.open(path, "r", keyring=RING)
    with pytest.raises(TypeError, match="Keyring"):
        cryptdisk.open(path, "rb", keyring="secret")  # type: ignore[call-overload]


def test_pyarrow_parquet_round_trip(tmp_path):
    table = pa.table({"c_int": list(range(50_000)), "c_str": [f"s{i}" for i in range(50_000)]})
    path = tmp_path / "t.parquet.cd"
    with cryptdisk.open(path, "wb", keyring=RING) as f:
        pq.write_table(table, f)
    assert b"PAR1" not in path.read_bytes()
    with cryptdisk.open(path, "rb", keyring=RING) as f:
        assert pq.read_table(f).equals(table)
    with cryptdisk.open(path, "rb", keyring=RING) as f:
        assert pq.ParquetFile(f).metadata.num_rows == 50_000


def test_pandas_csv_and_parquet(tmp_path):
    df = pd.DataFrame({"a": range(1000), "b": [x / 3 for x in range(1000)]})
    path = tmp_path / "df.csv.cd"
    with cryptdisk.open(path, "wb", keyring=RING) as f:
        df.to_csv(f, index=False)
    with cryptdisk.open(path, "rb", keyring=RING) as f:
        pd.testing.assert_frame_equal(pd.read_csv(f), df)
    ppath = tmp_path / "df.parquet.cd"
    with cryptdisk.open(ppath, "wb", keyring=RING) as f:
        df.to_parquet(f)
    with cryptdisk.open(ppath, "rb", keyring=RING) as f:
        pd.testing.assert_frame_equal(pd.read_parquet(f), df)


def test_zipfile_in_both_directions(tmp_path):
    path = tmp_path / "a.zip.cd"
    with cryptdisk.open(path, "wb", keyring=RING) as f, zipfile.ZipFile(f, "w") as z:
        z.writestr("one.txt", "first")
        z.writestr("two.bin", bytes(range(256)) * 100)
    with cryptdisk.open(path, "rb", keyring=RING) as f, zipfile.ZipFile(f) as z:
        assert z.read("one.txt") == b"first"
        assert z.read("two.bin") == bytes(range(256)) * 100
    # a mutable file is seekable for writing too
    mpath = tmp_path / "m.zip.cd"
    with cryptdisk.open(mpath, "w+b", keyring=RING) as f:
        with zipfile.ZipFile(f, "w") as z:
            z.writestr("x", "y" * 10_000)
        f.seek(0)
        with zipfile.ZipFile(f) as z:
            assert z.read("x") == b"y" * 10_000
