"""The cryptdisk:// filesystem's own API: paths, listing, atomic writes, pickling, secrets."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.csv as pa_csv
import pyarrow.dataset as ds
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import pytest

from cryptdisk.errors import ConfigError, PolicyError
from cryptdisk.fs import CryptdiskFileSystem

from .conftest import KEY_HEX, MARKER, assert_ciphertext_only


def test_registered_through_entry_point(config_path: str) -> None:
    fs = fsspec.filesystem("cryptdisk", config=config_path)
    assert isinstance(fs, CryptdiskFileSystem)


def test_pipe_cat_ls_info_rm(config_path: str, tmp_path: Path) -> None:
    fs = CryptdiskFileSystem(config=config_path)
    fs.pipe_file("cryptdisk://secure/a/b.txt", MARKER.encode() * 100)
    fs.pipe_file("cryptdisk://secure/a/c/d.txt", b"d")
    assert fs.cat_file("cryptdisk://secure/a/b.txt", 3, 10) == (MARKER.encode() * 100)[3:10]
    assert fs.cat_file("secure/a/b.txt", -5) == (MARKER.encode() * 100)[-5:]
    assert fs.ls("cryptdisk://secure/a", detail=False) == ["secure/a/b.txt", "secure/a/c"]
    assert sorted(fs.ls("", detail=False)) == ["default", "plain", "raw", "secure"]
    info = fs.info("cryptdisk://secure/a/b.txt")
    assert info["type"] == "file" and info["size"] == len(MARKER) * 100 and info["encrypted"]
    assert fs.info("cryptdisk://secure/a")["type"] == "directory"
    assert fs.modified("cryptdisk://secure/a/b.txt").year >= 2024
    assert sorted(fs.find("cryptdisk://secure")) == ["secure/a/b.txt", "secure/a/c/d.txt"]
    assert assert_ciphertext_only(tmp_path / "raw" / "enc") == 2
    fs.rm("cryptdisk://secure/a", recursive=True)
    assert fs.find("cryptdisk://secure") == []
    with pytest.raises(FileNotFoundError):
        fs.info("cryptdisk://secure/a/b.txt")
    with pytest.raises(PolicyError, match="no disk named 'nodisk'"):
        fs.open("cryptdisk://nodisk/x")


def test_open_write_is_atomic(config_path: str) -> None:
    fs = CryptdiskFileSystem(config=config_path)
    fs.pipe_file("cryptdisk://secure/f", b"old")
    with pytest.raises(RuntimeError), fs.open("cryptdisk://secure/f", "wb") as f:
        f.write(b"new new new")
        raise RuntimeError
    assert fs.cat_file("cryptdisk://secure/f") == b"old"
    with fs.open("cryptdisk://secure/f", "wb") as f:
        f.write(b"new")
    assert fs.cat_file("cryptdisk://secure/f") == b"new"
    with pytest.raises(ValueError, match="'rb' or 'wb'"):
        fs.open("cryptdisk://secure/f", "ab")


def test_mv_and_copy_between_disks(config_path: str, tmp_path: Path) -> None:
    fs = CryptdiskFileSystem(config=config_path)
    fs.pipe_file("cryptdisk://plain/p.txt", b"plain text")
    fs.cp_file("cryptdisk://plain/p.txt", "cryptdisk://secure/p.txt")
    fs.mv("cryptdisk://secure/p.txt", "cryptdisk://secure/q.txt")
    assert fs.cat_file("cryptdisk://secure/q.txt") == b"plain text"
    assert not fs.exists("cryptdisk://secure/p.txt")
    assert (tmp_path / "plain" / "p.txt").read_bytes() == b"plain text"


def test_pickle_carries_the_path_not_the_keys(config_path: str) -> None:
    fs = CryptdiskFileSystem(config=config_path, skip_instance_cache=True)
    fs.pipe_file("cryptdisk://secure/x", b"payload")
    blob = pickle.dumps(fs)
    assert KEY_HEX.encode() not in blob and bytes.fromhex(KEY_HEX) not in blob
    assert config_path.encode() in blob
    clone = pickle.loads(blob)
    assert clone.cat_file("cryptdisk://secure/x") == b"payload"
    assert KEY_HEX not in repr(fs) and KEY_HEX not in str(fs.storage_options)


def test_refuses_key_material_in_storage_options(config_path: str) -> None:
    with pytest.raises(TypeError, match="never in storage_options"):
        CryptdiskFileSystem(config=config_path, key=KEY_HEX)


def test_refuses_credentials_in_a_url_without_quoting_them(config_path: str) -> None:
    fs = CryptdiskFileSystem(config=config_path, skip_instance_cache=True)
    for call in (fs.cat_file, fs.info, fs.ls, lambda p: fs.open(p, "wb")):
        with pytest.raises(ConfigError, match="never credentials") as info:
            call("cryptdisk://user:s3cr3t@secure/x")
        assert "s3cr3t" not in str(info.value) and "s3cr3t" not in repr(info.value)


def test_config_from_environment(config_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRYPTDISK_CONFIG", config_path)
    fs = CryptdiskFileSystem(skip_instance_cache=True)
    assert fs.config_path == config_path
    monkeypatch.delenv("CRYPTDISK_CONFIG")
    with pytest.raises(ConfigError, match="CRYPTDISK_CONFIG"):
        CryptdiskFileSystem(skip_instance_cache=True)


def test_one_file_object_many_threads(config_path: str) -> None:
    fs = CryptdiskFileSystem(config=config_path)
    data = bytes(range(256)) * 4000
    fs.pipe_file("cryptdisk://secure/big", data)
    bad = []
    with fs.open("cryptdisk://secure/big", "rb") as f:
        def work(seed: int) -> None:
            for i in range(300):
                off = (seed * 7919 + i * 104729) % len(data)
                f.seek(off)
                if f.read(5000) != data[off : off + 5000]:
                    bad.append(off)
        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert bad == []


def test_fsspec_open_discards_on_exception(config_path: str) -> None:
    """fsspec.open() closes the file from __exit__ even when the block failed."""
    fs = CryptdiskFileSystem(config=config_path)
    fs.pipe_file("cryptdisk://secure/atom", b"old")
    with pytest.raises(RuntimeError), fsspec.open("cryptdisk://secure/atom", "wb",
                                                  config=config_path) as f:
        f.write(b"partial")
        raise RuntimeError("boom")
    assert fs.cat_file("cryptdisk://secure/atom") == b"old"
    with fsspec.open("cryptdisk://secure/atom", "wb", config=config_path) as f:
        f.write(b"whole")
    assert fs.cat_file("cryptdisk://secure/atom") == b"whole"


def test_writing_inside_an_except_block_still_publishes(config_path: str) -> None:
    import pandas as pd

    try:
        raise KeyError("the primary source is missing")
    except KeyError:
        pd.DataFrame({"a": [1, 2]}).to_parquet("cryptdisk://secure/fallback.parquet",
                                               storage_options={"config": config_path})
    back = pd.read_parquet("cryptdisk://secure/fallback.parquet",
                           storage_options={"config": config_path})
    assert back["a"].tolist() == [1, 2]


def _backing(tmp_path: Path) -> dict[str, bytes]:
    root = tmp_path / "raw" / "enc"
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_mv_directory_recursive_renames_each_file(config_path: str, tmp_path: Path) -> None:
    fs = CryptdiskFileSystem(config=config_path, skip_instance_cache=True)
    fs.pipe({"secure/src/a": b"A", "secure/src/sub/b": b"B", "secure/src.txt": b"T"})
    before = _backing(tmp_path)
    fs.mv("cryptdisk://secure/src", "cryptdisk://secure/dst", recursive=True)
    assert sorted(fs.find("secure")) == ["secure/dst/a", "secure/dst/sub/b", "secure/src.txt"]
    assert fs.cat("secure/dst/sub/b") == b"B"
    # Renamed, not re-encrypted: the ciphertext is byte for byte the same.
    after = _backing(tmp_path)
    assert after["dst/a"] == before["src/a"] and after["dst/sub/b"] == before["src/sub/b"]


def test_mv_directory_across_disks_and_into_a_directory(config_path: str) -> None:
    fs = CryptdiskFileSystem(config=config_path, skip_instance_cache=True)
    fs.pipe({"plain/d/x": b"X", "plain/d/y/z": b"Z", "secure/into/keep": b"K"})
    fs.mv("plain/d", "secure/into", recursive=True)
    assert sorted(fs.find("secure/into")) == ["secure/into/d/x", "secure/into/d/y/z",
                                              "secure/into/keep"]
    assert fs.cat("secure/into/d/y/z") == b"Z" and fs.find("plain") == []
    with pytest.raises(IsADirectoryError, match="recursive=True"):
        fs.mv("secure/into", "secure/elsewhere")
    assert fs.exists("secure/into/keep") and not fs.exists("secure/elsewhere")


def test_cp_directory_recursive(config_path: str) -> None:
    fs = CryptdiskFileSystem(config=config_path, skip_instance_cache=True)
    fs.pipe({"secure/s/a": b"A", "secure/s/n/b": b"B"})
    fs.cp("secure/s", "secure/t", recursive=True)
    assert sorted(fs.find("secure/t")) == ["secure/t/a", "secure/t/n/b"]
    assert fs.cat("secure/s/n/b") == fs.cat("secure/t/n/b") == b"B"


def test_pipe_create_refuses_an_existing_file(config_path: str) -> None:
    fs = CryptdiskFileSystem(config=config_path, skip_instance_cache=True)
    fs.pipe_file("secure/once", b"first", mode="create")
    with pytest.raises(FileExistsError):
        fs.pipe_file("secure/once", b"second", mode="create")
    assert fs.cat_file("secure/once") == b"first"
    with pytest.raises(ValueError, match="overwrite"):
        fs.pipe_file("secure/once", b"x", mode="append")


def test_rm_missing_and_directories(config_path: str) -> None:
    fs = CryptdiskFileSystem(config=config_path, skip_instance_cache=True)
    fs.pipe({"secure/d/f": b"1", "secure/g": b"2"})
    with pytest.raises(FileNotFoundError):
        fs.rm("secure/missing")
    with pytest.raises(FileNotFoundError):
        fs.rm(["secure/g", "secure/missing"])
    assert fs.exists("secure/g")  # checked before anything was deleted
    with pytest.raises(IsADirectoryError, match="recursive=True"):
        fs.rm("secure/d")
    with pytest.raises(ValueError):  # what fsspec's LocalFileSystem raises
        fs.rm("secure/d")
    assert fs.exists("secure/d/f")
    fs.rm("secure/d", recursive=True)
    assert fs.find("secure") == ["secure/g"]


def test_files_written_in_a_transaction_appear_when_it_ends(config_path: str) -> None:
    fs = CryptdiskFileSystem(config=config_path, skip_instance_cache=True)
    fs.pipe_file("secure/tx/old", b"old")
    with fs.transaction:
        with fs.open("secure/tx/a", "wb") as f:
            f.write(b"A")
        with fs.open("secure/tx/t.txt", "w") as t:
            t.write("text")
        fs.pipe_file("secure/tx/old", b"new")
        assert not fs.exists("secure/tx/a") and fs.cat_file("secure/tx/old") == b"old"
    assert fs.cat_file("secure/tx/a") == b"A" and fs.cat_file("secure/tx/t.txt") == b"text"
    assert fs.cat_file("secure/tx/old") == b"new"


def test_a_failed_transaction_publishes_nothing(config_path: str, tmp_path: Path) -> None:
    fs = CryptdiskFileSystem(config=config_path, skip_instance_cache=True)
    fs.pipe_file("secure/tx/old", b"old")
    with pytest.raises(RuntimeError, match="boom"), fs.transaction:
        with fs.open("secure/tx/b", "wb") as f:
            f.write(b"B")
        fs.pipe_file("secure/tx/old", b"new")
        raise RuntimeError("boom")
    assert fs.find("secure/tx") == ["secure/tx/old"] and fs.cat_file("secure/tx/old") == b"old"
    assert not [p for p in (tmp_path / "raw").rglob("*") if p.name.endswith(".cdtmp")]


def test_a_url_naming_no_disk_says_so_through_pyarrow(config_path: str) -> None:
    # pyarrow (under pandas and Dask) turns a FileNotFoundError into one naming the bare
    # path; the reader must learn that the disk name is what is wrong.
    fs = CryptdiskFileSystem(config=config_path, skip_instance_cache=True)
    with pytest.raises(PolicyError, match=r"no disk named 'scure'.*\(disks: default, plain"):
        pq.read_table("cryptdisk://scure/t.parquet", filesystem=fs)
    with pytest.raises(PolicyError, match="no disk named 'scure'"):
        ds.dataset("cryptdisk://scure/t", filesystem=fs)
    assert not fs.exists("cryptdisk://scure/t.parquet")


def test_reads_hopping_between_threads_continue_where_the_last_one_ended(
        config_path: str) -> None:
    # pyarrow's stream readers (CSV, JSON) read a Python file from whichever pool thread
    # is free; a position kept per thread read the first block again and again.
    fs = CryptdiskFileSystem(config=config_path, skip_instance_cache=True)
    data = bytes(range(256)) * 40
    fs.pipe_file("secure/seq", data)
    got: list[bytes] = []
    with fs.open("secure/seq", "rb") as f:
        for _ in range(len(data) // 1000 + 2):  # bounded: a file that never ends fails
            t = threading.Thread(target=lambda: got.append(f.read(1000)))
            t.start()
            t.join()
        assert b"".join(got) == data and got[-1] == b"" and f.tell() == len(data)
        f.seek(5)  # a seek holds for this thread's next read...
        t = threading.Thread(target=lambda: f.seek(100))
        t.start()
        t.join()
        assert f.read(3) == data[5:8]
        assert f.read(2) == data[8:10]  # ...and reads go on from there


def test_pyarrow_reads_csv_and_json_from_a_file_object(config_path: str) -> None:
    fs = CryptdiskFileSystem(config=config_path, skip_instance_cache=True)
    rows = 20000
    fs.pipe_file("secure/t.csv", ("k,v\n" + "".join(f"{i},{MARKER}\n" for i in range(rows))
                                  ).encode())
    fs.pipe_file("secure/t.json", "".join(f'{{"k": {i}}}\n' for i in range(rows)).encode())

    class Bounded:
        """The file, failing once far more than its size was read (no endless loop)."""

        def __init__(self, f: Any) -> None:
            self.f, self.read_bytes, self.closed = f, 0, False

        def read(self, n: int = -1) -> bytes:
            data = self.f.read(n)
            self.read_bytes += len(data)
            assert self.read_bytes <= 3 * self.f.size, "read the same bytes again"
            return bytes(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

    opts = pa_csv.ReadOptions(block_size=4096, use_threads=True)
    with fs.open("secure/t.csv", "rb") as f:
        table = pa_csv.read_csv(Bounded(f), read_options=opts)
    assert table.num_rows == rows and table["k"].to_pylist() == list(range(rows))
    with fs.open("secure/t.json", "rb") as f:
        jtable = pa_json.read_json(Bounded(f), read_options=pa_json.ReadOptions(block_size=4096))
    assert jtable["k"].to_pylist() == list(range(rows))


def test_bad_config_argument_and_touch(config_path: str) -> None:
    from cryptdisk.config import load_config

    with pytest.raises(TypeError, match="path of a cryptdisk config file, not Config"):
        CryptdiskFileSystem(config=load_config(config_path), skip_instance_cache=True)
    with pytest.raises(TypeError, match="not int"):
        fsspec.filesystem("cryptdisk", config=123, skip_instance_cache=True)
    fs = CryptdiskFileSystem(config=config_path, skip_instance_cache=True)
    fs.touch("secure/touched")
    assert fs.cat_file("secure/touched") == b""
    fs.pipe_file("secure/touched", b"data")
    with pytest.raises(NotImplementedError, match="modification time"):
        fs.touch("secure/touched", truncate=False)
    assert fs.cat_file("secure/touched") == b"data"
    fs.touch("secure/touched")
    assert fs.cat_file("secure/touched") == b""


def test_a_config_changed_by_a_key_rotation_is_loaded_again(tmp_path: Path) -> None:
    """fsspec keeps one filesystem per config path for the life of a process (a Dask
    worker's): after the config makes key 2 current, new files are sealed under key 2;
    once key 1 is removed from it, a file still under key 1 no longer reads."""
    from cryptdisk.errors import KeyNotFoundError
    from cryptdisk.format import Header
    from tests.db.dbhelpers import write_config

    cfg = str(write_config(tmp_path, [1], 1))
    fs = fsspec.filesystem("cryptdisk", config=cfg)
    fs.pipe_file("secure/old.bin", b"old")
    write_config(tmp_path, [1, 2], 2)
    assert fsspec.filesystem("cryptdisk", config=cfg) is fs  # fsspec's instance cache
    fs.pipe_file("secure/new.bin", b"new")
    store = tmp_path / "store" / "secure"
    assert Header.parse((store / "old.bin").read_bytes()[:128]).key_id == 1
    assert Header.parse((store / "new.bin").read_bytes()[:128]).key_id == 2
    assert fs.cat_file("secure/old.bin") == b"old"
    write_config(tmp_path, [2], 2)
    assert fs.cat_file("secure/new.bin") == b"new"
    with pytest.raises(KeyNotFoundError):
        fs.cat_file("secure/old.bin")


def test_blockcache_is_refused_as_it_would_keep_plaintext(config_path: str,
                                                          tmp_path: Path) -> None:
    """fsspec's blockcache:: keeps the byte ranges it reads in a sparse file of its cache
    directory: over cryptdisk:// those are the decrypted bytes, so reading through it is
    refused with a DiskError that says why and what to use (before the fix: fsspec's raw
    AttributeError on the file's blocksize). Writes pass through it (it caches none)."""
    from cryptdisk.errors import DiskError

    data = MARKER.encode() * 1000
    CryptdiskFileSystem(config=config_path).pipe_file("secure/a.bin", data)
    cache = tmp_path / "blockcache"
    chained = fsspec.open("blockcache::cryptdisk://secure/a.bin", cryptdisk={
        "config": config_path}, blockcache={"cache_storage": str(cache)})
    with pytest.raises(DiskError, match=r"blockcache::cryptdisk://secure/a\.bin: .*"
                       "blockcache would write the byte ranges it reads, decrypted") as err:
        with chained as f:
            f.read()
    assert "cache_mb" in (err.value.hint or "")
    bc = fsspec.filesystem("blockcache", target_protocol="cryptdisk",
                           target_options={"config": config_path}, cache_storage=str(cache))
    for read in (lambda: bc.cat_file("secure/a.bin"), lambda: bc.open("secure/a.bin").read(),
                 lambda: bc.open("secure/a.bin", compression="infer")):
        with pytest.raises(DiskError, match="blockcache"):
            read()
    assert not any(MARKER.encode() in p.read_bytes() for p in cache.rglob("*") if p.is_file())
    with bc.open("secure/b.bin", "wb") as f:
        f.write(data)
    assert CryptdiskFileSystem(config=config_path).cat_file("secure/b.bin") == data
    assert assert_ciphertext_only(tmp_path / "raw" / "enc") == 2
    with fsspec.open("simplecache::cryptdisk://secure/a.bin", cryptdisk={
            "config": config_path}, simplecache={"cache_storage": str(tmp_path / "sc")}) as f:
        assert f.read() == data  # the whole-file caches still work (docs/disks.md warns)
