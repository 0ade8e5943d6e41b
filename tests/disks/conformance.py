"""The conformance suite every disk type passes (as fsspec's ``tests/abstract``).

Subclass :class:`DiskConformance` in a test module that provides a ``disk``
fixture yielding a fresh, empty disk; each test checks one clause of the
contract in ``cryptdisk/disks/_base.py``.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import threading

import pytest

from cryptdisk.disks import Disk, discardable, positional
from cryptdisk.errors import (
    CryptdiskError,
    DiskError,
    DiskFileNotFoundError,
    DiskIsADirectoryError,
)

SIZES = [0, 1, 4095, 4096, 4097, 3 * 4096, 65536, 65537, 200_003]


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + n).randbytes(n)


class DiskConformance:
    # -- reading what was written -------------------------------------------------

    @pytest.mark.parametrize("size", SIZES)
    def test_round_trip(self, disk: Disk, size: int) -> None:
        data = payload(size)
        disk.write_bytes("dir/file.bin", data)
        assert disk.read_bytes("dir/file.bin") == data
        assert disk.info("dir/file.bin").size == size
        with disk.open_read("dir/file.bin") as f:
            assert positional(f).size == size

    def test_files_keep_the_contracts_protocols(self, disk: Disk) -> None:
        """positional() and discardable() accept every disk's files and refuse others."""
        with disk.open_write("p") as w:
            w.write(b"abc")
            assert callable(discardable(w).abort)
        with disk.open_read("p") as f:
            assert positional(f).pread(1, 5) == b"bc"
        with pytest.raises(TypeError, match="not a disk's read file"):
            positional(io.BytesIO(b"abc"))
        with pytest.raises(TypeError, match="not a disk's write file"):
            discardable(io.BytesIO())

    def test_write_in_many_small_pieces(self, disk: Disk) -> None:
        data = payload(50_000, 1)
        with disk.open_write("pieces") as f:
            for i in range(0, len(data), 777):
                f.write(data[i : i + 777])
        assert disk.read_bytes("pieces") == data

    def test_empty_file(self, disk: Disk) -> None:
        disk.write_bytes("empty", b"")
        assert disk.read_bytes("empty") == b""
        with disk.open_read("empty") as f:
            assert f.read() == b"" and f.read(10) == b""
            f.seek(0, os.SEEK_END)
            assert f.tell() == 0

    def test_seek_tell_read(self, disk: Disk) -> None:
        data = payload(20_000, 2)
        disk.write_bytes("f", data)
        with disk.open_read("f") as f:
            assert f.seekable() and f.readable()
            assert f.read(10) == data[:10] and f.tell() == 10
            f.seek(5000)
            assert f.read(4) == data[5000:5004]
            f.seek(-3, os.SEEK_END)
            assert f.read() == data[-3:]
            assert f.read(10) == b""
            f.seek(100, os.SEEK_SET)
            f.seek(50, os.SEEK_CUR)
            assert f.tell() == 150
            buf = bytearray(300)
            assert f.readinto(buf) == 300 and bytes(buf) == data[150:450]
            with pytest.raises(OSError):
                f.seek(-1)

    def test_pread_random_offsets(self, disk: Disk) -> None:
        data = payload(70_000, 3)
        disk.write_bytes("f", data)
        rnd = random.Random(4)
        with disk.open_read("f") as raw:
            f = positional(raw)
            for _ in range(200):
                off = rnd.randrange(0, len(data) + 10)
                n = rnd.randrange(0, 9000)
                assert f.pread(off, n) == data[off : off + n]

    def test_threads_share_one_file_object(self, disk: Disk) -> None:
        """DuckDB's pattern: many threads, one file object, seek() then read()."""
        data = payload(120_000, 5)
        disk.write_bytes("f", data)
        errors: list[str] = []
        with disk.open_read("f") as f:
            def worker(seed: int) -> None:
                rnd = random.Random(seed)
                for _ in range(150):
                    off, n = rnd.randrange(len(data)), rnd.randrange(1, 20_000)
                    if rnd.random() < 0.5:
                        got = positional(f).pread(off, n)
                    else:
                        f.seek(off)
                        got = f.read(n)
                    if got != data[off : off + n]:
                        errors.append(f"seed {seed} off {off} n {n}")
            threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert errors == []

    def test_file_objects_are_standard(self, disk: Disk) -> None:
        disk.write_bytes("f", b"line1\nline2\n")
        with disk.open_read("f") as raw:
            assert io.BufferedReader(raw).readlines() == [b"line1\n", b"line2\n"]  # type: ignore[arg-type]

    # -- atomic publish ----------------------------------------------------------

    def test_nothing_visible_before_close(self, disk: Disk) -> None:
        f = disk.open_write("new/file")
        f.write(payload(10_000))
        assert not disk.exists("new/file")
        assert disk.list() == []
        f.close()
        assert disk.exists("new/file")
        assert disk.list() == ["new/file"]

    def test_exception_keeps_old_file(self, disk: Disk) -> None:
        disk.write_bytes("f", b"old content")
        with pytest.raises(RuntimeError), disk.open_write("f") as f:
            f.write(payload(30_000))
            raise RuntimeError("boom")
        assert disk.read_bytes("f") == b"old content"
        assert disk.list() == ["f"]

    def test_abort_keeps_old_file_and_no_new_one(self, disk: Disk) -> None:
        disk.write_bytes("f", b"old")
        f = disk.open_write("f")
        f.write(b"new")
        f.abort()  # type: ignore[attr-defined]
        g = disk.open_write("g")
        g.write(b"never")
        g.abort()  # type: ignore[attr-defined]
        assert disk.read_bytes("f") == b"old"
        assert not disk.exists("g")
        assert disk.list() == ["f"]

    def test_close_during_an_exception_discards(self, disk: Disk) -> None:
        """Wrappers (fsspec.open) close from __exit__ without passing the exception on."""
        disk.write_bytes("f", b"old")
        f = disk.open_write("f")
        try:
            f.write(b"half")
            raise ValueError("failed mid-write")
        except ValueError:
            f.close()
        assert disk.read_bytes("f") == b"old"
        assert disk.list() == ["f"]

    def test_overwrite_replaces(self, disk: Disk) -> None:
        disk.write_bytes("f", payload(9000, 1))
        disk.write_bytes("f", b"short")
        assert disk.read_bytes("f") == b"short"

    # -- listing, removal, rename ---------------------------------------------------

    def test_list(self, disk: Disk) -> None:
        for name in ["b/2", "a/1", "a/sub/3", "ab", "c"]:
            disk.write_bytes(name, name.encode())
        assert disk.list() == ["a/1", "a/sub/3", "ab", "b/2", "c"]
        assert disk.list("a/") == ["a/1", "a/sub/3"]
        assert disk.list("a") == ["a/1", "a/sub/3", "ab"]
        assert disk.list("nothing/") == []

    def test_remove(self, disk: Disk) -> None:
        disk.write_bytes("f", b"x")
        disk.remove("f")
        assert not disk.exists("f") and disk.list() == []
        with pytest.raises(DiskFileNotFoundError):
            disk.remove("f")

    def test_missing_file(self, disk: Disk) -> None:
        with pytest.raises(FileNotFoundError):
            disk.open_read("missing")
        with pytest.raises(FileNotFoundError):
            disk.info("missing")
        assert not disk.exists("missing")

    def test_a_directory_is_not_a_file(self, disk: Disk) -> None:
        disk.write_bytes("d/f", b"x")
        for call in (disk.open_read, disk.remove, lambda p: disk.rename(p, "e")):
            with pytest.raises((DiskFileNotFoundError, DiskIsADirectoryError)) as exc:
                call("d")
            # The caller's path on this disk, never a backing disk's (stored) path.
            assert str(exc.value).startswith("d: ") and repr(disk.name) in str(exc.value)
        assert not disk.exists("d") and disk.read_bytes("d/f") == b"x"
        assert disk.list() == ["d/f"]

    def test_rename_replaces_destination(self, disk: Disk) -> None:
        disk.write_bytes("src", b"source")
        disk.write_bytes("dst", b"old")
        disk.rename("src", "dir/dst2")
        disk.rename("dir/dst2", "dst")
        assert disk.read_bytes("dst") == b"source"
        assert disk.list() == ["dst"]
        with pytest.raises(DiskFileNotFoundError):
            disk.rename("src", "x")

    # -- safety ----------------------------------------------------------------------

    @pytest.mark.parametrize("bad", ["../escape", "a/../../b", ""])
    def test_paths_cannot_escape(self, disk: Disk, bad: str) -> None:
        with pytest.raises(DiskError):
            disk.write_bytes(bad, b"x")

    def test_info_describes_storage(self, disk: Disk) -> None:
        disk.write_bytes("f", payload(5000))
        info = disk.info("f")
        assert info.encrypted == disk.is_encrypted
        assert info.format == ("plain" if not disk.is_encrypted else info.format)
        assert info.stored_size >= info.size
        assert info.mtime is not None

    def test_not_picklable_and_repr_is_safe(self, disk: Disk) -> None:
        with pytest.raises(TypeError):
            pickle.dumps(disk)
        assert disk.name in repr(disk)
        assert disk.path and isinstance(disk.path, str)
        assert issubclass(DiskFileNotFoundError, CryptdiskError)
